#include "registry.h"

namespace hs {

const std::vector<ArchSpec>& arch_specs() {
    static const std::vector<ArchSpec> kSpecs = {
        {"LlamaForCausalLM", Family::kLlama, parse_llama_config, load_llama_weights},
        {"MistralForCausalLM", Family::kLlama, parse_mistral_config, load_llama_weights},
        {"Qwen2ForCausalLM", Family::kLlama, parse_qwen2_config, load_llama_weights},
        {"Qwen3ForCausalLM", Family::kLlama, parse_qwen3_config, load_llama_weights},
        {"GPT2LMHeadModel", Family::kGpt2, parse_gpt2_config, load_gpt2_weights},
        {"GPTNeoXForCausalLM", Family::kGptNeoX, parse_gpt_neox_config, load_gpt_neox_weights},
        {"GemmaForCausalLM", Family::kGemma, parse_gemma_config, load_gemma_weights},
        {"Gemma2ForCausalLM", Family::kGemma, parse_gemma2_config, load_gemma_weights},
        {"Gemma3ForCausalLM", Family::kGemma, parse_gemma3_config, load_gemma_weights},
        {"Olmo2ForCausalLM", Family::kOlmo2, parse_olmo2_config, load_olmo2_weights},
    };
    return kSpecs;
}

const ArchSpec* find_arch(const std::string& architecture) {
    for (const auto& s : arch_specs())
        if (s.architecture == architecture) return &s;
    return nullptr;
}

}  // namespace hs
