// GPT-NeoX / Pythia forward (transformers' modeling_gpt_neox.py, v4.50): LayerNorm, partial
// rotary (the first rotary_pct of each head's dims), exact GELU MLP, and usually the parallel
// residual x + attn(ln1(x)) + mlp(ln2(x)).
//
// Capture points with the parallel residual: the MLP reads ln2(resid_pre), not resid_mid.
// resid_mid is still reported as resid_pre + attn_out, so that resid_post = resid_mid + mlp_out
// holds as in every family; an edit at resid_mid changes what reaches resid_post but not the
// MLP's input. Without the parallel residual the block is the usual sequential one.
#include "families.h"

#include "blocks.h"

namespace hs {

at::Tensor forward_gpt_neox(const blocks::Pass& p, const at::Tensor& tokens) {
    const Model& m = p.m;
    const ModelConfig& cfg = m.config;
    const ModelWeights& w = m.weights;
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = cfg.n_heads, d = cfg.d_head;
    // rot_dim = int(d * rotary_pct); the remaining dims of q and k pass through unrotated.
    auto rope = blocks::rope_tables(cfg, blocks::positions_for(tokens, p.cache), cfg.rope_theta, m.options.dtype);

    at::Tensor x = p.start([&] { return w.embed.index_select(0, tokens.reshape(-1)).view({B, T, cfg.d_model}); });  // [B, T, D]
    for (int l = p.first_layer(); l <= p.last_layer(); ++l) {
        const LayerWeights& lw = w.layers[l];
        x = p.hook(Point::kResidPre, l, x);
        auto h = blocks::norm(cfg, x, lw.attn_norm_w, lw.attn_norm_b);
        auto q = blocks::apply_rope(p.query_pre_rope(l, p.linear(h, lw.wq, lw.bq).view({B, T, H, d})), rope);
        auto k = blocks::apply_rope(p.linear(h, lw.wk, lw.bk).view({B, T, H, d}), rope);
        auto v = p.linear(h, lw.wv, lw.bv).view({B, T, H, d});
        if (p.keys_only(l)) {  // a prefill's last layer: only its keys and values are read later
            p.keep_keys(l, k, v);
            break;
        }
        auto attn_out = p.attention(l, q, k, v);  // [B, T, D]
        auto mlp_in = cfg.parallel_residual ? x : at::Tensor();          // parallel: ln2 reads resid_pre
        x = p.hook(Point::kResidMid, l, x + attn_out);
        if (!cfg.parallel_residual) mlp_in = x;
        auto h2 = blocks::norm(cfg, mlp_in, lw.mlp_norm_w, lw.mlp_norm_b);
        auto mlp_out = p.hook(Point::kMlpOut, l, p.mlp(lw, h2));
        x = p.hook(Point::kResidPost, l, x + mlp_out);
    }
    return p.finish(x);
}

}  // namespace hs
