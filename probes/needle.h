// Needle in a haystack: retrieval heads (Wu et al. 2024) and LOCOS (logit-contribution scoring)
// from one greedy decode pass per trial, plus query ablation. Methods: docs/methods.md
// ("Retrieval heads and LOCOS"); output names: docs/hdf5-schema.md ("/retrieval").
//
// A trial's prompt is built in token space (template prefix, haystack with the needle's tokens
// inserted at a sentence end, template suffix), so the needle span is exact by construction.
// Prefill runs in query chunks through the KV cache and each decode step keeps one attention row
// per head: memory grows linearly with the context.
#pragma once

#include "decoding.h"
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
#include <string>
#include <utility>
#include <vector>

namespace hs {

struct Needle {
    std::string needle, question, answer;
    int line = 0;  // 1-based line in the needles file
};

// One JSON object a line with string fields needle, question, answer; blank lines skipped.
// DataError naming "file:line" on a bad line, an answer whose words are not all in the needle, or
// an empty file.
std::vector<Needle> read_needles(const std::string& path);


// The prompt template split at {context}, {question} substituted. UsageError when {context} is not
// there exactly once or {question} is missing.
struct PromptTemplate {
    std::string text;
    std::string prefix(const std::string& question) const;
    std::string suffix(const std::string& question) const;
};
PromptTemplate parse_template(const std::string& text);
extern const char* const kDefaultTemplate;

struct Trial {
    int64_t length = 0;  // context tokens: haystack + needle
    double depth = 0;    // percent
    int needle = 0;      // index into the needles
    std::vector<int64_t> prompt;
    int64_t needle_start = 0, needle_end = 0;  // [start, end) in prompt positions: LOCOS's L+ keys
    int64_t answer_start = 0, answer_end = 0;  // the answer's tokens inside the needle: Wu's span
};

// When the decode loop stops (before keeping or scoring the token): kNewline on any token that
// decodes to exactly "\n" (LOCOS: the id of encode("\n"); Wu: "<0x0A>") and on EOS; kEos on EOS
// only; kNone never (max_new_tokens steps).
enum class StopRule { kNewline, kEos, kNone };
const NameTable<StopRule>& stop_rule_names();  // newline, eos, none
inline const char* stop_rule_name(StopRule r) { return name_in(stop_rule_names(), r); }

// Token-level facts about the tokenizer the trials need, computed once.
struct TokenFacts {
    std::vector<int64_t> bos_prefix;  // specials encode() puts before text (BOS), possibly empty
    std::vector<int64_t> newline_ids;  // tokens that decode to exactly "\n"
    std::vector<int64_t> eos_ids;      // the tokenizer's EOS (callers may add config.json's)
    StopRule stop_rule = StopRule::kNewline;
    std::function<bool(int64_t)> sentence_end;  // token text ends in . ! ? or a newline
    bool stop(int64_t id) const;                 // by stop_rule
};
TokenFacts token_facts(const Tokenizer& tok, StopRule rule = StopRule::kNewline);

// The answer's tokens inside the needle's tokens: the shortest run of needle tokens whose decoded
// text covers the first case-insensitive occurrence of the answer in the decoded needle (offsets
// from decoding growing prefixes, so a token's text is what it adds in context). [start, end)
// relative to the needle's first token; nullopt when the decoded needle does not contain the answer.
std::optional<std::pair<int64_t, int64_t>> answer_span(const Tokenizer& tok, const std::vector<int64_t>& needle,
                                                       const std::string& answer);

// Builds one trial. haystack: the haystack file's tokens (repeated to fill); answer: the answer's
// span inside the needle (answer_span). Throws DataError when the needle does not fit the length.
Trial build_trial(const TokenFacts& facts, const std::vector<int64_t>& haystack, const std::vector<int64_t>& prefix,
                  const std::vector<int64_t>& needle, const std::vector<int64_t>& suffix, int64_t length, double depth,
                  int needle_index, std::pair<int64_t, int64_t> answer);

// The interventions a needle test can run (src/intervention.h), in the order --help lists them.
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
    void apply(Hooks& hooks, int64_t row = -1) const;  // row >= 0: that batch row only
};

// Which forwards an ablation acts in: kAll = the prefill and every decode step (LOCOS,
// nolima_ablation.py: hooks on q_proj during generate); kDecode = decode steps only (Wu et al.,
// needle_in_haystack_with_mask.py: block_list is passed to the decode loop, not to the prefill).
enum class AblationScope { kAll, kDecode };
const NameTable<AblationScope>& ablation_scope_names();  // all, decode
inline const char* ablation_scope_name(AblationScope s) { return name_in(ablation_scope_names(), s); }

