// config.json and tensor names for Gemma, Gemma 2 and Gemma 3 text models (transformers'
// configuration_gemma.py, configuration_gemma2.py, configuration_gemma3.py defaults and the
// matching modeling files, v4.50). All three: (1 + w) RMSNorm with w stored, embeddings scaled
// by sqrt(hidden_size), GeGLU MLP, explicit head_dim, tied unembedding.
#include "json_get.h"
#include "registry.h"

#include <cmath>

namespace hs {

using cfgjson::get;
using cfgjson::get_or;

// The keys the three versions share. Gemma 1 configs say hidden_act "gelu" but transformers runs
// hidden_activation (default gelu_pytorch_tanh): the exact GELU was a bug in the first release.
static void parse_gemma_common(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    parse_llama_config(j, where, cfg);  // sizes, eps, rope_theta, rope_scaling (with its refusals)
    cfg.family = Family::kGemma;
    cfg.d_head = get_or<int>(j, "head_dim", 256, where);
    cfg.norm = NormKind::kRmsPlusOne;
    const std::string act = get_or<std::string>(j, "hidden_activation", "gelu_pytorch_tanh", where);
    if (act == "gelu_pytorch_tanh" || act == "gelu_new" || act == "gelu_fast")
        cfg.act = Activation::kGeluTanh;
    else if (act == "gelu")
        cfg.act = Activation::kGeluExact;
    else
        throw ConfigError(fmt::format("{}: hidden_activation '{}' is not implemented", where, act));
    cfg.gated_mlp = true;
    cfg.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", true, where);
    cfg.embed_scale = std::sqrt(static_cast<double>(cfg.d_model));
    cfg.max_seq_len = get_or<int>(j, "max_position_embeddings", 8192, where);
}

// A soft-cap key: absent means the transformers default, null (or 0) means off.
static double softcap(const nlohmann::json& j, const char* key, double fallback, const std::string& where) {
    if (!j.contains(key)) return fallback;
    if (j[key].is_null()) return 0.0;
    const double v = get<double>(j, key, where);
    if (v < 0) throw ConfigError(fmt::format("{}: \"{}\" must be positive (got {})", where, key, v));
    return v;
}

// layer_types (newer configs) wins over the version's rule: true where the layer slides.
static bool read_layer_types(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    if (!j.contains("layer_types") || j["layer_types"].is_null()) return false;
    const auto& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int>(lt.size()) != cfg.n_layers)
        throw ConfigError(fmt::format("{}: \"layer_types\" must list one type per layer", where));
    cfg.layer_sliding.clear();
    for (const auto& t : lt) {
        const std::string s = t.is_string() ? t.get<std::string>() : "";
        if (s != "sliding_attention" && s != "full_attention")
            throw ConfigError(fmt::format("{}: layer type '{}' is not implemented", where, s));
        cfg.layer_sliding.push_back(s == "sliding_attention");
    }
    return true;
}

void parse_gemma_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    parse_gemma_common(j, where, cfg);
}

void parse_gemma2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    parse_gemma_common(j, where, cfg);
    cfg.sandwich_norm = true;
    cfg.attn_scale = 1.0 / std::sqrt(get_or<double>(j, "query_pre_attn_scalar", 256.0, where));
    cfg.attn_softcap = softcap(j, "attn_logit_softcapping", 50.0, where);
    cfg.final_softcap = softcap(j, "final_logit_softcapping", 30.0, where);
    cfg.sliding_window = get_or<int>(j, "sliding_window", 4096, where);
    if (!read_layer_types(j, where, cfg)) {
        cfg.layer_sliding.assign(cfg.n_layers, false);
        for (int l = 0; l < cfg.n_layers; l += 2) cfg.layer_sliding[l] = true;  // is_sliding = not layer_idx % 2
    }
}

void parse_gemma3_config(const nlohmann::json& j_top, const std::string& where, ModelConfig& cfg) {
    // A Gemma3ForCausalLM config may nest the text model's keys under text_config.
    const bool nested = j_top.contains("text_config") && j_top["text_config"].is_object();
    const nlohmann::json& j = nested ? j_top["text_config"] : j_top;
    parse_gemma_common(j, where, cfg);
    cfg.sandwich_norm = true;
    cfg.qk_norm = true;
    cfg.attn_scale = 1.0 / std::sqrt(get_or<double>(j, "query_pre_attn_scalar", 256.0, where));
    cfg.attn_softcap = softcap(j, "attn_logit_softcapping", 0.0, where);
    cfg.final_softcap = softcap(j, "final_logit_softcapping", 0.0, where);
    cfg.rope_theta = get_or<double>(j, "rope_theta", 1e6, where);
    cfg.rope_local_theta = get_or<double>(j, "rope_local_base_freq", 10000.0, where);
    cfg.max_seq_len = get_or<int>(j, "max_position_embeddings", 131072, where);
    cfg.sliding_window = get_or<int>(j, "sliding_window", 4096, where);
    if (!read_layer_types(j, where, cfg)) {
        const int pattern = get_or<int>(j, "sliding_window_pattern", 6, where);
        if (pattern <= 0) throw ConfigError(fmt::format("{}: sliding_window_pattern must be positive", where));
        cfg.layer_sliding.assign(cfg.n_layers, false);
        for (int l = 0; l < cfg.n_layers; ++l) cfg.layer_sliding[l] = (l + 1) % pattern != 0;
    }
}

void load_gemma_weights(const WeightSource& src, Model& m) {
    const ModelConfig& c = m.config;
    const int64_t D = c.d_model, V = c.vocab_size;
    // Multimodal Gemma 3 checkpoints keep the text model under language_model.
    const std::string pre = !src.has("model.embed_tokens.weight") && src.has("language_model.model.embed_tokens.weight")
                                ? "language_model.model." : "model.";
    auto& w = m.weights;
    w.embed = src.take(pre + "embed_tokens.weight", {V, D});
    w.unembed = c.tie_embeddings && !src.has("lm_head.weight") ? w.embed : src.take("lm_head.weight", {V, D});
    w.final_norm_w = src.take(pre + "norm.weight", {D});
    w.layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
        auto& lw = w.layers[l];
        const std::string p = fmt::format("{}layers.{}.", pre, l);
        lw.attn_norm_w = src.take(p + "input_layernorm.weight", {D});
        take_llama_attention(src, p, c, lw);
        if (c.qk_norm) {
            lw.q_norm_w = src.take(p + "self_attn.q_norm.weight", {c.d_head});
            lw.k_norm_w = src.take(p + "self_attn.k_norm.weight", {c.d_head});
        }
        if (c.sandwich_norm) {  // Gemma 2/3: post_attention_layernorm normalises the attention output
            lw.post_attn_norm_w = src.take(p + "post_attention_layernorm.weight", {D});
            lw.mlp_norm_w = src.take(p + "pre_feedforward_layernorm.weight", {D});
            lw.post_mlp_norm_w = src.take(p + "post_feedforward_layernorm.weight", {D});
        } else {                // Gemma 1: post_attention_layernorm is the pre-MLP norm
            lw.mlp_norm_w = src.take(p + "post_attention_layernorm.weight", {D});
        }
        take_gated_mlp(src, p, c, lw);
    }
}

}  // namespace hs
