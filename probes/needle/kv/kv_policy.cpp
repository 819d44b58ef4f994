// KV-cache head policies compared at equal memory (kv_policy.h).
#include "kv_policy.h"

#include "errors.h"
#include "heads.h"
#include "model.h"
#include "progress.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>

namespace hs {

using torch::indexing::Slice;

const char* kv_policy_name(KvPolicy p) {
    switch (p) {
        case KvPolicy::kFull: return "full";
        case KvPolicy::kSnapKV: return "snapkv";
        case KvPolicy::kHeadKV: return "headkv";
        case KvPolicy::kDuo: return "duo";
        case KvPolicy::kRazor: return "razor";
        case KvPolicy::kStream: return "stream";
    }
    return "?";
}

at::Tensor snapkv_scores(const Model& m, const std::vector<int64_t>& prompt, const SnapKVSettings& s, int64_t chunk) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    const int64_t P = static_cast<int64_t>(prompt.size()), w = s.window, n = std::max<int64_t>(0, P - w);
    auto out = torch::zeros({cfg.n_layers, cfg.n_heads, n}, torch::kFloat);
    if (n == 0) return out;
    auto ids = torch::tensor(prompt, torch::kLong).view({1, P}).to(m.options.device);
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    KVCache cache;
    chunk = std::max<int64_t>(1, chunk);
    for (int64_t p0 = 0; p0 < n; p0 += chunk) m.forward(ids.index({Slice(), Slice(p0, std::min(n, p0 + chunk))}), nullptr, &cache, no_logits);
    // The window's queries against every key: [1, H, w, P] (snapkv_utils.py:393-405: softmax over all
    // P keys, causal inside the window, then the prefix columns averaged over the window's queries).
    Hooks h;
    h.capture(Point::kAttnPattern, [&](int l, const at::Tensor& a) {
        auto mean = a[0].narrow(2, 0, n).to(torch::kFloat).mean(1);  // [H, n]
        // max_pool1d(kernel, stride 1, padding kernel / 2): -inf padding, the length kept (odd kernel).
        out[l] = torch::max_pool1d(mean.unsqueeze(1), {s.kernel}, {1}, {s.kernel / 2}).squeeze(1).to(torch::kCPU);
    });
    m.forward(ids.index({Slice(), Slice(n, P)}), &h, &cache, no_logits);
    return out;
}

at::Tensor snapkv_keep(const at::Tensor& pooled, const std::vector<int64_t>& caps, int64_t P, int64_t w) {
    const int64_t H = pooled.size(0), n = pooled.size(1);
    HS_REQUIRE(static_cast<int64_t>(caps.size()) == H && n == std::max<int64_t>(0, P - w), "snapkv_keep: shapes");
    auto keep = torch::zeros({H, P}, torch::kBool);
    keep.narrow(1, n, P - n).fill_(true);
    if (n == 0) return keep;
    // Descending score; a stable sort puts the earlier of tied positions first.
    auto order = std::get<1>(pooled.to(torch::kCPU).sort(/*stable=*/true, /*dim=*/1, /*descending=*/true));
    for (int64_t h = 0; h < H; ++h) {
        const int64_t c = std::clamp<int64_t>(caps[static_cast<size_t>(h)], 0, n);
        if (c > 0) keep[h].index_fill_(0, order[h].narrow(0, 0, c), true);
    }
    return keep;
}

at::Tensor headkv_caps(const at::Tensor& scores, int64_t base, int64_t window, double beta, double temp) {
    auto s = torch::nan_to_num(scores.to(torch::kCPU, torch::kDouble), 0.0);
    if ((s < 0).any().item<bool>()) throw UsageError("headkv: the importance score has negative entries", "kv_score");
    const double sum = s.sum().item<double>();
    if (!(sum > 0)) throw UsageError("headkv: the importance score is 0 everywhere", "kv_score");
    s = s / sum;
    s = torch::pow(s, temp);
    s = s / s.sum();
    const double Bp = static_cast<double>(base - window);
    if (Bp <= 0) return torch::zeros_like(s, torch::kLong);
    const double p = std::floor(Bp / beta);  // Python's float //
    const double pool = p * static_cast<double>(s.numel()), m = Bp - p;
    auto caps = torch::empty_like(s, torch::kLong);
    auto sa = s.accessor<double, 2>();
    auto ca = caps.accessor<int64_t, 2>();
    for (int64_t l = 0; l < s.size(0); ++l)
        for (int64_t h = 0; h < s.size(1); ++h) ca[l][h] = static_cast<int64_t>(std::nearbyint(sa[l][h] * pool + m));  // half to even
    return caps;
}

