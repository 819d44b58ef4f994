// The KV-cache comparison's driver (kv_policy.h): every listed policy's configurations, decoded and
// measured; the policies themselves are kv_<name>.cpp, listed in kv_registry.cpp.
#include "kv_policy.h"

#include "errors.h"
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

int64_t KvCompareSpec::compress_at(const Trial& t) const {
    const int64_t P = static_cast<int64_t>(t.prompt.size());
    if (question_tokens.empty()) return P;
    const int64_t q = question_tokens.at(static_cast<size_t>(t.needle));
    return std::max<int64_t>(1, P - q);
}

namespace {

// Every (policy, budget) configuration and its controls ([P, B] indices in *main_out, [P, B, R] in
// *rnd_out, -1 where none).
std::vector<KvConfig> make_configs(const KvContext& ctx, std::vector<int64_t>* main_out, std::vector<int64_t>* rnd_out) {
    const KvCompareSpec& spec = ctx.spec;
    const int64_t Pn = static_cast<int64_t>(spec.policies.size()), Bn = static_cast<int64_t>(spec.budgets.size()), R = spec.random_orders;
    std::vector<KvConfig> configs;
    std::vector<int64_t>& main_idx = *main_out;
    std::vector<int64_t>& rnd_idx = *rnd_out;
    main_idx.assign(static_cast<size_t>(Pn * Bn), -1), rnd_idx.assign(static_cast<size_t>(Pn * Bn * R), -1);
    for (int64_t pi = 0; pi < Pn; ++pi) {
        const auto& p = spec.policies[static_cast<size_t>(pi)];
        for (int64_t bi = 0; bi < Bn; ++bi) {
            const double budget = spec.budgets[static_cast<size_t>(bi)];
            main_idx[static_cast<size_t>(pi * Bn + bi)] = static_cast<int64_t>(configs.size());
            configs.push_back(p.policy->config(p, budget, ctx));
            auto controls = p.policy->controls(p, budget, ctx);
            HS_REQUIRE(controls.empty() || static_cast<int64_t>(controls.size()) == R, "KvPolicy::controls: one a random order");
            for (size_t r = 0; r < controls.size(); ++r) {
                rnd_idx[static_cast<size_t>((pi * Bn + bi) * R) + r] = static_cast<int64_t>(configs.size());
                configs.push_back(std::move(controls[r]));
            }
        }
    }
    return configs;
}

// The listed policies' scores: [L, H] where the policy reads one, and what the policy asks of it.
void check_scores(const KvCompareSpec& spec, const KvShape& sh) {
    for (const auto& p : spec.policies) {
        HS_REQUIRE(p.policy, "run_kv_compare: a policy without its registry row");
        const bool scored = p.policy->score_from() != KvScoreFrom::kNone;
        if (scored && (!p.score.defined() || p.score.dim() != 2 || p.score.size(0) != sh.L || p.score.size(1) != sh.H))
            throw UsageError(fmt::format("{}: the score{} is not [{}, {}]", p.name, p.source.empty() ? "" : " " + p.source, sh.L, sh.H),
                             "kv_compare");
        p.policy->check_score(p, spec);
    }
}

// The parameters the file keeps: every policy's settings, where the scores came from, the controls.
Attrs compare_attrs(const KvCompareSpec& s, const KvCompare& k) {
    Attrs a;
    for (const KvPolicy* p : kv_policies())
        for (auto& kv : p->attrs(s)) a.insert(kv);
    std::string sources;
    for (const auto& p : s.policies)
        if (!p.source.empty()) sources += (sources.empty() ? "" : "; ") + p.name + ": " + p.source;
    a.insert({"score_sources", sources});
    a.insert({"random_orders", s.random_orders});
    a.insert({"compress_at", std::string(s.compress_at_name())});
    a.insert({"random_order_seeds", fmt::format("seed + 3 + r (seed {}), heads.h random_subset over the L x K KV groups", s.seed)});
    a.insert({"full_bytes", k.full_bytes});
    a.insert({"trials", k.trials});
    return a;
}

struct Measured {
    float acc, rl, frac, same;
    double bytes;
};

// The measures of [P, B] configurations and their controls into `out` (NaN where no control).
void measure_all(const std::vector<KvConfig>& configs, const std::vector<int64_t>& main_idx, const std::vector<int64_t>& rnd_idx,
                 const std::function<Measured(int64_t)>& measure, int64_t R, KvCompare* out) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const int64_t PB = static_cast<int64_t>(main_idx.size());
    out->random_accuracy.assign(static_cast<size_t>(PB * R), nan);
    out->random_rougeL_f = out->random_accuracy, out->random_kv_fraction = out->random_accuracy;
    out->random_same_as_full = out->random_accuracy;
    for (int64_t i = 0; i < PB; ++i) {
        const int64_t c = main_idx[static_cast<size_t>(i)];
        const auto mm = measure(c);
        out->accuracy.push_back(mm.acc), out->rougeL_f.push_back(mm.rl), out->kv_fraction.push_back(mm.frac), out->kv_bytes.push_back(mm.bytes);
        out->same_as_full.push_back(mm.same);
        out->full_groups.push_back(configs[static_cast<size_t>(c)].full_groups);
        for (int64_t r = 0; r < R; ++r) {
            const int64_t rc = rnd_idx[static_cast<size_t>(i * R + r)];
            if (rc < 0) continue;
            const auto rm = measure(rc);
            out->random_accuracy[static_cast<size_t>(i * R + r)] = rm.acc;
            out->random_rougeL_f[static_cast<size_t>(i * R + r)] = rm.rl;
            out->random_kv_fraction[static_cast<size_t>(i * R + r)] = rm.frac;
            out->random_same_as_full[static_cast<size_t>(i * R + r)] = rm.same;
        }
    }
}

}  // namespace

