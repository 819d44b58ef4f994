// headscope bench: forward-pass throughput on this machine, with and without capture, against the
// machine's measured fp32 GEMM rate and memory bandwidth. docs/performance.md explains the numbers.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "guard.h"
#include "intervention.h"
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
    double stream_decode = -1;  // fraction of heads streaming in the decode-step timing (< 0: not run)
    bool limits = false;        // only the machine's limits (GEMM rate, memory bandwidth), no forward
    StreamWindow window;
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

// Decode-step time (streaming heads, issue 23): --seq tokens prefilled into a KV cache once, then one
// decode step from that cache timed (median of --reps) with no window and with the first
// round(fraction x L x H) heads (flat order l * H + h) streaming; both in this run. Prints the ratio.
static void bench_stream_decode(const BenchOptions& o, const Model& m, const at::Tensor& tokens) {
    const auto& c = m.config;
    const int64_t LH = int64_t{c.n_layers} * c.n_heads;
    const int64_t k = std::llround(o.stream_decode * static_cast<double>(LH));
    Hooks stream;
    std::vector<Head> heads;
    for (int64_t i = 0; i < k; ++i) heads.emplace_back(static_cast<int>(i / c.n_heads), static_cast<int>(i % c.n_heads));
    InterventionSpec iv;
    iv.mode = Intervention::kStream, iv.window = o.window;
    apply_intervention(stream, iv, heads, -1, {Intervention::kStream});
    KVCache prefilled;
    prefilled.reserve(tokens.size(1));
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    const int64_t P = tokens.size(1) - 1;
    for (int64_t p0 = 0; p0 < P; p0 += 512)  // prefill in chunks, as the needle harness does
        m.forward(tokens.narrow(1, p0, std::min<int64_t>(512, P - p0)), nullptr, &prefilled, no_logits);
    auto next = tokens.narrow(1, P, 1);
    at::Tensor a, b;
    // Each step appends one position in place (as a decode does) and is then cut back off.
    const double t_full = median_time(o.reps, [&] {
        a = m.forward(next, nullptr, &prefilled);
        prefilled.truncate(P);
    });
    const double t_stream = median_time(o.reps, [&] {
        b = m.forward(next, &stream, &prefilled);
        prefilled.truncate(P);
    });
    fmt::print("decode step      {:8.2f} ms  after {} cached tokens, batch {}, no head streaming\n", t_full * 1e3, P, tokens.size(0));
    fmt::print("  streaming      {:8.2f} ms  {} of {} heads (sink {}, recent {}{}): {:.2f}x the full step's time\n",
               t_stream * 1e3, k, LH, o.window.sink, o.window.recent, o.window.compensate ? ", compensated" : "",
               t_stream / t_full);
}

// The machine's limits the forward's figures are read against: the fp32 512^3 product's rate and the
// memory bandwidth (a 1 GiB streaming sum and copy; docs/performance.md "The machine's limits").
static void bench_limits(const BenchOptions& o) {
    const double gemm = measure_gemm_gflops(512, 5);
    const auto bw = measure_memory_bandwidth();
    if (o.json) {
        nlohmann::json j = {{"threads", torch::get_num_threads()}, {"gemm_gflops_512_float32", gemm},
                            {"memory_read_gbs", bw.read_gbs}, {"memory_copy_gbs", bw.copy_gbs},
                            {"memory_buffer_bytes", bw.bytes}};
        fmt::print("{}\n", j.dump(2));
        return;
    }
    fmt::print("Float GEMM       {:8.1f} GFLOP/s (512x512x512, {} threads)\n", gemm, torch::get_num_threads());
    fmt::print("memory read      {:8.1f} GB/s (sum over {} MiB)\n", bw.read_gbs, bw.bytes >> 20);
    fmt::print("memory copy      {:8.1f} GB/s (bytes read + written)\n", bw.copy_gbs);
}

void run_bench(const BenchOptions& o) {
    if (o.limits) {
        set_threads(o.model.threads);
        bench_limits(o);
        return;
    }
    auto l = open_model(o.model, false);
    const auto& c = l.model->config;
    if (o.seq > c.max_seq_len) throw UsageError(fmt::format("--seq {} exceeds the model's context {}", o.seq, c.max_seq_len));
    // The ids and the logits at least: [batch, seq] int64 and [batch, seq, vocab] float.
    check_fits_in_memory(size_product({static_cast<double>(o.batch), static_cast<double>(o.seq), 8.0 + 4.0 * c.vocab_size}),
                         fmt::format("--batch {} --seq {}", o.batch, o.seq));
    torch::manual_seed(static_cast<uint64_t>(o.seed));
    auto tokens = torch::randint(0, c.vocab_size, {o.batch, o.seq}, torch::kLong).to(l.model->options.device);
    c10::InferenceMode im;
    if (o.stream_decode >= 0) {
        if (o.stream_decode > 1) throw UsageError(fmt::format("--stream-decode: {} is not a fraction in [0, 1]", o.stream_decode));
        if (o.seq < 2) throw UsageError("--stream-decode: needs --seq of at least 2 (a prefill and a step)");
        if (o.window.sink < 0) throw UsageError(fmt::format("--sink: {} is negative", o.window.sink));
        if (o.window.recent < 1) throw UsageError(fmt::format("--recent: {} must be at least 1 (the query sees itself)", o.window.recent));
        bench_stream_decode(o, *l.model, tokens);
        return;
    }
    ForwardOptions per_row;
    per_row.gemm = GemmMode::kPerRow;
    at::Tensor logits;
    const double t_plain = median_time(o.reps, [&] { logits = l.model->forward(tokens); });
    const double t_per_row = o.batch > 1 ? median_time(o.reps, [&] { l.model->forward(tokens, nullptr, nullptr, per_row); })
                                         : t_plain;
    // The detectors' access pattern: induction, previous-token and duplicate-token stripes reduced
    // from each layer's pattern block by block as attention makes it (src/interp/patterns.h).
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
    const auto bw = l.model->options.device.is_cpu() ? measure_memory_bandwidth() : MemoryBandwidth{};
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
                            {"gemm_gflops_512_float32", gemm_f32}, {"memory_read_gbs", bw.read_gbs},
                            {"memory_copy_gbs", bw.copy_gbs}, {"memory_buffer_bytes", bw.bytes}};
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
    if (bw.bytes > 0)
        fmt::print("memory read      {:8.1f} GB/s, copy {:.1f} GB/s (over {} MiB)\n", bw.read_gbs, bw.copy_gbs, bw.bytes >> 20);
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
    sub->add_option("--stream-decode", o->stream_decode,
                    "instead: time one decode step after --seq - 1 cached tokens, no window vs this fraction of heads "
                    "streaming (--sink, --recent)");
    sub->add_flag("--limits", o->limits,
                  "instead: measure only the machine's limits, the float32 512^3 GEMM rate and the memory bandwidth "
                  "(a streaming sum and a copy of 1 GiB); MODEL is not loaded");
    sub->add_option("--sink", o->window.sink, "--stream-decode: sink keys")->capture_default_str();
    sub->add_option("--recent", o->window.recent, "--stream-decode: recent keys")->capture_default_str();
    sub->callback([o] { run_bench(*o); });
}

}  // namespace hs::cli
