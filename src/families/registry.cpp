#include "registry.h"

namespace hs {

const std::vector<ArchSpec>& arch_specs() {
    static const std::vector<ArchSpec> kSpecs = {
        {"LlamaForCausalLM", Family::kLlama, parse_llama_config, load_llama_weights},
        {"MistralForCausalLM", Family::kLlama, parse_mistral_config, load_llama_weights},
        {"Qwen2ForCausalLM", Family::kLlama, parse_qwen2_config, load_llama_weights},
        {"Qwen3ForCausalLM", Family::kLlama, parse_qwen3_config, load_llama_weights},
    };
    return kSpecs;
}

const ArchSpec* find_arch(const std::string& architecture) {
    for (const auto& s : arch_specs())
        if (s.architecture == architecture) return &s;
    return nullptr;
}

}  // namespace hs
