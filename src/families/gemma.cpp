// Gemma, Gemma 2 and Gemma 3 text forward (transformers' modeling_gemma.py, modeling_gemma2.py,
// modeling_gemma3.py, v4.50), one function with the versions' differences as config flags:
//   all:     embeddings * sqrt(d_model) (cast to the compute dtype first, as HF does), (1 + w)
//            RMSNorm, GeGLU MLP, explicit head_dim;
//   Gemma 2: sandwich norms, scale query_pre_attn_scalar^-0.5, attention and final soft-caps,
//            sliding window on even layers;
//   Gemma 3: Gemma 2 plus per-head (1 + w) q/k norms before RoPE, and sliding layers rotating
//            with rope_local_base_freq and no rope_scaling (global layers use both).
//
// Capture points with sandwich norms: attn_out is the o_proj output (the sum of head_out, as in
// every family) and mlp_out the MLP's down-projection, both BEFORE their post-norms;
// resid_mid = resid_pre + post_attn_norm(attn_out) and resid_post = resid_mid + post_mlp_norm(mlp_out).
#include "families.h"

#include "blocks.h"

namespace hs {

at::Tensor forward_gemma(const blocks::Pass& p, const at::Tensor& tokens) {
    const Model& m = p.m;
    const ModelConfig& cfg = m.config;
    const ModelWeights& w = m.weights;
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = cfg.n_heads, K = cfg.n_kv_heads, d = cfg.d_head;
    const auto positions = blocks::positions_for(tokens, p.cache);
    auto rope_global = blocks::rope_tables(cfg, positions, cfg.rope_theta, m.options.dtype);
    auto rope_local = rope_global;
    if (cfg.rope_local_theta > 0) {  // Gemma 3: local layers use the default RoPE at their own base
        ModelConfig local = cfg;
        local.rope_scaling = RopeScaling{};
        rope_local = blocks::rope_tables(local, positions, cfg.rope_local_theta, m.options.dtype);
    }

    // normalizer = torch.tensor(hidden_size ** 0.5, dtype=hidden_states.dtype): rounded to bf16/fp16 too.
    auto normalizer = torch::scalar_tensor(cfg.embed_scale, w.embed.options());
    at::Tensor x = p.start([&] {  // [B, T, D]
        return w.embed.index_select(0, tokens.reshape(-1)).view({B, T, cfg.d_model}) * normalizer;
    });
    for (int l = p.first_layer(); l <= p.last_layer(); ++l) {
        const LayerWeights& lw = w.layers[l];
        const auto& rope = cfg.is_sliding(l) ? rope_local : rope_global;
        x = p.hook(Point::kResidPre, l, x);
        auto h = blocks::norm(cfg, x, lw.attn_norm_w, lw.attn_norm_b);
        auto q = p.linear(h, lw.wq, lw.bq).view({B, T, H, d});
        auto k = p.linear(h, lw.wk, lw.bk).view({B, T, K, d});
        auto v = p.linear(h, lw.wv, lw.bv).view({B, T, K, d});
        if (cfg.qk_norm) {  // Gemma 3: (1 + w) RMSNorm over each head's d dims, before RoPE
            q = blocks::rms_norm(q, lw.q_norm_w, cfg.norm_eps, true);
            k = blocks::rms_norm(k, lw.k_norm_w, cfg.norm_eps, true);
        }
        q = blocks::apply_rope(p.query_pre_rope(l, q), rope);
        k = blocks::apply_rope(k, rope);
        if (p.keys_only(l)) {  // a prefill's last layer: only its keys and values are read later
            p.keep_keys(l, k, v);
            break;
        }
        auto attn_out = p.attention(l, q, k, v);  // [B, T, D], soft-cap and window inside
        auto attn_add = cfg.sandwich_norm ? blocks::norm(cfg, attn_out, lw.post_attn_norm_w, {}) : attn_out;
        x = p.hook(Point::kResidMid, l, x + attn_add);
        auto mlp_out = p.hook(Point::kMlpOut, l, p.mlp(lw, blocks::norm(cfg, x, lw.mlp_norm_w, {})));
        auto mlp_add = cfg.sandwich_norm ? blocks::norm(cfg, mlp_out, lw.post_mlp_norm_w, {}) : mlp_out;
        x = p.hook(Point::kResidPost, l, x + mlp_add);
    }
    return p.finish(x);  // final norm, tied unembedding, final soft-cap (Gemma 2)
}

}  // namespace hs
