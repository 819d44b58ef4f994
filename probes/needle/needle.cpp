// The needle test: the grid's trials, their batches and the passes over them (see needle.h).
#include "needle.h"

#include "errors.h"
#include "guard.h"
#include "qrhead.h"
#include "reference_rng.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <random>

namespace hs {

NeedleTest::NeedleTest(const Model& m, const Tokenizer& tok, TrialBuilder builder, NeedleConfig config)
    : m_(m), tok_(tok), builder_(std::move(builder)), c_(std::move(config)) {
    const auto& p = builder_.protocol();
    separate_ = p.ablation_assembly != p.assembly || c_.ablation_tmpl.text != c_.tmpl.text ||
                c_.ablation_max_new_tokens != c_.decode.max_new_tokens;
    auto check_fits = [&](const Trial& t, int64_t steps) {
        const int64_t positions = static_cast<int64_t>(t.prompt.size()) + steps - 1;
        if (c_.max_positions > 0 && positions > c_.max_positions)
            throw UsageError(fmt::format("length {}: the prompt ({} tokens) plus {} new tokens needs {} positions, beyond the "
                                         "model's context of {}",
                                         t.length, t.prompt.size(), steps, positions, c_.max_positions));
    };
    for (auto len : c_.lengths)
        if (c_.max_positions > 0 && len - p.buffer > c_.max_positions)
            throw UsageError(fmt::format("length {}: {} context tokens are beyond the model's context of {}", len,
                                         len - p.buffer, c_.max_positions));
    for (auto len : c_.lengths)
        for (auto dep : c_.depths)
            for (size_t ni = 0; ni < needles().size(); ++ni) {
                trials_.push_back(builder_.build(len, dep, static_cast<int>(ni), p.assembly, c_.tmpl));
                check_fits(trials_.back(), c_.decode.max_new_tokens);
                if (!separate_) continue;
                abl_trials_.push_back(builder_.build(len, dep, static_cast<int>(ni), p.ablation_assembly, c_.ablation_tmpl));
                check_fits(abl_trials_.back(), c_.ablation_max_new_tokens);
            }
    if (c_.qrhead) set_query_spans();
    set_cuts(trials_);
    set_cuts(abl_trials_);
    // A scan decodes ragged rows (one context length's trials, whatever their prompts' lengths, in one
    // forward) where its rows read their prompt caches in place (reads_prompts_in_place).
    // (An ablation pass's own trials keep batches of one prompt length: KV policies, which hide keys, decode
    // them; the scan's batches serve its ablation passes where the trials are the same.)
    groups_ = make_groups(trials_, reads_prompts_in_place(c_.decode));
    if (separate_) abl_groups_ = make_groups(abl_trials_, false);
}

// QRHead's query: the template's suffix after the context, and the same suffix with the null query
// (attn_retriever.py lines 177-178, 197-198: the query span runs from the instruction after the
// documents to the prompt's end; the null prompt shares everything before it). The assembly must
// encode the suffix on its own (tokens, tracked) and the template hold the question only there.
void NeedleTest::set_query_spans() {
    const Assembly a = builder_.protocol().assembly;
    if (c_.tmpl.prefix("\x01") != c_.tmpl.prefix("\x02"))
        throw UsageError("qrhead: the template puts {question} before {context}; QRHead's null-query pass "
                         "replaces the question after the context only",
                         "scores");
    for (auto& t : trials_) {
        const auto& q = needles()[static_cast<size_t>(t.needle)].question;
        const auto suffix = builder_.suffix_tokens(q, a, c_.tmpl);
        if (!suffix)
            throw UsageError(fmt::format("qrhead: the {} assembly re-encodes the whole prompt, so the question's "
                                         "tokens have no exact span (the tokens and tracked assemblies have one)",
                                         name_in(assembly_names(), a)),
                             "scores");
        const int64_t P = static_cast<int64_t>(t.prompt.size()), Q = static_cast<int64_t>(suffix->size());
        HS_REQUIRE(Q <= P && std::equal(suffix->begin(), suffix->end(), t.prompt.end() - Q),
                   "set_query_spans: the prompt does not end with the template's suffix");
        if (Q == 0)
            throw UsageError("qrhead: the template has nothing after {context}: QRHead needs the question there", "scores");
        t.query_start = P - Q;
        t.null_query = *builder_.suffix_tokens(kQrheadNullQuery, a, c_.tmpl);
        if (t.null_query.empty())
            throw UsageError("qrhead: the template's suffix with the null query encodes to no token", "scores");
    }
}

NeedleTest::NeedleTest(const Model& m, const Tokenizer& tok, TrialBuilder builder, NeedleConfig config, std::vector<Trial> trials)
    : m_(m), tok_(tok), builder_(std::move(builder)), c_(std::move(config)), trials_(std::move(trials)) {
    for (const auto& t : trials_) {
        HS_REQUIRE(t.needle >= 0 && static_cast<size_t>(t.needle) < needles().size(), "NeedleTest: a trial's needle is not the builder's");
        const int64_t positions = static_cast<int64_t>(t.prompt.size()) + c_.decode.max_new_tokens - 1;
        if (c_.max_positions > 0 && positions > c_.max_positions)
            throw UsageError(fmt::format("a prompt of {} tokens plus {} new tokens needs {} positions, beyond the model's context of {}",
                                         t.prompt.size(), c_.decode.max_new_tokens, positions, c_.max_positions));
    }
    set_cuts(trials_);
    groups_ = make_groups(trials_, reads_prompts_in_place(c_.decode));
}

void NeedleTest::set_cuts(std::vector<Trial>& trials) {
    std::vector<const std::vector<int64_t>*> prompts;
    for (const auto& t : trials) prompts.push_back(&t.prompt);
    auto cuts = prefill_cuts(prompts);
    for (size_t i = 0; i < trials.size(); ++i) trials[i].cuts = std::move(cuts[i]);
}

void NeedleTest::keep_scan_prefills(const std::function<bool(int64_t)>& keep) const {
    PrefixCache* pc = prefix_for(nullptr, false);
    if (!pc) return;
    for (size_t i = 0; i < trials_.size(); ++i)
        if (keep(static_cast<int64_t>(i))) pc->keep.insert(&trials_[i]);
}

// Batches of up to batch_size trials of equal prompt length (rows of one forward), or with `ragged`
// of any lengths (the prompts' lengths may differ: decode_batch then decodes them as ragged rows where
// it can and one length at a time where it cannot), taken in the order of the
// prompts (lexicographic by token): a trial then shares the longest possible prefix with the trial
// before it, and the prefills it takes shared positions from (PrefixCache) are recent.
std::vector<std::vector<int64_t>> NeedleTest::make_groups(const std::vector<Trial>& trials, bool ragged) const {
    return needle_batches(trials, c_.batch, ragged);
}

std::vector<std::vector<int64_t>> needle_batches(const std::vector<Trial>& trials, int64_t batch_size, bool ragged) {
    std::vector<int64_t> order(trials.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const auto &pa = trials[static_cast<size_t>(a)].prompt, &pb = trials[static_cast<size_t>(b)].prompt;
        return std::lexicographical_compare(pa.begin(), pa.end(), pb.begin(), pb.end());
    });
    // Ragged rows take any trials together; other rows one prompt length. A key's trials are cut into
    // as few batches as config.batch allows, of sizes that differ by one at most (48 trials at a batch
    // of 45: 24 + 24, not 45 + 3, whose second forward would stream the weights for 3 rows).
    auto key = [&](int64_t i) {
        return ragged ? int64_t{0} : static_cast<int64_t>(trials[static_cast<size_t>(i)].prompt.size());
    };
    std::map<int64_t, std::pair<int64_t, int64_t>> left;  // key -> (trials not yet batched, batches still to cut)
    const int64_t batch = std::max<int64_t>(1, batch_size);
    for (auto i : order) ++left[key(i)].first;
    for (auto& [k, v] : left) v.second = (v.first + batch - 1) / batch;
    std::vector<std::vector<int64_t>> groups;
    std::map<int64_t, std::vector<int64_t>> open;
    for (auto i : order) {
        auto& g = open[key(i)];
        auto& [trials_left, batches_left] = left[key(i)];
        g.push_back(i);
        if (static_cast<int64_t>(g.size()) == (trials_left + batches_left - 1) / batches_left) {
            trials_left -= static_cast<int64_t>(g.size()), --batches_left;
            groups.push_back(std::move(g)), g.clear();
        }
    }
    for (const auto& [k, g] : open) HS_REQUIRE(g.empty(), "make_groups: a batch left open");
    return groups;
}

