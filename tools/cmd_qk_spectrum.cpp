// headscope qk-spectrum: each head's effective QK rank from weights alone (Autonomy-of-Heads).
// Method: probes/weights/qk_spectrum.h, docs/methods-weights.md ("QK spectrum").
#include "commands.h"
#include "common.h"
#include "score_records.h"
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
    schema::QkRankRecord r;
    r.L = L, r.H = H, r.S = s.singular_values.size(2);
    r.effective_rank = host_floats(s.effective_rank), r.singular_values = host_floats(s.singular_values);
    r.learned_positions = c.learned_positions, r.rotary_pct = c.rotary_pct;
    r.qk_norm = c.qk_norm, r.qk_norm_full = c.qk_norm_full, r.gemma = c.family == Family::kGemma;
    r.attention_bias = c.attention_bias;
    schema::write_qk_rank(w, r);
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
