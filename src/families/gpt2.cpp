// GPT-2 forward (transformers' modeling_gpt2.py, v4.50): token plus learned position embeddings,
// pre-LayerNorm blocks, no RoPE, unfused per-head attention, gelu_new MLP, tied unembedding.
#include "families.h"

#include "../blocks.h"

namespace hs {

at::Tensor forward_gpt2(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                        const ForwardOptions& opts) {
    using blocks::hook;
    const ModelConfig& cfg = m.config;
    const ModelWeights& w = m.weights;
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = cfg.n_heads, d = cfg.d_head;
    // Absolute positions continue from the cache; Model::forward has checked them < n_positions.
    auto positions = blocks::positions_for(tokens, cache);                               // [T]
    at::Tensor x = opts.start_layer > 0 ? opts.start_resid
                                        : w.embed.index_select(0, tokens.reshape(-1)).view({B, T, cfg.d_model}) +
                                              w.pos_embed.index_select(0, positions).unsqueeze(0);  // [B, T, D]
    const int last = opts.stop_after_layer >= 0 ? opts.stop_after_layer : cfg.n_layers - 1;
    for (int l = opts.start_layer; l <= last; ++l) {
        const LayerWeights& lw = w.layers[l];
        x = hook(hooks, Point::kResidPre, l, x);
        auto h = blocks::norm(cfg, x, lw.attn_norm_w, lw.attn_norm_b);
        auto q = blocks::query_pre_rope(hooks, l, blocks::linear(h, lw.wq, lw.bq).view({B, T, H, d}));  // c_attn's q third (no RoPE)
        auto k = blocks::linear(h, lw.wk, lw.bk).view({B, T, H, d});
        auto v = blocks::linear(h, lw.wv, lw.bv).view({B, T, H, d});
        auto attn_out = blocks::attention(m, l, q, k, v, hooks, cache);  // [B, T, D]
        x = hook(hooks, Point::kResidMid, l, x + attn_out);
        auto h2 = blocks::norm(cfg, x, lw.mlp_norm_w, lw.mlp_norm_b);
        auto mlp_out = hook(hooks, Point::kMlpOut, l, blocks::mlp(cfg, lw, h2));  // c_fc, gelu_new, c_proj
        x = hook(hooks, Point::kResidPost, l, x + mlp_out);
    }
    if (!opts.compute_logits || opts.stop_after_layer >= 0) return {};
    return m.unembed(x);
}

}  // namespace hs
