// Needle in a haystack: retrieval heads (Wu et al. 2024), LOCOS (logit-contribution scoring) and
// HeadKV's R2 score from one greedy decode pass per trial, plus query ablation. Methods: docs/methods.md
// ("Retrieval heads and LOCOS"); output names: docs/hdf5-schema.md ("/retrieval").
//
// A trial's prompt is built in token space (template prefix, haystack with the needle's tokens
// inserted at a sentence end, template suffix), so the needle span is exact by construction. This
// file is the experiment (NeedleTest: the grid's trials and the passes over them); the decode and
// its prefix cache are needle_decode.h, the per-step scores needle_scoring.h (the registry:
// scores.h), the bootstrap stats.h.
#pragma once

#include "decoding.h"
#include "needle_decode.h"
#include "needle_scoring.h"
#include "needle_trials.h"
#include "model.h"
#include "rouge.h"
#include "scores.h"
#include "stats.h"
#include "tokenizer.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hs {

// What one needle test runs: the grid and the decode.
struct NeedleConfig {
    std::vector<int64_t> lengths;  // context tokens (haystack + needle)
    std::vector<double> depths;    // percent
    PromptTemplate tmpl;           // the scan's prompts
    PromptTemplate ablation_tmpl;  // the ablated and decoding passes' prompts (LOCOS: a chat format)
    DecodeSettings decode;         // max_new_tokens, prefill_chunk, scope, keep_stop (score is set per pass)
    int64_t ablation_max_new_tokens = 50;  // the ablated and decoding passes' (LOCOS's ablation runs: 100)
    double pass_threshold = 0.5;   // ROUGE-1 recall > this passes
    int64_t batch = 1;             // trials decoded as rows of one forward (make_groups)
    int64_t max_positions = 0;     // the model's context: prompt + decode must fit (0 = unchecked)
    bool keep_steps = false;       // TrialResult::steps of the scored pass (--dump-steps)
    int64_t prefix_max_bytes = int64_t{4} << 30;  // the kept prefix's bound (PrefixCache::max_bytes)
    // The scored pass also computes QRHead's calibrated query rows (the score qrhead, qrhead.h): two
    // forwards of the template's suffix per trial, with the question and with the null query, from
    // the trial's kept prefill (else a prefill of the context). Off: the qrhead arrays are NaN.
    bool qrhead = false;
};

// One trial's outcome. arrays: every score's trial arrays (scores.h NeedleScoreRow::trial_arrays,
// [score][part] [L, H] double, the registry's trial functions: retrieval the sum of the per-step
// credit; locos the mean of L+ - L- over the answer steps, then lplus and lminus, their means, NaN
// without an answer step or when the needle span was not found; r2 the sum of the per-step R2 credit
// over the first min(steps, |answer encoded without specials|) steps). steps: every score's step
// arrays [score][part] [steps, L, H] (NeedleConfig::keep_steps; a score with steps_need_needle NaN
// where the needle's span was not found). The ablated passes fill only generated and the ROUGE fields.
struct TrialResult {
    std::vector<int64_t> generated;
    std::string response;  // decoded, stripped
    double rouge1_recall = 0, rougeL_f = 0;
    bool passed = false;
    int64_t answer_steps = 0;
    PerNeedleScore<at::Tensor> arrays, steps;  // empty where not scored / not kept
    const at::Tensor& score(NeedleScore s) const { return array(s, 0); }
    const at::Tensor& array(NeedleScore s, size_t part) const { return arrays[static_cast<size_t>(s)][part]; }
    const at::Tensor& step(NeedleScore s, size_t part = 0) const { return steps[static_cast<size_t>(s)][part]; }
};

// The batches a pass decodes (trial indices, each a row of one forward): at most batch_size trials, of
// any prompt lengths with `ragged` (rows that read their prompt caches in place) and of one prompt length
// without; a key's trials cut into as few batches as batch_size allows, of sizes that differ by one at
// most; trials taken in the order of their prompts (lexicographic by token), so that a trial shares the
// longest possible prefix with the trial before it (PrefixCache).
std::vector<std::vector<int64_t>> needle_batches(const std::vector<Trial>& trials, int64_t batch_size, bool ragged);