KvCompare run_kv_compare(const NeedleTest& test, const Model& m, const KvCompareSpec& spec) {
    const auto& cfg = m.config;
    const KvShape sh{cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.n_heads / cfg.n_kv_heads, int64_t{cfg.n_layers} * cfg.n_kv_heads};
    const auto& trials = test.ablation_trials();
    const int64_t N = static_cast<int64_t>(trials.size()), Pn = static_cast<int64_t>(spec.policies.size());
    const int64_t Bn = static_cast<int64_t>(spec.budgets.size()), R = spec.random_orders;
    HS_REQUIRE(N > 0 && Pn > 0 && Bn > 0, "run_kv_compare: no trial, policy or budget");
    check_scores(spec, sh);
    bool need_snap = false;
    for (const auto& p : spec.policies) need_snap |= p.policy->needs_snapkv();
    KvCompare out;
    out.budgets = spec.budgets;
    out.trials = N, out.random_orders = R;
    for (const auto& p : spec.policies) out.policies.push_back(p.name);

    // SnapKV's pooled scores, one whole prefill per trial, shared by every policy that reads them.
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
    const KvContext ctx{spec, sh, trials, pooled};
    std::vector<KvConfig> configs = make_configs(ctx, &main_idx, &rnd_idx);
    // The full cache's decode (what same_as_full compares with), then every configuration; identical
    // configurations decode once.
    {
        KvConfig full;
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
    measure_all(configs, main_idx, rnd_idx, measure, R, &out);
    out.attrs = compare_attrs(spec, out);
    return out;
}

schema::KvCompareRecord KvCompare::stored(double baseline_accuracy) const {
    schema::KvCompareRecord rec;
    rec.P = static_cast<int64_t>(policies.size()), rec.B = static_cast<int64_t>(budgets.size()), rec.R = random_orders;
    rec.policies = policies;
    rec.budgets.assign(budgets.begin(), budgets.end());
    rec.accuracy = accuracy, rec.rougeL_f = rougeL_f, rec.kv_fraction = kv_fraction, rec.same_as_full = same_as_full;
    rec.random_same_as_full = random_same_as_full;
    for (double b : kv_bytes) rec.kv_bytes.push_back(std::llround(b));
    rec.full_groups = full_groups;
    rec.random_accuracy = random_accuracy, rec.random_rougeL_f = random_rougeL_f, rec.random_kv_fraction = random_kv_fraction;
    rec.attrs = attrs;
    rec.attrs["baseline_accuracy"] = baseline_accuracy;
    return rec;
}

}  // namespace hs
