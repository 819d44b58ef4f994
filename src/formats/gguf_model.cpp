// GGUF -> the Hugging Face form every family loader reads. What llama.cpp's converter
// (convert_hf_to_gguf.py) changes is undone here, per architecture:
//   llama   q/k rows permuted for llama.cpp's adjacent-pair RoPE (LlamaModel.permute): inverted
//   gemma*  every "*norm.weight" stored as w + 1 (GemmaModel / Gemma2Model / Gemma3Model): minus 1
//   gpt2    Conv1D weights stored transposed ([out, in]): transposed back to [in, out]
//   gptneox query_key_value rows reordered from per-head [q, k, v] to [Q; K; V]: interleaved again
// and llama3's RoPE scaling, which the converter writes as a rope_freqs tensor of per-frequency
// divisors, is read as those divisors. What a GGUF file does not carry is taken as llama.cpp
// takes it (docs/models.md lists each case).
#include "gguf_model.h"

#include "errors.h"
#include "../families/registry.h"
#include "gguf.h"
#include "safetensors.h"
#include "util.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace hs {

namespace {

struct ArchInfo {
    const char* gguf;      // general.architecture
    const char* hf;        // config.json "architectures"[0]
};

const ArchInfo kArchs[] = {
    {"llama", "LlamaForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},   {"qwen3", "Qwen3ForCausalLM"},
    {"gemma", "GemmaForCausalLM"}, {"gemma2", "Gemma2ForCausalLM"}, {"gemma3", "Gemma3ForCausalLM"},
    {"olmo2", "Olmo2ForCausalLM"}, {"gpt2", "GPT2LMHeadModel"},     {"gptneox", "GPTNeoXForCausalLM"},
};

const ArchInfo& arch_of(const GgufFile& f) {
    const auto a = f.get_string("general.architecture");
    if (!a) throw ModelLoadError(fmt::format("{}: no general.architecture key", f.path()));
    for (const auto& x : kArchs)
        if (*a == x.gguf) return x;
    std::string names;
    for (const auto& x : kArchs) names += (names.empty() ? "" : ", ") + std::string(x.gguf);
    throw ModelLoadError(fmt::format("{}: GGUF architecture '{}' is not supported (supported: {})", f.path(), *a, names));
}

int64_t need_int(const GgufFile& f, const std::string& key) {
    auto v = f.get_int(key);
    if (!v) throw ModelLoadError(fmt::format("{}: missing metadata key '{}'", f.path(), key));
    return *v;
}

int64_t rows_of(const GgufFile& f, const std::string& tensor) {
    auto it = f.tensors().find(tensor);
    if (it == f.tensors().end()) throw ModelLoadError(fmt::format("{}: missing tensor '{}'", f.path(), tensor));
    return it->second.shape[0];
}

}  // namespace

std::string gguf_config_json(const GgufFile& f) {
    const ArchInfo& a = arch_of(f);
    const std::string p = std::string(a.gguf) + ".";
    const std::string arch = a.gguf;
    nlohmann::json j;
    j["architectures"] = {a.hf};
    const int64_t D = need_int(f, p + "embedding_length"), L = need_int(f, p + "block_count");
    int64_t blocks = 0;  // blocks the file holds tensors of ("blk.N.")
    for (const auto& entry : f.tensors()) {
        const std::string& name = entry.first;
        if (name.rfind("blk.", 0) != 0) continue;
        const auto dot = name.find('.', 4);
        const auto n = dot == std::string::npos ? std::nullopt : parse_int64(name.substr(4, dot - 4));
        if (n && *n >= 0 && *n < L) blocks = std::max(blocks, *n + 1);
    }
    if (L > blocks)
        throw ModelLoadError(fmt::format("{}: {}block_count is {} but the file has tensors for {} blocks", f.path(), p, L, blocks));
    const int64_t H = need_int(f, p + "attention.head_count");
    const int64_t V = rows_of(f, "token_embd.weight");
    const int64_t ctx = f.get_int(p + "context_length").value_or(2048);
    const int64_t F = need_int(f, p + "feed_forward_length");
    if (f.has(p + "attention.head_count_kv") && !f.get_int(p + "attention.head_count_kv"))
        throw ModelLoadError(fmt::format("{}: per-layer head counts are not supported", f.path()));
    const bool tied = !f.has_tensor("output.weight");
    auto rms_eps = [&] { return f.get_float(p + "attention.layer_norm_rms_epsilon"); };
    auto bos = f.get_int("tokenizer.ggml.bos_token_id"), eos = f.get_int("tokenizer.ggml.eos_token_id");
    if (bos) j["bos_token_id"] = *bos;
    if (eos) j["eos_token_id"] = *eos;
    j["vocab_size"] = V;
    j["tie_word_embeddings"] = tied;
    if (arch == "gpt2") {
        j["n_embd"] = D;
        j["n_layer"] = L;
        j["n_head"] = H;
        j["n_inner"] = F;
        j["n_positions"] = ctx;
        j["layer_norm_epsilon"] = f.get_float(p + "attention.layer_norm_epsilon").value_or(1e-5);
        return j.dump();
    }
    j["hidden_size"] = D;
    j["num_hidden_layers"] = L;
    j["num_attention_heads"] = H;
    j["intermediate_size"] = F;
    j["max_position_embeddings"] = ctx;
    if (arch == "gptneox") {
        const int64_t d = D / std::max<int64_t>(H, 1);
        const int64_t rot = f.get_int(p + "rope.dimension_count").value_or(d);
        j["rotary_pct"] = static_cast<double>(rot) / static_cast<double>(d);
        j["rotary_emb_base"] = f.get_float(p + "rope.freq_base").value_or(10000.0);
        j["use_parallel_residual"] = f.get_bool(p + "use_parallel_residual").value_or(true);
        j["layer_norm_eps"] = f.get_float(p + "attention.layer_norm_epsilon").value_or(1e-5);
        j["hidden_act"] = "gelu";
        // Pythia's head is separate; a GGUF without output.weight means tied.
        return j.dump();
    }
    j["num_key_value_heads"] = f.get_int(p + "attention.head_count_kv").value_or(H);
    const int64_t d_head = f.get_int(p + "attention.key_length").value_or(D / std::max<int64_t>(H, 1));
    j["head_dim"] = d_head;
    if (auto e = rms_eps()) j["rms_norm_eps"] = *e;
    if (auto t = f.get_float(p + "rope.freq_base")) j["rope_theta"] = *t;
    if (auto st = f.get_string(p + "rope.scaling.type"); st && *st != "none") {
        if (*st != "linear")
            throw ModelLoadError(fmt::format("{}: RoPE scaling '{}' is not supported (linear, or llama3 as a rope_freqs "
                                             "tensor)", f.path(), *st));
        auto factor = f.get_float(p + "rope.scaling.factor");
        if (!factor) throw ModelLoadError(fmt::format("{}: rope.scaling.type linear without {}rope.scaling.factor", f.path(), p));
        j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", *factor}};
    }
    if (arch == "gemma2" || arch == "gemma3") {
        // llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B models (46 layers for
        // Gemma 2, 62 for Gemma 3), where it uses 1/sqrt(hidden / heads): query_pre_attn_scalar is
        // not in the file (llama-model.cpp, LLM_ARCH_GEMMA2/GEMMA3 f_attention_scale).
        const bool is27b = (arch == "gemma2" && L == 46) || (arch == "gemma3" && L == 62);
        j["query_pre_attn_scalar"] = is27b ? static_cast<double>(D) / static_cast<double>(H) : static_cast<double>(d_head);
        if (auto w = f.get_int(p + "attention.sliding_window")) j["sliding_window"] = *w;
    }
    if (arch == "gemma2") {
        // Absent keys mean off, as llama.cpp reads them (the converter always writes both).
        j["attn_logit_softcapping"] = f.get_float(p + "attn_logit_softcapping").value_or(0.0);
        j["final_logit_softcapping"] = f.get_float(p + "final_logit_softcapping").value_or(0.0);
    }
    if (arch == "gemma3") {
        j["final_logit_softcapping"] = f.get_float(p + "final_logit_softcapping").value_or(0.0);
        j["attn_logit_softcapping"] = nullptr;
        // llama.cpp: every 6th layer global (set_swa_pattern(6)) unless the file states a pattern; the
        // sliding layers' RoPE base from rope.freq_base_swa (the converter writes rope_local_base_freq), else 10000.
        j["sliding_window_pattern"] = f.get_int(p + "attention.sliding_window_pattern").value_or(6);
        j["rope_local_base_freq"] = f.get_float(p + "rope.freq_base_swa").value_or(10000.0);
    }
    if (arch == "qwen3" || arch == "olmo2") {
        // Qwen3 has no q/k/v biases (attention_bias false); Qwen2's are implied by its architecture.
        j["attention_bias"] = f.has_tensor("blk.0.attn_q.bias");
    }
    if (arch == "llama") j["attention_bias"] = f.has_tensor("blk.0.attn_q.bias");
    return j.dump();
}

namespace {

// llama.cpp's name for a layer tensor -> Hugging Face's, per family; "" when not a known name.
std::string hf_name(const std::string& arch, const std::string& g) {
    static const std::map<std::string, std::string> kTop = {
        {"token_embd.weight", "model.embed_tokens.weight"}, {"output_norm.weight", "model.norm.weight"},
        {"output.weight", "lm_head.weight"}};
    static const std::map<std::string, std::string> kTopGpt2 = {
        {"token_embd.weight", "transformer.wte.weight"}, {"position_embd.weight", "transformer.wpe.weight"},
        {"output_norm.weight", "transformer.ln_f.weight"}, {"output_norm.bias", "transformer.ln_f.bias"},
        {"output.weight", "lm_head.weight"}};
    static const std::map<std::string, std::string> kTopNeox = {
        {"token_embd.weight", "gpt_neox.embed_in.weight"}, {"output_norm.weight", "gpt_neox.final_layer_norm.weight"},
        {"output_norm.bias", "gpt_neox.final_layer_norm.bias"}, {"output.weight", "embed_out.weight"}};
    static const std::map<std::string, std::string> kLayerLlama = {
        {"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
        {"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
        {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"}, {"ffn_gate", "mlp.gate_proj"},
        {"ffn_up", "mlp.up_proj"}, {"ffn_down", "mlp.down_proj"}};
    static const std::map<std::string, std::string> kLayerSandwich = {  // Gemma 2/3: ffn_norm is the pre-MLP norm
        {"post_attention_norm", "post_attention_layernorm"}, {"ffn_norm", "pre_feedforward_layernorm"},
        {"post_ffw_norm", "post_feedforward_layernorm"}};
    static const std::map<std::string, std::string> kLayerOlmo2 = {
        {"post_attention_norm", "post_attention_layernorm"}, {"post_ffw_norm", "post_feedforward_layernorm"}};
    static const std::map<std::string, std::string> kLayerGpt2 = {
        {"attn_norm", "ln_1"}, {"attn_qkv", "attn.c_attn"}, {"attn_output", "attn.c_proj"}, {"ffn_norm", "ln_2"},
        {"ffn_up", "mlp.c_fc"}, {"ffn_down", "mlp.c_proj"}};
    static const std::map<std::string, std::string> kLayerNeox = {
        {"attn_norm", "input_layernorm"}, {"attn_qkv", "attention.query_key_value"}, {"attn_output", "attention.dense"},
        {"ffn_norm", "post_attention_layernorm"}, {"ffn_up", "mlp.dense_h_to_4h"}, {"ffn_down", "mlp.dense_4h_to_h"}};
    const bool gpt2 = arch == "gpt2", neox = arch == "gptneox";
    if (g.rfind("blk.", 0) != 0) {
        const auto& top = gpt2 ? kTopGpt2 : neox ? kTopNeox : kTop;
        auto it = top.find(g);
        return it == top.end() ? "" : it->second;
    }
    const size_t dot = g.find('.', 4);
    const size_t last = g.rfind('.');
    if (dot == std::string::npos || last <= dot) return "";
    const std::string layer = g.substr(4, dot - 4), stem = g.substr(dot + 1, last - dot - 1), suffix = g.substr(last);
    if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return "";
    const std::map<std::string, std::string>* table = gpt2 ? &kLayerGpt2 : neox ? &kLayerNeox : &kLayerLlama;
    const std::string prefix = gpt2 ? "transformer.h." + layer + "." : neox ? "gpt_neox.layers." + layer + "." : "model.layers." + layer + ".";
    if (arch == "gemma2" || arch == "gemma3") {
        if (auto it = kLayerSandwich.find(stem); it != kLayerSandwich.end()) return prefix + it->second + suffix;
    }
    if (arch == "olmo2") {
        if (auto it = kLayerOlmo2.find(stem); it != kLayerOlmo2.end()) return prefix + it->second + suffix;
    }
    auto it = table->find(stem);
    return it == table->end() ? "" : prefix + it->second + suffix;
}

// Inverse of LlamaModel.permute (convert_hf_to_gguf.py): the converter reshapes rows to
// [heads, 2, d/2] and swaps the last two; reshaping to [heads, d/2, 2] and swapping back undoes it.
at::Tensor unpermute_rows(const at::Tensor& w, int64_t heads) {
    const int64_t rows = w.size(0);
    auto sizes = w.sizes().vec();
    std::vector<int64_t> v = {heads, rows / heads / 2, 2};
    v.insert(v.end(), sizes.begin() + 1, sizes.end());
    return w.reshape(v).transpose(1, 2).reshape(sizes).contiguous();
}

}  // namespace

std::unique_ptr<Model> load_gguf_model(const std::string& path, const LoadOptions& opts) {
    GgufFile f(path);
    const std::string cfg_text = gguf_config_json(f);
    auto m = std::make_unique<Model>();
    m->path = path;
    m->weight_files = path;
    m->options = opts;
    m->source.format = "gguf";
    m->config = parse_model_config(cfg_text, path + " (metadata)");
    ModelConfig& c = m->config;
    const std::string arch = *f.get_string("general.architecture");
    std::map<std::string, at::Tensor> named;
    torch::NoGradGuard ng;
    for (const auto& [g, info] : f.tensors()) {
        if (g == "rope_freqs.weight") {
            // llama3 scaling as the converter writes it: one divisor per frequency.
            auto t = f.get(g).to(torch::kDouble).contiguous();
            if (t.dim() != 1 || t.size(0) != c.d_head / 2)
                throw ModelLoadError(fmt::format("{}: rope_freqs.weight has shape {}, expected [{}]", path,
                                                 shape_str(t.sizes().vec()), c.d_head / 2));
            c.rope_scaling.type = "factors";
            c.rope_scaling.freq_factors.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
            continue;
        }
        const std::string h = hf_name(arch, g);
        if (h.empty())
            throw ModelLoadError(fmt::format("{}: tensor '{}' is not one headscope knows for architecture '{}'", path, g, arch));
        at::Tensor t = f.get(g);
        const bool is_weight = g.size() > 7 && g.compare(g.size() - 7, 7, ".weight") == 0;
        if (arch == "llama" && (g.find(".attn_q.") != std::string::npos || g.find(".attn_k.") != std::string::npos)) {
            const bool q = g.find(".attn_q.") != std::string::npos;
            const int64_t heads = q ? c.n_heads : c.n_kv_heads;
            if (t.size(0) % (2 * heads) != 0)
                throw ModelLoadError(fmt::format("{}: tensor '{}' has {} rows, not a multiple of 2 x {} heads", path, g, t.size(0), heads));
            t = unpermute_rows(t, heads);
        }
        if ((arch == "gemma" || arch == "gemma2" || arch == "gemma3") && is_weight &&
            g.size() >= 11 && g.compare(g.size() - 11, 11, "norm.weight") == 0)
            t = t.to(torch::kFloat) - 1.0;
        if (arch == "gpt2" && is_weight &&
            (g.find(".attn_qkv.") != std::string::npos || g.find(".attn_output.") != std::string::npos ||
             g.find(".ffn_up.") != std::string::npos || g.find(".ffn_down.") != std::string::npos))
            t = t.t().contiguous();
        if (arch == "gptneox" && g.find(".attn_qkv.") != std::string::npos) {
            // [Q; K; V] rows -> per head [q_h; k_h; v_h] (GPT-NeoX's fused layout).
            const int64_t H = c.n_heads, d = c.d_head;
            auto sizes = t.sizes().vec();
            if (t.size(0) != 3 * H * d)
                throw ModelLoadError(fmt::format("{}: tensor '{}' has {} rows, expected {}", path, g, t.size(0), 3 * H * d));
            std::vector<int64_t> v = {3, H, d};
            v.insert(v.end(), sizes.begin() + 1, sizes.end());
            t = t.reshape(v).transpose(0, 1).reshape(sizes).contiguous();
        }
        named.emplace(h, t);
    }
    const ArchSpec* spec = find_arch(c.architecture);
    WeightSource src(path, std::move(named), opts);
    spec->load_weights(src, *m);
    return m;
}

}  // namespace hs
