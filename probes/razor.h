// RazorAttention's head selection (Tang et al. 2024): the heads that keep a full KV cache are the
// "echo" heads (attend to earlier occurrences of the current token) and the "induction" heads
// (attend to the token after an earlier occurrence), found on random tokens repeated several
// times; with GQA a KV group is scored by the max over its query heads, since the cache is per
// kv head. Method, the reference code and where we differ: docs/methods.md ("RazorAttention's
// head selection").
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hs {

class Tokenizer;

struct RazorSettings {
    int64_t n_tokens = 0;     // |R|; 0 = min(2500, the longest with 1 + repeats * |R| <= context)
    int64_t repeats = 4;      // R appears this many times after BOS
    int64_t n_sequences = 1;  // rows [BOS, R, ..., R], each with its own R
    uint64_t seed = 0;
    int64_t token_lo = -1, token_hi = -1;  // R drawn from the ids in [lo, hi); -1 = 0 and vocab size
    double echo_share = 0.01;       // the paper's top 1 % of KV groups by echo score ...
    double induction_share = 0.14;  // ... and top 14 % by induction score
    int64_t max_rows = 8;           // sequences per forward
};

struct RazorScores {
    at::Tensor echo, induction;  // [L, H] float32, CPU: per query head, mean over sequences
    at::Tensor score;            // [L, H] float32, CPU: razor_combine of the two (equal within a KV group)
    at::Tensor tokens;           // [n_sequences, 1 + repeats * n_tokens] int64, CPU
    int64_t n_tokens = 0;        // |R| used
};

// Echo and induction scores on [BOS, R x repeats] (R uniform random, special tokens excluded: the
// drawing of `detect`'s stripe convention, repeated_random_tokens), from the attention pattern
// reduced block by block inside the forward. For a query q in repeat k >= 2:
//   echo(q)      = sum over the earlier copies q - j|R| (j >= 1) of A[q, q - j|R|]
//   induction(q) = sum over the same copies of A[q, q - j|R| + 1]
// each averaged over the (repeats - 1)|R| such queries: with repeats = 2 exactly `detect`'s
// duplicate-token and induction stripes. Errors name the parameter (n_tokens, repeats,
// n_sequences, token_range, echo_share, induction_share).
RazorScores razor_scores(const Model& m, const RazorSettings& s, const Tokenizer* tok = nullptr);

// razor_scores(...).score: higher = keep full attention.
at::Tensor razor_head_score(const Model& m, const RazorSettings& s, const Tokenizer* tok = nullptr);

// One ordering from the two scores [L, H]. Each is reduced to KV groups (max over the group's g
// query heads) and ranked over the N = L * K groups (rank = groups strictly higher, so ties share
// a rank); a group's score is max(N * echo_share / (echo rank + 1), N * induction_share /
// (induction rank + 1)), given to each of its query heads. A group scores >= 1 exactly when it is
// among the top N * share of either list, so the paper's selection (top 1 % echo + top 14 %
// induction) is a prefix of this ordering, and any other budget takes the two lists in the same
// 1 : 14 proportion. [L, H] float32, CPU.
at::Tensor razor_combine(const at::Tensor& echo, const at::Tensor& induction, int64_t n_kv_heads, double echo_share,
                         double induction_share);

}  // namespace hs
