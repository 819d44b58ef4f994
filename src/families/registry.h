// Architectures as data: each entry names the config.json architecture, fills ModelConfig from
// config.json and loads the canonical weights. The forward is not here: Model::forward
// (src/model/model.cpp) picks the family's forward (families.h) by a switch on ModelConfig::family.
#pragma once

#include "weight_source.h"

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace hs {

struct ArchSpec {
    std::string architecture;  // config.json "architectures"[0]
    Family family;
    // Fills cfg from config.json (where = file name for messages); throws ConfigError on an
    // unsupported feature rather than ignoring it.
    void (*parse_config)(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
    void (*load_weights)(const WeightSource& src, Model& m);
};

const std::vector<ArchSpec>& arch_specs();
const ArchSpec* find_arch(const std::string& architecture);

// Llama family: Llama, Mistral, Qwen2, Qwen3.
void parse_llama_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void parse_mistral_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void parse_qwen2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void parse_qwen3_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void load_llama_weights(const WeightSource& src, Model& m);
// Llama-style per-layer tensors under prefix p ("model.layers.3."), shared by the Llama, Gemma
// and OLMo-2 loaders: q/k/v/o_proj with the biases the config asks for (attention_bias: q, k, v;
// attn_out_bias: o), and the gated MLP's gate/up/down_proj (with mlp_bias).
void take_llama_attention(const WeightSource& src, const std::string& p, const ModelConfig& c, LayerWeights& lw);
void take_gated_mlp(const WeightSource& src, const std::string& p, const ModelConfig& c, LayerWeights& lw);

// GPT-2 (gpt2_load.cpp).
void parse_gpt2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void load_gpt2_weights(const WeightSource& src, Model& m);

// GPT-NeoX / Pythia (gpt_neox_load.cpp).
void parse_gpt_neox_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void load_gpt_neox_weights(const WeightSource& src, Model& m);

// Gemma, Gemma 2, Gemma 3 text (gemma_load.cpp): one weight loader, flags from the config.
void parse_gemma_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void parse_gemma2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void parse_gemma3_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void load_gemma_weights(const WeightSource& src, Model& m);

// OLMo-2 (olmo2_load.cpp).
void parse_olmo2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg);
void load_olmo2_weights(const WeightSource& src, Model& m);

}  // namespace hs
