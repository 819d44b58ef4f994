// headscope influence: AttentionInfluence (Hua et al. 2025) - rank a corpus by how much the model's
// loss on each sample rises when its retrieval heads are masked, with random head sets as controls.
// Method: probes/influence.h, docs/methods.md ("AttentionInfluence").
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "heads.h"
#include "influence.h"
#include "progress.h"
#include "schema.h"
#include "tokenizer.h"
#include "util.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace hs::cli {

struct InfluenceCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string corpus, heads, from;
    int64_t top = 0, random_controls = 5, seed = 0, max_tokens = 0, max_rows = 8, show = 3;
    double select_fraction = 0.3;
    std::string loss_tokens = "all";
};

// Set 0 (the named heads) and where it came from.
static std::pair<std::vector<Head>, std::string> chosen_heads(const InfluenceCliOptions& o, int L, int H) {
    if (!o.heads.empty()) return {with_flag("--heads", [&] { return parse_head_list(o.heads, L, H); }), "--heads " + o.heads};
    if (o.from.empty() || o.top < 1) throw UsageError("give --heads, or --from FILE.h5:DATASET with --top K");
    if (o.top > static_cast<int64_t>(L) * H) throw UsageError(fmt::format("--top: {} is more than the model's {} heads", o.top, L * H));
    auto score = with_flag("--from", [&] { return read_head_score(split_head_score_ref(o.from), L, H); });
    return {top_heads(score, o.top), fmt::format("top {} of {}", o.top, o.from)};
}

static schema::InfluenceRecord make_record(const InfluenceCliOptions& o, const Model& m, const std::vector<CorpusSample>& corpus,
                                           const std::vector<std::vector<Head>>& sets, const InfluenceResult& r) {
    schema::InfluenceRecord x;
    x.N = static_cast<int64_t>(corpus.size()), x.S = static_cast<int64_t>(sets.size());
    x.L = m.config.n_layers, x.H = m.config.n_heads;
    x.loss = host_floats(r.loss), x.masked_loss = host_floats(r.masked_loss), x.score = host_floats(r.score);
    x.n_tokens = r.n_tokens;
    for (const auto& s : corpus) {
        x.line.push_back(s.line);
        x.truncated.push_back(s.truncated ? 1 : 0);
        x.preview.push_back(s.preview);
    }
    x.rank.resize(static_cast<size_t>(x.N));
    std::iota(x.rank.begin(), x.rank.end(), 0);
    // Highest score first; NaN (a sample whose loss is 0) last; ties keep corpus order.
    std::stable_sort(x.rank.begin(), x.rank.end(), [&](int64_t a, int64_t b) {
        const float sa = x.score[static_cast<size_t>(a)], sb = x.score[static_cast<size_t>(b)];
        if (std::isnan(sa) || std::isnan(sb)) return !std::isnan(sa) && std::isnan(sb);
        return sa > sb;
    });
    const auto n_sel = static_cast<int64_t>(std::ceil(o.select_fraction * static_cast<double>(x.N) - 1e-9));
    x.selected.assign(static_cast<size_t>(x.N), 0);
    for (int64_t i = 0; i < n_sel; ++i) x.selected[static_cast<size_t>(x.rank[static_cast<size_t>(i)])] = 1;
    x.masks.assign(static_cast<size_t>(x.S * x.L * x.H), 0);
    std::vector<std::string> names;
    for (int64_t s = 0; s < x.S; ++s) {
        names.push_back(format_heads(sets[static_cast<size_t>(s)]));
        for (auto [l, h] : sets[static_cast<size_t>(s)]) x.masks[static_cast<size_t>((s * x.L + l) * x.H + h)] = 1;
    }
    int64_t n_trunc = 0;
    for (auto t : x.truncated) n_trunc += t;
    x.attrs = {{"corpus", o.corpus},
               {"corpus_sha256", sha256_file(o.corpus)},
               {"heads", names},
               {"random_controls", static_cast<int64_t>(x.S - 1)},
               {"control_seed", o.seed},
               {"masking", std::string("zero: the heads' attention output z set to 0 in every position (their attention "
                                       "weights zeroed), through the ablation engine's per-row masks")},
               {"loss", std::string(o.loss_tokens == "last"
                                        ? "next-token cross-entropy of each sample's last token alone (--loss-tokens last)"
                                        : "mean next-token cross-entropy over positions 1..T-1 of each sample (every token "
                                          "after the first; text samples start with the tokenizer's BOS)")},
               {"loss_tokens", o.loss_tokens},
               {"score", std::string("(masked_loss - loss) / loss")},
               {"max_tokens", o.max_tokens},
               {"n_truncated", n_trunc},
               {"select_fraction", o.select_fraction},
               {"n_selected", n_sel},
               {"max_rows", o.max_rows},
               {"forwards", r.forwards}};
    return x;
}

