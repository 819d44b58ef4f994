// The QK spectrum of each head from weights alone (Autonomy-of-Heads): the effective rank
// (Roy & Vetterli 2007) of the head's bilinear attention form M_h, computed from thin QR factors
// of W_Q^h and W_K^{h/g} so that the cost per head after the QRs is O(d^3), never a [D, D] SVD.
// Method, and what RoPE, q/k norms and biases do to the meaning: docs/methods-weights.md
// ("QK spectrum").
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <utility>

namespace hs {

// Head factors of layer `layer` in the row-vector convention (a residual row x [D] gives the query
// x A_h and the key x B_{h/g}), so the head's score form is M_h = A_h B_{h/g}^T [D, D] (= W_Q^T W_K
// with torch's [d, D] weights, the transpose of W_K^T W_Q: the same singular values). The q/k norm
// weights (Qwen3 and Gemma 3 per head, 1 + w for Gemma; OLMo-2 over the whole projection) are
// folded in as diagonal scales of the columns; the norm's 1/rms factor is a positive per-token
// scalar and is left out. Biases and RoPE are left out. float64 on the model's device:
// {A [H, D, d], B [K, D, d]}.
std::pair<at::Tensor, at::Tensor> qk_head_factors(const Model& m, int layer);

struct QkSpectrum {
    at::Tensor singular_values;  // [L, H, r] float64, CPU, descending; r = min(d_head, d_model)
    at::Tensor effective_rank;   // [L, H] float64, CPU; NaN for a head whose form is 0
};

// Per layer: thin QRs A_h = Q1 R1 (per query head) and B_j = Q2 R2 (once per kv head j); the
// singular values of M_h = Q1 (R1 R2^T) Q2^T are those of the [r, r] core R1 R2^T (Q1, Q2 have
// orthonormal columns), batched over the heads.
QkSpectrum qk_spectrum(const Model& m);

// exp(-sum_i p_i log p_i), p = s / sum(s), over the last dimension of singular values s [.., r];
// 0 log 0 = 0. NaN where sum(s) = 0 (the effective rank of a zero matrix is undefined).
at::Tensor effective_rank(const at::Tensor& singular_values);

}  // namespace hs
