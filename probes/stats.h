// Bootstrap statistics over trials, shared by the studies (the needle scan's LOCOS intervals).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace hs {

// Bootstrap over trials: `resamples` draws of N trial indices with replacement (std::mt19937_64
// seeded, index = floor(u * N) with u = generate_canonical<double>), the mean of each draw, and
// the 2.5th and 97.5th percentiles (linear interpolation, numpy's default) per head.
std::vector<std::vector<int64_t>> bootstrap_indices(int64_t n, int64_t resamples, uint64_t seed);
std::pair<at::Tensor, at::Tensor> bootstrap_ci(const at::Tensor& samples /* [N, L, H] */, int64_t resamples,
                                               uint64_t seed);
double percentile_linear(std::vector<double> v, double q);  // q in [0, 100]
// LOCOS's bootstrap as logit_contrib.py computes it (lines 1387-1396), to the last float32 digit:
// numpy's RandomState(seed).randint(0, N, size=N) per resample, the float32 mean over the drawn
// trials (numpy sums axis 0 in order), np.percentile 2.5 / 97.5 (float64 interpolation between float32
// neighbours), cast to float32. samples [N, ...] float.
std::pair<at::Tensor, at::Tensor> bootstrap_ci_numpy(const at::Tensor& samples, int64_t resamples, uint32_t seed);

}  // namespace hs
