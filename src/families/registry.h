// Architectures as data: each entry names the config.json architecture, fills ModelConfig from
// config.json, loads the canonical weights, and runs the family forward.
#pragma once

#include "../weight_source.h"

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

}  // namespace hs