DecodeSettings NeedleTest::ablation_settings() const {
    DecodeSettings s = c_.decode;
    s.score = false;
    s.times = &times_;
    s.max_new_tokens = c_.ablation_max_new_tokens;
    return s;
}

std::function<bool(int64_t)> NeedleTest::stopper() const {
    const TokenFacts* f = &builder_.facts();
    return [f](int64_t id) { return f->stop(id); };
}

PrefixCache* NeedleTest::prefix_for(const HeadSet* ablate, bool ablation_trials) const {
    if (!c_.decode.reuse_prefix) return nullptr;
    // What the prefill runs under: nothing (the baseline, or any pass with scope decode), or the set;
    // and which trials (the scan's, or the ablation passes' own).
    std::string key = ablation_trials && separate_ ? "ablation-trials " : "scan-trials ";
    if (ablate && c_.decode.scope == AblationScope::kAll && !ablate->empty()) {
        HS_REQUIRE(!ablate->keep && !ablate->window_after_prompt, "prefix_for: a KV policy's prefill is not keyed");
        key += fmt::format("{} {} {} {} {} {}", intervention_name(ablate->mode), ablate->window.sink, ablate->window.recent,
                           ablate->window.compensate, ablate->q_mean.defined() ? ablate->q_mean.data_ptr() : nullptr,
                           ablate->heads.size());
        for (auto [l, h] : ablate->heads) key += fmt::format(" {}.{}", l, h);
    } else {
        key += "none";
    }
    if (key != prefix_key_) {
        prefix_reused_ += prefix_.reused, prefix_computed_ += prefix_.computed;
        prefix_ = PrefixCache{};
        prefix_.max_bytes = c_.prefix_max_bytes;
        prefix_key_ = key;
    }
    return &prefix_;
}

