// OLMo-2 forward (transformers' modeling_olmo2.py, v4.50): no norms before attention or MLP;
// RMSNorm of each sublayer's output before its residual add; q_norm / k_norm over the whole
// projection (all heads together) before splitting into heads and RoPE; gated SiLU MLP.
//
// Capture points: attn_out is the o_proj output (the sum of head_out) and mlp_out the MLP's
// down-projection, both BEFORE their post-norms; resid_mid = resid_pre + post_attn_norm(attn_out),
// resid_post = resid_mid + post_mlp_norm(mlp_out).
#include "families.h"

#include "blocks.h"

namespace hs {

at::Tensor forward_olmo2(const blocks::Pass& p, const at::Tensor& tokens) {
    const Model& m = p.m;
    const ModelConfig& cfg = m.config;
    const ModelWeights& w = m.weights;
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = cfg.n_heads, K = cfg.n_kv_heads, d = cfg.d_head;
    auto rope = blocks::rope_tables(cfg, blocks::positions_for(tokens, p.cache), cfg.rope_theta, m.options.dtype);

    at::Tensor x = p.start([&] { return w.embed.index_select(0, tokens.reshape(-1)).view({B, T, cfg.d_model}); });  // [B, T, D]
    for (int l = p.first_layer(); l <= p.last_layer(); ++l) {
        const LayerWeights& lw = w.layers[l];
        x = p.hook(Point::kResidPre, l, x);
        // Norms over [H*d] and [K*d]: the statistics mix heads, so they come before the split.
        auto q = blocks::rms_norm(p.linear(x, lw.wq, lw.bq), lw.q_norm_w, cfg.norm_eps, false);  // [B, T, H*d]
        auto k = blocks::rms_norm(p.linear(x, lw.wk, lw.bk), lw.k_norm_w, cfg.norm_eps, false);  // [B, T, K*d]
        auto v = p.linear(x, lw.wv, lw.bv).view({B, T, K, d});
        q = blocks::apply_rope(p.query_pre_rope(l, q.view({B, T, H, d})), rope);
        k = blocks::apply_rope(k.view({B, T, K, d}), rope);
        if (p.keys_only(l)) {  // a prefill's last layer: only its keys and values are read later
            p.keep_keys(l, k, v);
            break;
        }
        auto attn_out = p.attention(l, q, k, v);  // [B, T, D]
        x = p.hook(Point::kResidMid, l, x + blocks::norm(cfg, attn_out, lw.post_attn_norm_w, {}));
        auto mlp_out = p.hook(Point::kMlpOut, l, p.mlp(lw, x));
        x = p.hook(Point::kResidPost, l, x + blocks::norm(cfg, mlp_out, lw.post_mlp_norm_w, {}));
    }
    return p.finish(x);
}

}  // namespace hs
