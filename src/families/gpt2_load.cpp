// config.json and tensor names for GPT-2 (transformers' configuration_gpt2.py defaults and
// modeling_gpt2.py, v4.50): Conv1D layers store weights [in, out] and compute x @ W + b, so every
// one is transposed here into the canonical [out, in]; c_attn fuses q, k, v along its out axis.
#include "json_get.h"
#include "registry.h"

#include <torch/torch.h>

namespace hs {

using cfgjson::get;
using cfgjson::get_or;

static Activation parse_gpt2_act(const std::string& act, const std::string& where) {
    if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") return Activation::kGeluTanh;
    if (act == "gelu") return Activation::kGeluExact;
    if (act == "relu") return Activation::kRelu;
    if (act == "silu" || act == "swish") return Activation::kSilu;
    throw ConfigError(fmt::format("{}: activation_function '{}' is not implemented", where, act));
}

void parse_gpt2_config(const nlohmann::json& j, const std::string& where, ModelConfig& cfg) {
    cfg.family = Family::kGpt2;
    cfg.d_model = get<int>(j, "n_embd", where);
    cfg.n_layers = get<int>(j, "n_layer", where);
    cfg.n_heads = get<int>(j, "n_head", where);
    cfg.n_kv_heads = cfg.n_heads;
    if (cfg.n_heads > 0 && cfg.d_model % cfg.n_heads != 0)
        throw ConfigError(fmt::format("{}: n_embd {} is not divisible by n_head {}", where, cfg.d_model, cfg.n_heads));
    cfg.d_head = cfg.n_heads > 0 ? cfg.d_model / cfg.n_heads : 0;
    cfg.d_ff = get_or<int>(j, "n_inner", 4 * cfg.d_model, where);  // null -> 4 * n_embd
    cfg.vocab_size = get<int>(j, "vocab_size", where);
    cfg.max_seq_len = get_or<int>(j, "n_positions", 1024, where);
    cfg.norm = NormKind::kLayerNorm;
    cfg.norm_eps = get_or<double>(j, "layer_norm_epsilon", 1e-5, where);
    cfg.act = parse_gpt2_act(get_or<std::string>(j, "activation_function", "gelu_new", where), where);
    cfg.gated_mlp = false;
    cfg.attention_bias = cfg.attn_out_bias = cfg.mlp_bias = true;
    cfg.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", true, where);
    cfg.learned_positions = true;
    cfg.rotary_pct = 0.0;  // no RoPE: rope_tables returns rot_dim 0
    // scale_attn_weights false means raw q.k scores (scale 1); true is 1/sqrt(d_head).
    if (!get_or<bool>(j, "scale_attn_weights", true, where)) cfg.attn_scale = 1.0;
    if (get_or<bool>(j, "scale_attn_by_inverse_layer_idx", false, where))
        throw ConfigError(fmt::format("{}: scale_attn_by_inverse_layer_idx is not implemented", where));
    if (get_or<bool>(j, "add_cross_attention", false, where))
        throw ConfigError(fmt::format("{}: add_cross_attention (encoder-decoder GPT-2) is not implemented", where));
    // reorder_and_upcast_attn only changes the precision of the score matmul; the function is the same.
    cfg.bos_id = get_or<int>(j, "bos_token_id", -1, where);
    const bool eos_int = j.contains("eos_token_id") && j["eos_token_id"].is_number_integer();
    cfg.eos_id = eos_int ? j["eos_token_id"].get<int>() : -1;
}

// A Conv1D weight stored [in, out], returned as the canonical [out, in].
static at::Tensor take_conv1d(const WeightSource& src, const std::string& name, int64_t in, int64_t out) {
    return src.take(name, {in, out}).t().contiguous();
}

void load_gpt2_weights(const WeightSource& src, Model& m) {
    const ModelConfig& c = m.config;
    const int64_t D = c.d_model, V = c.vocab_size, F = c.d_ff, P = c.max_seq_len;
    // The original gpt2 checkpoints store GPT2Model's names (wte.weight); GPT2LMHeadModel saves
    // transformer.wte.weight.
    const std::string pre = src.has("transformer.wte.weight") ? "transformer." : "";
    auto& w = m.weights;
    w.embed = src.take(pre + "wte.weight", {V, D});
    w.pos_embed = src.take(pre + "wpe.weight", {P, D});
    w.unembed = c.tie_embeddings ? w.embed : src.take("lm_head.weight", {V, D});
    w.final_norm_w = src.take(pre + "ln_f.weight", {D});
    w.final_norm_b = src.take(pre + "ln_f.bias", {D});
    w.layers.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
        auto& lw = w.layers[l];
        const std::string p = fmt::format("{}h.{}.", pre, l);
        lw.attn_norm_w = src.take(p + "ln_1.weight", {D});
        lw.attn_norm_b = src.take(p + "ln_1.bias", {D});
        auto qkv = take_conv1d(src, p + "attn.c_attn.weight", D, 3 * D);  // [3D, D]: q rows, k rows, v rows
        auto qkv_b = src.take(p + "attn.c_attn.bias", {3 * D});
        lw.wq = qkv.slice(0, 0, D).contiguous();
        lw.wk = qkv.slice(0, D, 2 * D).contiguous();
        lw.wv = qkv.slice(0, 2 * D, 3 * D).contiguous();
        lw.bq = qkv_b.slice(0, 0, D).contiguous();
        lw.bk = qkv_b.slice(0, D, 2 * D).contiguous();
        lw.bv = qkv_b.slice(0, 2 * D, 3 * D).contiguous();
        lw.wo = take_conv1d(src, p + "attn.c_proj.weight", D, D);
        lw.bo = src.take(p + "attn.c_proj.bias", {D});
        lw.mlp_norm_w = src.take(p + "ln_2.weight", {D});
        lw.mlp_norm_b = src.take(p + "ln_2.bias", {D});
        lw.w_up = take_conv1d(src, p + "mlp.c_fc.weight", D, F);      // [F, D]
        lw.b_up = src.take(p + "mlp.c_fc.bias", {F});
        lw.w_down = take_conv1d(src, p + "mlp.c_proj.weight", F, D);  // [D, F]
        lw.b_down = src.take(p + "mlp.c_proj.bias", {D});
    }
}

}  // namespace hs
