// Needle in a haystack: retrieval heads (Wu et al. 2024), LOCOS (logit-contribution scoring) and
// HeadKV's R2 score from one greedy decode pass per trial, plus query ablation. Methods: docs/methods.md
// ("Retrieval heads and LOCOS"); output names: docs/hdf5-schema.md ("/retrieval").
//
// A trial's prompt is built in token space (template prefix, haystack with the needle's tokens
// inserted at a sentence end, template suffix), so the needle span is exact by construction.
// Prefill runs in query chunks through the KV cache and each decode step keeps one attention row
// per head: memory grows linearly with the context.
#pragma once

#include "decoding.h"
#include "needle_trials.h"
#include "heads.h"
#include "hooks.h"
#include "intervention.h"
#include "model.h"
#include "rouge.h"
#include "tokenizer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hs {

// The interventions a needle test can run (src/interp/intervention.h), in the order --help lists them.
const std::vector<Intervention>& needle_ablations();  // zero-query, mean-query, zero, stream

// Zero-query and zero act on the query after RoPE and on z; mean-query replaces the query BEFORE
// RoPE (after q-norm) with q_mean, which the family then rotates at each position (LOCOS's
// nolima_ablation.py). `rows` >= 0 aims the ablation at one batch row only.
// Stream gives each head the attention window `window` (sink, recent, compensation: Hooks::window).
struct HeadSet {
    std::vector<Head> heads;
    Intervention mode = Intervention::kNone;
    at::Tensor q_mean;  // [L, H, d] for kMeanQuery: pre-RoPE query mean (calibrate_query_mean)
    StreamWindow window;  // kStream
    // KV-cache policies (probes/needle/kv/kv_policy.h). kv_from: where a trial's cache is compressed (the
    // positions before it were prefilled whole; unset: the prompt's length P).
    // window_after_prompt (kStream): the window acts only on queries at kv_from and later
    // (StreamWindow::from): DuoAttention's deployment, a whole prefill and then sink + recent.
    // keep: the positions before kv_from each head keeps, for a trial: [L, H, kv_from] bool
    // (Hooks::keep); later keys (the decoded tokens) stay visible. keep_compensate: RazorAttention's
    // mean token for what is dropped.
    std::function<int64_t(const Trial&)> kv_from;
    bool window_after_prompt = false;
    std::function<at::Tensor(const Trial&)> keep;
    bool keep_compensate = false;
    bool empty() const { return heads.empty() && !keep; }  // decodes as the unablated model
    // row >= 0: that batch row only; `trial` (the row's) is needed by keep and window_after_prompt.
    void apply(Hooks& hooks, int64_t row = -1, const Trial* trial = nullptr) const;
};

// Where a needle test's time goes (seconds, summed over its decodes): the prefill forwards, the
// decode steps' forwards, the per-step scoring.
struct DecodeTimes {
    double prefill = 0, decode = 0, score = 0;
};

struct DecodeSettings {
    int64_t max_new_tokens = 50;
    int64_t prefill_chunk = 512;
    bool score = true;  // capture rows and compute per-step scores
    bool keep_stop = false;  // StopOrder::kAfter: a stop token is kept and scored, then the row ends (Wu)
    DecodeTimes* times = nullptr;  // optional: time accumulated here
    AblationScope scope = AblationScope::kAll;
    // NeedleTest: keep the last prompt's KV cache and prefill only past the prefix the next batch
    // shares with it (PrefixCache). Off: every trial prefilled whole.
    bool reuse_prefix = true;
};

