// A decode step's weight products (blocks::gemv_rows, src/model/blocks.cpp) against libtorch's GEMM
// (at::matmul, the BLAS) in one run, on the GPT-2-small-shaped model's weights (the needle bench grid's):
// x [R, D] times w [N, D]^T for R rows, milliseconds a call (median of --reps), GFLOP/s, the ratio,
// and each one's largest error against float64. The decode step of R rows runs these products once a
// layer (q/k/v, o, gate/up, down) and once for the logits. Each call takes the next of 12 copies of
// the weight (--copies: a model's 12 layers), so that the weights come from memory as in a decode step
// (one copy: the same weight every call, from the cache where it fits).
//   build/headscope_bench_gemv [--rows 1,6,12,24,48] [--copies 12] [--threads N] [--reps 24]
// docs/performance.md, "AVX2 kernels".
#include "bench_util.h"
#include "blocks.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using hs::bench::median_ms;

int main(int argc, char** argv) {
    std::vector<int64_t> rows = {1, 6, 12, 24, 48};
    int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), reps = 24, copies = 12;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--rows") {
            rows.clear();
            std::stringstream ss(argv[i + 1]);
            for (std::string v; std::getline(ss, v, ',');) rows.push_back(std::atoll(v.c_str()));
        } else if (a == "--threads") {
            threads = std::atoi(argv[i + 1]);
        } else if (a == "--copies") {
            copies = std::max(1, std::atoi(argv[i + 1]));
        } else if (a == "--reps") {
            reps = std::atoi(argv[i + 1]);
        } else {
            fmt::print(stderr, "headscope_bench_gemv: unknown option {}\n", a);
            return 2;
        }
    }
    at::set_num_threads(threads);
    torch::NoGradGuard ng;
    torch::manual_seed(0);
    // (N, D): fused q/k/v, o, gate and up, down, the logits.
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}, {50257, 768}};
    fmt::print("{} threads, {} copies of each weight; gemv_rows against at::matmul (x w^T), float32\n", threads, copies);
    fmt::print("{:>5} {:>6} {:>5} | {:>9} {:>8} {:>9} | {:>9} {:>8} {:>9} | {:>6}\n", "rows", "N", "D", "GEMM ms", "GFLOP/s",
               "error", "gemv ms", "GFLOP/s", "error", "ratio");
    for (auto R : rows)
        for (auto [N, D] : shapes) {
            const int c = N * D > (int64_t{1} << 26) ? 1 : copies;  // the logits' weight is far past any cache
            std::vector<at::Tensor> ws;
            for (int i = 0; i < c; ++i) ws.push_back(torch::randn({N, D}) / std::sqrt(static_cast<double>(D)));
            const auto& w = ws.front();
            const auto x = torch::randn({R, D});
            at::Tensor g, y;
            int ig = 0, iv = 0;
            const double tg = median_ms([&] { g = torch::matmul(x, ws[ig++ % c].t()); }, reps);
            const double tv = median_ms([&] { y = hs::blocks::gemv_rows(x, ws[iv++ % c], at::Tensor()); }, reps);
            g = torch::matmul(x, w.t()), y = hs::blocks::gemv_rows(x, w, at::Tensor());
            if (!y.defined()) {
                fmt::print("{:>5} {:>6} {:>5} | gemv_rows does not take {} rows here\n", R, N, D, R);
                continue;
            }
            const auto exact = torch::matmul(x.to(torch::kDouble), w.to(torch::kDouble).t());
            const double flop = 2.0 * R * N * D;
            fmt::print("{:>5} {:>6} {:>5} | {:>9.3f} {:>8.1f} {:>9.2e} | {:>9.3f} {:>8.1f} {:>9.2e} | {:>5.2f}x\n", R, N, D, tg,
                       flop / tg / 1e6, (g.to(torch::kDouble) - exact).abs().max().item<double>(), tv, flop / tv / 1e6,
                       (y.to(torch::kDouble) - exact).abs().max().item<double>(), tg / tv);
        }
    return 0;
}
