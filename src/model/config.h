// ModelConfig: one flat description of an architecture, filled by one validating loader per
// source format (Hugging Face config.json, llama2.c header). Families read flags, never strings.
#pragma once

#include <string>
#include <vector>

namespace hs {

enum class Family { kLlama, kGpt2, kGptNeoX, kGemma, kOlmo2 };
enum class NormKind { kRms, kRmsPlusOne, kLayerNorm };  // RmsPlusOne: Gemma's x * (1 + w)
enum class Activation { kSilu, kGeluTanh, kGeluExact, kRelu };

struct RopeScaling {
    std::string type = "none";  // none | linear | llama3 | factors
    std::vector<double> freq_factors;  // factors: inv_freq[i] / freq_factors[i] (a GGUF's rope_freqs)
    double factor = 1.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    double original_max_position = 8192;
};

struct ModelConfig {
    std::string architecture;  // as named in config.json "architectures", or "llama2c"
    Family family = Family::kLlama;
    int n_layers = 0;
    int n_heads = 0;
    int n_kv_heads = 0;
    int d_model = 0;
    int d_head = 0;
    int d_ff = 0;
    int vocab_size = 0;
    int max_seq_len = 0;
    double norm_eps = 1e-5;
    NormKind norm = NormKind::kRms;
    Activation act = Activation::kSilu;
    bool gated_mlp = true;         // down(act(gate x) * up x) vs down(act(up x))
    bool attention_bias = false;   // q/k/v biases
    bool attn_out_bias = false;    // o_proj bias
    bool mlp_bias = false;
    bool tie_embeddings = false;
    bool qk_norm = false;          // per-head RMSNorm on q and k before RoPE (Qwen3, Gemma 3)
    bool qk_norm_full = false;     // RMSNorm over the whole q/k projection (OLMo-2)
    bool parallel_residual = false;
    bool learned_positions = false;
    bool sandwich_norm = false;    // extra norms after attention and MLP outputs (Gemma 2/3)
    bool post_norm_only = false;   // OLMo-2: norms after attention/MLP outputs, none before
    double embed_scale = 1.0;      // Gemma: sqrt(d_model)
    double rope_theta = 10000.0;
    double rope_local_theta = 0.0; // Gemma 3 sliding layers; 0 = same as rope_theta
    double rotary_pct = 1.0;       // GPT-NeoX partial rotary
    RopeScaling rope_scaling;
    double attn_scale = 0.0;       // softmax scale; 0 = 1/sqrt(d_head)
    double attn_softcap = 0.0;     // 0 = off
    double final_softcap = 0.0;
    int sliding_window = 0;        // 0 = off
    std::vector<bool> layer_sliding;  // per layer, empty = no sliding layers
    int bos_id = -1;
    int eos_id = -1;

    int kv_group() const { return n_heads / n_kv_heads; }  // query head h reads kv head h / kv_group()
    int d_q() const { return n_heads * d_head; }
    int d_kv() const { return n_kv_heads * d_head; }
    bool is_sliding(int layer) const {
        return sliding_window > 0 && (layer_sliding.empty() || layer_sliding[layer]);
    }
    // Throws ConfigError naming `where` when a dimension is inconsistent.
    void validate(const std::string& where) const;
};

std::string family_name(Family f);

}  // namespace hs
