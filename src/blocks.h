// Building blocks shared by the family forwards (internal header: includes torch).
// Each block does one published operation; the families call them top to bottom.
#pragma once

#include "model.h"

#include <torch/torch.h>

namespace hs::blocks {

// What the current Model::forward call asked of the blocks (set by Model::forward for its
// thread, restored on return): the GEMM mode after resolving kAuto, and the attention block size.
struct ForwardContext {
    bool per_row_gemm = false;
    int64_t attn_block = 0;
};
const ForwardContext& forward_context();
class ForwardScope {
public:
    explicit ForwardScope(const ForwardContext& c);
    ~ForwardScope();
    ForwardScope(const ForwardScope&) = delete;
    ForwardScope& operator=(const ForwardScope&) = delete;

private:
    ForwardContext saved_;
};
// Query rows per attention block for B x H heads over S keys (requested 0 = automatic).
int64_t attention_block_rows(int64_t requested, int64_t B, int64_t H, int64_t T, int64_t S);

// Normalisation by config.norm, computed in float32 and cast back (as Hugging Face does).
at::Tensor norm(const ModelConfig& cfg, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, bool plus_one);
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
at::Tensor activation(Activation a, const at::Tensor& x);
at::Tensor mlp(const ModelConfig& cfg, const LayerWeights& lw, const at::Tensor& x);

// RoPE tables for absolute positions [T]: cos, sin [T, rot_dim] in the rotate_half layout.
struct Rope {
    at::Tensor cos, sin;
    int64_t rot_dim = 0;
};
Rope rope_tables(const ModelConfig& cfg, const at::Tensor& positions, double theta, c10::ScalarType dtype);
// x [B, T, N, d]: rotates the first rot_dim dims of each head (rotate_half), passes the rest.
at::Tensor apply_rope(const at::Tensor& x, const Rope& rope);

// The query before RoPE, q [B, T, H, d] after the family's q-norm (if any): the layer's pre-RoPE
// query interventions, then the attn.q_pre_rope capture point. Every family calls it on its way
// to RoPE (GPT-2, which has none, just before attention).
at::Tensor query_pre_rope(const Hooks* hooks, int layer, at::Tensor q);

// The attention of one layer from projected q [B,T,H,d] (after RoPE) and k, v [B,T,K,d]:
// query interventions, cache, scores, mask (causal, sliding window), soft-cap, softmax,
// z interventions, W_O, with every capture point from attn.q to attn_out. Returns attn_out [B,T,D].
at::Tensor attention(const Model& m, int layer, at::Tensor q, at::Tensor k, at::Tensor v, const Hooks* hooks,
                     KVCache* cache);

// The same attention written whole, as a reader learns it (no cache bookkeeping, no query blocks,
// no scratch reuse, no hooks): q [B, T, H, d] after RoPE, k, v [B, S, K, d] holding every key the
// queries see (S - T of them from before: `past`), -> z [B, T, H, d] before W_O. attention() must
// equal it (tests/test_blocks.cpp); read this one first.
at::Tensor attention_reference(const ModelConfig& cfg, int layer, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v);

// Positions [T] int64 continuing from the cache.
at::Tensor positions_for(const at::Tensor& tokens, const KVCache* cache);

inline at::Tensor hook(const Hooks* h, Point p, int layer, at::Tensor x) {
    return (h && h->wants(p, layer)) ? h->run(p, layer, std::move(x)) : x;
}

}  // namespace hs::blocks