struct DecodeSettings {
    int64_t max_new_tokens = 50;
    int64_t prefill_chunk = 512;
    bool score = true;  // capture rows and compute per-step scores
    AblationScope scope = AblationScope::kAll;
    // NeedleTest: keep the last prompt's KV cache and prefill only past the prefix the next batch
    // shares with it (PrefixCache). Off: every trial prefilled whole.
    bool reuse_prefix = true;
};

// Whole prefill chunks kept between decodes of one pass. The trials of a grid share the haystack
// before the needle (every needle at one depth; the next depth up to the earlier insertion point).
// A decode computes the whole chunks [0, shared) that all its rows share in row 0 alone, as a batch-1
// prefill from position 0 does; those chunks whose tokens equal the kept ones are taken from here,
// the rest computed and kept. A chunk's keys and values depend only on the tokens up to its end, so
// a kept chunk holds exactly the bits the decode would compute: at batch 1 the results equal a whole
// prefill's bit for bit, and at any batch a decode's bits depend only on its own rows (not on which
// decodes ran before: shards and resumed runs agree with the uninterrupted run). Valid only between
// forwards with the same prefill interventions (the caller keys it; NeedleTest per pass).
struct PrefixCache {
    std::vector<int64_t> tokens;  // the positions `cache` holds (whole chunks)
    KVCache cache;                // batch 1
    int64_t reused = 0;           // prompt positions (summed over rows) taken from here or shared across rows
    int64_t computed = 0;         // prompt positions (summed over rows) prefilled
};

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
    // answer's span and holds generated[t]), LOCOS L+ and L- (already scaled by n/(K-n)).
    // [steps, L, H] double.
    at::Tensor credit, lplus, lminus;
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
// once and its KV cache copied to its rows.
std::vector<DecodeOut> decode_batch_sets(const Model& m, const std::vector<const Trial*>& trials,
                                         const std::vector<const HeadSet*>& sets, const DecodeSettings& s,
                                         const std::function<bool(int64_t)>& stop);

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
// Returns credit, L+, L- each [H] double.
struct StepScores {
    at::Tensor credit, lplus, lminus;
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
    PromptTemplate tmpl;
    DecodeSettings decode;         // max_new_tokens, prefill_chunk, scope (score is set per pass)
    double pass_threshold = 0.5;   // ROUGE-1 recall > this passes
    int64_t batch = 1;             // trials of equal prompt length decoded as rows of one forward
    int64_t max_positions = 0;     // the model's context: prompt + decode must fit (0 = unchecked)
};

// One trial's outcome. retrieval [L, H] (sum of the per-step credit), locos [L, H] (mean of
// L+ - L- over the answer steps; NaN without one). The ablated passes fill only the ROUGE fields.
struct TrialResult {
    std::vector<int64_t> generated;
    std::string response;  // decoded, stripped
    double rouge1_recall = 0, rougeL_f = 0;
    bool passed = false;
    int64_t answer_steps = 0;
    at::Tensor retrieval, locos;
};

// The trials of a grid (lengths x depths x needles, needle fastest) and the passes over them:
// the scored baseline, LOCOS's mean-query calibration and ablated reruns. Trials of equal prompt
// length run as rows of one batch (config.batch). Methods: docs/methods.md.
class NeedleTest {
public:
    // Builds every trial. DataError naming "needles_path:line" for a needle whose answer is not in
    // its decoded tokens or that is not shorter than a length; UsageError ("length N: ...") for a
    // length whose prompt plus max_new_tokens - 1 positions exceed config.max_positions (checked
    // before the trial is built).
    NeedleTest(const Model& m, const Tokenizer& tok, std::vector<Needle> needles, const std::string& needles_path,
               std::vector<int64_t> haystack, TokenFacts facts, NeedleConfig config);

    const std::vector<Trial>& trials() const { return trials_; }
    const std::vector<Needle>& needles() const { return needles_; }
    const NeedleConfig& config() const { return c_; }

