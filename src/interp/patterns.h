// Attention-pattern reductions, one implementation each, shared by the head detectors (probes/)
// and the toy trainer's attention statistics (src/train/train.cpp). Every reduction consumes a block of
// query rows of one layer's pattern, rows [B, H, n, S] holding queries [q0, q0 + n), and returns
// that block's partial sum [B, H] (float32): the whole-pattern value is the sum over blocks. So a
// consumer subscribed with Hooks::capture_rows lets attention run in query blocks and never form
// the [B, H, T, T] pattern (memory linear in T).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hs {

// The stripes of the [BOS, R, R] convention (R of length n, T = 2n + 1), as query ranges and
// offsets: a head's stripe score is the mean over q in [q_lo, q_hi] of A[q, q - back], or of
// A[q, column] for a column stripe.
enum class StripeKind {
    kInduction,       // mean over q in [n+1, 2n] of A[q, q-n+1]
    kPreviousToken,   // mean over q in [1, 2n]   of A[q, q-1]  (q = 1 attends to BOS)
    kDuplicateToken,  // mean over q in [n+1, 2n] of A[q, q-n]
    kAttentionSink,   // mean over q in [1, 2n]   of A[q, 0]    (q = 0 has no choice)
    kFirstToken,      // mean over q in [0, 2n]   of A[q, 0]    (Gu et al.'s alpha_0: q = 0 counted)
};
struct StripeSpec {
    int64_t q_lo = 0, q_hi = 0;  // inclusive query range
    int64_t back = 0;            // key = q - back (diagonal stripes)
    int64_t column = -1;         // >= 0: key = column (column stripes)
    int64_t count() const { return q_hi - q_lo + 1; }
};
StripeSpec stripe_spec(StripeKind kind, int64_t n);

// Sum over q in [q_lo, q_hi] of A[q, q - back], restricted to the block's queries.
at::Tensor diagonal_sum_rows(const at::Tensor& rows, int64_t q0, int64_t q_lo, int64_t q_hi, int64_t back);
// Sum over q in [q_lo, q_hi] of A[q, column], restricted to the block's queries.
at::Tensor column_sum_rows(const at::Tensor& rows, int64_t q0, int64_t q_lo, int64_t q_hi, int64_t column);
// The stripe's partial sum (divide the total by spec.count() for the mean).
at::Tensor stripe_sum_rows(const at::Tensor& rows, int64_t q0, const StripeSpec& spec);
// Per batch row b: A[b, :, qpos[b], kpos[b]] when qpos[b] lies in the block, else 0. qpos, kpos [B] int64.
at::Tensor pick_rows(const at::Tensor& rows, int64_t q0, const at::Tensor& qpos, const at::Tensor& kpos);

}  // namespace hs