std::pair<int64_t, int64_t> NeedleTest::prefix_stats() const {
    return {prefix_reused_ + prefix_.reused, prefix_computed_ + prefix_.computed};
}

TrialResult NeedleTest::judge(int64_t i, const std::vector<int64_t>& generated) const {
    TrialResult r;
    r.generated = generated;
    // The response as the protocol's reference decodes it: decode(ids, skip_special_tokens=True).strip()
    // through the tokenizers crate (which keeps a special token stored normalized), or headscope's
    // decode without specials.
    std::vector<int32_t> ids;
    for (auto id : generated)
        if (builder_.protocol().protocol == Protocol::kHeadscope || !tok_.crate_skips(static_cast<int32_t>(id)))
            ids.push_back(static_cast<int32_t>(id));
    r.response = trim(tok_.decode(ids, builder_.protocol().protocol == Protocol::kHeadscope));
    const std::string& answer = needles()[static_cast<size_t>(trials_[static_cast<size_t>(i)].needle)].answer;
    r.rouge1_recall = rouge1(answer, r.response).recall;
    r.rougeL_f = rougeL(answer, r.response).fmeasure;
    r.passed = r.rouge1_recall > c_.pass_threshold;
    return r;
}

std::vector<TrialResult> NeedleTest::run_baseline(const std::function<void()>& tick) const {
    std::vector<TrialResult> out(trials_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
        auto rs = run_baseline_batch(static_cast<int64_t>(g));
        for (size_t k = 0; k < rs.size(); ++k) {
            out[static_cast<size_t>(groups_[g][k])] = std::move(rs[k]);
            if (tick) tick();
        }
    }
    return out;
}

