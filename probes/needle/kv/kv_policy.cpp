// The KV-cache comparison's driver (kv_policy.h): every listed policy's configurations, decoded as a
// resumable job (one work item an ablation batch, its outcomes kept at checkpoints) and measured; the
// policies themselves are kv_<name>.cpp, listed in kv_registry.cpp.
#include "kv_policy.h"

#include "errors.h"
#include "jobs.h"
#include "model.h"
#include "progress.h"
#include "store.h"
#include "util.h"

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
    if (tail_tokens > 0) return std::max<int64_t>(1, P - tail_tokens);
    if (question_tokens.empty()) return P;
    const int64_t q = question_tokens.at(static_cast<size_t>(t.needle));
    return std::max<int64_t>(1, P - q);
}

double kv_capacity_fraction(const KvCompareSpec& s, const std::vector<Trial>& trials, int64_t C, int64_t H, int64_t K) {
    HS_REQUIRE(!trials.empty() && C > 0, "kv_capacity_fraction: no trial or a capacity below 1");
    double f = 0;
    for (const auto& t : trials)
        f += std::min(1.0, static_cast<double>(C * H) / static_cast<double>(K * s.compress_at(t)));
    return f / static_cast<double>(trials.size());
}

std::vector<KvColumn> kv_columns(const KvCompareSpec& s, const std::vector<Trial>& trials, int64_t H, int64_t K) {
    std::vector<KvColumn> out;
    for (double b : s.budgets) out.push_back({b, 0});
    for (int64_t C : s.capacities) out.push_back({kv_capacity_fraction(s, trials, C, H, K), C});
    return out;
}

