// `retrieval --kv-compare` (kv_compare_args.h).
#include "kv_compare_args.h"

#include "common.h"
#include "errors.h"
#include "heads.h"
#include "model.h"
#include "progress.h"
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
                    "after the scan: KV-cache policies compared at equal memory on the ablation trials, comma-separated: " +
                        kv_policy_names() +
                        " (SCORE: locos, retrieval, r2 or FILE.h5:DATASET); writes /retrieval/kv_compare (docs/methods.md, "
                        "\"KV-cache policies\")");
    sub->add_option("--kv-budgets", a.budgets,
                    fmt::format("kv compare: budgets as fractions of the full prompt cache, in (0, 1] (default {} when "
                                "--kv-capacity is not given)",
                                kDefaultBudgets));
    sub->add_option("--kv-capacity", a.capacities,
                    "kv compare: fixed capacities in tokens per query head, comma-separated whole numbers >= 1 (HeadKV's "
                    "and SnapKV's max_capacity_prompt, e.g. 128,256,512,1024,2048 as their run scripts); columns after "
                    "--kv-budgets' (given alone: no default budgets); the order policies keep within the fraction of the "
                    "cache a capacity is (docs/methods.md)");
    sub->add_option("--kv-score", a.score, "kv compare: headkv's importance: r2, retrieval, locos (this run) or FILE.h5:DATASET")
        ->capture_default_str();
    sub->add_option("--duo-gates", a.duo_gates,
                    "kv compare: duo's gates, FILE.h5:DATASET [L, H] (e.g. a duo-gates study's /ablation/<study>/duo/alpha)");
    sub->add_option("--duo-window", a.duo_window, "kv compare: SINK,RECENT cached keys of duo's and stream's streaming heads")
        ->capture_default_str();
    sub->add_option("--duo-select", a.duo_select,
                    "kv compare: how duo picks its full KV groups at budget b: sparsity (DuoAttention's deployment, "
                    "duo_attn/utils.py sparsify_attention_heads: the gates at or above the 1 - b quantile of all "
                    "KV groups' gates, ties broken by U(0, 1e-6) noise seeded --seed + 2; b is then the share of "
                    "groups kept whole, the measured cache is more) or budget (the most groups in the gates' order "
                    "whose measured cache stays within b)")
        ->capture_default_str();
    sub->add_option("--razor-window", a.razor_window,
                    "kv compare: SINK,RECENT keys razor's compressed heads keep (+ 1 mean token); default golden-stick's "
                    "local_capacity 256: 4,251 with the mean token, 4,252 with --razor-no-compensate");
    sub->add_flag("--razor-no-compensate", a.razor_no_compensate,
                  "kv compare: razor's heads drop the rest without the mean token (golden-stick's use_virtual_token=False: "
                  "4 sinks + 252 recent = 256 by default)");
    sub->add_option("--snapkv-window", a.snap_window, "kv compare: SnapKV's observation window (kept whole)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--snapkv-kernel", a.snap_kernel, "kv compare: SnapKV's max-pool kernel (odd)")->capture_default_str()->check(at_least(1));
    sub->add_option("--headkv-beta", a.beta, "kv compare: HeadKV's beta (share of the budget given by score)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--headkv-temp", a.temp, "kv compare: HeadKV's temperature on the normalised scores")->capture_default_str();
    sub->add_option("--kv-compress-at", a.compress_at,
                    "kv compare: prompt (the references' needle settings: the whole prompt prefilled, then compressed), "
                    "question (the context compressed before the question's tokens, which decode through it: "
                    "query-agnostic) or tail[:N] (DuoAttention's LongBench setting: compressed before the prompt's last N "
                    "tokens, default 50, which decode one by one through the compressed cache)")
        ->capture_default_str();
}

