#include "atlas.h"

#include "errors.h"
#include "maps.h"
#include "progress.h"
#include "qk_spectrum.h"
#include "successor.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace hs {

namespace {

constexpr double kArenaThreshold = 0.4;  // ARENA's detectors: a head whose stripe score is above 0.4

// Average ranks (1-based) of v, ties sharing their mean rank.
std::vector<double> ranks(const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
        size_t j = i;
        while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
        const double mean = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
        for (size_t k = i; k <= j; ++k) r[idx[k]] = mean;
        i = j + 1;
    }
    return r;
}

std::vector<double> values(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kDouble).contiguous().flatten();
    return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// The detectors, one pass over the [BOS, R, R] rows.
void add_detectors(const Model& m, const Tokenizer* tok, const AtlasSpec& spec, AtlasResult& out) {
    const int64_t ctx = m.config.max_seq_len;
    StripeInput in = spec.stripe;
    if (2 * in.seq_len + 1 > ctx) in.seq_len = (ctx - 1) / 2;  // the longest [BOS, R, R] the context holds
    ProbeInput p;
    p.stripe_tokens = repeated_random_tokens(m, in, tok);
    p.n = in.seq_len, p.max_rows = spec.max_rows, p.sink_epsilon = spec.sink_epsilon;
    out.probes = run_head_probes(m, {"induction", "previous-token", "duplicate-token", "sink-rate"}, p);
    out.seq_len = in.seq_len;
    const std::string rows = fmt::format("{} rows of [BOS, R, R], |R| = {}, seed {}", in.batch, in.seq_len, in.seed);
    for (const auto& s : out.probes) {
        AtlasColumn c{s.probe, "", s.score, "", kArenaThreshold, "ARENA's detectors (0.4)"};
        if (s.sink) {
            c.source = "Gu et al. 2025 (sail-sg/Attention-Sink): mean alpha_0, " + rows;
            c.role = "sink", c.threshold = spec.sink_epsilon, c.threshold_source = "Gu et al.'s epsilon (--sink-epsilon)";
            out.model_sink_rate = s.sink->model_rate;
        } else {
            c.source = probe_description(find_head_probe(s.probe), true) + ", " + rows;
            c.role = s.probe == "induction" ? "induction" : s.probe == "previous-token" ? "previous-token" : "duplicate-token";
        }
        out.columns.push_back(std::move(c));
    }
}

void add_successor(const Model& m, const Tokenizer* tok, AtlasResult& out) {
    if (!tok) {
        out.skipped.push_back("successor: no tokenizer (the tasks are words)");
        return;
    }
    std::vector<TokenizedTask> tasks;
    for (const auto& t : default_successor_tasks()) tasks.push_back(tokenize_task(t, *tok));
    if (std::none_of(tasks.begin(), tasks.end(), [](const TokenizedTask& t) { return !t.ids.empty(); })) {
        out.skipped.push_back("successor: no task has two consecutive words that are single tokens of this vocabulary");
        return;
    }
    auto s = successor_scores(m, tasks, SuccessorEmbedding::kReference);
    // The reference counts a tie with the largest logit as a success; a head above the threshold only
    // through ties (a vocabulary whose task tokens share one unembedding, as the toy models') is named.
    auto strict = successor_scores(m, tasks, SuccessorEmbedding::kReference, SuccessorTies::kFail);
    const int64_t by_ties = (s.score.gt(kSuccessorThreshold) & strict.score.le(kSuccessorThreshold)).sum().item<int64_t>();
    std::string source = "Gould et al. 2023 (circuits-over-time's succession score, reference embedding, the default tasks)";
    if (by_ties > 0)
        source += fmt::format("; {} heads are above 0.4 only through ties (their successor's logit equals another task "
                              "token's; successor --ties fail scores them at or below 0.4)",
                              by_ties);
    out.columns.push_back({"successor", source, s.score, "successor", kSuccessorThreshold, "the reference's 0.4"});
}

