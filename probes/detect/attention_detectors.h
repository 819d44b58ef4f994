// Pattern-based head detectors (induction, previous-token, duplicate-token, attention sink) and
// the causal companion, induction loss with per-head zero ablation. Methods: Olsson et al. 2022
// and TransformerLens head_detector.py / evals.induction_loss (methods-reference.md, section 2).
//
// Two conventions:
//  - stripe: tokens [BOS, R, R], R uniform random of length n; a head's score is the mean of
//    one diagonal stripe of its pattern over the repeated half (see StripeKind).
//  - detector: given sequences; a detection pattern D [T, T] per sequence and an error measure
//    (mul or abs), averaged over sequences (TransformerLens head_detector semantics).
// Patterns are reduced layer by layer inside the attn.pattern capture: only one layer's
// [B, H, T, T] is alive at a time. The reduction functions are public so tests can feed them
// hand-made patterns.
#pragma once

#include "model.h"
#include "patterns.h"  // StripeKind and the row-block reductions

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

enum class ErrorMeasure { kMul, kAbs };

// Probe names as the CLI and the HDF5 file spell them (the names of head_probes(), in order).
const std::vector<std::string>& detector_probe_names();  // induction, previous-token, ...
std::string stripe_name(StripeKind k);
StripeKind parse_stripe_kind(const std::string& name);  // throws UsageError listing valid names

// ---- Per-layer reductions (one layer at a time by construction) ----

// pattern [B, H, T, T] for tokens [BOS, R, R] (T = 2n+1) -> per-row scores [B, H] float32.
// (The whole-pattern form of stripe_sum_rows in src/interp/patterns.h, for tests and callers that have
// a whole pattern.)
at::Tensor stripe_scores_layer(const at::Tensor& pattern, StripeKind kind, int64_t n);

// tokens [T] int64 -> D [T, T] float32, lower triangular (TransformerLens detection patterns) for
// induction, previous-token and duplicate-token; UsageError for attention-sink, which has none.
at::Tensor detection_pattern(const at::Tensor& tokens, StripeKind kind);

struct DetectorOptions {
    ErrorMeasure measure = ErrorMeasure::kMul;
    bool exclude_bos = false;            // zero column 0 (of A for mul, of |A - D| for abs)
    bool exclude_current_token = false;  // zero the diagonal likewise
};
// pattern [B, H, T, T] (one layer), D [T, T] -> [B, H] float32. The pattern is never modified.
//   mul: sum(A' * D) / sum(A')        abs: 1 - mean_i ||A_i - D_i||_1 (after the exclusions)
// (TransformerLens rounds abs scores to 3 decimals; we do not.)
at::Tensor detector_scores_layer(const at::Tensor& pattern, const at::Tensor& detection,
                                 const DetectorOptions& opts);
// The same from row blocks: rows [B, H, n, T] holding queries [q0, q0 + n) -> partial sums
// [2, B, H] (mul: numerator, denominator; abs: sum of |A - D|, unused); detector_score_finish
// turns the total into the score.
at::Tensor detector_sums_rows(const at::Tensor& rows, int64_t q0, const at::Tensor& detection,
                              const DetectorOptions& opts);
at::Tensor detector_score_finish(const at::Tensor& sums, int64_t T, const DetectorOptions& opts);

// ---- Inputs ----

struct StripeInput {
    int64_t seq_len = 50;  // n
    int64_t batch = 10;    // rows
    int64_t seed = 0;
    int64_t token_lo = -1;  // [lo, hi); -1 = 0 and vocab_size
    int64_t token_hi = -1;
};
// [batch, 1 + 2n] int64: BOS then R twice. R is drawn uniformly from the ids in [lo, hi) that are
// not special (the model's BOS/EOS and, with a tokenizer, every id it calls special), by a CPU
// generator seeded with `seed`, so runs are reproducible across devices. Throws UsageError on an
// empty or out-of-vocabulary range, ConfigError when no BOS id is known.
at::Tensor repeated_random_tokens(const Model& m, const StripeInput& in, const Tokenizer* tok = nullptr);
// The effective [lo, hi) after defaults.
std::pair<int64_t, int64_t> token_range(const Model& m, const StripeInput& in);

// ---- Whole-model runs ----

struct LayerHeadScores {
    std::string probe;
    at::Tensor score;    // [L, H] float32, CPU
    at::Tensor samples;  // [N, L, H] float32, CPU: per sequence / batch row
};

// The attn.pattern row-block capture behind stripe_scores (register it with Hooks::capture_rows):
// adds each block's share of layer l's stripe means to samples[k][row0 : row0 + b, l] ([N, L, H]
// each, zero at the start); it keeps no reference to the pattern, so attention runs in query
// blocks and no [b, H, T, T] tensor is formed.
RowCaptureFn stripe_capture(const std::vector<StripeKind>& kinds, int64_t n, std::vector<at::Tensor>& samples,
                         int64_t row0);