// The trials of a grid (lengths x depths x needles, needle fastest) and the passes over them:
// the scored baseline, LOCOS's mean-query calibration and ablated reruns. Trials are built by a
// TrialBuilder (the protocol's choices); the ablated and decoding passes have trials of their own
// when the protocol assembles them differently (LOCOS: the scan's tracked prompts, the ablation
// runs' joined ones), else they decode the scan's. Trials of any lengths (of one prompt length where the rows cannot
// read their prompt caches in place: make_groups) run as rows of one batch (config.batch, cut evenly); batches run in the order of their prompts (lexicographic by token), so that
// the prefills a trial shares most with are usually the most recent, and it takes its shared
// positions from them (PrefixCache): over the grid each node of the prompts' prefix tree is computed
// about once a pass. Methods: docs/methods.md.
class NeedleTest {
public:
    // Builds every trial. DataError naming "needles_path:line" for a needle that does not fit a
    // length; UsageError ("length N: ...") for a length whose prompt plus max_new_tokens - 1 positions
    // exceed config.max_positions.
    NeedleTest(const Model& m, const Tokenizer& tok, TrialBuilder builder, NeedleConfig config);
    // A test of trials built elsewhere (AttentionInfluence's key -> value task, key_value_trials.h):
    // trial i's `needle` indexes builder's needles (its answer), builder gives the protocol (the stop
    // rule, the response's decode); config's lengths and depths are not read. The same batches, passes
    // and scores as a grid's; the ablation passes decode these trials. UsageError as above when a
    // prompt plus max_new_tokens - 1 positions exceed config.max_positions.
    NeedleTest(const Model& m, const Tokenizer& tok, TrialBuilder builder, NeedleConfig config, std::vector<Trial> trials);

    const std::vector<Trial>& trials() const { return trials_; }
    // The ablated and decoding passes' trials (the scan's unless the protocol assembles them apart).
    const std::vector<Trial>& ablation_trials() const { return separate_ ? abl_trials_ : trials_; }
    bool separate_ablation_trials() const { return separate_; }
    const std::vector<Needle>& needles() const { return builder_.needles(); }
    const TrialBuilder& builder() const { return builder_; }
    const NeedleConfig& config() const { return c_; }

    // The unablated, scored decode of every trial; tick() after each trial.
    std::vector<TrialResult> run_baseline(const std::function<void()>& tick = {}) const;
    // Every ablation trial decoded with `ablate` (unscored): generated, ROUGE and the pass flag only.
    // A set with no heads is the unablated decode of the ablation trials.
    std::vector<TrialResult> run_ablated(const HeadSet& ablate, const std::function<void()>& tick = {}) const;
    // Every ablation trial decoded under each of `sets` (unscored), the sets as rows of shared forwards
    // (decode_batch_sets): each batch of trials (ablation_batches()) with as many sets as keep the rows
    // of one forward <= max_rows (at least one set). [set][trial]; tick() per (set, trial).
    // scope: this pass's instead of the config's (KV-cache policies that act only past the prompt
    // decode the same from an unablated prefill, AblationScope::kDecode, which trials share).
    std::vector<std::vector<TrialResult>> run_ablated_sets(const std::vector<HeadSet>& sets, int64_t max_rows,
                                                           const std::function<void()>& tick = {},
                                                           std::optional<AblationScope> scope = {}) const;
    // LOCOS's calibration (nolima_ablation.py calibrate_mean_activations): n trials drawn from the
    // whole grid (headscope: std::mt19937_64(seed), a partial Fisher-Yates; RngKind::kReference:
    // random.Random(seed).shuffle of the grid, the first n), their indices in *chosen; each rebuilt
    // at min(length, max_tokens) context tokens as the ablation passes assemble prompts (with the
    // scan's template: LOCOS calibrates without the chat format) and cut to max_tokens prompt tokens,
    // then calibrate_query_mean over their prompts. tick() after each prompt.
    at::Tensor calibrate(int64_t n, uint64_t seed, int64_t max_tokens, std::vector<int64_t>* chosen,
                         const std::function<void()>& tick = {}) const;