namespace {

// Every (policy, column) configuration and its controls ([P, B] indices in *main_out, [P, B, R] in
// *rnd_out, -1 where none).
std::vector<KvConfig> make_configs(const KvContext& ctx, std::vector<int64_t>* main_out, std::vector<int64_t>* rnd_out) {
    const KvCompareSpec& spec = ctx.spec;
    const auto columns = kv_columns(spec, ctx.trials, ctx.sh.H, ctx.sh.K);
    const int64_t Pn = static_cast<int64_t>(spec.policies.size()), Bn = static_cast<int64_t>(columns.size()), R = spec.random_orders;
    std::vector<KvConfig> configs;
    std::vector<int64_t>& main_idx = *main_out;
    std::vector<int64_t>& rnd_idx = *rnd_out;
    main_idx.assign(static_cast<size_t>(Pn * Bn), -1), rnd_idx.assign(static_cast<size_t>(Pn * Bn * R), -1);
    for (int64_t pi = 0; pi < Pn; ++pi) {
        const auto& p = spec.policies[static_cast<size_t>(pi)];
        for (int64_t bi = 0; bi < Bn; ++bi) {
            const KvColumn col = columns[static_cast<size_t>(bi)];
            KvContext cc = ctx;
            cc.capacity = col.capacity;
            main_idx[static_cast<size_t>(pi * Bn + bi)] = static_cast<int64_t>(configs.size());
            configs.push_back(p.policy->config(p, col.budget, cc));
            auto controls = p.policy->controls(p, col.budget, cc);
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
Attrs compare_attrs(const KvCompareSpec& s, double full_bytes, int64_t trials) {
    Attrs a;
    for (const KvPolicy* p : kv_policies())
        for (auto& kv : p->attrs(s)) a.insert(kv);
    std::string sources;
    for (const auto& p : s.policies)
        if (!p.source.empty()) sources += (sources.empty() ? "" : "; ") + p.name + ": " + p.source;
    a.insert({"score_sources", sources});
    a.insert({"random_orders", s.random_orders});
    a.insert({"compress_at", std::string(s.compress_at_name())});
    a.insert({"tail_tokens", s.tail_tokens});
    a.insert({"random_order_seeds", fmt::format("seed + 3 + r (seed {}), heads.h random_subset over the L x K KV groups", s.seed)});
    a.insert({"full_bytes", full_bytes});
    a.insert({"trials", trials});
    return a;
}

KvShape kv_shape(const Model& m) {
    const auto& cfg = m.config;
    return KvShape{cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.n_heads / cfg.n_kv_heads, int64_t{cfg.n_layers} * cfg.n_kv_heads};
}

// The bytes of trial t's full prompt cache (keys and values, the model's dtype).
double cache_bytes(const Model& m, const KvCompareSpec& spec, const Trial& t) {
    const KvShape sh = kv_shape(m);
    const double elem = static_cast<double>(c10::elementSize(m.options.dtype));
    return 2.0 * static_cast<double>(m.config.d_head) * elem * static_cast<double>(sh.L * sh.K) * static_cast<double>(spec.compress_at(t));
}

// Mean over the ablation trials of the full prompt cache.
double mean_full_bytes(const NeedleTest& test, const Model& m, const KvCompareSpec& spec) {
    const auto& trials = test.ablation_trials();
    double full_bytes = 0;
    for (const auto& t : trials) full_bytes += cache_bytes(m, spec, t);
    return full_bytes / static_cast<double>(trials.size());
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

// What the comparison decodes: every configuration ([P, B] main, [P, B, R] random controls, then the
// full cache's, which same_as_full compares with) and the distinct head sets among them (identical
// configurations decode once).
struct KvPlan {
    std::vector<KvConfig> configs;
    std::vector<int64_t> main_idx, rnd_idx;
    size_t full_config = 0;
    std::vector<HeadSet> sets;
    std::vector<size_t> set_of;      // configuration -> its set
    std::string configurations_sha256;  // over the sets' keys: the resume check of what was decoded
};

KvPlan plan_configs(const KvContext& ctx) {
    KvPlan pl;
    pl.configs = make_configs(ctx, &pl.main_idx, &pl.rnd_idx);
    {
        KvConfig full;
        full.key = "full";
        full.frac.assign(ctx.trials.size(), 1.0);
        pl.configs.push_back(std::move(full));
    }
    pl.full_config = pl.configs.size() - 1;
    std::map<std::string, size_t> index;
    std::string keys;
    pl.set_of.resize(pl.configs.size());
    for (size_t c = 0; c < pl.configs.size(); ++c) {
        auto [it, fresh] = index.emplace(pl.configs[c].key, pl.sets.size());
        if (fresh) pl.sets.push_back(pl.configs[c].set), keys += pl.configs[c].key + "\n";
        pl.set_of[c] = it->second;
    }
    // Compressed at the prompt's end, the steps after the first decode through the kept entries alone.
    if (ctx.spec.compresses_prompt_end())
        for (auto& hs : pl.sets) hs.pack_cache = !hs.empty();
    pl.configurations_sha256 = sha256_bytes(keys.data(), keys.size());
    return pl;
}

// A resumed comparison whose parameters differ from this one's: the one-line refusal (the command
// adds how to start over).
[[noreturn]] void refuse_resume(const std::string& path, const jobs::Difference& d) {
    if (d.kind == jobs::Difference::Kind::kModel)
        throw StorageError(fmt::format("{}: holds results of another model; refusing to resume", path));
    auto cut = [](const std::string& s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; };
    throw StorageError(fmt::format("{}: its KV comparison was run with {} {}, not {}; refusing to resume", path, d.key, cut(d.was),
                                   cut(d.now)),
                       "resume");
}

// The outcomes of every (distinct set, ablation trial) decode, resumed or fresh, and the work items
// (ablation batches) done.
schema::KvComparePartialRecord start_state(const KvPlan& pl, const NeedleTest& test, const Model& m, const KvCompareSpec& spec,
                                           const KvCompareJob& job) {
    const int64_t S = static_cast<int64_t>(pl.sets.size()), N = static_cast<int64_t>(test.ablation_trials().size());
    const int64_t G = static_cast<int64_t>(test.ablation_batches().size());
    Attrs attrs = kv_compare_params(test, m, spec);
    attrs["configurations_sha256"] = pl.configurations_sha256;
    schema::KvComparePartialRecord st;
    if (job.resumed) {  // its parameters were checked before the scan; what they configure, now
        jobs::Identity id;
        id.params = attrs, id.keys = {"configurations_sha256"};
        if (const jobs::Difference d = jobs::compare("", job.resumed->attrs, "", id)) refuse_resume(job.out, d);
        HS_REQUIRE(job.resumed->S == S && job.resumed->N == N && job.resumed->G == G, "run_kv_compare: a resumed state of other sizes");
        st = *job.resumed;
    } else {
        st.S = S, st.N = N, st.G = G;
        st.passed.assign(static_cast<size_t>(S * N), 0), st.same_as_full = st.passed;
        st.rougeL_f.assign(static_cast<size_t>(S * N), 0.0);
        st.done.assign(static_cast<size_t>(G), 0);
    }
    st.attrs = std::move(attrs);
    return st;
}

// Decodes the work items not done (each ablation batch under every distinct set, as run_ablated_sets
// decodes it), keeping their outcomes in *st, with a checkpoint after each but the last.
void decode_items(const KvPlan& pl, const NeedleTest& test, const KvCompareSpec& spec, const KvCompareJob& job,
                  schema::KvComparePartialRecord* st) {
    const int64_t N = st->N, G = st->G;
    const auto& batches = test.ablation_batches();
    std::vector<const HeadSet*> ptrs;
    for (const auto& hs : pl.sets) ptrs.push_back(&hs);
    jobs::Checkpoint checkpoint(job.checkpoint_seconds, [&] {
        if (job.out.empty()) return;
        ResultWriter w(job.out, WriteMode::kAppend);
        schema::write_kv_compare_partial(w, *st);
        w.commit();
    }, job.pause_ms);
    const auto todo = jobs::pending_items(jobs::Shard{}, G, [st](int64_t g) { return st->done[static_cast<size_t>(g)] != 0; });
    if (job.resumed) {
        log_info(fmt::format("resuming the KV comparison in {}: {} of {} work items already done", job.out,
                             G - static_cast<int64_t>(todo.size()), G));
        if (!todo.empty()) checkpoint.write_now();  // the scan rewrote /retrieval without it
    }
    Progress prog("KV policy trials", st->S * N);
    for (int64_t g = 0; g < G; ++g)
        if (st->done[static_cast<size_t>(g)])
            for (size_t k = 0; k < batches[static_cast<size_t>(g)].size() * pl.sets.size(); ++k) prog.tick();
    // Compressed at the prompt's end, every policy acts past the prefill: the trials' unablated prefills
    // are shared (scope decode). Compressed before the question or the prompt's tail, the prefill carries
    // the policies: its queries from the compression point on see what the compressed cache holds, as
    // decoding those tokens one by one through it would (the masked model is exact, kv_policy.h).
    const AblationScope scope = spec.compresses_prompt_end() ? AblationScope::kDecode : AblationScope::kAll;
    const size_t full_set = pl.set_of[pl.full_config];
    for (size_t j = 0; j < todo.size(); ++j) {
        const int64_t g = todo[j];
        const auto& batch = batches[static_cast<size_t>(g)];
        const auto rs = test.run_ablated_sets_batch(ptrs, g, spec.sweep_rows, scope);
        for (size_t s = 0; s < pl.sets.size(); ++s)
            for (size_t k = 0; k < batch.size(); ++k) {
                const size_t i = s * static_cast<size_t>(N) + static_cast<size_t>(batch[k]);
                st->passed[i] = rs[s][k].passed;
                st->rougeL_f[i] = rs[s][k].rougeL_f;
                st->same_as_full[i] = rs[s][k].generated == rs[full_set][k].generated;
                prog.tick();
            }
        st->done[static_cast<size_t>(g)] = 1;
        if (j + 1 < todo.size()) checkpoint.item_finished();
    }
    prog.finish();
}

// What one decode of the timing trial measured: the peak of its cache's allocated bytes and the mean
// step time, over the steps past the compression (the first step reads the whole prefill).
struct Timed {
    int64_t peak = 0;
    double ms = std::numeric_limits<double>::quiet_NaN();
};

// Every distinct set's decode of the longest ablation trial alone (batch 1), kKvTimedSteps steps past
// the compression whatever the tokens (no stop), its prefill shared (scope decode) or its own; a
// first decode of the full cache warms the allocator and is not kept. [set].
std::vector<Timed> time_sets(const KvPlan& pl, const NeedleTest& test, const Model& m, const KvCompareSpec& spec, int64_t* tokens,
                             int64_t* steps) {
    const auto& trials = test.ablation_trials();
    size_t t = 0;
    for (size_t i = 1; i < trials.size(); ++i)
        if (trials[i].prompt.size() > trials[t].prompt.size()) t = i;
    const Trial* trial = &trials[t];
    const int64_t P = static_cast<int64_t>(trial->prompt.size());
    *tokens = P;
    DecodeSettings s = test.config().decode;
    s.score = false, s.times = nullptr, s.keep_stop = false;
    s.scope = spec.compresses_prompt_end() ? AblationScope::kDecode : AblationScope::kAll;
    s.max_new_tokens = 1 + kKvTimedSteps;
    const int64_t max_pos = test.config().max_positions;
    if (max_pos > 0) s.max_new_tokens = std::min(s.max_new_tokens, max_pos - P + 1);
    *steps = std::max<int64_t>(0, s.max_new_tokens - 1);
    std::vector<Timed> out(pl.sets.size());
    if (s.max_new_tokens < 2) return out;  // no step past the prompt fits the model's context
    PrefixCache prefix;
    PrefixCache* pre = s.scope == AblationScope::kDecode ? &prefix : nullptr;
    const auto never = [](int64_t) { return false; };
    decode_batch_sets(m, {trial}, {nullptr}, s, never, pre);  // warm-up
    Progress prog("KV cache memory and step time", static_cast<int64_t>(pl.sets.size()));
    for (size_t i = 0; i < pl.sets.size(); ++i) {
        CacheLog log;
        s.cache_log = &log;
        const HeadSet* hs = pl.sets[i].empty() ? nullptr : &pl.sets[i];
        decode_batch_sets(m, {trial}, {hs}, s, never, pre);
        double sum = 0;
        int64_t n = 0;
        for (size_t k = 1; k < log.step_seconds.size(); ++k)
            sum += log.step_seconds[k], ++n, out[i].peak = std::max(out[i].peak, log.cache_bytes[k]);
        if (n > 0) out[i].ms = 1000.0 * sum / static_cast<double>(n);
        prog.tick();
    }
    prog.finish();
    return out;
}

}  // namespace

Attrs kv_compare_params(const NeedleTest& test, const Model& m, const KvCompareSpec& spec) {
    Attrs a = compare_attrs(spec, mean_full_bytes(test, m, spec), static_cast<int64_t>(test.ablation_trials().size()));
    std::vector<std::string> names;
    for (const auto& p : spec.policies) names.push_back(p.name);
    a["policies"] = names;
    a["budgets"] = spec.budgets;
    a["capacities"] = spec.capacities;
    a["sweep_rows"] = spec.sweep_rows;
    return a;
}

std::shared_ptr<const schema::KvComparePartialRecord> load_kv_compare_resume(const std::string& path, const NeedleTest& test,
                                                                             const Model& m, const KvCompareSpec& spec) {
    ResultReader r(path);
    if (!r.exists(schema::retrieval_kv_compare("partial"))) return nullptr;
    jobs::Identity id;
    id.weights_sha256 = m.weights_sha256();
    id.params = kv_compare_params(test, m, spec);  // the configurations' keys need the scan: run_kv_compare checks them
    if (const jobs::Difference d = jobs::compare_file(r, schema::retrieval_kv_compare("partial"), id)) refuse_resume(path, d);
    auto prev = std::make_shared<schema::KvComparePartialRecord>(schema::read_kv_compare_partial(r));
    if (prev->N != static_cast<int64_t>(test.ablation_trials().size()) ||
        prev->G != static_cast<int64_t>(test.ablation_batches().size()))
        throw StorageError(fmt::format("{}: {} holds {} trials in {} work items, not {} in {}; refusing to resume", path,
                                       schema::retrieval_kv_compare("partial"), prev->N, prev->G, test.ablation_trials().size(),
                                       test.ablation_batches().size()),
                           "resume");
    return prev;
}

KvCompare run_kv_compare(const NeedleTest& test, const Model& m, const KvCompareSpec& spec, const KvCompareJob& job) {
    const KvShape sh = kv_shape(m);
    const auto& trials = test.ablation_trials();
    const int64_t N = static_cast<int64_t>(trials.size()), Pn = static_cast<int64_t>(spec.policies.size());
    const auto columns = kv_columns(spec, trials, sh.H, sh.K);
    const int64_t Bn = static_cast<int64_t>(columns.size()), R = spec.random_orders;
    HS_REQUIRE(N > 0 && Pn > 0 && Bn > 0, "run_kv_compare: no trial, policy, budget or capacity");
    check_scores(spec, sh);
    bool need_snap = false, need_vo = false;
    for (const auto& p : spec.policies) need_snap |= p.policy->needs_snapkv(), need_vo |= p.policy->needs_vo_norms();
    KvCompare out;
    for (const auto& col : columns) out.budgets.push_back(col.budget), out.capacities.push_back(col.capacity > 0 ? col.capacity : -1);
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
    // CriticalKV's value norms, one more whole prefill per trial (critical-adakv).
    auto vo = std::make_shared<std::map<const Trial*, at::Tensor>>();
    if (need_vo) {
        Progress prog("CriticalKV value norms", N);
        for (const auto& t : trials) {
            const std::vector<int64_t> head(t.prompt.begin(), t.prompt.begin() + spec.compress_at(t));
            (*vo)[&t] = critical_vo_norms(m, head, test.config().decode.prefill_chunk);
            prog.tick();
        }
        prog.finish();
        out.score_passes += N;
    }

    const KvContext ctx{spec, sh, trials, pooled, vo};
    const KvPlan pl = plan_configs(ctx);
    out.distinct_sets = static_cast<int64_t>(pl.sets.size());
    schema::KvComparePartialRecord st = start_state(pl, test, m, spec, job);
    decode_items(pl, test, spec, job, &st);

    out.full_bytes = mean_full_bytes(test, m, spec);
    const double elem = static_cast<double>(c10::elementSize(m.options.dtype));
    auto measure = [&](int64_t c) {
        const size_t s = pl.set_of[static_cast<size_t>(c)];
        const auto& cf = pl.configs[static_cast<size_t>(c)];
        double acc = 0, rl = 0, fr = 0, by = 0, same = 0;
        for (int64_t i = 0; i < N; ++i) {
            const size_t k = s * static_cast<size_t>(N) + static_cast<size_t>(i);
            acc += st.passed[k] != 0, rl += st.rougeL_f[k];
            same += st.same_as_full[k] != 0;
            const double f = cf.frac[static_cast<size_t>(i)];
            fr += f;
            by += f * 2.0 * static_cast<double>(m.config.d_head) * elem * static_cast<double>(sh.L * sh.K) *
                  static_cast<double>(spec.compress_at(trials[static_cast<size_t>(i)]));
        }
        const double n = static_cast<double>(N);
        return Measured{static_cast<float>(acc / n), static_cast<float>(rl / n), static_cast<float>(fr / n),
                        static_cast<float>(same / n), by / n};
    };
    measure_all(pl.configs, pl.main_idx, pl.rnd_idx, measure, R, &out);
    int64_t steps = 0;
    const auto timed = time_sets(pl, test, m, spec, &out.timing_tokens, &steps);
    for (int64_t c : pl.main_idx) {
        const Timed& tm = timed[pl.set_of[static_cast<size_t>(c)]];
        out.peak_cache_bytes.push_back(tm.peak), out.decode_ms.push_back(static_cast<float>(tm.ms));
    }
    const Timed& full = timed[pl.set_of[pl.full_config]];
    out.full_peak_cache_bytes = full.peak, out.full_decode_ms = full.ms;
    out.attrs = compare_attrs(spec, out.full_bytes, out.trials);
    out.attrs["cache"] = std::string(spec.compresses_prompt_end() ? "packed" : "masked");
    out.attrs["full_peak_cache_bytes"] = out.full_peak_cache_bytes;
    out.attrs["full_decode_ms"] = out.full_decode_ms;
    out.attrs["timing_trial_tokens"] = out.timing_tokens;
    out.timed_steps = steps;  // kKvTimedSteps, fewer where the model's context ends first
    out.attrs["timed_steps"] = steps;
    return out;
}

schema::KvCompareRecord KvCompare::stored(double baseline_accuracy) const {
    schema::KvCompareRecord rec;
    rec.P = static_cast<int64_t>(policies.size()), rec.B = static_cast<int64_t>(budgets.size()), rec.R = random_orders;
    rec.policies = policies;
    rec.budgets.assign(budgets.begin(), budgets.end());
    rec.capacities = capacities;
    rec.accuracy = accuracy, rec.rougeL_f = rougeL_f, rec.kv_fraction = kv_fraction, rec.same_as_full = same_as_full;
    rec.random_same_as_full = random_same_as_full;
    for (double b : kv_bytes) rec.kv_bytes.push_back(std::llround(b));
    rec.full_groups = full_groups;
    rec.peak_cache_bytes = peak_cache_bytes, rec.decode_ms = decode_ms;
    rec.random_accuracy = random_accuracy, rec.random_rougeL_f = random_rougeL_f, rec.random_kv_fraction = random_kv_fraction;
    rec.attrs = attrs;
    rec.attrs["baseline_accuracy"] = baseline_accuracy;
    return rec;
}

}  // namespace hs
