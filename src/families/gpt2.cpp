// GPT-2 forward (transformers' modeling_gpt2.py, v4.50): token plus learned position embeddings,
// pre-LayerNorm blocks, no RoPE, unfused per-head attention, gelu_new MLP, tied unembedding.
#include "families.h"

#include "blocks.h"

namespace hs {

at::Tensor forward_gpt2(const blocks::Pass& p, const at::Tensor& tokens) {
    const Model& m = p.m;
    const ModelConfig& cfg = m.config;
    const ModelWeights& w = m.weights;
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = cfg.n_heads, d = cfg.d_head;
    // Absolute positions continue from the cache; Model::forward has checked them < n_positions.
    auto positions = blocks::positions_for(tokens, p.cache);  // [T], or [B, T] for ragged rows
    at::Tensor x = p.start([&] {  // [B, T, D]: token + learned position embeddings
        return w.embed.index_select(0, tokens.reshape(-1)).view({B, T, cfg.d_model}) +
               w.pos_embed.index_select(0, positions.reshape(-1)).view({positions.dim() == 2 ? B : 1, T, cfg.d_model});
    });
    for (int l = p.first_layer(); l <= p.last_layer(); ++l) {
        const LayerWeights& lw = w.layers[l];
        x = p.hook(Point::kResidPre, l, x);
        auto h = blocks::norm(cfg, x, lw.attn_norm_w, lw.attn_norm_b);
        auto q = p.query_pre_rope(l, p.linear(h, lw.wq, lw.bq).view({B, T, H, d}));  // c_attn's q third (no RoPE)
        auto k = p.linear(h, lw.wk, lw.bk).view({B, T, H, d});
        auto v = p.linear(h, lw.wv, lw.bv).view({B, T, H, d});
        if (p.keys_only(l)) {  // a prefill's last layer: only its keys and values are read later
            p.keep_keys(l, k, v);
            break;
        }
        auto attn_out = p.attention(l, q, k, v);  // [B, T, D]
        x = p.hook(Point::kResidMid, l, x + attn_out);
        auto h2 = blocks::norm(cfg, x, lw.mlp_norm_w, lw.mlp_norm_b);
        auto mlp_out = p.hook(Point::kMlpOut, l, p.mlp(lw, h2));  // c_fc, gelu_new, c_proj
        x = p.hook(Point::kResidPost, l, x + mlp_out);
    }
    return p.finish(x);
}

}  // namespace hs
