// Bootstrap statistics over trials (see stats.h).
#include "stats.h"

#include "reference_rng.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace hs {

std::vector<std::vector<int64_t>> bootstrap_indices(int64_t n, int64_t resamples, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int64_t>> out(resamples, std::vector<int64_t>(n));
    for (auto& draw : out)
        for (auto& i : draw) {
            const double u = std::generate_canonical<double, 53>(rng);
            i = std::min<int64_t>(n - 1, static_cast<int64_t>(u * static_cast<double>(n)));
        }
    return out;
}

double percentile_linear(std::vector<double> v, double q) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::sort(v.begin(), v.end());
    const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
    return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

std::pair<at::Tensor, at::Tensor> bootstrap_ci(const at::Tensor& samples, int64_t resamples, uint64_t seed) {
    const int64_t N = samples.size(0);
    int64_t C = 1;
    for (int64_t i = 1; i < samples.dim(); ++i) C *= samples.size(i);
    auto flat = samples.to(torch::kDouble).reshape({N, C}).contiguous();
    auto low = torch::full({C}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble), high = low.clone();
    if (N > 0 && resamples > 0) {
        const auto idx = bootstrap_indices(N, resamples, seed);
        auto means = torch::empty({resamples, C}, torch::kDouble);
        for (int64_t r = 0; r < resamples; ++r)
            means[r] = flat.index_select(0, torch::tensor(idx[r], torch::kLong)).mean(0);
        auto acc = means.accessor<double, 2>();
        for (int64_t c = 0; c < C; ++c) {
            std::vector<double> col(resamples);
            for (int64_t r = 0; r < resamples; ++r) col[r] = acc[r][c];
            low[c] = percentile_linear(col, 2.5);
            high[c] = percentile_linear(col, 97.5);
        }
    }
    auto shape = samples.sizes().slice(1).vec();
    return {low.view(shape), high.view(shape)};
}

std::pair<at::Tensor, at::Tensor> bootstrap_ci_numpy(const at::Tensor& samples, int64_t resamples, uint32_t seed) {
    const int64_t N = samples.size(0);
    int64_t C = 1;
    for (int64_t i = 1; i < samples.dim(); ++i) C *= samples.size(i);
    auto flat = samples.to(torch::kFloat).reshape({N, C}).contiguous();
    const float* x = flat.data_ptr<float>();
    auto low = torch::full({C}, std::numeric_limits<float>::quiet_NaN(), torch::kFloat), high = low.clone();
    if (N > 0 && resamples > 0) {
        NumpyRandomState rng(seed);
        std::vector<float> means(static_cast<size_t>(resamples * C));
        std::vector<float> acc(static_cast<size_t>(C));
        for (int64_t r = 0; r < resamples; ++r) {
            const auto idx = rng.randint(0, N, N);  // rng.randint(0, len(S_arr), size=len(S_arr))
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (auto i : idx)  // S_arr[idx].mean(axis=0): float32 sums in draw order, then / N
                for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += x[i * C + c];
            for (int64_t c = 0; c < C; ++c) means[static_cast<size_t>(r * C + c)] = acc[static_cast<size_t>(c)] / static_cast<float>(N);
        }
        // np.percentile(boot_means, q, axis=0), method "linear": virtual index (n - 1) * (q / 100),
        // numpy's _lerp in float64 between the float32 neighbours (from the upper one when the
        // fraction is >= 0.5), then .astype(np.float32).
        auto pct = [&](std::vector<float>& col, double q) {
            const double index = static_cast<double>(resamples - 1) * (q / 100.0);
            const int64_t lo = static_cast<int64_t>(std::floor(index)), hi = std::min<int64_t>(lo + 1, resamples - 1);
            const double t = index - static_cast<double>(lo);
            const float a = col[static_cast<size_t>(lo)], b = col[static_cast<size_t>(hi)];
            const float diff = b - a;
            const double v = t >= 0.5 ? static_cast<double>(b) - static_cast<double>(diff) * (1.0 - t)
                                      : static_cast<double>(a) + static_cast<double>(diff) * t;
            return static_cast<float>(v);
        };
        auto lo_a = low.accessor<float, 1>(), hi_a = high.accessor<float, 1>();
        std::vector<float> col(static_cast<size_t>(resamples));
        for (int64_t c = 0; c < C; ++c) {
            for (int64_t r = 0; r < resamples; ++r) col[static_cast<size_t>(r)] = means[static_cast<size_t>(r * C + c)];
            std::sort(col.begin(), col.end());
            lo_a[c] = pct(col, 2.5);
            hi_a[c] = pct(col, 97.5);
        }
    }
    auto shape = samples.sizes().slice(1).vec();
    return {low.view(shape), high.view(shape)};
}

}  // namespace hs
