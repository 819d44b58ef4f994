// RazorAttention's head selection (Tang et al. 2024): the heads that keep a full KV cache are the
// "echo" heads (attend to earlier occurrences of the current token) and the "induction" heads
// (attend to the token after an earlier occurrence), found on random tokens repeated several
// times; with GQA a KV group is scored by the max over its query heads, since the cache is per
// kv head. Method, the reference code and where we differ: docs/methods.md ("RazorAttention's
// head selection"). Three presets (RazorPreset): headscope's own scoring and ordering
// (razor_scores, razor_combine), and the reference code's scoring and selection as it runs
// (razor_reference_scores, razor_select), quirks included, or with its early-return bug fixed.
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

namespace hs {

class Tokenizer;

struct RazorSettings {
    int64_t n_tokens = 0;     // |R|; 0 = min(2500, the longest with 1 + repeats * |R| <= context)
    int64_t repeats = 4;      // R appears this many times after BOS
    int64_t n_sequences = 1;  // rows [BOS, R, ..., R], each with its own R
    uint64_t seed = 0;
    // R drawn from the ids in [lo, hi) (half-open). -1: headscope preset 0 and the vocab size; reference
    // and paper presets the reference's 10000 and 12501 (randint(10000, 12500), inclusive), clamped to
    // the vocabulary: [10000, min(12501, V)), or the top min(2501, V) ids when V <= 10000.
    int64_t token_lo = -1, token_hi = -1;
    double echo_share = 0.01;       // the paper's top 1 % of KV groups by echo score ...
    double induction_share = 0.14;  // ... and top 14 % by induction score
    int64_t max_rows = 8;           // sequences per forward (headscope preset; the reference's run one each)
};

// Which Razor head selection (docs/methods.md, "RazorAttention's head selection"; command line
// `retrieval --razor-preset`):
//   kHeadscope  razor_scores + razor_combine: stripe-convention scores, the rank-based ordering,
//               selected = the groups it scores >= 1 (rank + 1 <= N share in either list, ties kept)
//   kReference  golden-stick@a50ddc93 as it runs: razor_reference_scores (non-causal -1e-5 softmax,
//               BOS-column mask entries, sum / S^2), razor_select with round-half-even k, membership
//               by value and the early return (all induction heads + the echo heads of the first
//               layer that has any)
//   kPaper      the reference's scoring and selection with the early return fixed: the full union
enum class RazorPreset { kHeadscope, kReference, kPaper };
const char* razor_preset_name(RazorPreset p);  // "headscope", "reference", "paper"
RazorPreset parse_razor_preset(const std::string& name);  // UsageError (no param: a value parser) otherwise

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

// ---- The reference code's scoring and selection (golden-stick@a50ddc93,
// mindspore_gs/experimental/long_context_compress/razor_attention/; docs/methods.md) ----

// RazorAttention's scores as the reference computes them (attention_wrappers.py:50-143), per query
// head, mean over s.n_sequences sequences (the reference: 1). Input: [BOS, R x repeats], R of
// n = s.n_tokens ids (0: min(2500, (context - 1) / repeats)) drawn i.i.d. uniform (with
// replacement, special tokens not excluded) from [token_lo, token_hi) (above) by a CPU generator
// seeded with s.seed (the reference: unseeded SystemRandom), BOS = the config's (else the
// tokenizer's). One ordinary causal forward per sequence; from each layer's post-RoPE q and k
// (Point::kAttnQ / kAttnK; query head h reads kv head h / g)
//   P = softmax(q k^T * scale + M),  M[i, j] = -1e-5 for j > i, else 0  (scale: the model's)
// i.e. every row is normalised over all S = 1 + repeats n keys, future ones included; no soft-cap
// or window (the reference's formula). Then, for rows i in [n, S) and j in range(i % n, i, n):
//   echo += P[i, j],  induction += P[i, j + 1],  each / S^2
// (for i a multiple of n, j = 0 is the BOS column). Float32 probabilities, float64 sums, in blocks
// of query rows (never [H, S, S] at once). Returns echo / induction [L, H] float32 CPU, score =
// razor_combine of them, tokens [n_sequences, S], n_tokens.
RazorScores razor_reference_scores(const Model& m, const RazorSettings& s, const Tokenizer* tok = nullptr);

// One layer's reference sums for one sequence, from q [S, H, d] and k [S, K, d] (any device or
// dtype): {echo, induction} [H] float64 CPU, already / S^2. `block_elems` bounds the [H, rows, S]
// float32 scratch. Exposed for tests and other probes.
std::pair<at::Tensor, at::Tensor> razor_reference_layer(const at::Tensor& q, const at::Tensor& k, int64_t n, double scale,
                                                        int64_t block_elems = int64_t{1} << 24);

// Python's round(x): round half to even (round(2.5) = 2, round(0.5) = 0).
int64_t round_half_even(double x);

// The selection (razor_attention.py:209-245), on per-KV-head scores echo / induction [L, K]:
//   kReference / kPaper: each list pooled over all N = L K values, k = round_half_even(N share),
//     selected = value >= the k-th largest (membership by value: ties kept; k = 0 selects none);
//     kReference: kv = every selected induction head + the selected echo heads of only the first
//     layer (in layer order) with any (none selected: the induction heads only); kPaper: the union.
//   kHeadscope: a group is in a list's selection when its rank (groups strictly higher) + 1 <=
//     N share (razor_combine's score >= 1); kv = the union.
struct RazorPick {
    at::Tensor echo, induction;  // [L, K] bool: each list's selection
    at::Tensor kv;               // [L, K] bool: the heads kept full
    int64_t echo_k = 0, induction_k = 0;  // the k of each list (kHeadscope: floor(N share) when not whole)
};
RazorPick razor_select(const at::Tensor& echo, const at::Tensor& induction, double echo_share, double induction_share,
                       RazorPreset preset);

struct RazorSelection {
    RazorPreset preset = RazorPreset::kHeadscope;
    at::Tensor echo, induction;  // [L, K] float32 CPU: per KV head, max over its query heads
    RazorPick pick;              // razor_select of the two
    at::Tensor full;             // [L, H] bool: every query head of a selected KV head
    // [L, H] float32: selected heads first: full + c / (1 + c), c = razor_combine of echo and
    // induction (so >= 1 exactly on `full`; the rest in razor_combine's 1 : 14 order). kHeadscope:
    // razor_scores(...).score itself (the ordering --order razor has always used).
    at::Tensor order;
    RazorScores scores;          // the per-query-head scores behind it (and the tokens)
};

// Scores with the preset's scoring (kHeadscope: razor_scores; else razor_reference_scores), reduces
// them to KV heads (max over each group's query heads: the reference's _max_every_group; the
// reference code itself crashes for g > 1 in _repeat_kv's x.shape()) and selects. The shares are
// s.echo_share and s.induction_share (the reference's 0.01 and 0.14 by default).
RazorSelection razor_reference_selection(const Model& m, const RazorSettings& s, RazorPreset preset,
                                         const Tokenizer* tok = nullptr);

// razor_reference_selection(...).order: the [L, H] score `--order razor` ranks heads by.
at::Tensor razor_preset_score(const Model& m, const RazorSettings& s, RazorPreset preset, const Tokenizer* tok = nullptr);

}  // namespace hs