// The trial's kept prefill (prompt[:-1], the scored pass's PrefixCache) cut to the query's start, or a
// prefill of the context when none is kept; then the two query passes.
at::Tensor NeedleTest::query_cal(const Trial& t) const {
    KVCache prefix;
    PrefixCache* pc = prefix_for(nullptr, false);
    const auto it = pc ? pc->entries.find(&t) : prefix_.entries.end();
    if (pc && it != pc->entries.end()) {
        prefix = it->second.cache;
        prefix.truncate(t.query_start);
    } else {
        prefix = qrhead_prefill(m_, t.prompt, t.query_start, c_.decode.prefill_chunk);
    }
    const std::vector<int64_t> query(t.prompt.begin() + t.query_start, t.prompt.end());
    return qrhead_calibrated(m_, prefix, query, t.null_query);
}

// The trial's arrays of every score from its steps (the registry's trial functions), and its steps
// when kept.
TrialResult NeedleTest::scored(int64_t i, const DecodeOut& d, const at::Tensor* query_cal) const {
    const int L = m_.config.n_layers, H = m_.config.n_heads;
    const Trial& t = trials_[static_cast<size_t>(i)];
    TrialResult r = judge(i, d.generated);
    const std::string& answer = needles()[static_cast<size_t>(t.needle)].answer;
    const int64_t answer_tokens = static_cast<int64_t>(tok_.encode(answer, false).size());
    const auto steps = answer_steps(tok_, d.generated, answer);
    r.answer_steps = static_cast<int64_t>(steps.size());
    const bool found = t.needle_start >= 0;
    for (const auto& row : needle_scores()) {
        const auto& own = d.steps[static_cast<size_t>(row.id)];  // [0, L, H] each where not computed
        if (!c_.decode.scores.has(row.id)) {  // not asked for (--score): its arrays NaN
            r.arrays.emplace_back(row.trial_arrays.size(), torch::full({L, H}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble));
            if (c_.keep_steps) r.steps.push_back(own);
            continue;
        }
        r.arrays.push_back(row.trial(NeedleTrialSteps{own, steps, answer_tokens, found, L, H, query_cal, t.needle_start, t.needle_end}));
        if (!c_.keep_steps) continue;
        std::vector<at::Tensor> kept;
        for (const auto& s : own)
            kept.push_back(found || !row.steps_need_needle ? s : torch::full_like(s, std::numeric_limits<double>::quiet_NaN()));
        r.steps.push_back(std::move(kept));
    }
    return r;
}

