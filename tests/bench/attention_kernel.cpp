// The lane attention kernel (src/model/cpu_attention.cpp) against libtorch's kernels on a prefill
// chunk's shapes, in one run: the call the forward made before it (libtorch >= 2.1: the masked fused
// call, or compat::chunk_attention past its bounds; Debian's 1.13: the plain float32 product, softmax,
// product that the blocked attention computes), milliseconds a call (median of --reps), GFLOP/s of
// useful (causal) work, the ratio, and each one's largest error against float64.
//   build/headscope_bench_attention [--heads 12] [--kv-heads 12] [--head-dim 64] [--threads N] [--reps 10]
// Shapes: a few queries after 1000 keys (blocks::kCpuAttentionMinQueries), the needle bench grid's prefill
// chunks (queries, keys), then whole causal prompts.
// docs/performance.md, "A prefill attention kernel".
#include "bench_util.h"
#include "blocks.h"
#include "cpu_attention.h"
#include "torch_compat.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using hs::bench::median_ms;

int main(int argc, char** argv) {
    int64_t H = 12, K = 12, d = 64;
    int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), reps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const int64_t v = std::atoll(argv[i + 1]);
        if (a == "--heads") H = v;
        else if (a == "--kv-heads") K = v;
        else if (a == "--head-dim") d = v;
        else if (a == "--threads") threads = static_cast<int>(v);
        else if (a == "--reps") reps = static_cast<int>(v);
        else {
            fmt::print(stderr, "headscope_bench_attention: unknown option {}\n", a);
            return 2;
        }
    }
    at::set_num_threads(threads);
    torch::NoGradGuard ng;
    torch::manual_seed(0);
    const auto probe = torch::randn({1, 32, K, d});
    if (!hs::blocks::cpu_attention_applies(torch::randn({1, 32, H, d}), probe, probe)) {
        fmt::print("headscope_bench_attention: the lane kernel does not run here (neither AVX2 with FMA nor AVX-512, or H {} / K {} / d {} outside it)\n", H, K, d);
        return 0;
    }
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{4, 1000},   {8, 1000},    {16, 1000},   {24, 1000},
                                                             {25, 337},   {54, 851},    {224, 851},   {311, 312},
                                                             {512, 1336}, {537, 1873},  {794, 1873},  {1049, 1361},
                                                             {1520, 1873}, {512, 512},  {2048, 2048}, {1024, 4096}};
    const bool fused = hs::compat::has_fused_attention();
    fmt::print("{} heads ({} kv), d {}, {} threads; before: {}\n", H, K, d, threads,
               fused ? "libtorch's fused call (masked, or chunk_attention past its bounds)" : "float32 product, softmax, product");
    fmt::print("{:>6} {:>6} | {:>10} {:>8} {:>9} | {:>10} {:>8} {:>9} | {:>6}\n", "chunk", "keys", "before ms", "GFLOP/s",
               "error", "lane ms", "GFLOP/s", "error", "ratio");
    for (auto [T, S] : shapes) {
        const int64_t P = S - T;
        auto q = torch::randn({1, T, H, d});
        auto kb = torch::randn({1, K, S + 64, d}), vb = torch::randn({1, K, S + 64, d});  // cache buffers with room
        auto k = kb.narrow(2, 0, S).permute({0, 2, 1, 3}), v = vb.narrow(2, 0, S).permute({0, 2, 1, 3});
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        auto q4 = q.permute({0, 2, 1, 3}), k4 = k.permute({0, 2, 1, 3}), v4 = v.permute({0, 2, 1, 3});
        const auto seen = torch::arange(S).view({1, S}) <= torch::arange(P, S).view({T, 1});
        at::Tensor before, lane;
        std::function<void()> run_before;
        if (fused && P > 0 && (T >= hs::blocks::kChunkAttentionQueries || P >= hs::blocks::kChunkAttentionPast) &&
            hs::compat::has_chunk_attention())
            run_before = [&] { before = hs::compat::chunk_attention(q4, k4, v4, scale).permute({0, 2, 1, 3}); };
        else if (fused)
            run_before = [&] { before = hs::compat::fused_attention(q4, k4, v4, P > 0 ? seen : at::Tensor(), P == 0, scale).permute({0, 2, 1, 3}); };
        else
            run_before = [&] {
                auto kh = k4.repeat_interleave(H / K, 1), vh = v4.repeat_interleave(H / K, 1);
                auto s = torch::matmul(q4, kh.transpose(2, 3)).mul_(scale).masked_fill_(seen.logical_not(), -INFINITY);
                before = torch::matmul(torch::softmax(s, -1), vh).permute({0, 2, 1, 3});
            };
        const double tb = median_ms(run_before, reps);
        const double tl = median_ms([&] { lane = hs::blocks::cpu_attention_z(q, k, v, scale); }, reps);
        auto kd = k4.to(torch::kDouble).repeat_interleave(H / K, 1), vd = v4.to(torch::kDouble).repeat_interleave(H / K, 1);
        auto sd = torch::matmul(q4.to(torch::kDouble), kd.transpose(2, 3)).mul_(scale).masked_fill_(seen.logical_not(), -INFINITY);
        const auto exact = torch::matmul(torch::softmax(sd, -1), vd).permute({0, 2, 1, 3});
        const double flop = 4.0 * H * d * T * (P + (T + 1) / 2.0);
        fmt::print("{:>6} {:>6} | {:>10.2f} {:>8.0f} {:>9.2e} | {:>10.2f} {:>8.0f} {:>9.2e} | {:>5.2f}x\n", T, S, tb, flop / tb / 1e6,
                   (before.to(torch::kDouble) - exact).abs().max().item<double>(), tl, flop / tl / 1e6,
                   (lane.to(torch::kDouble) - exact).abs().max().item<double>(), tb / tl);
    }
    return 0;
}
