// DuoAttention's deployment by sparsity (duo_sparsity.h; duo_attn/utils.py l. 353-373).
#include "duo_sparsity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace hs {

double numpy_quantile_linear(std::vector<double> x, double q) {
    if (x.empty()) throw std::invalid_argument("numpy_quantile_linear: no values");
    if (!(q >= 0 && q <= 1)) throw std::invalid_argument(fmt::format("quantile {} is not in [0, 1]", q));
    for (double v : x)
        if (std::isnan(v)) throw std::invalid_argument("numpy_quantile_linear: a NaN value");
    std::sort(x.begin(), x.end());
    const int64_t n = static_cast<int64_t>(x.size());
    const double virt = static_cast<double>(n - 1) * q;  // _QuantileMethods["linear"]: (n - 1) * quantiles
    double prev_d = std::floor(virt);
    int64_t prev = static_cast<int64_t>(prev_d), next = prev + 1;
    if (virt >= static_cast<double>(n - 1)) prev = next = n - 1;  // _get_indexes: indexes_above_bounds -> -1
    const double t = virt - (virt >= static_cast<double>(n - 1) ? -1.0 : prev_d);  // _get_gamma: virtual - previous (-1 there)
    const double a = x[static_cast<size_t>(prev)], b = x[static_cast<size_t>(next)];
    const double diff = b - a;
    return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;  // _lerp
}

std::vector<double> duo_tie_noise(int64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<double> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
    for (auto& v : out) v = static_cast<double>(rng() >> 11) * 0x1.0p-53 * 1e-6;
    return out;
}

DuoSparsified duo_sparsify(const std::vector<double>& gates, double sparsity, const std::vector<double>& noise) {
    if (gates.size() != noise.size())
        throw std::invalid_argument(fmt::format("duo_sparsify: {} gates, {} noise values", gates.size(), noise.size()));
    if (!(sparsity >= 0 && sparsity <= 1)) throw std::invalid_argument(fmt::format("sparsity {} is not in [0, 1]", sparsity));
    std::vector<double> g(gates.size());
    for (size_t i = 0; i < g.size(); ++i) {
        if (std::isnan(gates[i])) throw std::invalid_argument("duo_sparsify: a NaN gate");
        g[i] = std::clamp(gates[i], 0.0, 1.0) + noise[i];  // load_attn_pattern's np.clip (l. 332), then l. 355
    }
    DuoSparsified r;
    r.threshold = numpy_quantile_linear(g, sparsity);  // l. 360
    if (sparsity >= 1) r.threshold = 2;                // l. 364-366
    if (sparsity <= 0) r.threshold = -1;               // l. 367-369
    r.full.resize(g.size());
    int64_t kept = 0;
    for (size_t i = 0; i < g.size(); ++i) kept += (r.full[i] = g[i] >= r.threshold ? 1 : 0);
    r.sparsity = 1 - static_cast<double>(kept) / static_cast<double>(g.size());
    return r;
}

}  // namespace hs