// Prefills kept between decodes of one pass. The trials of a grid share the haystack before the
// needle (every needle at one depth; the next depth up to the earlier insertion point; other lengths
// when the haystack is one text). Each trial is prefilled alone (batch 1) in chunks that end at the
// multiples of the chunk size and at its cuts (Trial::cuts: where it parts from another trial of
// the grid), so every trial that shares a prefix computes it in the same chunks with the same bits.
// Every prefill is kept here (the least recently used dropped first beyond max_bytes); a trial takes
// the positions it shares with the kept prefill that shares most, up to the last chunk end the two
// have in common, and prefills the rest: over the grid each node of the prompts' prefix tree is
// computed about once. The results equal a whole prefill's bit for bit, whatever ran before (shards
// and resumed runs agree with the whole run), and the rows of a batch are stacked from their trials'
// own prefills. Valid only between forwards with the same prefill interventions (the caller keys
// it; NeedleTest per pass) and while the trials live. Trials in `keep` stay (are not dropped) until
// release(): the scan's, for the ablation sets' rows (scope decode).
struct PrefixCache {
    struct Entry {
        KVCache cache;              // batch 1, the trial's prompt but its last token
        std::vector<int64_t> ends;  // its prefill's chunk ends
        int64_t bytes = 0, used = 0;
        bool pinned = false;
    };
    std::map<const Trial*, Entry> entries;
    int64_t reused = 0;     // prompt positions (summed over trials) taken from kept prefills
    int64_t computed = 0;   // prompt positions (summed over trials) prefilled
    int64_t max_bytes = 0;  // > 0: the kept prefills' bound
    int64_t bytes = 0, clock = 0;
    std::set<const Trial*> keep;
    void release(const Trial* t);  // t's prefill may be dropped again
    // Keeps t's prefill, dropping the least recently used unpinned ones to make room; false when it
    // does not fit.
    bool put(const Trial* t, const KVCache& cache, std::vector<int64_t> ends);
};

// Each prompt's Trial::cuts within its grid: the distinct lengths of its longest common prefix with
// every other prompt, ascending.
std::vector<std::vector<int64_t>> prefill_cuts(const std::vector<const std::vector<int64_t>*>& prompts);

// LOCOS's mean-query calibration (nolima_ablation.py calibrate_mean_activations): one prefill
// forward per prompt (no decode, unablated), the pre-RoPE query averaged over that prompt's
// positions, then the prompts' means averaged, each prompt weighing equally. [L, H, d] float.
// after_each (optional) runs after each prompt (progress).
at::Tensor calibrate_query_mean(const Model& m, const std::vector<std::vector<int64_t>>& prompts, int64_t prefill_chunk,
                                const std::function<void()>& after_each = {});

// One greedy decode. Step t feeds prompt[P-1] (t = 0) or generated[t-1] and produces
// generated[t] from that query's logits; a stop token ends the loop without being kept or scored.
struct DecodeOut {
    std::vector<int64_t> generated;
    // Per step t and head: retrieval credit (1/|answer span| when the head's argmax key lies in the
    // answer's span and holds generated[t]), LOCOS L+ and L- (already scaled by n/(K-n)), HeadKV's
    // R2 credit (score_step). [steps, L, H] double.
    at::Tensor credit, lplus, lminus, r2;
    int64_t peak_keys = 0;
};
DecodeOut decode_trial(const Model& m, const Trial& trial, const DecodeSettings& s,
                       const std::function<bool(int64_t)>& stop, const HeadSet* ablate = nullptr);

// Several trials of the same prompt length decoded as rows of one batch (each row equals its
// trial decoded alone: the forward is batch-independent). A finished row keeps feeding its last
// token until every row stops; its outputs are not extended.
// With `prefix`, the prefill reuses and then replaces it (PrefixCache); s.reuse_prefix is not read here.
std::vector<DecodeOut> decode_batch(const Model& m, const std::vector<const Trial*>& trials, const DecodeSettings& s,
                                    const std::function<bool(int64_t)>& stop, const HeadSet* ablate = nullptr,
                                    PrefixCache* prefix = nullptr);

