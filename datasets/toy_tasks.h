// Synthetic tasks for the ground-truth toy models: a single-character vocabulary, its
// tokenizer.json, and seeded batch generators for induction and associative recall.
//
// Vocabulary (68 tokens, one character each, so text and ids map one to one):
//   0 <unk>, 1 <s> (BOS), 2 '?', 3 '=', 4 '.', 5 ';', 6-15 '0'-'9', 16-41 'a'-'z', 42-67 'A'-'Z'.
// Induction draws random tokens from the 62 alphanumerics. Recall writes pairs "k V" (key a
// lowercase letter, value an uppercase letter) among filler (digits and '.'), then "?k" and asks
// for V.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace hs::toy {

constexpr int kVocabSize = 68;
constexpr int64_t kUnk = 0, kBos = 1, kQuery = 2, kFillerDot = 4;
constexpr int64_t kDigit0 = 6, kLower0 = 16, kUpper0 = 42;
constexpr int64_t kFirstAlnum = kDigit0;  // 62 alphanumerics: ids 6..67

// The text of token id (e.g. "a", "<s>").
std::string token_text(int64_t id);
// tokenizer.json for this vocabulary: BPE, single-character vocab, no merges, BOS prepended by a
// TemplateProcessing post-processor.
std::string tokenizer_json();

// A batch of next-token examples. logits[b, t] predict targets[b, t] (= tokens[b, t + 1] where
// scored); mask marks the scored positions.
struct Batch {
    at::Tensor tokens;   // [B, T] int64
    at::Tensor targets;  // [B, T] int64 (0 where not scored)
    at::Tensor mask;     // [B, T] float32, 1 = scored
};

using Rng = std::mt19937_64;

// Training rows of length T: half are [BOS, filler, R, R, R, ...] with a short period |R| = 3..9
// and 1..11 leading tokens; half are [BOS, R, R, random tail] with |R| = 4..30. Every next-token
// position is scored (random tokens carry log 62 nats of irreducible loss; repeats are what can be
// learned). Why this mix: docs/methods.md, "Toy models".
Batch induction_train_batch(Rng& rng, int64_t B, int64_t T);
// Evaluation rows [BOS, R, R] with |R| = n: scored positions q in [n+1, 2n-1] (the second copy,
// whose next token is predictable by induction) and, separately, first_mask q in [1, n-1].
struct InductionEval {
    Batch batch;            // mask = repeated half
    at::Tensor first_mask;  // [B, T] float32: first occurrence
    int64_t n = 0;
};
InductionEval induction_eval_batch(Rng& rng, int64_t B, int64_t n);

// Recall rows of length T: BOS, then 1..12 pairs "k V" (distinct keys) with filler spread between
// pairs, then queries "? k V". Training rows end with 1..8 queries (at most (T - 3) / 5) (all scored at the query key,
// target V); evaluation rows (n_queries = 1) end with "? k" and score only the last position.
// value_pos[b] = position of the queried V in the body (for attention ground truth).
struct RecallBatch {
    Batch batch;
    std::vector<int64_t> value_pos;  // [B] position of the queried pair's value (first query)
    std::vector<int64_t> query_pos;  // [B] position of the (first) query key
};
RecallBatch recall_batch(Rng& rng, int64_t B, int64_t T, bool eval);

// In-context functions (function vectors, Todd et al. 2024): task k in [0, 4) maps the letter x of
// the first 12 (a..l, index 0..11) to the uppercase letter of (x + k) mod 12. A row: BOS, n in
// [3, 8] demonstrations "x Y" (distinct inputs from b..l, Y = f_k(x), k one per row), then the query
// 'a', whose answer f_k(a) only the task decides (so a head's mean output over prompts of one task
// carries the task, not the query). Training rows score each demonstration's output from the second
// on (at its input) and the answer (at the query); evaluation rows only the answer. shuffle
// permutes the demonstrations' outputs (the reference's corrupted prompts). Rows are right-padded
// with 0 to kIclLen.
constexpr int kIclDomain = 12, kIclTasks = 4, kIclMinShots = 3, kIclMaxShots = 8;
constexpr int64_t kIclLen = 2 * kIclMaxShots + 2;
int64_t icl_output(int task, int64_t x);  // the output token of input index x (0..11) under task
struct IclBatch {
    Batch batch;
    std::vector<int64_t> last;                     // [B] the query's position
    std::vector<std::vector<int64_t>> label_pos;   // [B] the demonstrations' output positions
};
// task < 0: a task drawn per row.
IclBatch icl_batch(Rng& rng, int64_t B, bool eval, int task = -1, bool shuffle = false);
// The task's word pairs {"x", "Y"} as text (datasets/fv/toy-icl-shift<k>.json holds them).
std::vector<std::pair<std::string, std::string>> icl_pairs(int task);

}  // namespace hs::toy
