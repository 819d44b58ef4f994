// config.json and tensor names for GPT-NeoX / Pythia (transformers' configuration_gpt_neox.py
// defaults and modeling_gpt_neox.py, v4.50). query_key_value is fused per head: its output rows
// are [H, 3, d] (head h's q, then its k, then its v), not [3, H, d] as in GPT-2's c_attn.
#include "json_get.h"
#include "registry.h"

#include <torch/torch.h>

namespace hs {

using cfgjson::get;
using cfgjson::get_or;

void parse_gpt_neox_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    // The shared keys (sizes, hidden_act, rope_scaling with its refusals) read as for Llama.
    parse_llama_config(j, where, cfg);
    cfg.family = Family::kGptNeoX;
    cfg.n_kv_heads = cfg.n_heads;
    cfg.d_head = cfg.n_heads > 0 ? cfg.d_model / cfg.n_heads : 0;
    cfg.act = j.contains("hidden_act") ? cfg.act : Activation::kGeluExact;  // default "gelu"
    cfg.norm = NormKind::kLayerNorm;
    cfg.norm_eps = get_or<double>(j, "layer_norm_eps", 1e-5, where);
    cfg.gated_mlp = false;
    cfg.attention_bias = cfg.attn_out_bias = get_or<bool>(j, "attention_bias", true, where);
    cfg.mlp_bias = true;
    cfg.rotary_pct = get_or<double>(j, "rotary_pct", 0.25, where);
    if (cfg.rotary_pct < 0 || cfg.rotary_pct > 1)
        throw ConfigError(fmt::format("{}: rotary_pct {} is outside [0, 1]", where, cfg.rotary_pct));
    // Older configs name the base rotary_emb_base; newer ones also write rope_theta.
    cfg.rope_theta = get_or<double>(j, "rotary_emb_base", get_or<double>(j, "rope_theta", 10000.0, where), where);
    cfg.parallel_residual = get_or<bool>(j, "use_parallel_residual", true, where);
    cfg.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false, where);
    cfg.max_seq_len = get_or<int>(j, "max_position_embeddings", 2048, where);
}

void load_gpt_neox_weights(const WeightSource& src, Model& m) {
    const ModelConfig& c = m.config;
    const int64_t D = c.d_model, V = c.vocab_size, F = c.d_ff, H = c.n_heads, d = c.d_head;
    auto& w = m.weights;
    w.embed = src.take("gpt_neox.embed_in.weight", {V, D});
    w.unembed = c.tie_embeddings && !src.has("embed_out.weight") ? w.embed : src.take("embed_out.weight", {V, D});
    w.final_norm_w = src.take("gpt_neox.final_layer_norm.weight", {D});
    w.final_norm_b = src.take("gpt_neox.final_layer_norm.bias", {D});
    w.layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
        auto& lw = w.layers[l];
        const std::string p = fmt::format("gpt_neox.layers.{}.", l);
        lw.attn_norm_w = src.take(p + "input_layernorm.weight", {D});
        lw.attn_norm_b = src.take(p + "input_layernorm.bias", {D});
        auto qkv = src.take(p + "attention.query_key_value.weight", {3 * D, D}).view({H, 3, d, D});
        lw.wq = qkv.select(1, 0).reshape({H * d, D}).contiguous();
        lw.wk = qkv.select(1, 1).reshape({H * d, D}).contiguous();
        lw.wv = qkv.select(1, 2).reshape({H * d, D}).contiguous();
        lw.wo = src.take(p + "attention.dense.weight", {D, D});
        if (c.attention_bias) {
            auto qkv_b = src.take(p + "attention.query_key_value.bias", {3 * D}).view({H, 3, d});
            lw.bq = qkv_b.select(1, 0).reshape({H * d}).contiguous();
            lw.bk = qkv_b.select(1, 1).reshape({H * d}).contiguous();
            lw.bv = qkv_b.select(1, 2).reshape({H * d}).contiguous();
            lw.bo = src.take(p + "attention.dense.bias", {D});
        }
        lw.mlp_norm_w = src.take(p + "post_attention_layernorm.weight", {D});
        lw.mlp_norm_b = src.take(p + "post_attention_layernorm.bias", {D});
        lw.w_up = src.take(p + "mlp.dense_h_to_4h.weight", {F, D});
        lw.b_up = src.take(p + "mlp.dense_h_to_4h.bias", {F});
        lw.w_down = src.take(p + "mlp.dense_4h_to_h.weight", {D, F});
        lw.b_down = src.take(p + "mlp.dense_4h_to_h.bias", {D});
    }
}

}  // namespace hs