// Rows with their own head sets: row b decodes *trials[b] (unscored when s.score is false) under
// *sets[b] (nullptr: unablated); one trial may fill several rows. The rows share each GEMM
// (GemmMode::kFolded: a row equals its run alone up to fp rounding, docs/forward.md "Batch rows and
// GEMMs"). With AblationScope::kDecode the prefill is unablated, so each distinct trial is prefilled
// once and its KV cache copied to its rows, and `prefix` (optional, scope decode only) serves its chunks
// as for decode_batch.
std::vector<DecodeOut> decode_batch_sets(const Model& m, const std::vector<const Trial*>& trials,
                                         const std::vector<const HeadSet*>& sets, const DecodeSettings& s,
                                         const std::function<bool(int64_t)>& stop, PrefixCache* prefix = nullptr);

// The spans one step is scored on (prompt positions, [start, end)) and the first key the layer's
// heads can see (0, or the sliding window's start).
struct StepSpans {
    int64_t needle_start = 0, needle_end = 0, answer_start = 0, answer_end = 0;
    int64_t first_visible = 0;
};
// The per-step arithmetic on one layer, exposed for the tests. pattern [H, S] (one query row),
// v [S, K, d], wo [D, H*d], u [D] (raw unembedding row of y), prompt ids (positions >= its size
// never count). Retrieval credit: 1/|answer| when the argmax key (first of ties) lies in the answer
// span and holds y (Wu et al., retrieval_head_detection.py lines 221-227). LOCOS: L+ = sum of phi
// over the needle, L- = the sum over the other keys times n / (keys visible - needle keys visible)
// (logit_contrib.py compute_logit_contribution_per_step; 0 when no other key is visible).
// R2 (HeadKV, FYYFU/HeadKV Important_Head/retrieval_head_detection_r2.py lines 218-229): with
// N = |answer span| (r2's needle span is its real_needle, the answer), the top N keys of the whole
// row (every key S, BOS and generated tokens included; ties: the first indices), and (1/N) times
// the sum of the weights of those inside the span; no copy condition. 0 without a span.
// Returns credit, L+, L-, R2 each [H] double.
struct StepScores {
    at::Tensor credit, lplus, lminus, r2;
};
StepScores score_step(const at::Tensor& pattern, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
                      const std::vector<int64_t>& prompt, const StepSpans& spans, int64_t y);

// Decode steps that produced the gold answer (the LOCOS rule): the first contiguous run of the
// answer's own tokens (encoded without specials); else the tokens whose decoded text overlaps the
// first case-insensitive occurrence of the answer in the concatenated decoded pieces.
std::vector<int64_t> answer_steps(const Tokenizer& tok, const std::vector<int64_t>& generated, const std::string& answer);

// ---- the experiment ----

// What one needle test runs: the grid and the decode.
struct NeedleConfig {
    std::vector<int64_t> lengths;  // context tokens (haystack + needle)
    std::vector<double> depths;    // percent
    PromptTemplate tmpl;           // the scan's prompts
    PromptTemplate ablation_tmpl;  // the ablated and decoding passes' prompts (LOCOS: a chat format)
    DecodeSettings decode;         // max_new_tokens, prefill_chunk, scope, keep_stop (score is set per pass)
    int64_t ablation_max_new_tokens = 50;  // the ablated and decoding passes' (LOCOS's ablation runs: 100)
    double pass_threshold = 0.5;   // ROUGE-1 recall > this passes
    int64_t batch = 1;             // trials of equal prompt length decoded as rows of one forward
    int64_t max_positions = 0;     // the model's context: prompt + decode must fit (0 = unchecked)
    bool keep_steps = false;       // TrialResult::steps_* of the scored pass (--dump-steps)
    int64_t prefix_max_bytes = int64_t{4} << 30;  // the kept prefix's bound (PrefixCache::max_bytes)
};

