// GPT-NeoX / Pythia forward (transformers' modeling_gpt_neox.py, v4.50): LayerNorm, partial
// rotary (the first rotary_pct of each head's dims), exact GELU MLP, and usually the parallel
// residual x + attn(ln1(x)) + mlp(ln2(x)).
//
// Capture points with the parallel residual: the MLP reads ln2(resid_pre), not resid_mid.
// resid_mid is still reported as resid_pre + attn_out, so that resid_post = resid_mid + mlp_out
// holds as in every family; an edit at resid_mid changes what reaches resid_post but not the
// MLP's input. Without the parallel residual the block is the usual sequential one.
#include "families.h"

#include "../blocks.h"

namespace hs {

at::Tensor forward_gpt_neox(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                            const ForwardOptions& opts) {
    using blocks::hook;
    const ModelConfig& cfg = m.config;
    const ModelWeights& w = m.weights;
    const int64_t B = tokens.size(0), T = tokens.size(1);
    const int64_t H = cfg.n_heads, d = cfg.d_head;
    // rot_dim = int(d * rotary_pct); the remaining dims of q and k pass through unrotated.
    auto rope = blocks::rope_tables(cfg, blocks::positions_for(tokens, cache), cfg.rope_theta, m.options.dtype);

    at::Tensor x = opts.start_layer > 0 ? opts.start_resid
                                        : w.embed.index_select(0, tokens.reshape(-1)).view({B, T, cfg.d_model});  // [B, T, D]
    const int last = opts.stop_after_layer >= 0 ? opts.stop_after_layer : cfg.n_layers - 1;
    for (int l = opts.start_layer; l <= last; ++l) {
        const LayerWeights& lw = w.layers[l];
        x = hook(hooks, Point::kResidPre, l, x);
        auto h = blocks::norm(cfg, x, lw.attn_norm_w, lw.attn_norm_b);
        auto q = blocks::apply_rope(blocks::query_pre_rope(hooks, l, blocks::linear(h, lw.wq, lw.bq).view({B, T, H, d})), rope);
        auto k = blocks::apply_rope(blocks::linear(h, lw.wk, lw.bk).view({B, T, H, d}), rope);
        auto v = blocks::linear(h, lw.wv, lw.bv).view({B, T, H, d});
        auto attn_out = blocks::attention(m, l, q, k, v, hooks, cache);  // [B, T, D]
        auto mlp_in = cfg.parallel_residual ? x : at::Tensor();          // parallel: ln2 reads resid_pre
        x = hook(hooks, Point::kResidMid, l, x + attn_out);
        if (!cfg.parallel_residual) mlp_in = x;
        auto h2 = blocks::norm(cfg, mlp_in, lw.mlp_norm_w, lw.mlp_norm_b);
        auto mlp_out = hook(hooks, Point::kMlpOut, l, blocks::mlp(cfg, lw, h2));
        x = hook(hooks, Point::kResidPost, l, x + mlp_out);
    }
    if (!opts.compute_logits || opts.stop_after_layer >= 0) return {};
    return m.unembed(x);
}

}  // namespace hs