    // The unablated, scored decode of every trial; tick() after each trial.
    std::vector<TrialResult> run_baseline(const std::function<void()>& tick = {}) const;
    // Every trial decoded with `ablate` (unscored): ROUGE and the pass flag only.
    std::vector<TrialResult> run_ablated(const HeadSet& ablate, const std::function<void()>& tick = {}) const;
    // Every trial decoded under each of `sets` (unscored), the sets as rows of shared forwards
    // (decode_batch_sets): each batch of trials (batches()) with as many sets as keep the rows of one
    // forward <= max_rows (at least one set). [set][trial]; tick() per (set, trial).
    std::vector<std::vector<TrialResult>> run_ablated_sets(const std::vector<HeadSet>& sets, int64_t max_rows,
                                                           const std::function<void()>& tick = {}) const;
    // LOCOS's calibration (nolima_ablation.py): n trials drawn from the whole grid by
    // std::mt19937_64(seed) (partial Fisher-Yates; their indices into trials() in *chosen), each
    // rebuilt at min(length, max_tokens) context tokens and cut to max_tokens prompt tokens, then
    // calibrate_query_mean over their prompts. tick() after each prompt.
    at::Tensor calibrate(int64_t n, uint64_t seed, int64_t max_tokens, std::vector<int64_t>* chosen,
                         const std::function<void()>& tick = {}) const;

    // The batches the passes decode (trial indices, each a row of one forward), and one batch of a
    // pass on its own: its trials' results in the batch's order, equal to what the whole pass gives
    // them (the same forwards). For sharded and resumable runs (headscope retrieval --shard, --resume).
    // Every trial decoded under `spec` (probes/decoding.h: DeCoRe's or JUICE's two rows, one trial
    // a forward of those rows, the prompt prefilled in chunks of the decode's prefill_chunk; at most
    // max_new_tokens steps, the stop rule as above): ROUGE and the pass flag of the combined output,
    // and at the first step the margin of the answer's first token (its score minus the best other
    // token's) under the rule (answer_margin) and under the plain model (base_margin). tick() per trial.
    struct Decoded {
        TrialResult result;
        double answer_margin = 0, base_margin = 0;
    };
    std::vector<Decoded> run_decoding(DecodingSpec spec, const std::function<void()>& tick = {}) const;

    const std::vector<std::vector<int64_t>>& batches() const { return groups_; }
    // Prompt positions taken from the prefix cache (or shared by a batch's rows) and prefilled, over
    // every decode of this test so far (config.decode.reuse_prefix).
    std::pair<int64_t, int64_t> prefix_stats() const;
    std::vector<TrialResult> run_baseline_batch(int64_t batch) const;
    std::vector<TrialResult> run_ablated_batch(const HeadSet& ablate, int64_t batch) const;

private:
    Trial make_trial(int64_t length, double depth, size_t needle) const;
    std::vector<int64_t> encode(const std::string& s) const;
    void run(const DecodeSettings& s, const HeadSet* ablate, const std::function<void(int64_t, const DecodeOut&)>& f) const;
    TrialResult judge(int64_t i, const std::vector<int64_t>& generated) const;
    TrialResult scored(int64_t i, const DecodeOut& d) const;  // judge + the head scores

    const Model& m_;
    const Tokenizer& tok_;
    std::vector<Needle> needles_;
    std::vector<int64_t> haystack_;
    TokenFacts facts_;
    NeedleConfig c_;
    std::vector<std::pair<int64_t, int64_t>> answer_spans_;  // per needle, inside its tokens
    std::vector<Trial> trials_;
    std::vector<std::vector<int64_t>> groups_;  // trial indices decoded together
    // The prefix cache of the pass that ran last, keyed by its prefill interventions (prefill_key).
    PrefixCache* prefix_for(const HeadSet* ablate) const;
    mutable std::string prefix_key_;
    mutable PrefixCache prefix_;
    mutable int64_t prefix_reused_ = 0, prefix_computed_ = 0;
};

// Bootstrap over trials: `resamples` draws of N trial indices with replacement (std::mt19937_64
// seeded, index = floor(u * N) with u = generate_canonical<double>), the mean of each draw, and
// the 2.5th and 97.5th percentiles (linear interpolation, numpy's default) per head.
std::vector<std::vector<int64_t>> bootstrap_indices(int64_t n, int64_t resamples, uint64_t seed);
std::pair<at::Tensor, at::Tensor> bootstrap_ci(const at::Tensor& samples /* [N, L, H] */, int64_t resamples,
                                               uint64_t seed);
double percentile_linear(std::vector<double> v, double q);  // q in [0, 100]

}  // namespace hs