// One trial's outcome. retrieval [L, H] (sum of the per-step credit), locos [L, H] (mean of
// L+ - L- over the answer steps; NaN without one, or when the needle span was not found), lplus and
// lminus [L, H] (their means over the answer steps, NaN likewise), r2 [L, H] (sum of the per-step R2
// credit over the first min(steps, |answer encoded without specials|) steps: the reference stops
// after len(answer_tokens) steps, retrieval_head_detection_r2.py lines 245, 255; not normalised).
// steps_* [steps, L, H]: each step's credit, L+, L- and R2 (NeedleConfig::keep_steps; R2 at every
// step). The ablated passes fill only generated and the ROUGE fields.
struct TrialResult {
    std::vector<int64_t> generated;
    std::string response;  // decoded, stripped
    double rouge1_recall = 0, rougeL_f = 0;
    bool passed = false;
    int64_t answer_steps = 0;
    at::Tensor retrieval, locos, lplus, lminus, r2;
    at::Tensor steps_credit, steps_lplus, steps_lminus, steps_r2;
};

// The trials of a grid (lengths x depths x needles, needle fastest) and the passes over them:
// the scored baseline, LOCOS's mean-query calibration and ablated reruns. Trials are built by a
// TrialBuilder (the protocol's choices); the ablated and decoding passes have trials of their own
// when the protocol assembles them differently (LOCOS: the scan's tracked prompts, the ablation
// runs' joined ones), else they decode the scan's. Trials of equal prompt length run as rows of one
// batch (config.batch); batches run in the order of their prompts (lexicographic by token), so that
// the prefills a trial shares most with are usually the most recent, and it takes its shared
// positions from them (PrefixCache): over the grid each node of the prompts' prefix tree is computed
// about once a pass. Methods: docs/methods.md.
class NeedleTest {
public:
    // Builds every trial. DataError naming "needles_path:line" for a needle that does not fit a
    // length; UsageError ("length N: ...") for a length whose prompt plus max_new_tokens - 1 positions
    // exceed config.max_positions.
    NeedleTest(const Model& m, const Tokenizer& tok, TrialBuilder builder, NeedleConfig config);

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
    std::vector<TrialResult> run_baseline_batch(int64_t batch) const;
    std::vector<TrialResult> run_ablated_batch(const HeadSet& ablate, int64_t batch) const;
    // One ablation batch under each of `sets` (nullptr or no heads: unablated) as rows of shared
    // forwards, as run_ablated_sets decodes it: [set][k], k in the batch's order.
    std::vector<std::vector<TrialResult>> run_ablated_sets_batch(const std::vector<const HeadSet*>& sets, int64_t batch,
                                                                 int64_t max_rows, std::optional<AblationScope> scope = {}) const;

private:
    std::vector<std::vector<int64_t>> make_groups(const std::vector<Trial>& trials) const;
    static void set_cuts(std::vector<Trial>& trials);
    DecodeSettings ablation_settings() const;
    std::function<bool(int64_t)> stopper() const;
    TrialResult judge(int64_t i, const std::vector<int64_t>& generated) const;
    TrialResult scored(int64_t i, const DecodeOut& d) const;  // judge + the head scores

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

// Bootstrap over trials: `resamples` draws of N trial indices with replacement (std::mt19937_64
// seeded, index = floor(u * N) with u = generate_canonical<double>), the mean of each draw, and
// the 2.5th and 97.5th percentiles (linear interpolation, numpy's default) per head.
std::vector<std::vector<int64_t>> bootstrap_indices(int64_t n, int64_t resamples, uint64_t seed);
std::pair<at::Tensor, at::Tensor> bootstrap_ci(const at::Tensor& samples /* [N, L, H] */, int64_t resamples,
                                               uint64_t seed);
double percentile_linear(std::vector<double> v, double q);  // q in [0, 100]
// LOCOS's bootstrap as logit_contrib.py computes it (lines 1387-1396), to the last float32 digit:
// numpy's RandomState(seed).randint(0, N, size=N) per resample, the float32 mean over the drawn
// trials (numpy sums axis 0 in order), np.percentile 2.5 / 97.5 (float64 interpolation between float32
// neighbours), cast to float32. samples [N, ...] float.
std::pair<at::Tensor, at::Tensor> bootstrap_ci_numpy(const at::Tensor& samples, int64_t resamples, uint32_t seed);

}  // namespace hs
