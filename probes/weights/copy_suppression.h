// Copy suppression (McDougall et al. 2023, GPT-2 small L10H7; methods-reference.md section 3):
// does a head, attending to a token, push that same token's logit down?
//
// Weights only: the effective embedding W_EE [V, D] (token embedding plus layer 0's attention to
// itself and MLP0), then per head
//   OV: M = norm1_l(W_EE) W_V W_O W_U_f^T   rank_i = #{j != i : M_ij <= M_ii}  (0 = most suppressed)
//   QK: M = norm1_l(W_U) W_Q W_K^T norm1_l(W_EE)^T   rank_i = #{j != i : M_ij >= M_ii}  (0 = attends most
//       to the token the residual predicts)
// W_U_f is W_U with the final norm's weight folded in and centred over the vocabulary (and over
// D for LayerNorm models): the paper's "folded + centered" processing. Both circuits have rank d,
// so M is formed from [V, d] factors, row_block rows at a time; [V, V] never exists. Ties count
// against the token (a head with no output ranks nothing first).
// RoPE models: the weights-only QK uses the unrotated q and k (position ignored).
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hs {

// W_EE [V, D] float32: x = W_E (no positions); r = x + sum_h norm1_0(x) W_V^{0,h/g} W_O^{0,h}
// (each token attending only to itself, no biases); W_EE = r + MLP0(norm2_0(r)) (MLP0 reads x for
// parallel-residual families). Formed row_block tokens at a time.
at::Tensor effective_embedding(const Model& m, int64_t row_block);
// The rows of W_EE for token ids [n] int64 (on the model's device): [n, D] float32.
at::Tensor effective_embedding_rows(const Model& m, const at::Tensor& ids);
// W_U with the final norm folded in and centred over the vocabulary: [V, D] float32.
at::Tensor folded_unembed(const Model& m);

struct CopySuppressionOptions {
    int64_t block_size = 2048;  // rows of M alive at once: [block_size, V] float32
    int64_t n_tokens = 0;       // source tokens scored; 0 = every token of the vocabulary
    int64_t seed = 0;           // which tokens when n_tokens > 0
};

// Per-head statistics [L, H] float32 of the ranks over the scored tokens.
struct RankStats {
    at::Tensor median, frac_rank0, frac_lt10;
    at::Tensor summary;  // mean log(rank + 1) - (log V - 1): negative = better than chance
};

struct CopySuppressionScores {
    RankStats ov, qk;
    at::Tensor tokens;  // [n] int64 source tokens scored
};

CopySuppressionScores copy_suppression_weights(const Model& m, const CopySuppressionOptions& o);

// Per-head ranks of the scored tokens for one layer ([H, n] int64 each), the core of the above;
// public so tests can compare blocked against unblocked computation.
struct LayerRanks {
    at::Tensor ov, qk;
};
LayerRanks copy_suppression_layer_ranks(const Model& m, int layer, const at::Tensor& w_ee, const at::Tensor& u_f,
                                        const at::Tensor& tokens, int64_t row_block);

// The query (key = false) or key (key = true) of head `slot` (a query head, or a kv head for keys)
// of `layer` for rows x [N, D] that are already the layer's attention input (after its norm), as
// the QK scores above form them: the projection and the family's q/k norm, RoPE left out. Equal to
// the forward's attn.q_pre_rope (tests/test_weight_probes.cpp).
at::Tensor copy_suppression_qk(const Model& m, int layer, const at::Tensor& x, bool key, int64_t slot);

// Dynamic score on real text: for each (q, k) with A[q, k] > threshold and k != 0, the head's
// output A[q,k] v_k W_O / scale[q] projected by W_U_f; rank of token[k] among the most negative
// logits (a positive rescaling, so the rank depends on k and the head only).
struct DynamicCopySuppression {
    at::Tensor frac_rank0;   // [L, H] fraction of qualifying pairs whose source token is rank 0 (NaN: none)
    at::Tensor n_pairs;      // [L, H] qualifying pairs
    at::Tensor mean_effect;  // [L, H] mean A[q,k] (v_k W_O) . W_U_f[token_k] / scale[q] (negative = suppression)
};
// windows: token sequences (each within the context), scored one at a time.
DynamicCopySuppression copy_suppression_dynamic(const Model& m, const std::vector<std::vector<int64_t>>& windows,
                                                double threshold = 0.1);

}  // namespace hs