void add_weights(const Model& m, const Tokenizer* tok, const AtlasSpec& spec, const std::vector<Relation>& relations,
                 AtlasResult& out) {
    CopySuppressionOptions co = spec.copy_suppression;
    if (co.n_tokens >= m.config.vocab_size) co.n_tokens = 0;  // every token: the whole vocabulary
    auto cs = copy_suppression_weights(m, co);
    out.cs_tokens = cs.tokens.size(0);
    out.columns.push_back({"copy-suppression",
                           fmt::format("McDougall et al. 2023: OV circuit, share of {} source tokens whose own logit is the "
                                       "most suppressed (rank 0)", cs.tokens.size(0)),
                           cs.ov.frac_rank0, "copy-suppression", NAN, "none published"});
    auto qk = qk_spectrum(m);
    out.columns.push_back({"qk-rank", "effective rank of W_Q W_K^T (Autonomy-of-Heads; RoPE left out)",
                           qk.effective_rank.to(torch::kFloat), "qk-rank", NAN, "none published"});
    if (relations.empty()) return;
    if (!tok) {
        out.skipped.push_back("maps: no tokenizer (the relations are words)");
        return;
    }
    for (const auto& rel : relations) {
        auto t = tokenize_relation(rel, *tok);
        if (t.src.empty()) {
            out.skipped.push_back(fmt::format("maps/{}: none of its {} pairs are single tokens", rel.name, t.n_total));
            continue;
        }
        auto s = maps_static(m, t, {});
        out.columns.push_back({"maps/" + rel.name,
                               fmt::format("Elhelo & Geva 2024 (MAPS static): share of {} pairs whose target is in the top {} "
                                           "of the head's OV map",
                                           t.src.size(), s.k),
                               s.score, "maps/" + rel.name, NAN, "none published"});
    }
}

// The needle scan's head scores over one scored pass of the spec's trials (the study's own
// functions: read_needle_inputs, make_needle_test, NeedleTest::run_baseline, summarize).
void add_needle(const Model& m, const Tokenizer* tok, const NeedleStudySpec& s, AtlasResult& out) {
    if (!tok) {
        out.skipped.push_back("retrieval, qrhead: no tokenizer (the needle trials are text)");
        return;
    }
    const NeedleInputs in = read_needle_inputs(s, m, *tok);
    const auto test = make_needle_test(s, m, *tok, in);
    const int64_t N = static_cast<int64_t>(test->trials().size()), L = m.config.n_layers, H = m.config.n_heads;
    Progress prog("atlas: needle trials", N);
    const auto rs = test->run_baseline([&prog] { prog.tick(); });
    prog.finish();
    NeedleResults res;
    res.init(N, L, H, s.cfg.decode.max_new_tokens, s.cfg.ablation_max_new_tokens, false);
    for (int64_t i = 0; i < N; ++i) res.set_trial(i, rs[static_cast<size_t>(i)]);
    const NeedleSummary sum = summarize(res, 0, static_cast<uint64_t>(s.proto.seed), s.flag_threshold);
    out.needle_trials = sum.n_done, out.needle_passed = sum.n_pass;
    const std::string grid = fmt::format("{} trials (lengths {}, depths {}), {} passed", sum.n_done, fmt::join(s.cfg.lengths, ","),
                                         fmt::join(s.cfg.depths, ","), sum.n_pass);
    auto col = [&](NeedleScore id) { return sum.scores[static_cast<size_t>(id)].to(torch::kFloat); };
    out.columns.push_back({"retrieval", "Wu et al. 2024's retrieval score (copy-paste while decoding, passing trials) over " + grid,
                           col(NeedleScore::kRetrieval), "retrieval", s.flag_threshold, "Wu et al.'s 0.1 (--flag-threshold)"});
    out.columns.push_back({"qrhead",
                           "QRHead (Zhang et al. 2025): the question's calibrated attention to the needle, mean over " + grid,
                           col(NeedleScore::kQrhead), "qrhead", NAN, "none published"});
}

}  // namespace

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
    HS_REQUIRE(a.size() == b.size(), "spearman: vectors of different lengths");
    for (size_t i = 0; i < a.size(); ++i)
        if (std::isnan(a[i]) || std::isnan(b[i])) return NAN;
    const auto ra = ranks(a), rb = ranks(b);
    const double n = static_cast<double>(a.size());
    const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n, mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
    double sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < ra.size(); ++i) {
        sab += (ra[i] - ma) * (rb[i] - mb), saa += (ra[i] - ma) * (ra[i] - ma), sbb += (rb[i] - mb) * (rb[i] - mb);
    }
    return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : NAN;
}