static void print_influence(const schema::InfluenceRecord& x, const std::vector<std::string>& names, int64_t show) {
    auto mean = [&](int64_t s) {
        double a = 0;
        int64_t n = 0;
        for (int64_t i = 0; i < x.N; ++i) {
            const float v = x.score[static_cast<size_t>(s * x.N + i)];
            if (!std::isnan(v)) a += v, ++n;
        }
        return n ? a / static_cast<double>(n) : std::nan("");
    };
    double loss = 0;
    for (float v : x.loss) loss += v;
    std::printf("%lld samples, mean loss %.4f\n", static_cast<long long>(x.N), loss / static_cast<double>(x.N));
    std::printf("heads    %-24s mean score %+.4f\n", names[0].c_str(), mean(0));
    for (int64_t s = 1; s < x.S; ++s) std::printf("control  %-24s mean score %+.4f\n", names[static_cast<size_t>(s)].c_str(), mean(s));
    auto row = [&](const char* what, int64_t k) {
        const int64_t i = x.rank[static_cast<size_t>(k)];
        std::printf("%s %4lld  line %-5lld score %+.4f  \"%s\"\n", what, static_cast<long long>(k + 1),
                    static_cast<long long>(x.line[static_cast<size_t>(i)]), x.score[static_cast<size_t>(i)],
                    x.preview[static_cast<size_t>(i)].substr(0, 48).c_str());
    };
    for (int64_t k = 0; k < std::min(show, x.N); ++k) row("top   ", k);
    for (int64_t k = std::max<int64_t>(std::min(show, x.N), x.N - show); k < x.N; ++k) row("bottom", k);
}

void run_influence(InfluenceCliOptions o) {
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    if (o.max_tokens == 0) o.max_tokens = m.config.max_seq_len;
    if (o.max_tokens > m.config.max_seq_len)
        throw UsageError(fmt::format("--max-tokens: {} is over the model's context of {}", o.max_tokens, m.config.max_seq_len));
    auto [heads, source] = chosen_heads(o, L, H);
    const auto corpus = read_corpus(o.corpus, l.tokenizer.get(), m.config.vocab_size, o.max_tokens);
    std::vector<std::vector<Head>> sets{heads};
    int64_t possible = 0;
    if (o.random_controls > 0)
        for (auto& s : with_flag("--random-controls", [&] {
                 return random_head_sets(L, H, heads, o.random_controls, static_cast<uint64_t>(o.seed), &possible);
             }))
            sets.push_back(s);
    log_info("{} samples from {}; heads {} ({}) and {} random control set(s)", corpus.size(), o.corpus, format_heads(heads),
             source, sets.size() - 1);
    const auto r = attention_influence(m, corpus, sets, {o.max_rows, o.loss_tokens == "last"});
    auto x = make_record(o, m, corpus, sets, r);
    x.attrs["heads_source"] = source;
    x.attrs["distinct_controls_possible"] = possible;
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, o.seed);
    schema::write_influence(w, x);
    w.commit();
    std::vector<std::string> names;
    for (const auto& s : sets) names.push_back(format_heads(s));
    print_influence(x, names, o.show);
    log_info("wrote {} ({} forwards)", o.out.out, r.forwards);
}

void setup_influence(CLI::App& app) {
    auto o = std::make_shared<InfluenceCliOptions>();
    auto* sub = app.add_subcommand(
        "influence", "AttentionInfluence (Hua et al. 2025): rank a JSONL corpus by the relative rise of each sample's loss\n"
                     "when the given (retrieval) heads are masked, with random head sets of the same size as controls\n"
                     "Example: headscope influence ../shared/testdata/tinystories-656k --corpus "
                     "datasets/examples/influence-corpus.jsonl --heads L1H1,L1H6 --out influence.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--corpus", o->corpus, "JSONL: {\"text\": ...} or {\"tokens\": [ids]} a line")->required();
    sub->add_option("--heads", o->heads, "the heads to mask, e.g. L1H0,L1H3")->excludes(
        sub->add_option("--from", o->from, "a score to take the heads from, FILE.h5:DATASET (with --top)"));
    sub->add_option("--top", o->top, "with --from: mask the K best-scoring heads")->check(at_least(1));
    sub->add_option("--random-controls", o->random_controls, "random head sets of the same size (distinct, other heads)")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--seed", o->seed, "seed of the control sets")->capture_default_str();
    sub->add_option("--max-tokens", o->max_tokens, "cut each sample to this many tokens (0: the model's context)")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--max-rows", o->max_rows, "rows a forward (samples x head sets)")->check(at_least(1))->capture_default_str();
    sub->add_option("--select-fraction", o->select_fraction, "the top fraction of the ranking marked selected")
        ->check(in_range(0, 1))->capture_default_str();
    sub->add_option("--loss-tokens", o->loss_tokens, "all (the paper's: every token after the first) or last (the last token alone)")
        ->check(CLI::IsMember({"all", "last"}))->capture_default_str();
    sub->add_option("--show", o->show, "top and bottom samples printed")->check(at_least(0))->capture_default_str();
    sub->callback([o] { run_influence(*o); });
}

}  // namespace hs::cli
