#include "decoding.h"

#include "errors.h"
#include "hooks.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace hs {

const std::vector<Intervention>& decoding_row_modes() {
    static const std::vector<Intervention> m = {Intervention::kZero, Intervention::kZeroQuery, Intervention::kScale};
    return m;
}

const NameTable<CombineRule>& combine_rule_names() {
    static const NameTable<CombineRule> t = {
        {CombineRule::kIndependent, "independent"}, {CombineRule::kDecore, "decore"}, {CombineRule::kJuice, "juice"}};
    return t;
}

DecodingRow parse_decoding_row(const std::string& spec, int L, int H) {
    DecodingRow r;
    const std::string s = trim(spec);
    if (s == "none") return r;
    const auto colon = s.find(':');
    if (colon == std::string::npos)
        throw UsageError(fmt::format("row '{}': expected MODE:HEADS (e.g. zero-query:L1H0,L1H1 or scale=2:L0H1) or none", spec));
    std::string mode = s.substr(0, colon);
    const auto eq = mode.find('=');
    if (eq != std::string::npos) {
        const std::string f = mode.substr(eq + 1);
        mode = mode.substr(0, eq);
        const auto factor = parse_double(f);
        if (!factor) throw UsageError(fmt::format("row '{}': factor '{}' is not a number", spec, f));
        r.factor = *factor;
    }
    r.mode = parse_intervention(mode, fmt::format("row '{}': mode", spec), decoding_row_modes());
    if ((r.mode == Intervention::kScale) != (eq != std::string::npos))
        throw UsageError(fmt::format("row '{}': scale takes a factor (scale=F), the other modes none", spec));
    r.heads = parse_head_list(s.substr(colon + 1), L, H);
    if (r.heads.empty()) throw UsageError(fmt::format("row '{}': no head named", spec));
    return r;
}

std::string format_decoding_row(const DecodingRow& r) {
    if (r.mode == Intervention::kNone || r.heads.empty()) return "none";
    const std::string mode = r.mode == Intervention::kScale ? fmt::format("scale={}", r.factor) : intervention_name(r.mode);
    return mode + ":" + format_heads(r.heads);
}

DecodingSpec decore_spec(const std::vector<Head>& heads, bool alpha_entropy, double alpha, double alpha_max) {
    DecodingSpec s;
    s.rule = CombineRule::kDecore;
    s.rows = {DecodingRow{}, DecodingRow{heads, Intervention::kZeroQuery, 1.0}};
    s.alpha_entropy = alpha_entropy, s.alpha = alpha, s.alpha_max = alpha_max;
    return s;
}

DecodingSpec juice_spec(const std::vector<Head>& enhance, double alpha_enhance, const std::vector<Head>& suppress,
                        double alpha_suppress) {
    DecodingSpec s;
    s.rule = CombineRule::kJuice;
    s.rows = {DecodingRow{}, DecodingRow{}};
    s.enhance = enhance, s.suppress = suppress, s.alpha_enhance = alpha_enhance, s.alpha_suppress = alpha_suppress;
    return s;
}

namespace {

// The rows' interventions as per-row head interventions (row r of the batch is spec.rows[r]).
void add_row_interventions(Hooks& hooks, const DecodingSpec& spec) {
    for (size_t r = 0; r < spec.rows.size(); ++r) {
        const auto& row = spec.rows[r];
        InterventionSpec iv;
        iv.mode = row.mode, iv.factor = row.factor;
        apply_intervention(hooks, iv, row.heads, static_cast<int64_t>(r), decoding_row_modes());
    }
    // JUICE: row 1's head output += coefficient x row 0's, at the same layer and position.
    for (auto [l, h] : spec.enhance) {
        HeadIntervention iv{l, h, 1, HeadOp::kAddPeer, spec.alpha_enhance, {}};
        iv.peer = 0;
        hooks.intervene_z(iv);
    }
    for (auto [l, h] : spec.suppress) {
        HeadIntervention iv{l, h, 1, HeadOp::kAddPeer, -spec.alpha_suppress, {}};
        iv.peer = 0;
        hooks.intervene_z(iv);
    }
}

// Top-1 minus top-2 of a score vector [V] (0 when V < 2).
double margin_of(const at::Tensor& s) {
    if (s.size(0) < 2) return 0.0;
    auto top = std::get<0>(s.topk(2));
    return top[0].item<double>() - top[1].item<double>();
}

}  // namespace

double token_margin(const at::Tensor& scores, int64_t y) {
    auto s = scores.to(torch::kDouble).clone();
    const double mine = s[y].item<double>();
    s[y] = -std::numeric_limits<double>::infinity();
    return mine - s.max().item<double>();
}