AtlasResult run_atlas(const Model& m, const Tokenizer* tok, const AtlasSpec& spec) {
    AtlasResult out;
    // The relation files are read first: a bad one fails before any forward pass.
    const auto relations = spec.maps_relations.empty() ? std::vector<Relation>{} : read_relations(spec.maps_relations);
    add_detectors(m, tok, spec, out);
    add_successor(m, tok, out);
    add_weights(m, tok, spec, relations, out);
    if (spec.needle) add_needle(m, tok, *spec.needle, out);
    for (const auto& entry : spec.thresholds) {
        const auto& name = entry.first;  // (a named variable: clang 14 cannot capture a structured binding)
        const auto thr = entry.second;
        auto it = std::find_if(out.columns.begin(), out.columns.end(), [&](const AtlasColumn& c) { return c.name == name; });
        if (it == out.columns.end()) {
            std::vector<std::string> names;
            for (const auto& c : out.columns) names.push_back(c.name);
            throw UsageError(fmt::format("threshold for '{}': the atlas has no such score (it has: {})", name,
                                         fmt::join(names, ", ")),
                             "thresholds");
        }
        it->threshold = thr, it->threshold_source = "set by the caller";
    }
    const int64_t S = static_cast<int64_t>(out.columns.size()), L = m.config.n_layers, H = m.config.n_heads;
    out.correlation = torch::full({S, S}, NAN);
    out.roles = torch::zeros({S, L, H}, torch::kUInt8);
    std::vector<std::vector<double>> v;
    for (const auto& c : out.columns) v.push_back(values(c.score));
    for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j < S; ++j) out.correlation[i][j] = spearman(v[i], v[j]);
        if (!std::isnan(out.columns[i].threshold)) out.roles[i].copy_(out.columns[i].score.cpu().gt(out.columns[i].threshold));
    }
    out.n_roles = out.roles.to(torch::kLong).sum(0);
    return out;
}

schema::AtlasRecord atlas_record(const AtlasResult& r, const AtlasSpec& spec) {
    schema::AtlasRecord a;
    a.S = static_cast<int64_t>(r.columns.size()), a.L = r.roles.size(1), a.H = r.roles.size(2);
    std::vector<at::Tensor> cols;
    for (const auto& c : r.columns) {
        a.columns.push_back(c.name), a.sources.push_back(c.source), a.roles.push_back(c.role);
        a.thresholds.push_back(c.threshold), a.threshold_sources.push_back(c.threshold_source);
        cols.push_back(c.score.to(torch::kCPU, torch::kFloat));
    }
    auto f32 = [](const at::Tensor& t) {
        auto c = t.to(torch::kFloat).contiguous();
        return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
    };
    a.scores = f32(torch::stack(cols));
    a.correlation = f32(r.correlation);
    auto ro = r.roles.contiguous();
    a.role.assign(ro.data_ptr<uint8_t>(), ro.data_ptr<uint8_t>() + ro.numel());
    auto nr = r.n_roles.contiguous();
    a.n_roles.assign(nr.data_ptr<int64_t>(), nr.data_ptr<int64_t>() + nr.numel());
    a.skipped = r.skipped;
    a.seq_len = r.seq_len, a.batch = spec.stripe.batch, a.seed = spec.stripe.seed;
    a.cs_tokens = r.cs_tokens;
    a.sink_epsilon = spec.sink_epsilon, a.model_sink_rate = r.model_sink_rate;
    return a;
}

}  // namespace hs