namespace {

// --kv-compress-at: prompt, question, tail or tail:N (N >= 1); the tail's length, 0 for prompt and question.
int64_t parse_compress_at(const std::string& text) {
    if (text == "prompt" || text == "question") return 0;
    if (text == "tail") return 50;  // pred.py's --decoding_simulation_length default
    if (text.rfind("tail:", 0) == 0) {
        const auto n = parse_int64(text.substr(5));
        if (!n || *n < 1) throw UsageError(fmt::format("--kv-compress-at: '{}' is not tail:N with N a whole number >= 1", text));
        return *n;
    }
    throw UsageError(fmt::format("--kv-compress-at: '{}' is not prompt, question, tail or tail:N", text));
}

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

// --kv-capacity: whole numbers >= 1, each once.
std::vector<int64_t> parse_capacities(const std::string& text) {
    std::vector<int64_t> out;
    for (const auto& part : split(text, ',')) {
        const auto p = trim(part);
        if (p.empty()) continue;
        const auto v = parse_int64(p);
        if (!v) throw UsageError(fmt::format("--kv-capacity: '{}' is not a whole number of tokens", p));
        if (*v < 1) throw UsageError(fmt::format("--kv-capacity: {} is not at least 1 token", p));
        if (std::find(out.begin(), out.end(), *v) != out.end()) throw UsageError(fmt::format("--kv-capacity: {} given twice", p));
        out.push_back(*v);
    }
    if (out.empty()) throw UsageError("--kv-capacity: no capacity given");
    return out;
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

// A needle score by its name; none for another word (a FILE.h5:DATASET).
std::optional<NeedleScore> needle_score_named(const std::string& name) {
    for (const auto& row : needle_scores())
        if (name == row.name) return row.id;
    return std::nullopt;
}

// A score named on the command line for policy `pol`: this run's (returned in *from_run, the tensor
// undefined) or a file's.
at::Tensor score_named(const std::string& flag, const std::string& name, const KvPolicy& pol, const NeedleScoreSet& run, int L, int H,
                       std::optional<NeedleScore>* from_run, std::string* source) {
    if (const auto sc = needle_score_named(name)) {
        const std::string why = pol.refuse_score(*sc);
        if (!why.empty()) throw UsageError(fmt::format("{} {}: {}", flag, name, why));
        if (!run.has(*sc)) throw UsageError(fmt::format("{} {}: this run does not compute it (see --score)", flag, name));
        *from_run = *sc, *source = run_score_source(*sc);
        return {};
    }
    *source = name;
    return with_flag(flag.c_str(), [&] { return read_head_score(split_head_score_ref(name), L, H); });
}

// The settings' flags (KvPolicy::check_settings names the setting).
const std::vector<Flag> kSettingFlags = {{"--snapkv-kernel", "snapkv_kernel"}, {"--headkv-temp", "headkv_temp"}, {"--duo-select", "duo_select"}};

// A listed policy's score, from the flag that carries what it needs (KvPolicy::score_from).
at::Tensor policy_score(const KvCompareArgs& a, const Model& m, const KvCompareSpec& s, const KvPolicy& pol, const std::string& name,
                        const std::string& arg, const NeedleScoreSet& run, std::optional<NeedleScore>* from_run, std::string* source) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    switch (pol.score_from()) {
        case KvScoreFrom::kNone: return {};
        case KvScoreFrom::kImportance: return score_named("--kv-score", a.score, pol, run, L, H, from_run, source);
        case KvScoreFrom::kGates:
            if (a.duo_gates.empty())
                throw UsageError(fmt::format("--kv-compare {}: needs --duo-gates FILE.h5:DATASET (a duo-gates study's alpha)", name));
            *source = a.duo_gates;
            return with_flag("--duo-gates", [&] { return read_head_score(split_head_score_ref(a.duo_gates), L, H); });
        case KvScoreFrom::kOwn: return with_flag({{"--razor-preset", "razor_preset"}}, [&] { return pol.own_score(m, s, source); });
        case KvScoreFrom::kArgument: return score_named("--kv-compare " + name, arg, pol, run, L, H, from_run, source);
    }
    return {};
}

}  // namespace

