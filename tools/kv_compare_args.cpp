// `retrieval --kv-compare` (kv_compare_args.h).
#include "kv_compare_args.h"

#include "common.h"
#include "errors.h"
#include "heads.h"
#include "model.h"
#include "progress.h"
#include "razor.h"
#include "schema.h"
#include "store.h"
#include "tokenizer.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace hs::cli {

void add_kv_compare_args(CLI::App* sub, KvCompareArgs& a) {
    sub->add_option("--kv-compare", a.policies,
                    "after the scan: KV-cache policies compared at equal memory on the ablation trials, comma-separated: "
                    "full, snapkv, headkv, duo, razor, stream:SCORE (SCORE: locos, retrieval, r2 or FILE.h5:DATASET); "
                    "writes /retrieval/kv_compare (docs/methods.md, \"KV-cache policies\")");
    sub->add_option("--kv-budgets", a.budgets, "kv compare: budgets as fractions of the full prompt cache, in (0, 1]")
        ->capture_default_str();
    sub->add_option("--kv-score", a.score, "kv compare: headkv's importance: r2, retrieval, locos (this run) or FILE.h5:DATASET")
        ->capture_default_str();
    sub->add_option("--duo-gates", a.duo_gates,
                    "kv compare: duo's gates, FILE.h5:DATASET [L, H] (e.g. a duo-gates study's /ablation/<study>/duo/alpha)");
    sub->add_option("--duo-window", a.duo_window, "kv compare: SINK,RECENT cached keys of duo's and stream's streaming heads")
        ->capture_default_str();
    sub->add_option("--razor-window", a.razor_window, "kv compare: SINK,RECENT keys razor's compressed heads keep (+ 1 mean token)")
        ->capture_default_str();
    sub->add_flag("--razor-no-compensate", a.razor_no_compensate, "kv compare: razor's heads drop the rest without the mean token");
    sub->add_option("--snapkv-window", a.snap_window, "kv compare: SnapKV's observation window (kept whole)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--snapkv-kernel", a.snap_kernel, "kv compare: SnapKV's max-pool kernel (odd)")->capture_default_str()->check(at_least(1));
    sub->add_option("--headkv-beta", a.beta, "kv compare: HeadKV's beta (share of the budget given by score)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--headkv-temp", a.temp, "kv compare: HeadKV's temperature on the normalised scores")->capture_default_str();
    sub->add_option("--kv-compress-at", a.compress_at,
                    "kv compare: prompt (the references: the whole prompt prefilled, then compressed) or question (the "
                    "context compressed before the question's tokens, which decode through it: query-agnostic)")
        ->capture_default_str()
        ->check(CLI::IsMember({"prompt", "question"}));
}

namespace {

std::pair<int64_t, int64_t> parse_window(const std::string& flag, const std::string& text) {
    const auto parts = split(text, ',');
    auto num = [&](const std::string& s) -> int64_t {
        const auto v = parse_double(trim(s));
        if (!v || *v < 0 || *v != std::floor(*v)) throw UsageError(fmt::format("{}: '{}' is not SINK,RECENT (whole numbers >= 0)", flag, text));
        return static_cast<int64_t>(*v);
    };
    if (parts.size() != 2) throw UsageError(fmt::format("{}: '{}' is not SINK,RECENT", flag, text));
    const auto w = std::make_pair(num(parts[0]), num(parts[1]));
    if (w.second < 1) throw UsageError(fmt::format("{}: recent {} must be at least 1", flag, w.second));
    return w;
}

std::vector<double> parse_budgets(const std::string& text) {
    std::vector<double> out;
    for (const auto& part : split(text, ',')) {
        const auto p = trim(part);
        if (p.empty()) continue;
        const auto v = parse_double(p);
        if (!v) throw UsageError(fmt::format("--kv-budgets: '{}' is not a number", p));
        if (*v > 1) throw UsageError(fmt::format("--kv-budgets: {} is above the full cache (budgets are fractions of it, at most 1)", p));
        if (!(*v > 0)) throw UsageError(fmt::format("--kv-budgets: {} is not above 0", p));
        out.push_back(*v);
    }
    if (out.empty()) throw UsageError("--kv-budgets: no budget given");
    return out;
}

// A score named on the command line: this run's (returned in *from_run, the tensor undefined) or a file's.
at::Tensor score_named(const std::string& flag, const std::string& name, const RunScores& run, int L, int H, std::string* from_run,
                       std::string* source) {
    if (name == "locos" || name == "retrieval" || name == "r2") {
        if (!(name == "locos" ? run.locos : name == "r2" ? run.r2 : run.ret))
            throw UsageError(fmt::format("{} {}: this run does not compute it (see --score)", flag, name));
        *from_run = name, *source = "this run: scores/" + name + "/score";
        return {};
    }
    *source = name;
    return with_flag(flag.c_str(), [&] { return read_head_score(split_head_score_ref(name), L, H); });
}

}  // namespace