int64_t KvCompareSpec::compress_at(const Trial& t) const {
    const int64_t P = static_cast<int64_t>(t.prompt.size());
    if (question_tokens.empty()) return P;
    const int64_t q = question_tokens.at(static_cast<size_t>(t.needle));
    return std::max<int64_t>(1, P - q);
}

at::Tensor razor_keep_mask(const at::Tensor& full, int64_t P, int64_t sink, int64_t recent, bool compensate) {
    auto f = full.to(torch::kCPU).to(torch::kBool);
    auto k = torch::ones({f.size(0), f.size(1), P}, torch::kBool);
    if (P <= sink + recent + (compensate ? 1 : 0)) return k;  // _compress: T <= local_capacity stays whole
    // The compressed heads drop [sink, P - recent).
    k.narrow(2, sink, P - recent - sink).copy_(f.unsqueeze(2).expand({f.size(0), f.size(1), P - recent - sink}));
    return k;
}

namespace {

// One configuration to decode: a head set and its measured cache.
struct Config {
    HeadSet set;
    std::string key;            // identical configurations decode once
    std::vector<double> frac;   // per trial: prompt cache kept / (L K P)
    int64_t full_groups = -1;
};

struct Shape {
    int64_t L, H, K, g, M;
};

// The entries a streaming (or compressed) KV group holds of a P-token prompt.
int64_t stream_entries(KvPolicy kind, const KvCompareSpec& s, int64_t P) {
    if (kind == KvPolicy::kRazor) {
        const int64_t cap = s.razor_sink + s.razor_recent + (s.razor_compensate ? 1 : 0);
        return P > cap ? cap : P;  // _compress leaves T <= local_capacity whole
    }
    return std::min(P, s.duo_sink + s.duo_recent);
}

// KV groups ranked best first by the max of `score` over each group's query heads (NaN last).
std::vector<int64_t> group_order(const at::Tensor& score, const Shape& sh) {
    auto gs = score.to(torch::kCPU, torch::kDouble).reshape({sh.L, sh.K, sh.g});
    gs = torch::where(torch::isnan(gs), torch::full_like(gs, -std::numeric_limits<double>::infinity()), gs).amax(2);
    auto order = rank_heads(gs, true);  // flat l * K + k
    return order;
}

// The order policy's configuration keeping the first n groups of `order` whole.
Config order_config(KvPolicy kind, const std::vector<int64_t>& order, int64_t n, const Shape& sh, const KvCompareSpec& s,
                    const std::vector<Trial>& trials) {
    Config c;
    c.full_groups = n;
    std::vector<char> full(static_cast<size_t>(sh.M), 0);
    for (int64_t i = 0; i < n; ++i) full[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
    std::vector<Head> streamed;
    for (int64_t grp = 0; grp < sh.M; ++grp)
        if (!full[static_cast<size_t>(grp)])
            for (int64_t j = 0; j < sh.g; ++j)
                streamed.push_back({static_cast<int>(grp / sh.K), static_cast<int>((grp % sh.K) * sh.g + j)});
    c.key = std::string(kv_policy_name(kind == KvPolicy::kStream ? KvPolicy::kDuo : kind));
    for (const auto& hd : streamed) c.key += fmt::format(" {}.{}", hd.first, hd.second);
    for (const auto& t : trials) {
        const int64_t P = s.compress_at(t);
        const double e = static_cast<double>(n * P + (sh.M - n) * stream_entries(kind, s, P));
        c.frac.push_back(e / static_cast<double>(sh.M * P));
    }
    if (streamed.empty()) return c;  // every group whole: the full model
    c.set.kv_from = [s](const Trial& t) { return s.compress_at(t); };
    if (kind == KvPolicy::kRazor) {
        auto mask = torch::ones({sh.L, sh.H}, torch::kBool);
        for (const auto& hd : streamed) mask[hd.first][hd.second] = false;
        c.set.keep = [mask, s](const Trial& t) {
            return razor_keep_mask(mask, s.compress_at(t), s.razor_sink, s.razor_recent, s.razor_compensate);
        };
        c.set.keep_compensate = s.razor_compensate;
        c.key += fmt::format(" razor {} {} {}", s.razor_sink, s.razor_recent, s.razor_compensate);
    } else {
        c.set.heads = streamed;
        c.set.mode = Intervention::kStream;
        // The cache holds sink + recent keys; the query sees them and itself (duo_attn/patch/llama.py:234-290).
        c.set.window = StreamWindow{s.duo_sink, s.duo_recent + 1, false, 0};
        c.set.window_after_prompt = true;
        c.key += fmt::format(" duo {} {}", s.duo_sink, s.duo_recent);
    }
    return c;
}

// The most groups kept whole whose mean measured cache stays within the budget (0 when even none does).
int64_t groups_within(KvPolicy kind, double budget, const Shape& sh, const KvCompareSpec& s, const std::vector<Trial>& trials) {
    int64_t best = 0;
    for (int64_t n = 0; n <= sh.M; ++n) {
        double f = 0;
        for (const auto& t : trials) {
            const int64_t P = s.compress_at(t);
            f += static_cast<double>(n * P + (sh.M - n) * stream_entries(kind, s, P)) / static_cast<double>(sh.M * P);
        }
        if (f / static_cast<double>(trials.size()) <= budget + 1e-12) best = n;
    }
    return best;
}

// snapkv / headkv at one budget: per trial, capacity B = round(budget P K / H) per query head.
Config snap_config(const KvPolicySpec& p, double budget, const Shape& sh, const KvCompareSpec& s, const std::vector<Trial>& trials,
                   std::shared_ptr<const std::map<const Trial*, at::Tensor>> pooled) {
    Config c;
    c.key = fmt::format("{} {}", p.name, budget);
    const int64_t w = s.snap.window;
    auto caps_for = [p, budget, sh, s, w](int64_t P) -> at::Tensor {  // [L, H] prefix caps; undefined: no compression
        const int64_t B = std::llround(budget * static_cast<double>(P * sh.K) / static_cast<double>(sh.H));
        if (B >= P) return {};  // the references leave a prompt shorter than the budget whole
        if (p.kind == KvPolicy::kSnapKV) return torch::full({sh.L, sh.H}, std::max<int64_t>(0, B - w), torch::kLong);
        return headkv_caps(p.score, B, w, s.headkv_beta, s.headkv_temp);
    };
    for (const auto& t : trials) {
        const int64_t P = s.compress_at(t);
        const auto caps = caps_for(P);
        if (!caps.defined()) {
            c.frac.push_back(1.0);
            continue;
        }
        const double kept = (caps.clamp(0, std::max<int64_t>(0, P - w)) + std::min(w, P)).sum().item<double>();
        c.frac.push_back(kept / static_cast<double>(sh.L * sh.K * P));
    }
    c.set.kv_from = [s](const Trial& t) { return s.compress_at(t); };
    c.set.keep = [caps_for, pooled, w, s](const Trial& t) {
        const int64_t P = s.compress_at(t);
        const at::Tensor& sc = pooled->at(&t);  // [L, H, P - w]
        auto caps = caps_for(P);
        if (!caps.defined()) return torch::ones({sc.size(0), sc.size(1), P}, torch::kBool);
        std::vector<at::Tensor> layers;
        for (int64_t l = 0; l < sc.size(0); ++l) {
            auto cl = caps[l].contiguous();
            std::vector<int64_t> cv(cl.data_ptr<int64_t>(), cl.data_ptr<int64_t>() + cl.numel());
            layers.push_back(snapkv_keep(sc[l], cv, P, w));
        }
        return torch::stack(layers);
    };
    return c;
}

// Every (policy, budget) configuration and the random orders' ([P, B] indices in *main_out, [P, B, R]
// in *rnd_out, -1 where none).
std::vector<Config> make_configs(const KvCompareSpec& spec, const Shape& sh, const std::vector<Trial>& trials,
                                 const std::shared_ptr<const std::map<const Trial*, at::Tensor>>& pooled,
                                 std::vector<int64_t>* main_out, std::vector<int64_t>* rnd_out) {
    const int64_t Pn = static_cast<int64_t>(spec.policies.size()), Bn = static_cast<int64_t>(spec.budgets.size()), R = spec.random_orders;
    std::vector<Config> configs;
    std::vector<int64_t>& main_idx = *main_out;
    std::vector<int64_t>& rnd_idx = *rnd_out;
    main_idx.assign(static_cast<size_t>(Pn * Bn), -1), rnd_idx.assign(static_cast<size_t>(Pn * Bn * R), -1);
    std::vector<int64_t> all_groups(static_cast<size_t>(sh.M));
    for (int64_t i = 0; i < sh.M; ++i) all_groups[static_cast<size_t>(i)] = i;
    for (int64_t pi = 0; pi < Pn; ++pi) {
        const auto& p = spec.policies[static_cast<size_t>(pi)];
        const bool ordered = p.kind == KvPolicy::kDuo || p.kind == KvPolicy::kRazor || p.kind == KvPolicy::kStream;
        const auto order = ordered ? group_order(p.score, sh) : std::vector<int64_t>{};
        for (int64_t bi = 0; bi < Bn; ++bi) {
            const double budget = spec.budgets[static_cast<size_t>(bi)];
            main_idx[static_cast<size_t>(pi * Bn + bi)] = static_cast<int64_t>(configs.size());
            if (p.kind == KvPolicy::kFull) {
                Config c;
                c.key = "full";
                c.frac.assign(trials.size(), 1.0);
                configs.push_back(std::move(c));
            } else if (!ordered) {
                configs.push_back(snap_config(p, budget, sh, spec, trials, pooled));
            } else {
                const int64_t n = groups_within(p.kind, budget, sh, spec, trials);
                configs.push_back(order_config(p.kind, order, n, sh, spec, trials));
                for (int64_t r = 0; r < R; ++r) {
                    rnd_idx[static_cast<size_t>((pi * Bn + bi) * R + r)] = static_cast<int64_t>(configs.size());
                    configs.push_back(order_config(p.kind, random_subset(all_groups, sh.M, spec.seed + 3 + static_cast<uint64_t>(r)), n,
                                                   sh, spec, trials));
                }
            }
        }
    }
    return configs;
}

}  // namespace

KvCompare run_kv_compare(const NeedleTest& test, const Model& m, const KvCompareSpec& spec) {
    const auto& cfg = m.config;
    Shape sh{cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.n_heads / cfg.n_kv_heads, int64_t{cfg.n_layers} * cfg.n_kv_heads};
    const auto& trials = test.ablation_trials();
    const int64_t N = static_cast<int64_t>(trials.size()), Pn = static_cast<int64_t>(spec.policies.size());
    const int64_t Bn = static_cast<int64_t>(spec.budgets.size()), R = spec.random_orders;
    HS_REQUIRE(N > 0 && Pn > 0 && Bn > 0, "run_kv_compare: no trial, policy or budget");
    bool need_snap = false;
    for (const auto& p : spec.policies) {
        need_snap |= p.kind == KvPolicy::kSnapKV || p.kind == KvPolicy::kHeadKV;
        const bool scored = p.kind != KvPolicy::kFull && p.kind != KvPolicy::kSnapKV;
        if (scored && (!p.score.defined() || p.score.dim() != 2 || p.score.size(0) != sh.L || p.score.size(1) != sh.H))
            throw UsageError(fmt::format("{}: the score{} is not [{}, {}]", p.name, p.source.empty() ? "" : " " + p.source, sh.L, sh.H),
                             "kv_compare");
        if (p.kind == KvPolicy::kHeadKV) headkv_caps(p.score, 2 * spec.snap.window + 2, spec.snap.window, spec.headkv_beta, spec.headkv_temp);
    }
    KvCompare out;
    out.budgets = spec.budgets;
    for (const auto& p : spec.policies) out.policies.push_back(p.name);

    // SnapKV's pooled scores, one whole prefill per trial, shared by every snapkv / headkv configuration.
    auto pooled = std::make_shared<std::map<const Trial*, at::Tensor>>();
    if (need_snap) {
        Progress prog("SnapKV observation-window scores", N);
        for (const auto& t : trials) {
            const std::vector<int64_t> head(t.prompt.begin(), t.prompt.begin() + spec.compress_at(t));
            (*pooled)[&t] = snapkv_scores(m, head, spec.snap, test.config().decode.prefill_chunk);
            prog.tick();
        }
        prog.finish();
        out.score_passes = N;
    }

    // Configurations: [P, B] main, [P, B, R] random controls (order policies).
    std::vector<int64_t> main_idx, rnd_idx;
    std::vector<Config> configs = make_configs(spec, sh, trials, pooled, &main_idx, &rnd_idx);
    // The full cache's decode (what same_as_full compares with), then every configuration; identical
    // configurations decode once.
    {
        Config full;
        full.key = "full";
        full.frac.assign(static_cast<size_t>(N), 1.0);
        configs.push_back(std::move(full));
    }
    const size_t full_config = configs.size() - 1;
    std::map<std::string, size_t> index;
    std::vector<HeadSet> sets;
    std::vector<size_t> set_of(configs.size());
    for (size_t c = 0; c < configs.size(); ++c) {
        auto [it, fresh] = index.emplace(configs[c].key, sets.size());
        if (fresh) sets.push_back(configs[c].set);
        set_of[c] = it->second;
    }
    out.distinct_sets = static_cast<int64_t>(sets.size());
    Progress prog("KV policy trials", static_cast<int64_t>(sets.size()) * N);
    // Compressed at the prompt's end, every policy acts past the prefill: the trials' unablated prefills
    // are shared (scope decode). Compressed before the question, the prefill carries the policies.
    const AblationScope scope = spec.question_tokens.empty() ? AblationScope::kDecode : AblationScope::kAll;
    const auto res = test.run_ablated_sets(sets, spec.sweep_rows, [&prog] { prog.tick(); }, scope);
    prog.finish();

    const double elem = static_cast<double>(c10::elementSize(m.options.dtype));
    double full_bytes = 0;
    for (const auto& t : trials) full_bytes += 2.0 * static_cast<double>(cfg.d_head) * elem * static_cast<double>(sh.L * sh.K) * static_cast<double>(spec.compress_at(t));
    out.full_bytes = full_bytes / static_cast<double>(N);
    struct Measured {
        float acc, rl, frac, same;
        double bytes;
    };
    const auto& full_res = res[set_of[full_config]];
    auto measure = [&](int64_t c) {
        const auto& rs = res[set_of[static_cast<size_t>(c)]];
        const auto& cf = configs[static_cast<size_t>(c)];
        double acc = 0, rl = 0, fr = 0, by = 0, same = 0;
        for (int64_t i = 0; i < N; ++i) {
            acc += rs[static_cast<size_t>(i)].passed, rl += rs[static_cast<size_t>(i)].rougeL_f;
            same += rs[static_cast<size_t>(i)].generated == full_res[static_cast<size_t>(i)].generated;
            const double f = cf.frac[static_cast<size_t>(i)];
            fr += f;
            by += f * 2.0 * static_cast<double>(cfg.d_head) * elem * static_cast<double>(sh.L * sh.K) *
                  static_cast<double>(spec.compress_at(trials[static_cast<size_t>(i)]));
        }
        const double n = static_cast<double>(N);
        return Measured{static_cast<float>(acc / n), static_cast<float>(rl / n), static_cast<float>(fr / n),
                        static_cast<float>(same / n), by / n};
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    out.random_accuracy.assign(static_cast<size_t>(Pn * Bn * R), nan);
    out.random_rougeL_f = out.random_accuracy, out.random_kv_fraction = out.random_accuracy;
    out.random_same_as_full = out.random_accuracy;
    for (int64_t i = 0; i < Pn * Bn; ++i) {
        const int64_t c = main_idx[static_cast<size_t>(i)];
        const auto mm = measure(c);
        out.accuracy.push_back(mm.acc), out.rougeL_f.push_back(mm.rl), out.kv_fraction.push_back(mm.frac), out.kv_bytes.push_back(mm.bytes);
        out.same_as_full.push_back(mm.same);
        out.full_groups.push_back(configs[static_cast<size_t>(c)].full_groups);
        for (int64_t r = 0; r < R; ++r) {
            const int64_t rc = rnd_idx[static_cast<size_t>(i * R + r)];
            if (rc < 0) continue;
            const auto rm = measure(rc);
            out.random_accuracy[static_cast<size_t>(i * R + r)] = rm.acc;
            out.random_rougeL_f[static_cast<size_t>(i * R + r)] = rm.rl;
            out.random_kv_fraction[static_cast<size_t>(i * R + r)] = rm.frac;
            out.random_same_as_full[static_cast<size_t>(i * R + r)] = rm.same;
        }
    }
    return out;
}

}  // namespace hs