KvComparePlan plan_kv_compare(const KvCompareArgs& a, const Model& m, const NeedleScoreSet& run, int64_t random_orders,
                              int64_t sweep_rows, uint64_t seed, const std::string& razor_preset) {
    KvComparePlan plan;
    auto& s = plan.spec;
    // --kv-budgets and --kv-capacity combine (budgets' columns first); the default budgets only when neither is given.
    if (!a.capacities.empty()) s.capacities = parse_capacities(a.capacities);
    if (!a.budgets.empty() || a.capacities.empty()) s.budgets = parse_budgets(a.budgets.empty() ? kDefaultBudgets : a.budgets);
    std::tie(s.duo_sink, s.duo_recent) = parse_window("--duo-window", a.duo_window);
    s.duo_select = a.duo_select;
    s.razor_compensate = !a.razor_no_compensate;
    s.tail_tokens = parse_compress_at(a.compress_at);
    if (a.razor_window.empty())  // golden-stick's _compress: local_capacity 256 with or without the mean token
        s.razor_sink = kRazorSink, s.razor_recent = razor_reference_recent(s.razor_compensate);
    else
        std::tie(s.razor_sink, s.razor_recent) = parse_window("--razor-window", a.razor_window);
    s.razor_preset = razor_preset;
    s.snap.window = a.snap_window, s.snap.kernel = a.snap_kernel;
    s.headkv_beta = a.beta, s.headkv_temp = a.temp;
    with_flag(kSettingFlags, [&] {
        for (const KvPolicy* p : kv_policies()) p->check_settings(s);
    });
    s.random_orders = random_orders, s.sweep_rows = sweep_rows, s.seed = seed;
    for (const auto& part : split(a.policies, ',')) {
        const std::string name = trim(part);
        if (name.empty()) continue;
        std::string arg;
        const KvPolicy* pol = find_kv_policy(name, &arg);
        if (!pol) throw UsageError(fmt::format("--kv-compare: unknown policy '{}' (valid: {})", name, kv_policy_names()));
        KvPolicySpec p;
        p.policy = pol;
        p.name = name;
        std::optional<NeedleScore> from_run;
        p.score = policy_score(a, m, s, *pol, name, arg, run, &from_run, &p.source);
        for (const auto& q : s.policies)
            if (q.name == name) throw UsageError(fmt::format("--kv-compare: '{}' listed twice", name));
        s.policies.push_back(std::move(p));
        plan.run_scores.push_back(from_run);
    }
    if (s.policies.empty()) throw UsageError("--kv-compare: no policy named");
    // SnapKVCluster asserts max_capacity_prompt - window_size > 0 (snapkv_utils.py:106).
    for (const auto& p : s.policies)
        for (int64_t C : s.capacities)
            if (p.policy->needs_snapkv() && C <= s.snap.window)
                throw UsageError(fmt::format("--kv-capacity: {} is not above the SnapKV observation window ({}, --snapkv-window) "
                                             "that {} keeps besides it",
                                             C, s.snap.window, p.name));
    return plan;
}