std::vector<TrialResult> NeedleTest::run_baseline_batch(int64_t batch) const {
    const auto& g = groups_.at(static_cast<size_t>(batch));
    std::vector<const Trial*> ptrs;
    for (auto i : g) ptrs.push_back(&trials_[static_cast<size_t>(i)]);
    DecodeSettings s = c_.decode;
    s.score = true;
    s.times = &times_;
    const auto outs = decode_batch(m_, ptrs, s, stopper(), nullptr, prefix_for(nullptr, false));
    std::vector<TrialResult> res;
    for (size_t k = 0; k < g.size(); ++k) {
        at::Tensor cal;
        if (c_.qrhead) {
            const auto t0 = std::chrono::steady_clock::now();
            cal = query_cal(*ptrs[k]);
            times_.query += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        res.push_back(scored(g[k], outs[k], cal.defined() ? &cal : nullptr));
    }
    return res;
}

std::vector<TrialResult> NeedleTest::run_ablated_batch(const HeadSet& ablate, int64_t batch) const {
    const auto& g = ablation_batches().at(static_cast<size_t>(batch));
    const auto& trials = ablation_trials();
    std::vector<const Trial*> ptrs;
    for (auto i : g) ptrs.push_back(&trials[static_cast<size_t>(i)]);
    const HeadSet* set = ablate.empty() ? nullptr : &ablate;
    const auto outs = decode_batch(m_, ptrs, ablation_settings(), stopper(), set, prefix_for(set, true));
    std::vector<TrialResult> res;
    for (size_t k = 0; k < g.size(); ++k) res.push_back(judge(g[k], outs[k].generated));
    return res;
}

std::vector<TrialResult> NeedleTest::run_ablated(const HeadSet& ablate, const std::function<void()>& tick) const {
    std::vector<TrialResult> out(trials_.size());
    const auto& groups = ablation_batches();
    for (size_t g = 0; g < groups.size(); ++g) {
        auto rs = run_ablated_batch(ablate, static_cast<int64_t>(g));
        for (size_t k = 0; k < rs.size(); ++k) {
            out[static_cast<size_t>(groups[g][k])] = std::move(rs[k]);
            if (tick) tick();
        }
    }
    return out;
}

std::vector<std::vector<TrialResult>> NeedleTest::run_ablated_sets_batch(const std::vector<const HeadSet*>& sets,
                                                                         int64_t batch, int64_t max_rows,
                                                                         std::optional<AblationScope> scope) const {
    const int64_t S = static_cast<int64_t>(sets.size());
    const auto& g = ablation_batches().at(static_cast<size_t>(batch));
    const auto& trials = ablation_trials();
    DecodeSettings s = ablation_settings();
    if (scope) s.scope = *scope;
    const int64_t n = static_cast<int64_t>(g.size());
    // Sets per forward: as many as max_rows holds, spread evenly over the forwards that takes (6 sets
    // of 12 trials under 64 rows: 3 + 3, not 5 + 1, whose second forward streams the weights for 12 rows).
    const int64_t most = std::max<int64_t>(1, max_rows / std::max<int64_t>(1, n));
    const int64_t forwards = (S + most - 1) / most;
    const int64_t per = forwards > 0 ? (S + forwards - 1) / forwards : 1;
    std::vector<std::vector<TrialResult>> out(static_cast<size_t>(S));
    for (int64_t s0 = 0; s0 < S; s0 += per) {
        const int64_t s1 = std::min(S, s0 + per);
        std::vector<const Trial*> ptrs;
        std::vector<const HeadSet*> hs;
        for (int64_t j = s0; j < s1; ++j)
            for (auto i : g) {
                ptrs.push_back(&trials[static_cast<size_t>(i)]);
                const HeadSet* set = sets[static_cast<size_t>(j)];
                hs.push_back(set && !set->empty() ? set : nullptr);
            }
        // Unablated prefills (scope decode) share the kept chunks of the trials before.
        PrefixCache* prefix = s.scope == AblationScope::kDecode ? prefix_for(nullptr, true) : nullptr;
        const auto outs = decode_batch_sets(m_, ptrs, hs, s, stopper(), prefix);
            for (int64_t j = s0; j < s1; ++j)
            for (int64_t k = 0; k < n; ++k)
                out[static_cast<size_t>(j)].push_back(
                    judge(g[static_cast<size_t>(k)], outs[static_cast<size_t>((j - s0) * n + k)].generated));
    }
    if (s.scope == AblationScope::kDecode)
        if (PrefixCache* prefix = prefix_for(nullptr, true))
            for (auto i : g) prefix->release(&trials[static_cast<size_t>(i)]);  // its last use (keep_scan_prefills)
    return out;
}

std::vector<std::vector<TrialResult>> NeedleTest::run_ablated_sets(const std::vector<HeadSet>& sets, int64_t max_rows,
                                                                   const std::function<void()>& tick,
                                                                   std::optional<AblationScope> scope) const {
    const int64_t S = static_cast<int64_t>(sets.size());
    std::vector<std::vector<TrialResult>> out(static_cast<size_t>(S), std::vector<TrialResult>(trials_.size()));
    std::vector<const HeadSet*> ptrs;
    for (const auto& hs : sets) ptrs.push_back(&hs);
    const auto& groups = ablation_batches();
    for (size_t g = 0; g < groups.size(); ++g) {
        auto rs = run_ablated_sets_batch(ptrs, static_cast<int64_t>(g), max_rows, scope);
        for (int64_t j = 0; j < S; ++j)
            for (size_t k = 0; k < groups[g].size(); ++k) {
                out[static_cast<size_t>(j)][static_cast<size_t>(groups[g][k])] = std::move(rs[static_cast<size_t>(j)][k]);
                if (tick) tick();
            }
    }
    return out;
}

std::vector<NeedleTest::Decoded> NeedleTest::run_decoding(DecodingSpec spec, const std::function<void()>& tick) const {
    spec.max_new_tokens = c_.ablation_max_new_tokens;
    const auto stop = stopper();
    const auto& trials = ablation_trials();
    std::vector<Decoded> out;
    out.reserve(trials.size());
    for (size_t i = 0; i < trials.size(); ++i) {
        const Trial& t = trials[i];
        const DecodingOut d = decode_rows(m_, t.prompt, spec, stop, c_.decode.prefill_chunk);
        Decoded r;
        r.result = judge(static_cast<int64_t>(i), d.tokens);
        // The answer's first token as the needle holds it (no span found: the margin is NaN).
        const int64_t a = t.answer_start;
        const bool found = a >= 0 && a < static_cast<int64_t>(t.prompt.size());
        r.answer_margin = found ? token_margin(d.first_scores, t.prompt[static_cast<size_t>(a)]) : std::numeric_limits<double>::quiet_NaN();
        r.base_margin = found ? token_margin(d.first_base, t.prompt[static_cast<size_t>(a)]) : std::numeric_limits<double>::quiet_NaN();
        out.push_back(std::move(r));
        if (tick) tick();
    }
    return out;
}

at::Tensor NeedleTest::calibrate(int64_t n, uint64_t seed, int64_t max_tokens, std::vector<int64_t>* chosen,
                                 const std::function<void()>& tick) const {
    const int64_t N = static_cast<int64_t>(trials_.size());
    n = std::min(n, N);
    std::vector<int64_t> order(N);
    for (int64_t i = 0; i < N; ++i) order[i] = i;
    if (builder_.protocol().rng == RngKind::kReference) {
        // nolima_ablation.py lines 322-325: rng = random.Random(seed); rng.shuffle(trials); [:n]
        PythonRandom rng(seed);
        order = rng.shuffle_order(N);
    } else {
        std::mt19937_64 rng(seed);
        for (int64_t i = 0; i < n; ++i) {  // partial Fisher-Yates
            std::uniform_int_distribution<int64_t> pick(i, N - 1);
            std::swap(order[i], order[pick(rng)]);
        }
    }
    order.resize(n);
    std::vector<std::vector<int64_t>> prompts;
    const Assembly a = builder_.protocol().ablation_assembly;
    for (auto i : order) {
        const Trial& t = trials_[static_cast<size_t>(i)];
        const bool same = a == builder_.protocol().assembly && t.length <= max_tokens;
        auto p = same ? t.prompt : builder_.build(std::min(t.length, max_tokens), t.depth, t.needle, a, c_.tmpl).prompt;
        if (static_cast<int64_t>(p.size()) > max_tokens) p.resize(max_tokens);
        prompts.push_back(std::move(p));
    }
    if (chosen) *chosen = order;
    return calibrate_query_mean(m_, prompts, c_.decode.prefill_chunk, tick);
}

}  // namespace hs
