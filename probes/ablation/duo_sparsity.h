// DuoAttention's deployment of its learned gates (Xiao et al. 2024): which KV heads keep a full cache
// at a given sparsity, as mit-han-lab/duo-attention@fe93c31 `duo_attn/utils.py` l. 353-373
// (`sparsify_attention_heads`, called with `threshold=None, sparsity=args.sparsity` by
// eval/needle/needle_in_haystack.py l. 202-203, eval/LongBench/pred.py l. 215-216,
// eval/efficiency/benchmark_static.py l. 40-41 and demo/run_duo_w8a8kv4.py l. 67-68):
//   gates += U(0, 1e-6) noise                                         (l. 355, "to break ties")
//   threshold = np.quantile(gates, sparsity)  over all layers' heads (l. 360, method "linear")
//   threshold = 2 if sparsity >= 1; -1 if sparsity <= 0               (l. 364-369)
//   full = gates >= threshold;  sparsity = 1 - mean(full)              (l. 371-372)
// The gates are clipped to [0, 1] first, as load_attn_pattern does (l. 332). "sparsity" is the share
// of KV heads streamed (a share of heads, not of KV memory). The reference draws its noise unseeded;
// headscope draws it from a seed (duo_tie_noise) so a run repeats.
#pragma once

#include <cstdint>
#include <vector>

namespace hs {

// numpy.quantile(x, q) with its default method "linear" as numpy 1.24 computes it
// (numpy/lib/function_base.py: virtual index (n - 1) q, floor and next index, an index at or past
// n - 1 taking the last value, `_lerp`: a + (b - a) t, or b - (b - a)(1 - t) where t >= 0.5).
// q in [0, 1] (numpy refuses others), x not empty and without NaN: std::invalid_argument otherwise.
double numpy_quantile_linear(std::vector<double> x, double q);

// n draws of U(0, 1e-6): std::mt19937_64(seed), each draw (u >> 11) * 2^-53 * 1e-6.
std::vector<double> duo_tie_noise(int64_t n, uint64_t seed);

struct DuoSparsified {
    std::vector<char> full;   // per gate: 1 = kept full (gate + noise >= threshold), 0 = streamed
    double threshold = 0;     // the threshold the gates were compared with (2 or -1 at the ends)
    double sparsity = 0;      // the reference's returned sparsity: 1 - mean(full)
};

// The reference's selection of `gates` (any flat order, e.g. [L, K] row-major) at `sparsity` in
// [0, 1] with the given noise (same length): std::invalid_argument for a sparsity outside [0, 1], a
// NaN gate or a length mismatch.
DuoSparsified duo_sparsify(const std::vector<double>& gates, double sparsity, const std::vector<double>& noise);

}  // namespace hs
