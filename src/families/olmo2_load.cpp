// config.json and tensor names for OLMo-2 (transformers' configuration_olmo2.py defaults and
// modeling_olmo2.py, v4.50): Llama's keys and projections, but norms only after attention and
// MLP, and q_norm / k_norm over the whole q and k projections.
#include "json_get.h"
#include "registry.h"

namespace hs {

using cfgjson::get_or;

void parse_olmo2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    parse_llama_config(j, where, cfg);  // sizes, rope_theta, rope_scaling (with its refusals), biases
    cfg.family = Family::kOlmo2;
    cfg.norm_eps = get_or<double>(j, "rms_norm_eps", 1e-5, where);
    cfg.post_norm_only = true;
    cfg.qk_norm_full = true;
}

void load_olmo2_weights(const WeightSource& src, Model& m) {
    const ModelConfig& c = m.config;
    const int64_t D = c.d_model, V = c.vocab_size, Q = c.d_q(), KV = c.d_kv();
    auto& w = m.weights;
    w.embed = src.take("model.embed_tokens.weight", {V, D});
    w.unembed = c.tie_embeddings && !src.has("lm_head.weight") ? w.embed : src.take("lm_head.weight", {V, D});
    w.final_norm_w = src.take("model.norm.weight", {D});
    w.layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
        auto& lw = w.layers[l];
        const std::string p = fmt::format("model.layers.{}.", l);
        take_llama_attention(src, p, c, lw);
        lw.q_norm_w = src.take(p + "self_attn.q_norm.weight", {Q});   // over all heads together
        lw.k_norm_w = src.take(p + "self_attn.k_norm.weight", {KV});
        lw.post_attn_norm_w = src.take(p + "post_attention_layernorm.weight", {D});
        lw.post_mlp_norm_w = src.take(p + "post_feedforward_layernorm.weight", {D});
        take_gated_mlp(src, p, c, lw);
    }
}

}  // namespace hs