// tokens [B, 1+2n]: one forward (rows in chunks of max_rows), every requested stripe at once.
std::vector<LayerHeadScores> stripe_scores(const Model& m, const at::Tensor& tokens, int64_t n,
                                           const std::vector<StripeKind>& kinds, int64_t max_rows = 64);
// Sequences of any lengths, run one at a time (no padding to get wrong). attention-sink is scored
// with its stripe formula (mean A[q, 0] over q >= 1), sink-rate as mean A[q, 0] over every q of the
// sequence (its own T); the other kinds by detection pattern.
std::vector<LayerHeadScores> detector_scores(const Model& m, const std::vector<std::vector<int64_t>>& seqs,
                                             const std::vector<StripeKind>& kinds, const DetectorOptions& opts);

// ---- The head probes of `headscope detect` and of a YAML study's `probes:` list: one table ----

struct HeadProbe {
    const char* name;
    std::optional<StripeKind> pattern;  // the attention stripe / detection pattern it reads;
                                        // nullopt for induction-loss (causal: one forward per head)
    bool repeated_only;                 // runs only on [BOS, R, R] rows
    const char* stripe_description;     // what the score is on [BOS, R, R] rows
};
const std::vector<HeadProbe>& head_probes();
// UsageError "unknown probe 'x' (valid: induction, ...)".
const HeadProbe& find_head_probe(const std::string& name);
// The `description` attribute of a score: the stripe formula on [BOS, R, R] rows, or the
// TransformerLens detector on given sequences.
std::string probe_description(const HeadProbe& p, bool stripe);

// What the probes run on: [BOS, R, R] rows (stripe_tokens [B, 1 + 2n] defined) or given sequences.
struct ProbeInput {
    at::Tensor stripe_tokens;
    int64_t n = 0;
    std::vector<std::vector<int64_t>> seqs;  // when stripe_tokens is undefined
    DetectorOptions detector;
    int64_t max_rows = 64;
    double sink_epsilon = 0.3;  // sink-rate: Gu et al.'s epsilon
};

// Attention-sink rates (Gu et al., ICLR 2025; sail-sg/Attention-Sink eval_sink_open_source.py:41-49):
// from alpha_0 [N, L, H] (sink-rate's samples: a sequence's mean attention to position 0 over all its
// query positions), the indicator alpha_0 > epsilon per (sequence, layer, head), averaged. The
// reference's one number is model_rate (it prints it x 100); head_rate and layer_rate are its means
// over the other axes. UsageError (param sink_epsilon) outside [0, 1].
struct SinkRates {
    double epsilon = 0.3;
    at::Tensor head_rate;   // [L, H] float32: share of sequences where the head's alpha_0 > epsilon
    at::Tensor layer_rate;  // [L] float32: share of (sequence, head) pairs of the layer
    double model_rate = 0;  // share of (sequence, layer, head) triples
};
SinkRates sink_rates(const at::Tensor& alpha, double epsilon);

struct ProbeScores {
    std::string probe;
    at::Tensor score, samples;            // [L, H], [N, L, H]
    std::optional<double> baseline_loss;  // induction-loss
    std::optional<SinkRates> sink;        // sink-rate
};
// Every pattern probe in one pass (stripe_scores or detector_scores), then induction-loss if
// asked. UsageError when a repeated-only probe meets given sequences. Results: the pattern probes
// in the order asked, then induction-loss.
std::vector<ProbeScores> run_head_probes(const Model& m, const std::vector<std::string>& probes, const ProbeInput& in);

// Induction loss (TransformerLens evals.induction_loss): per-token cross-entropy of predicting
// token p+1 from position p, averaged over p in [n+1, 2n-1] (tokens n+2..2n, the part of the
// repeated half an induction head can predict), over every row. tokens [B, 1+2n].
struct InductionLoss {
    double baseline = 0;  // no ablation
    at::Tensor ablated;   // [L, H]: loss with head (l, h)'s z zeroed
    at::Tensor samples;   // [B, L, H]: per row
    at::Tensor baseline_rows;  // [B]
};
// Heads are ablated through per-row z interventions, so up to max_rows / B heads share a forward.
InductionLoss induction_loss(const Model& m, const at::Tensor& tokens, int64_t n, int64_t max_rows = 64);
// Per-row mean loss over the positions above: logits [B, T, V], tokens [B, T] -> [B].
at::Tensor induction_loss_rows(const at::Tensor& logits, const at::Tensor& tokens, int64_t n);

}  // namespace hs
