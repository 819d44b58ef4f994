#include "config.h"

#include "errors.h"

#include <fmt/format.h>

namespace hs {

std::string family_name(Family f) {
    switch (f) {
        case Family::kLlama: return "llama";
        case Family::kGpt2: return "gpt2";
        case Family::kGptNeoX: return "gpt_neox";
        case Family::kGemma: return "gemma";
        case Family::kOlmo2: return "olmo2";
    }
    return "?";
}

void ModelConfig::validate(const std::string& where) const {
    auto need = [&](bool ok, const std::string& what) {
        if (!ok) throw ConfigError(fmt::format("{}: {}", where, what));
    };
    need(n_layers > 0, fmt::format("num_hidden_layers must be positive (got {})", n_layers));
    need(n_heads > 0, fmt::format("num_attention_heads must be positive (got {})", n_heads));
    need(n_kv_heads > 0, fmt::format("num_key_value_heads must be positive (got {})", n_kv_heads));
    need(n_heads % n_kv_heads == 0,
         fmt::format("num_attention_heads {} not divisible by num_key_value_heads {}", n_heads, n_kv_heads));
    need(d_model > 0, fmt::format("hidden_size must be positive (got {})", d_model));
    need(d_head > 0, fmt::format("head dim must be positive (hidden_size {} / heads {})", d_model, n_heads));
    need(d_head % 2 == 0 || family == Family::kGpt2, fmt::format("head dim {} must be even for RoPE", d_head));
    need(static_cast<int64_t>(n_heads) * d_head <= (1 << 30) && static_cast<int64_t>(n_kv_heads) * d_head <= (1 << 30),
         fmt::format("heads x head dim ({} x {}) is out of range", n_heads, d_head));
    need(d_ff > 0, fmt::format("intermediate_size must be positive (got {})", d_ff));
    need(vocab_size > 0, fmt::format("vocab_size must be positive (got {})", vocab_size));
    need(max_seq_len > 0, fmt::format("max_position_embeddings must be positive (got {})", max_seq_len));
    need(norm_eps > 0, "norm epsilon must be positive");
    need(rope_theta > 0, "rope_theta must be positive");
    need(layer_sliding.empty() || static_cast<int>(layer_sliding.size()) == n_layers,
         "per-layer sliding-window list does not match num_hidden_layers");
}

}  // namespace hs
