// headscope qk-spectrum: each head's effective QK rank from weights alone (Autonomy-of-Heads).
// Method: probes/weights/qk_spectrum.h, docs/methods-weights.md ("QK spectrum").
#include "commands.h"
#include "common.h"
#include "schema.h"
#include "errors.h"
#include "heads.h"
#include "progress.h"
#include "qk_spectrum.h"

#include <torch/torch.h>

#include <cstdio>

namespace hs::cli {

struct QkSpectrumCliOptions {
    ModelArgs model;
    OutputArgs out;
    int top = 5;
};

// "rope" attribute: what the weights-only form means for this family's positions.
static std::string rope_note(const ModelConfig& c) {
    if (c.learned_positions) return "none: learned absolute positions live in the residual stream; M_h is the whole form";
    std::string s = "unrotated: RoPE makes the form W_Q R_(j-i) W_K^T depend on the offset j - i; M_h is its value "
                    "at offset 0";
    if (c.rotary_pct < 1.0) s += fmt::format(" (only the first {:.0f}% of each head's dims rotate)", 100.0 * c.rotary_pct);
    return s;
}

static std::string qk_norm_note(const ModelConfig& c) {
    if (c.qk_norm_full) return "folded: OLMo-2's q/k RMSNorm weights (over the whole projection) scale each head's columns";
    if (c.qk_norm)
        return c.family == Family::kGemma ? "folded: Gemma 3's per-head q/k RMSNorm scales (1 + w)"
                                          : "folded: the per-head q/k RMSNorm weights";
    return "none (this family has no q/k norm)";
}

static void print_heads(const char* what, const at::Tensor& score, const std::vector<int64_t>& order, int k) {
    const int64_t H = score.size(1);
    std::string line = fmt::format("{:<8}", what);
    for (int64_t i = 0; i < std::min<int64_t>(k, order.size()); ++i) {
        const int64_t j = order[i];
        line += fmt::format(" {} {:.3f}", format_head(static_cast<int>(j / H), static_cast<int>(j % H)),
                            score.flatten()[j].item<double>());
    }
    std::printf("%s\n", line.c_str());
}

void run_qk_spectrum(const QkSpectrumCliOptions& o) {
    if (o.top < 0) throw UsageError(fmt::format("--top {}: need 0 or more", o.top));
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    const auto& c = m.config;
    const int64_t L = c.n_layers, H = c.n_heads;
    auto s = qk_spectrum(m);
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, 0);
    Attrs a{{"probe", std::string("qk_rank")},
            {"description", std::string("effective rank exp(H(p)), p = singular values of M_h = W_Q^h W_K^(h/g)T "
                                        "normalised to sum 1 (Roy & Vetterli); NaN for a zero form")},
            {"method", std::string("thin QR of W_Q^h and W_K^(h/g); singular values of the d x d core R_Q R_K^T")},
            {"weight_processing", std::string("raw W_Q, W_K (pre-attention norm weight not folded)")},
            {"qk_norm", qk_norm_note(c)},
            {"biases", std::string(c.attention_bias ? "ignored: b_q adds a per-key term, b_k a per-query constant "
                                                      "(softmax-invariant); neither is in the bilinear form"
                                                    : "none")},
            {"rope", rope_note(c)}};
    schema::write_scores(w, {"qk_rank", a, {{"score", {{L, H}, host_floats(s.effective_rank), {}}},
                                            {"singular_values", {{L, H, s.singular_values.size(2)}, host_floats(s.singular_values), {}}}}});
    w.commit();
    if (o.top > 0) {
        print_heads("lowest", s.effective_rank, rank_heads(s.effective_rank, false), o.top);
        print_heads("highest", s.effective_rank, rank_heads(s.effective_rank, true), o.top);
    }
    log_info("wrote {} (effective QK rank of {} heads, at most {})", o.out.out, L * H,
                         s.singular_values.size(2));
}

void setup_qk_spectrum(CLI::App& app) {
    auto o = std::make_shared<QkSpectrumCliOptions>();
    auto* sub = app.add_subcommand(
        "qk-spectrum", "effective rank of each head's QK form W_Q W_K^T from weights alone (Autonomy-of-Heads; RoPE\n"
                       "left out: the form at relative offset 0). Writes /scores/qk_rank/{score, singular_values}\n"
                       "Example: headscope qk-spectrum ../shared/testdata/stories260K/stories260K.bin --out qk.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--top", o->top, "print this many lowest and highest heads (0: none)")->capture_default_str();
    sub->callback([o] { run_qk_spectrum(*o); });
}

}  // namespace hs::cli