KvComparePlan plan_kv_compare(const KvCompareArgs& a, const Model& m, const RunScores& run, int64_t random_orders,
                              int64_t sweep_rows, uint64_t seed, const std::string& razor_preset) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    KvComparePlan plan;
    auto& s = plan.spec;
    s.budgets = parse_budgets(a.budgets);
    std::tie(s.duo_sink, s.duo_recent) = parse_window("--duo-window", a.duo_window);
    std::tie(s.razor_sink, s.razor_recent) = parse_window("--razor-window", a.razor_window);
    s.razor_compensate = !a.razor_no_compensate;
    if (a.snap_kernel % 2 == 0) throw UsageError(fmt::format("--snapkv-kernel: {} is even (the pooled length must stay)", a.snap_kernel));
    s.snap.window = a.snap_window, s.snap.kernel = a.snap_kernel;
    s.headkv_beta = a.beta, s.headkv_temp = a.temp;
    if (!(a.temp > 0)) throw UsageError(fmt::format("--headkv-temp: {} is not above 0", a.temp));
    s.random_orders = random_orders, s.sweep_rows = sweep_rows, s.seed = seed;
    for (const auto& part : split(a.policies, ',')) {
        const std::string name = trim(part);
        if (name.empty()) continue;
        KvPolicySpec p;
        p.name = name;
        std::string from_run;
        if (name == "full") {
            p.kind = KvPolicy::kFull;
        } else if (name == "snapkv") {
            p.kind = KvPolicy::kSnapKV;
        } else if (name == "headkv") {
            p.kind = KvPolicy::kHeadKV;
            if (a.score == "locos")
                throw UsageError("--kv-score locos: HeadKV's allocation needs a non-negative importance and LOCOS is signed "
                                 "(use r2, retrieval or a FILE.h5:DATASET)");
            p.score = score_named("--kv-score", a.score, run, L, H, &from_run, &p.source);
        } else if (name == "duo") {
            p.kind = KvPolicy::kDuo;
            if (a.duo_gates.empty()) throw UsageError("--kv-compare duo: needs --duo-gates FILE.h5:DATASET (a duo-gates study's alpha)");
            p.source = a.duo_gates;
            p.score = with_flag("--duo-gates", [&] { return read_head_score(split_head_score_ref(a.duo_gates), L, H); });
        } else if (name == "razor") {
            p.kind = KvPolicy::kRazor;
            const RazorPreset preset = with_flag("--razor-preset", [&] { return parse_razor_preset(razor_preset); });
            p.source = fmt::format("razor, preset {} (echo and induction scores on repeated random tokens, max over each KV group)",
                                   razor_preset_name(preset));
            p.score = razor_preset_score(m, RazorSettings{}, preset);
        } else if (name.rfind("stream:", 0) == 0 && name.size() > 7) {
            p.kind = KvPolicy::kStream;
            p.score = score_named("--kv-compare " + name, name.substr(7), run, L, H, &from_run, &p.source);
        } else {
            throw UsageError(fmt::format("--kv-compare: unknown policy '{}' (valid: full, snapkv, headkv, duo, razor, stream:SCORE)", name));
        }
        for (const auto& q : s.policies)
            if (q.name == name) throw UsageError(fmt::format("--kv-compare: '{}' listed twice", name));
        s.policies.push_back(std::move(p));
        plan.run_scores.push_back(from_run);
    }
    if (s.policies.empty()) throw UsageError("--kv-compare: no policy named");
    return plan;
}

