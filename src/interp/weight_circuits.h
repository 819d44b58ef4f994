// Weight circuits: what the weight-space probes (MAPS, copy suppression, direct logit attribution)
// read from a model's parameters. Per-head W_V / W_O / W_Q / W_K factors in the row-vector
// convention (a residual row x [D] maps to x W), the embedding and MLP source representations,
// the final norm folded into the unembedding, and the blocked rank count that never materialises
// a [V, V] matrix.
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

namespace hs {

class Tokenizer;

// Everything below is float32, on the model's device.

// Per-head factors: the OV circuit of head (l, h) is v_in(l, h) @ o_out(l, h), rank d.
at::Tensor head_v_in(const Model& m, int layer, int head);   // [D, d]  W_V^{l, h/g} transposed
at::Tensor head_o_out(const Model& m, int layer, int head);  // [d, D]  W_O^{l, h} transposed
at::Tensor head_q_in(const Model& m, int layer, int head);   // [D, d]
at::Tensor head_k_in(const Model& m, int layer, int head);   // [D, d]  W_K^{l, h/g}
// W_E[ids] times the family's embedding scale (no positions), float32 [N, D].
at::Tensor embed_rows(const Model& m, const at::Tensor& ids);
// What layer `l`'s attention / MLP reads from a residual row: the pre-norm, or x itself for
// post-norm-only families. [N, D] -> [N, D].
at::Tensor attn_input(const Model& m, int layer, const at::Tensor& x);
at::Tensor mlp_input(const Model& m, int layer, const at::Tensor& x);
// MLP_l(norm2_l(x)) including any post-MLP norm of the family, [N, D] -> [N, D].
at::Tensor mlp_output(const Model& m, int layer, const at::Tensor& x);

// Final norm as a linear map at fixed scale: inv_scale(resid) [..] is the per-position factor
// (RMSNorm: rsqrt(mean x^2 + eps); LayerNorm: rsqrt(var x + eps), after centring), and
// fold_final_norm(u) [.., D] multiplies by the norm weight (1 + w for Gemma) and, for LayerNorm,
// centres over D, so that logit_j ~ inv_scale * x . fold(W_U[j]) up to per-position constants.
at::Tensor final_norm_inv_scale(const Model& m, const at::Tensor& resid);
at::Tensor fold_final_norm(const Model& m, const at::Tensor& u);

// For each row i: #{j != t_i : S[i, j] >= S[i, t_i]} (descending) or #{j != t_i : S[i, j] <=
// S[i, t_i]} (ascending; ties count against the target), where S = left @ right^T, left [N, r], right [V, r], targets [N] int64.
// S is formed `row_block` rows at a time ([row_block, V] alive at once) and t_i's value is
// read from the same GEMM that produced the row, so rank 0 is exact for the best entry.
// Returns {descending ranks, ascending ranks}, each [N] int64 on the CPU; a side not asked for
// (each is a full pass over the [N, V] scores) stays undefined.
// On the CPU in float32 the count is fused: one reused cache-sized buffer, filled by a GEMM and
// counted in place; `fused = false` forces the plain tensor-op path (what other devices use),
// kept for the equality test and the benchmark's ratio.
enum class RankSide { kDescending, kAscending, kBoth };
std::pair<at::Tensor, at::Tensor> blocked_target_ranks(const at::Tensor& left, const at::Tensor& right,
                                                       const at::Tensor& targets, int64_t row_block,
                                                       RankSide side = RankSide::kBoth, bool fused = true);

// The token id a word gets as a whole word after a space (" " + word for byte-level BPE, the
// tokenizer's own dummy-prefix space for SentencePiece / llama2.c), or -1 when that is not
// exactly one token. No special tokens are added.
int32_t word_token(const Tokenizer& tok, const std::string& word);

}  // namespace hs