DecodingOut decode_rows(const Model& m, const std::vector<int64_t>& prompt, const DecodingSpec& spec,
                        const std::function<bool(int64_t)>& stop, int64_t prefill_chunk) {
    HS_REQUIRE(!prompt.empty(), "decode_rows: empty prompt");
    HS_REQUIRE(!spec.rows.empty(), "decode_rows: no row");
    HS_REQUIRE(spec.rule == CombineRule::kIndependent || spec.rows.size() == 2, "decode_rows: decore and juice take two rows");
    torch::NoGradGuard ng;
    c10::InferenceMode im;
    const int64_t R = static_cast<int64_t>(spec.rows.size());
    const int64_t P = static_cast<int64_t>(prompt.size());
    const auto dev = m.options.device;
    const auto longs = torch::TensorOptions().dtype(torch::kLong).device(dev);
    Hooks hooks;
    add_row_interventions(hooks, spec);

    // Prefill of prompt[:-1]. DeCoRe prefills once, unmasked, and gives both rows that cache
    // (decore_entropy.py: one forward on inputs[:, :-1], its past_key_values deep-copied to the base
    // and the masked model); the other rules prefill every row with its interventions (JUICE adds
    // to every token).
    KVCache cache;
    cache.reserve(P - 1 + spec.max_new_tokens);
    ForwardOptions no_logits, step_opts;
    no_logits.compute_logits = false;
    no_logits.gemm = step_opts.gemm = spec.exact_rows ? GemmMode::kPerRow : GemmMode::kFolded;
    const bool shared_prefill = spec.rule == CombineRule::kDecore;
    const int64_t chunk = std::max<int64_t>(1, prefill_chunk);
    auto ids = torch::tensor(prompt, longs).unsqueeze(0);
    if (!shared_prefill) ids = ids.expand({R, P}).contiguous();
    for (int64_t p0 = 0; p0 < P - 1; p0 += chunk)
        m.forward(ids.narrow(1, p0, std::min(P - 1, p0 + chunk) - p0), shared_prefill ? nullptr : &hooks, &cache, no_logits);
    if (shared_prefill)
        for (size_t l = 0; l < cache.k.size(); ++l)
            if (cache.k[l].defined()) {
                cache.k[l] = cache.k[l].expand({R, -1, -1, -1});  // the next append copies it into R rows
                cache.v[l] = cache.v[l].expand({R, -1, -1, -1});
            }

    DecodingOut out;
    out.row_tokens.resize(R);
    std::vector<int64_t> feed(R, prompt.back());
    std::vector<bool> stopped(R, false);
    for (int64_t t = 0; t < spec.max_new_tokens; ++t) {
        auto logits = m.forward(torch::tensor(feed, longs).unsqueeze(1), &hooks, &cache, step_opts)  // [R, 1, V]
                          .select(1, 0)
                          .to(torch::kFloat)
                          .cpu();
        const auto own = logits.argmax(-1);  // [R]
        if (t == 0) {
            out.first_base = logits[0].to(torch::kDouble);
            out.first_scores = spec.rule == CombineRule::kJuice ? logits[1].to(torch::kDouble) : out.first_base;
        }
        if (spec.keep_logits) out.logits.push_back(logits);
        int64_t next = -1;
        if (spec.rule == CombineRule::kIndependent) {
            bool all_stopped = true;
            for (int64_t r = 0; r < R; ++r) {
                if (stopped[r]) continue;
                const int64_t y = own[r].item<int64_t>();
                if (stop && stop(y)) {
                    stopped[r] = true;
                    continue;
                }
                out.row_tokens[r].push_back(y);
                feed[r] = y;
                all_stopped = false;
            }
            if (!stopped[0]) {
                out.tokens.push_back(feed[0]);
                out.margins.push_back(margin_of(logits[0]));
            }
            if (all_stopped) break;
            continue;
        }
        at::Tensor combined;
        if (spec.rule == CombineRule::kDecore) {
            // decore_entropy.py: a = -sum p log(p + 1e-12) of the base row, min(a, alpha_cap); the
            // raw logits are contrasted (an argmax and a margin equal to log-softmax's).
            const auto base = logits[0], masked = logits[1];
            double a = spec.alpha;
            if (spec.alpha_entropy) {
                const auto p = torch::softmax(base.to(torch::kDouble), -1);
                a = -(p * torch::log(p + 1e-12)).sum().item<double>();
            }
            a = std::min(a, spec.alpha_max);
            out.alphas.push_back(a);
            combined = (1 + a) * base.to(torch::kDouble) - a * masked.to(torch::kDouble);
            if (t == 0) out.first_scores = combined;
        } else {
            combined = logits[1];
        }
        next = combined.argmax().item<int64_t>();
        if (stop && stop(next)) break;
        for (int64_t r = 0; r < R; ++r) out.row_tokens[r].push_back(own[r].item<int64_t>());
        out.tokens.push_back(next);
        out.margins.push_back(margin_of(combined));
        std::fill(feed.begin(), feed.end(), next);
    }
    return out;
}

}  // namespace hs
