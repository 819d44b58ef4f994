// config.json and tensor names for the Llama family (transformers' configuration_llama.py,
// configuration_mistral.py, configuration_qwen2.py, configuration_qwen3.py defaults).
#include "json_get.h"
#include "registry.h"

namespace hs {

using cfgjson::get;
using cfgjson::get_or;

static void parse_rope_scaling(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return;
    const auto& rs = j["rope_scaling"];
    if (!rs.is_object()) throw ConfigError(fmt::format("{}: \"rope_scaling\" is not an object", where));
    std::string type = rs.contains("rope_type") ? get<std::string>(rs, "rope_type", where)
                                                : get_or<std::string>(rs, "type", "default", where);
    if (type == "default") return;
    if (type != "linear" && type != "llama3")
        throw ConfigError(fmt::format("{}: rope_scaling type '{}' is not implemented (supported: linear, llama3)",
                                      where, type));
    cfg.rope_scaling.type = type;
    cfg.rope_scaling.factor = get<double>(rs, "factor", where);
    if (type == "llama3") {
        cfg.rope_scaling.low_freq_factor = get<double>(rs, "low_freq_factor", where);
        cfg.rope_scaling.high_freq_factor = get<double>(rs, "high_freq_factor", where);
        cfg.rope_scaling.original_max_position = get<double>(rs, "original_max_position_embeddings", where);
    }
}

static Activation parse_act(const std::string& act, const std::string& where) {
    if (act == "silu" || act == "swish") return Activation::kSilu;
    if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast") return Activation::kGeluTanh;
    if (act == "gelu") return Activation::kGeluExact;
    if (act == "relu") return Activation::kRelu;
    throw ConfigError(fmt::format("{}: hidden_act '{}' is not implemented", where, act));
}

void parse_llama_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    cfg.family = Family::kLlama;
    cfg.d_model = get<int>(j, "hidden_size", where);
    cfg.n_layers = get<int>(j, "num_hidden_layers", where);
    cfg.n_heads = get<int>(j, "num_attention_heads", where);
    cfg.n_kv_heads = get_or<int>(j, "num_key_value_heads", cfg.n_heads, where);
    if (cfg.n_heads > 0 && cfg.d_model % cfg.n_heads != 0 && !j.contains("head_dim"))
        throw ConfigError(fmt::format("{}: hidden_size {} is not divisible by num_attention_heads {}", where,
                                      cfg.d_model, cfg.n_heads));
    cfg.d_head = get_or<int>(j, "head_dim", cfg.n_heads > 0 ? cfg.d_model / cfg.n_heads : 0, where);
    cfg.d_ff = get<int>(j, "intermediate_size", where);
    cfg.vocab_size = get<int>(j, "vocab_size", where);
    cfg.max_seq_len = get_or<int>(j, "max_position_embeddings", 2048, where);
    cfg.norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, where);
    cfg.rope_theta = get_or<double>(j, "rope_theta", 10000.0, where);
    cfg.attention_bias = get_or<bool>(j, "attention_bias", false, where);
    cfg.attn_out_bias = cfg.attention_bias;
    cfg.mlp_bias = get_or<bool>(j, "mlp_bias", false, where);
    cfg.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false, where);
    cfg.act = parse_act(get_or<std::string>(j, "hidden_act", "silu", where), where);
    cfg.bos_id = get_or<int>(j, "bos_token_id", -1, where);
    cfg.eos_id = j.contains("eos_token_id") && j["eos_token_id"].is_number_integer() ? j["eos_token_id"].get<int>() : -1;
    parse_rope_scaling(j, where, cfg);
    if (get_or<int>(j, "pretraining_tp", 1, where) != 1) {
        // pretraining_tp > 1 only changes how HF splits the matmuls; the function is the same.
    }
}

void parse_mistral_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    parse_llama_config(j, where, cfg);
    cfg.sliding_window = get_or<int>(j, "sliding_window", 0, where);
}

