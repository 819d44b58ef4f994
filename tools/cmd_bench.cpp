// headscope bench: forward-pass throughput on this machine, with and without capture, against the
// machine's measured fp32 GEMM rate. docs/performance.md explains the numbers.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "guard.h"
#include "patterns.h"
#include "system.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>

namespace hs::cli {

struct BenchOptions {
    ModelArgs model;
    int batch = 8;
    int seq = 256;
    int reps = 5;
    int64_t seed = 0;
    bool json = false;
};

// Median seconds of `reps` runs of fn after one warm-up.
static double median_time(int reps, const std::function<void()>& fn) {
    fn();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// Matmul FLOPs of one forward: projections, attention (both products, causal), MLP, unembedding.
static double forward_flops(const ModelConfig& c, int64_t B, int64_t T) {
    const double tok = static_cast<double>(B * T);
    const double proj = 2.0 * c.d_model * (c.d_q() + 2.0 * c.d_kv()) + 2.0 * c.d_q() * c.d_model;
    const double mlp = 2.0 * c.d_model * c.d_ff * (c.gated_mlp ? 3.0 : 2.0);
    // Attention: both products over the keys a query can see, (T + 1) / 2 on average under the
    // causal mask: the work a forward must do, not the full T x T some implementations compute.
    const double attn = 2.0 * 2.0 * c.n_heads * c.d_head * (static_cast<double>(T) + 1.0) / 2.0;
    return tok * (c.n_layers * (proj + mlp + attn) + 2.0 * c.d_model * c.vocab_size);
}

void run_bench(const BenchOptions& o) {
    auto l = open_model(o.model, false);
    const auto& c = l.model->config;
    if (o.seq > c.max_seq_len) throw UsageError(fmt::format("--seq {} exceeds the model's context {}", o.seq, c.max_seq_len));
    // The ids and the logits at least: [batch, seq] int64 and [batch, seq, vocab] float.
    check_fits_in_memory(size_product({static_cast<double>(o.batch), static_cast<double>(o.seq), 8.0 + 4.0 * c.vocab_size}),
                         fmt::format("--batch {} --seq {}", o.batch, o.seq));
    torch::manual_seed(static_cast<uint64_t>(o.seed));
    auto tokens = torch::randint(0, c.vocab_size, {o.batch, o.seq}, torch::kLong).to(l.model->options.device);
    c10::InferenceMode im;
    ForwardOptions per_row;
    per_row.gemm = GemmMode::kPerRow;
    at::Tensor logits;
    const double t_plain = median_time(o.reps, [&] { logits = l.model->forward(tokens); });
    const double t_per_row = o.batch > 1 ? median_time(o.reps, [&] { l.model->forward(tokens, nullptr, nullptr, per_row); })
                                         : t_plain;
    // The detectors' access pattern: induction, previous-token and duplicate-token stripes reduced
    // from each layer's pattern block by block as attention makes it (src/patterns.h).
    Hooks reduce;
    const int64_t n = std::max<int64_t>(2, (o.seq - 1) / 2);
    at::Tensor sink;
    reduce.capture_rows(Point::kAttnPattern, [&](int, int64_t q0, const at::Tensor& p) {
        for (int64_t back : {n - 1, int64_t{1}, n})
            sink = diagonal_sum_rows(p, q0, std::min<int64_t>(back + 1, o.seq - 1), o.seq - 1, back);
    });
    const double t_capture = median_time(o.reps, [&] { l.model->forward(tokens, &reduce); });
    Hooks heads;
    heads.capture(Point::kAttnHeadOut, [&](int, const at::Tensor& x) { sink = x.sum(); });
    const double t_head_out = median_time(o.reps, [&] { l.model->forward(tokens, &heads); });
    // The rate of a plain 512^3 product in the forward's own dtype (on the CPU; the device's
    // figure is not measured here), so efficiency compares like with like.
    const auto dt = l.model->options.dtype;
    const double gemm = l.model->options.device.is_cpu() ? measure_gemm_gflops(512, 5, dt) : 0.0;
    const double gemm_f32 = dt == c10::kFloat ? gemm : l.model->options.device.is_cpu() ? measure_gemm_gflops(512, 5) : 0.0;
    const double flops = forward_flops(c, o.batch, o.seq);
    const double tok = static_cast<double>(o.batch) * o.seq;
    // A probe of the numbers, for comparison with another implementation: the first row's last
    // position, its first 16 logits.
    std::vector<double> probe;
    auto last = logits[0][o.seq - 1].to(torch::kDouble);
    for (int64_t i = 0; i < std::min<int64_t>(16, c.vocab_size); ++i) probe.push_back(last[i].item<double>());
    if (o.json) {
        nlohmann::json j = {{"model", l.model->path}, {"batch", o.batch}, {"seq", o.seq}, {"threads", torch::get_num_threads()},
                            {"dtype", c10::toString(l.model->options.dtype)},
                            {"forward_s", t_plain}, {"forward_per_row_s", t_per_row},
                            {"forward_pattern_capture_s", t_capture}, {"logits_probe", probe},
                            {"forward_head_out_s", t_head_out}, {"tokens_per_s", tok / t_plain},
                            {"forward_gflops", flops / t_plain / 1e9}, {"gemm_gflops_512", gemm},
                            {"gemm_gflops_512_float32", gemm_f32}};
        fmt::print("{}\n", j.dump(2));
        return;
    }
    fmt::print("model            {} ({} layers, d_model {}, vocab {})\n", l.model->path, c.n_layers, c.d_model, c.vocab_size);
    fmt::print("input            {} x {} tokens, {} threads, median of {}\n", o.batch, o.seq, torch::get_num_threads(), o.reps);
    fmt::print("forward          {:8.2f} ms  {:9.0f} tok/s  {:6.1f} GFLOP/s ({:.0f}% of GEMM rate)\n", t_plain * 1e3,
               tok / t_plain, flops / t_plain / 1e9, 100.0 * flops / t_plain / 1e9 / gemm);
    if (o.batch > 1) fmt::print("per-row GEMMs    {:8.2f} ms  ({:+.0f}%)\n", t_per_row * 1e3, 100.0 * (t_per_row / t_plain - 1));
    fmt::print("+ pattern reduce {:8.2f} ms  ({:+.0f}%)\n", t_capture * 1e3, 100.0 * (t_capture / t_plain - 1));
    fmt::print("+ head_out       {:8.2f} ms  ({:+.0f}%)\n", t_head_out * 1e3, 100.0 * (t_head_out / t_plain - 1));
    fmt::print("{:<16s} {:8.1f} GFLOP/s (512x512x512)\n", std::string(c10::toString(dt)) + " GEMM", gemm);
    if (dt != c10::kFloat) fmt::print("{:<16s} {:8.1f} GFLOP/s (512x512x512)\n", "Float GEMM", gemm_f32);
}

void setup_bench(CLI::App& app) {
    auto o = std::make_shared<BenchOptions>();
    auto* sub = app.add_subcommand("bench", "time the forward pass (plain, with pattern capture, with head outputs)\n"
                                            "Example: headscope bench ../shared/testdata/tinystories-656k --batch 8 --seq 256");
    add_model_args(sub, o->model);
    sub->add_option("--batch", o->batch, "batch rows")->capture_default_str()->check(at_least(1));
    sub->add_option("--seq", o->seq, "tokens per row")->capture_default_str()->check(at_least(1));
    sub->add_option("--reps", o->reps, "timed repetitions (median reported)")->capture_default_str()->check(at_least(1));
    sub->add_option("--seed", o->seed, "seed for the random tokens")->capture_default_str();
    sub->add_flag("--json", o->json, "print the numbers as JSON");
    sub->callback([o] { run_bench(*o); });
}

}  // namespace hs::cli