void run_kv_compare_args(KvComparePlan plan, const NeedleTest& test, const Model& m, const Tokenizer& tok,
                         const NeedleSummary& sum, const std::string& out, const KvCompareArgs& a) {
    auto& s = plan.spec;
    if (a.compress_at == "question")  // the question's tokens: the ablation template's suffix, encoded alone
        for (const auto& nd : test.needles())
            s.question_tokens.push_back(
                static_cast<int64_t>(tok.encode(test.config().ablation_tmpl.suffix(nd.question), false).size()));
    for (size_t i = 0; i < s.policies.size(); ++i) {
        const auto& r = plan.run_scores[i];
        if (!r.empty()) s.policies[i].score = r == "locos" ? sum.locos : r == "r2" ? sum.r2 : sum.ret;
    }
    const KvCompare k = with_flag({{"--kv-score", "kv_score"}, {"--kv-compare", "kv_compare"}}, [&] { return run_kv_compare(test, m, s); });
    schema::KvCompareRecord rec;
    rec.P = static_cast<int64_t>(k.policies.size()), rec.B = static_cast<int64_t>(k.budgets.size()), rec.R = s.random_orders;
    rec.policies = k.policies;
    rec.budgets.assign(k.budgets.begin(), k.budgets.end());
    rec.accuracy = k.accuracy, rec.rougeL_f = k.rougeL_f, rec.kv_fraction = k.kv_fraction, rec.same_as_full = k.same_as_full;
    rec.random_same_as_full = k.random_same_as_full;
    for (double b : k.kv_bytes) rec.kv_bytes.push_back(std::llround(b));
    rec.full_groups = k.full_groups;
    rec.random_accuracy = k.random_accuracy, rec.random_rougeL_f = k.random_rougeL_f, rec.random_kv_fraction = k.random_kv_fraction;
    std::string sources;
    for (const auto& p : s.policies)
        if (!p.source.empty()) sources += (sources.empty() ? "" : "; ") + p.name + ": " + p.source;
    rec.attrs = {{"score_sources", sources},
                 {"snapkv_window", s.snap.window},
                 {"snapkv_kernel", s.snap.kernel},
                 {"headkv_beta", s.headkv_beta},
                 {"headkv_temp", s.headkv_temp},
                 {"duo_sink", s.duo_sink},
                 {"duo_recent", s.duo_recent},
                 {"razor_sink", s.razor_sink},
                 {"razor_recent", s.razor_recent},
                 {"razor_compensate", std::string(s.razor_compensate ? "true" : "false")},
                 {"random_orders", s.random_orders},
                 {"compress_at", a.compress_at},
                 {"random_order_seeds", fmt::format("seed + 3 + r (seed {}), heads.h random_subset over the L x K KV groups", s.seed)},
                 {"full_bytes", k.full_bytes},
                 {"trials", static_cast<int64_t>(test.ablation_trials().size())},
                 {"baseline_accuracy", sum.accuracy},
                 {"description", std::string("accuracy, rougeL_f [policy, budget] over the ablation trials; kv_fraction: the "
                                             "prompt cache a policy keeps / the full cache (L K P entries), mean over trials; "
                                             "kv_bytes: the same in bytes (K and V, the model's dtype); full_groups: KV groups "
                                             "kept whole by an order policy (-1: not one); random_*: [policy, budget, order], "
                                             "random KV-group orders at the same count (NaN: no order); same_as_full: the "
                                             "fraction of trials whose generated tokens equal the full cache's; docs/methods.md")}};
    ResultWriter w(out, WriteMode::kAppend);
    schema::write_kv_compare(w, rec);
    w.commit();

    const int64_t P = rec.P, B = rec.B, R = rec.R;
    for (int64_t p = 0; p < P; ++p)
        for (int64_t b = 0; b < B; ++b) {
            const size_t i = static_cast<size_t>(p * B + b);
            if (k.kv_fraction[i] > k.budgets[static_cast<size_t>(b)] + 0.02)
                log_warn(fmt::format("{} at budget {}: keeps {:.3f} of the cache at least (its window or observation window "
                                     "alone); reported as measured",
                                     k.policies[static_cast<size_t>(p)], k.budgets[static_cast<size_t>(b)], k.kv_fraction[i]));
        }
    std::printf("KV-cache policies at equal memory: %lld trials, %lld distinct configurations, full prompt cache %.1f KiB a trial\n",
                static_cast<long long>(test.ablation_trials().size()), static_cast<long long>(k.distinct_sets), k.full_bytes / 1024.0);
    int wid = 16;  // the policy column: as wide as the longest name
    for (const auto& p : k.policies) wid = std::max(wid, static_cast<int>(p.size()));
    std::printf("%-*s %7s %9s %9s %9s %9s %6s  %s\n", wid, "policy", "budget", "kv_kept", "accuracy", "ROUGE-L F", "same", "groups",
                "random orders' accuracy");
    for (int64_t p = 0; p < P; ++p)
        for (int64_t b = 0; b < B; ++b) {
            const int64_t i = p * B + b;
            std::string rnd;
            for (int64_t r = 0; r < R; ++r)
                if (std::isfinite(k.random_accuracy[static_cast<size_t>(i * R + r)]))
                    rnd += fmt::format("{}{:.3f}", rnd.empty() ? "" : " ", k.random_accuracy[static_cast<size_t>(i * R + r)]);
            const int64_t g = k.full_groups[static_cast<size_t>(i)];
            std::printf("%-*s %7.3f %9.3f %9.3f %9.3f %9.3f %6s  %s\n", wid, k.policies[static_cast<size_t>(p)].c_str(),
                        k.budgets[static_cast<size_t>(b)], k.kv_fraction[static_cast<size_t>(i)], k.accuracy[static_cast<size_t>(i)],
                        k.rougeL_f[static_cast<size_t>(i)], k.same_as_full[static_cast<size_t>(i)],
                        g < 0 ? "-" : std::to_string(g).c_str(), rnd.empty() ? "-" : rnd.c_str());
        }
}

}  // namespace hs::cli