void parse_qwen2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    parse_llama_config(j, where, cfg);
    cfg.attention_bias = true;  // Qwen2 always has q/k/v biases and no o_proj bias
    cfg.attn_out_bias = false;
    if (get_or<bool>(j, "use_sliding_window", false, where)) {
        cfg.sliding_window = get<int>(j, "sliding_window", where);
        const int max_window_layers = get_or<int>(j, "max_window_layers", cfg.n_layers, where);
        cfg.layer_sliding.assign(cfg.n_layers, false);
        for (int l = max_window_layers; l < cfg.n_layers; ++l) cfg.layer_sliding[l] = true;
    }
}

void parse_qwen3_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    parse_qwen2_config(j, where, cfg);
    cfg.attention_bias = get_or<bool>(j, "attention_bias", false, where);
    cfg.attn_out_bias = cfg.attention_bias;
    cfg.qk_norm = true;
}

void take_llama_attention(const WeightSource& src, const std::string& p, const ModelConfig& c, LayerWeights& lw) {
    const int64_t D = c.d_model, Q = c.d_q(), KV = c.d_kv();
    lw.wq = src.take(p + "self_attn.q_proj.weight", {Q, D});
    lw.wk = src.take(p + "self_attn.k_proj.weight", {KV, D});
    lw.wv = src.take(p + "self_attn.v_proj.weight", {KV, D});
    lw.wo = src.take(p + "self_attn.o_proj.weight", {D, Q});
    if (c.attention_bias) {
        lw.bq = src.take(p + "self_attn.q_proj.bias", {Q});
        lw.bk = src.take(p + "self_attn.k_proj.bias", {KV});
        lw.bv = src.take(p + "self_attn.v_proj.bias", {KV});
    }
    if (c.attn_out_bias) lw.bo = src.take(p + "self_attn.o_proj.bias", {D});
}

void take_gated_mlp(const WeightSource& src, const std::string& p, const ModelConfig& c, LayerWeights& lw) {
    const int64_t D = c.d_model, F = c.d_ff;
    lw.w_gate = src.take(p + "mlp.gate_proj.weight", {F, D});
    lw.w_up = src.take(p + "mlp.up_proj.weight", {F, D});
    lw.w_down = src.take(p + "mlp.down_proj.weight", {D, F});
    if (c.mlp_bias) {
        lw.b_gate = src.take(p + "mlp.gate_proj.bias", {F});
        lw.b_up = src.take(p + "mlp.up_proj.bias", {F});
        lw.b_down = src.take(p + "mlp.down_proj.bias", {D});
    }
}

void load_llama_weights(const WeightSource& src, Model& m) {
    const ModelConfig& c = m.config;
    const int64_t D = c.d_model, V = c.vocab_size;
    auto& w = m.weights;
    // Tied checkpoints may store either name (tinystories-656k stores only lm_head.weight).
    const bool has_embed = src.has("model.embed_tokens.weight");
    const bool has_head = src.has("lm_head.weight");
    w.embed = src.take(has_embed || !has_head ? "model.embed_tokens.weight" : "lm_head.weight", {V, D});
    if (has_head && !has_embed)
        w.unembed = w.embed;  // one stored tensor serves both
    else if (has_head)
        w.unembed = src.take("lm_head.weight", {V, D});
    else if (c.tie_embeddings)
        w.unembed = w.embed;
    else
        w.unembed = src.take("lm_head.weight", {V, D});  // throws: missing and not tied
    w.final_norm_w = src.take("model.norm.weight", {D});
    w.layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
        auto& lw = w.layers[l];
        const std::string p = fmt::format("model.layers.{}.", l);
        lw.attn_norm_w = src.take(p + "input_layernorm.weight", {D});
        take_llama_attention(src, p, c, lw);
        if (c.qk_norm) {
            lw.q_norm_w = src.take(p + "self_attn.q_norm.weight", {c.d_head});
            lw.k_norm_w = src.take(p + "self_attn.k_norm.weight", {c.d_head});
        }
        lw.mlp_norm_w = src.take(p + "post_attention_layernorm.weight", {D});
        take_gated_mlp(src, p, c, lw);
    }
}

}  // namespace hs