    // Every trial decoded under `spec` (probes/decoding/decoding.h: DeCoRe's or JUICE's two rows, one trial
    // a forward of those rows, the prompt prefilled in chunks of the decode's prefill_chunk; at most
    // max_new_tokens steps, the stop rule as above): ROUGE and the pass flag of the combined output,
    // and at the first step the margin of the answer's first token (its score minus the best other
    // token's) under the rule (answer_margin) and under the plain model (base_margin). tick() per trial.
    struct Decoded {
        TrialResult result;
        double answer_margin = 0, base_margin = 0;
    };
    std::vector<Decoded> run_decoding(DecodingSpec spec, const std::function<void()>& tick = {}) const;

    // The batches the passes decode (trial indices, each a row of one forward), and one batch of a
    // pass on its own: its trials' results in the batch's order, equal to what the whole pass gives
    // them (the same forwards). For sharded and resumable runs (headscope retrieval --shard, --resume).
    const std::vector<std::vector<int64_t>>& batches() const { return groups_; }
    const std::vector<std::vector<int64_t>>& ablation_batches() const { return separate_ ? abl_groups_ : groups_; }
    // Prompt positions taken from kept prefills (PrefixCache) and prefilled, over
    // every decode of this test so far (config.decode.reuse_prefix).
    std::pair<int64_t, int64_t> prefix_stats() const;
    // The scan keeps the whole prefill of each trial i with keep(i) (within config.prefix_max_bytes)
    // for the ablation sets' rows (run_ablated_sets_batch with scope decode on the scan's trials),
    // which decode from it instead of prefilling again and then release it: one prefill a trial for
    // the whole study. A kept prefill holds the bits a new one computes (PrefixCache): what is kept
    // changes no result. Call before the baseline pass.
    void keep_scan_prefills(const std::function<bool(int64_t)>& keep) const;
    const DecodeTimes& times() const { return times_; }
    // The decode forwards times().decode spent, and their batch rows summed (rows / forwards: the
    // rows a step decoded on average), over every pass so far.
    std::pair<int64_t, int64_t> decode_forwards() const { return {times_.forwards, times_.rows}; }
    std::vector<TrialResult> run_baseline_batch(int64_t batch) const;
    std::vector<TrialResult> run_ablated_batch(const HeadSet& ablate, int64_t batch) const;
    // One ablation batch under each of `sets` (nullptr or no heads: unablated) as rows of shared
    // forwards, as run_ablated_sets decodes it: [set][k], k in the batch's order.
    std::vector<std::vector<TrialResult>> run_ablated_sets_batch(const std::vector<const HeadSet*>& sets, int64_t batch,
                                                                 int64_t max_rows, std::optional<AblationScope> scope = {}) const;

private:
    std::vector<std::vector<int64_t>> make_groups(const std::vector<Trial>& trials, bool ragged) const;
    static void set_cuts(std::vector<Trial>& trials);
    void set_query_spans();  // Trial::query_start and null_query of the scan's trials (config.qrhead)
    DecodeSettings ablation_settings() const;
    std::function<bool(int64_t)> stopper() const;
    TrialResult judge(int64_t i, const std::vector<int64_t>& generated) const;
    TrialResult scored(int64_t i, const DecodeOut& d, const at::Tensor* query_cal) const;  // judge + the head scores
    at::Tensor query_cal(const Trial& t) const;  // QRHead's calibrated rows of trial t (qrhead_calibrated)

    const Model& m_;
    const Tokenizer& tok_;
    TrialBuilder builder_;
    NeedleConfig c_;
    std::vector<Trial> trials_, abl_trials_;
    bool separate_ = false;
    std::vector<std::vector<int64_t>> groups_, abl_groups_;  // trial indices decoded together, in prefix order
    // The prefix cache of the pass that ran last, keyed by its prefill interventions (prefill_key).
    PrefixCache* prefix_for(const HeadSet* ablate, bool ablation_trials) const;
    mutable std::string prefix_key_;
    mutable PrefixCache prefix_;
    mutable int64_t prefix_reused_ = 0, prefix_computed_ = 0;
    mutable DecodeTimes times_;
};

}  // namespace hs
