// Llama-family forward (Hugging Face modeling_llama.py / modeling_mistral.py / modeling_qwen2.py /
// modeling_qwen3.py; llama2.c run.c): pre-norm RMSNorm blocks, RoPE on q and k, gated SiLU MLP.
#include "families.h"

#include "../blocks.h"

namespace hs {

at::Tensor forward_llama(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
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
        auto h = blocks::norm(cfg, x, lw.attn_norm_w, lw.attn_norm_b);
        auto q = blocks::linear(h, lw.wq, lw.bq).view({B, T, H, d});
        auto k = blocks::linear(h, lw.wk, lw.bk).view({B, T, K, d});
        auto v = blocks::linear(h, lw.wv, lw.bv).view({B, T, K, d});
        if (cfg.qk_norm) {  // Qwen3: RMSNorm over each head's d dims, before RoPE
            q = blocks::rms_norm(q, lw.q_norm_w, cfg.norm_eps, false);
            k = blocks::rms_norm(k, lw.k_norm_w, cfg.norm_eps, false);
        }
        q = blocks::apply_rope(blocks::query_pre_rope(hooks, l, q), rope);
        k = blocks::apply_rope(k, rope);
        auto attn_out = blocks::attention(m, l, q, k, v, hooks, cache);  // [B, T, D]
        x = hook(hooks, Point::kResidMid, l, x + attn_out);
        auto mlp_out = hook(hooks, Point::kMlpOut, l, blocks::mlp(cfg, lw, blocks::norm(cfg, x, lw.mlp_norm_w, lw.mlp_norm_b)));
        x = hook(hooks, Point::kResidPost, l, x + mlp_out);
    }
    if (!opts.compute_logits || opts.stop_after_layer >= 0) return {};
    return m.unembed(x);
}

}  // namespace hs
