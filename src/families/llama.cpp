// Llama-family forward (Hugging Face modeling_llama.py / modeling_mistral.py / modeling_qwen2.py /
// modeling_qwen3.py; llama2.c run.c): pre-norm RMSNorm blocks, RoPE on q and k, gated SiLU MLP.
#include "families.h"

#include "blocks.h"

namespace hs {

at::Tensor forward_llama(const blocks::Pass& p, const at::Tensor& tokens) {
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
        auto h = blocks::norm(cfg, x, lw.attn_norm_w, lw.attn_norm_b);
        auto q = p.linear(h, lw.wq, lw.bq).view({B, T, H, d});
        auto k = p.linear(h, lw.wk, lw.bk).view({B, T, K, d});
        auto v = p.linear(h, lw.wv, lw.bv).view({B, T, K, d});
        if (cfg.qk_norm) {  // Qwen3: RMSNorm over each head's d dims, before RoPE
            q = blocks::rms_norm(q, lw.q_norm_w, cfg.norm_eps, false);
            k = blocks::rms_norm(k, lw.k_norm_w, cfg.norm_eps, false);
        }
        q = blocks::apply_rope(p.query_pre_rope(l, q), rope);
        k = blocks::apply_rope(k, rope);
        if (p.keys_only(l)) {  // a prefill's last layer: only its keys and values are read later
            p.keep_keys(l, k, v);
            break;
        }
        auto attn_out = p.attention(l, q, k, v);  // [B, T, D]
        x = p.hook(Point::kResidMid, l, x + attn_out);
        if (p.opts.attention_only) continue;  // its MLP adds exactly 0 (Model::forward checked)
        auto mlp_out = p.hook(Point::kMlpOut, l, p.mlp(lw, blocks::norm(cfg, x, lw.mlp_norm_w, lw.mlp_norm_b)));
        x = p.hook(Point::kResidPost, l, x + mlp_out);
    }
    return p.finish(x);
}

}  // namespace hs
