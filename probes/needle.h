// Needle in a haystack: retrieval heads (Wu et al. 2024) and LOCOS (logit-contribution scoring)
// from one greedy decode pass per trial, plus query ablation. Methods: docs/methods.md
// ("Retrieval heads and LOCOS"); output names: docs/hdf5-schema.md ("/retrieval").
//
// A trial's prompt is built in token space (template prefix, haystack with the needle's tokens
// inserted at a sentence end, template suffix), so the needle span is exact by construction.
// Prefill runs in query chunks through the KV cache and each decode step keeps one attention row
// per head: memory grows linearly with the context.
#pragma once

#include "hooks.h"
#include "model.h"
#include "tokenizer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
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

// ROUGE-1 as the rouge-score package tokenises (no stemmer): lowercase, every run of characters
// outside [a-z0-9] splits words. Recall = clipped unigram overlap / reference unigrams (0 for an
// empty reference).
std::vector<std::string> rouge_tokens(const std::string& text);
double rouge1_recall(const std::string& reference, const std::string& candidate);

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
    int64_t needle_start = 0, needle_end = 0;  // [start, end) in prompt positions
};

// Token-level facts about the tokenizer the trials need, computed once.
struct TokenFacts {
    std::vector<int64_t> bos_prefix;  // specials encode() puts before text (BOS), possibly empty
    std::function<bool(int64_t)> sentence_end;  // token text ends in . ! ? or a newline
    std::function<bool(int64_t)> stop;          // EOS or a token whose text holds a newline
};
TokenFacts token_facts(const Tokenizer& tok);

// Builds one trial. haystack: the haystack file's tokens (repeated to fill). Throws DataError when
// the needle does not fit the length (naming the needle's line).
Trial build_trial(const TokenFacts& facts, const std::vector<int64_t>& haystack, const std::vector<int64_t>& prefix,
                  const std::vector<int64_t>& needle, const std::vector<int64_t>& suffix, int64_t length, double depth,
                  int needle_index);

// The head interventions of one ablation run.
enum class Ablation { kNone, kZeroQuery, kMeanQuery, kZero };
Ablation parse_ablation(const std::string& s);  // zero-query | mean-query | zero (UsageError)
const char* ablation_name(Ablation a);

struct HeadSet {
    std::vector<std::pair<int, int>> heads;
    Ablation mode = Ablation::kNone;
    at::Tensor q_mean;  // [L, H, d] for kMeanQuery
    void apply(Hooks& hooks) const;
};

struct DecodeSettings {
    int64_t max_new_tokens = 50;
    int64_t prefill_chunk = 512;
    bool score = true;  // capture rows and compute per-step scores
};

// Sum and count of every query vector seen (calibration of mean-query ablation).
struct QueryMean {
    at::Tensor sum;  // [L, H, d] double
    int64_t count = 0;
    at::Tensor mean() const;  // [L, H, d] float
};

// One greedy decode. Step t feeds prompt[P-1] (t = 0) or generated[t-1] and produces
// generated[t] from that query's logits; a stop token ends the loop without being kept or scored.
struct DecodeOut {
    std::vector<int64_t> generated;
    // Per step t and head: retrieval credit (1/|span| when the head's argmax key lies in the needle
    // and holds generated[t]), LOCOS L+ and L- (already scaled by n/(K-n)). [steps, L, H] double.
    at::Tensor credit, lplus, lminus;
    int64_t peak_keys = 0;
};
DecodeOut decode_trial(const Model& m, const Trial& trial, const DecodeSettings& s,
                       const std::function<bool(int64_t)>& stop, const HeadSet* ablate = nullptr,
                       QueryMean* calibrate = nullptr);

// Several trials of the same prompt length decoded as rows of one batch (each row equals its
// trial decoded alone: the forward is batch-independent). A finished row keeps feeding its last
// token until every row stops; its outputs are not extended. Calibration needs one trial a call.
std::vector<DecodeOut> decode_batch(const Model& m, const std::vector<const Trial*>& trials, const DecodeSettings& s,
                                    const std::function<bool(int64_t)>& stop, const HeadSet* ablate = nullptr,
                                    QueryMean* calibrate = nullptr);

// The per-step arithmetic on one layer, exposed for the tests. pattern [H, S] (one query row),
// v [S, K, d], wo [D, H*d], u [D] (raw unembedding row of y), prompt ids (positions >= its size
// never count as needle). Returns credit, L+, L- each [H] double.
struct StepScores {
    at::Tensor credit, lplus, lminus;
};
StepScores score_step(const at::Tensor& pattern, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
                      const std::vector<int64_t>& prompt, int64_t needle_start, int64_t needle_end, int64_t y);

// Decode steps that produced the gold answer (the LOCOS rule): the first contiguous run of the
// answer's own tokens (encoded without specials); else the tokens whose decoded text overlaps the
// first case-insensitive occurrence of the answer in the concatenated decoded pieces.
std::vector<int64_t> answer_steps(const Tokenizer& tok, const std::vector<int64_t>& generated, const std::string& answer);

// Bootstrap over trials: `resamples` draws of N trial indices with replacement (std::mt19937_64
// seeded, index = floor(u * N) with u = generate_canonical<double>), the mean of each draw, and
// the 2.5th and 97.5th percentiles (linear interpolation, numpy's default) per head.
std::vector<std::vector<int64_t>> bootstrap_indices(int64_t n, int64_t resamples, uint64_t seed);
std::pair<at::Tensor, at::Tensor> bootstrap_ci(const at::Tensor& samples /* [N, L, H] */, int64_t resamples,
                                               uint64_t seed);
double percentile_linear(std::vector<double> v, double q);  // q in [0, 100]

// Random head sets of `size` heads each drawn without replacement from the heads NOT in `exclude`.
std::vector<std::vector<std::pair<int, int>>> random_head_sets(int L, int H, const std::vector<std::pair<int, int>>& exclude,
                                                               int64_t n_sets, uint64_t seed);

// "L1H0,L2H3" -> heads (UsageError naming the bad entry or a head outside the model).
std::vector<std::pair<int, int>> parse_heads(const std::string& s, int L, int H);
// The top-k heads of an [L, H] score (ties in (layer, head) order; NaN last).
std::vector<std::pair<int, int>> top_heads(const at::Tensor& score, int64_t k);

}  // namespace hs
