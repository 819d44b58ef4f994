// OLMo-2 forward (transformers' modeling_olmo2.py, v4.50): no norms before attention or MLP;
// RMSNorm of each sublayer's output before its residual add; q_norm / k_norm over the whole
// projection (all heads together) before splitting into heads and RoPE; gated SiLU MLP.
//
// Capture points: attn_out is the o_proj output (the sum of head_out) and mlp_out the MLP's
// down-projection, both BEFORE their post-norms; resid_mid = resid_pre + post_attn_norm(attn_out),
// resid_post = resid_mid + post_mlp_norm(mlp_out).
#include "families.h"

#include "../blocks.h"

namespace hs {

at::Tensor forward_olmo2(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                         const ForwardOptions& opts) {
    using blocks::hook;
    const ModelConfig& cfg = m.config;
    const ModelWeights& w = m.weights;
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = cfg.n_heads, K = cfg.n_kv_heads, d = cfg.d_head;
    auto rope = blocks::rope_tables(cfg, blocks::positions_for(tokens, cache), cfg.rope_theta, m.options.dtype);

    at::Tensor x = opts.start_layer > 0 ? opts.start_resid
                                        : w.embed.index_select(0, tokens.reshape(-1)).view({B, T, cfg.d_model});  // [B, T, D]
    const int last = opts.stop_after_layer >= 0 ? opts.stop_after_layer : cfg.n_layers - 1;
    for (int l = opts.start_layer; l <= last; ++l) {
        const LayerWeights& lw = w.layers[l];
        x = hook(hooks, Point::kResidPre, l, x);
        // Norms over [H*d] and [K*d]: the statistics mix heads, so they come before the split.
        auto q = blocks::rms_norm(blocks::linear(x, lw.wq, lw.bq), lw.q_norm_w, cfg.norm_eps, false);  // [B, T, H*d]
        auto k = blocks::rms_norm(blocks::linear(x, lw.wk, lw.bk), lw.k_norm_w, cfg.norm_eps, false);  // [B, T, K*d]
        auto v = blocks::linear(x, lw.wv, lw.bv).view({B, T, K, d});
        q = blocks::apply_rope(blocks::query_pre_rope(hooks, l, q.view({B, T, H, d})), rope);
        k = blocks::apply_rope(k.view({B, T, K, d}), rope);
        auto attn_out = blocks::attention(m, l, q, k, v, hooks, cache);  // [B, T, D]
        x = hook(hooks, Point::kResidMid, l, x + blocks::norm(cfg, attn_out, lw.post_attn_norm_w, {}));
        auto mlp_out = hook(hooks, Point::kMlpOut, l, blocks::mlp(cfg, lw, x));
        x = hook(hooks, Point::kResidPost, l, x + blocks::norm(cfg, mlp_out, lw.post_mlp_norm_w, {}));
    }
    if (!opts.compute_logits || opts.stop_after_layer >= 0) return {};
    return m.unembed(x);
}

}  // namespace hs