namespace {

// A policy that keeps more than its budget (a window or observation window alone) is reported as measured.
// duo at the reference's sparsity (--duo-select sparsity) keeps b of its KV groups whole and the window
// in the others by design (docs/methods.md), so it is not warned about.
void warn_over_budget(const KvCompare& k, const KvCompareSpec& s) {
    const int64_t P = static_cast<int64_t>(k.policies.size()), B = static_cast<int64_t>(k.budgets.size());
    for (int64_t p = 0; p < P; ++p)
        for (int64_t b = 0; b < B; ++b) {
            const size_t i = static_cast<size_t>(p * B + b);
            if (k.policies[static_cast<size_t>(p)] == "duo" && s.duo_select == "sparsity") continue;
            if (k.kv_fraction[i] > k.budgets[static_cast<size_t>(b)] + 0.02) {
                const int64_t C = k.capacities[static_cast<size_t>(b)];
                log_warn(fmt::format("{} at {}: keeps {:.3f} of the cache (its window or observation window alone{}); reported "
                                     "as measured",
                                     k.policies[static_cast<size_t>(p)],
                                     C > 0 ? fmt::format("capacity {} ({:.3f} of the cache)", C, k.budgets[static_cast<size_t>(b)])
                                           : fmt::format("budget {}", k.budgets[static_cast<size_t>(b)]),
                                     k.kv_fraction[i], C > 0 ? ", or a per-query-head cache above the KV heads' full one" : ""));
            }
        }
}

void print_kv_compare(const KvCompare& k) {
    const int64_t P = static_cast<int64_t>(k.policies.size()), B = static_cast<int64_t>(k.budgets.size()), R = k.random_orders;
    std::printf("KV-cache policies at equal memory: %lld trials, %lld distinct configurations, full prompt cache %.1f KiB a trial\n",
                static_cast<long long>(k.trials), static_cast<long long>(k.distinct_sets), k.full_bytes / 1024.0);
    int wid = 16;  // the policy column: as wide as the longest name
    for (const auto& p : k.policies) wid = std::max(wid, static_cast<int>(p.size()));
    // budget: the column's fraction (a capacity column's: the fraction its capacity is); capacity: tokens per
    // query head ("-": a budget column); kv_kept, kv_KiB: the prompt cache measured, mean over trials;
    // peak_KiB, step_ms: the cache's allocated bytes at their peak and a decode step's time, measured on
    // the longest trial decoded alone past the compression.
    std::printf("cache %s: memory and step time measured on a %lld-token trial, %lld steps past the compression; full cache: "
                "peak %.1f KiB, %.2f ms a step\n",
                k.attrs.count("cache") ? std::get<std::string>(k.attrs.at("cache")).c_str() : "?", static_cast<long long>(k.timing_tokens),
                static_cast<long long>(k.timed_steps), static_cast<double>(k.full_peak_cache_bytes) / 1024.0, k.full_decode_ms);
    std::printf("%-*s %7s %8s %9s %9s %9s %9s %9s %6s %10s %8s  %s\n", wid, "policy", "budget", "capacity", "kv_kept", "kv_KiB",
                "accuracy", "ROUGE-L F", "same", "groups", "peak_KiB", "step_ms", "random orders' accuracy");
    for (int64_t p = 0; p < P; ++p)
        for (int64_t b = 0; b < B; ++b) {
            const int64_t i = p * B + b;
            std::string rnd;
            for (int64_t r = 0; r < R; ++r)
                if (std::isfinite(k.random_accuracy[static_cast<size_t>(i * R + r)]))
                    rnd += fmt::format("{}{:.3f}", rnd.empty() ? "" : " ", k.random_accuracy[static_cast<size_t>(i * R + r)]);
            const int64_t g = k.full_groups[static_cast<size_t>(i)], C = k.capacities[static_cast<size_t>(b)];
            std::printf("%-*s %7.3f %8s %9.3f %9.1f %9.3f %9.3f %9.3f %6s %10.1f %8.2f  %s\n", wid,
                        k.policies[static_cast<size_t>(p)].c_str(), k.budgets[static_cast<size_t>(b)],
                        C > 0 ? std::to_string(C).c_str() : "-", k.kv_fraction[static_cast<size_t>(i)],
                        k.kv_bytes[static_cast<size_t>(i)] / 1024.0, k.accuracy[static_cast<size_t>(i)],
                        k.rougeL_f[static_cast<size_t>(i)], k.same_as_full[static_cast<size_t>(i)],
                        g < 0 ? "-" : std::to_string(g).c_str(), static_cast<double>(k.peak_cache_bytes[static_cast<size_t>(i)]) / 1024.0,
                        k.decode_ms[static_cast<size_t>(i)], rnd.empty() ? "-" : rnd.c_str());
        }
}

}  // namespace

void prepare_kv_compare(KvComparePlan* plan, const NeedleTest& test, const Model& m, const Tokenizer& tok, const KvCompareArgs& a,
                        KvCompareJob job, bool resume) {
    auto& s = plan->spec;
    if (a.compress_at == "question")  // the question's tokens: the ablation template's suffix, encoded alone
        for (const auto& nd : test.needles())
            s.question_tokens.push_back(
                static_cast<int64_t>(tok.encode(test.config().ablation_tmpl.suffix(nd.question), false).size()));
    if (resume && file_exists(job.out)) job.resumed = load_kv_compare_resume(job.out, test, m, s);
    plan->job = std::move(job);
}

void run_kv_compare_args(KvComparePlan plan, const NeedleTest& test, const Model& m, const NeedleSummary& sum,
                         const std::string& out) {
    auto& s = plan.spec;
    for (size_t i = 0; i < s.policies.size(); ++i)
        if (const auto& r = plan.run_scores[i]) s.policies[i].score = sum.score(*r);
    const KvCompare k = [&] {
        try {
            return with_flag({{"--kv-score", "kv_score"}, {"--kv-compare", "kv_compare"}},
                             [&] { return run_kv_compare(test, m, s, plan.job); });
        } catch (const StorageError& e) {  // a resumed comparison of other configurations
            if (e.param() != "resume") throw;
            throw StorageError(std::string(e.what()) + " (--force starts over)", e.param());
        }
    }();
    ResultWriter w(out, WriteMode::kAppend);
    schema::write_kv_compare(w, k.stored(sum.accuracy));
    w.commit();
    warn_over_budget(k, s);
    print_kv_compare(k);
}

}  // namespace hs::cli
