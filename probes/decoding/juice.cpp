#include "juice.h"

#include "errors.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace hs {

JuiceSelection juice_selection(const at::Tensor& rows_in, const at::Tensor& masks_in, const std::vector<double>& factors,
                               const std::vector<int64_t>& variants_in) {
    const int64_t S = rows_in.size(0);
    if (masks_in.dim() != 3 || masks_in.size(0) != S || factors.size() != static_cast<size_t>(S) || S < 2)
        throw ConfigError("JUICE selection needs a scale-grid study (a mask and a factor per configuration)");
    const int L = static_cast<int>(masks_in.size(1)), H = static_cast<int>(masks_in.size(2));
    auto masks = masks_in.to(torch::kCPU).ne(0);
    auto rows = rows_in.to(torch::kCPU, torch::kDouble);
    const int64_t N = rows.size(1);
    std::vector<int64_t> variants = variants_in.empty() ? std::vector<int64_t>(N, 0) : variants_in;
    if (static_cast<int64_t>(variants.size()) != N)
        throw ConfigError(fmt::format("JUICE selection: {} variant ids for {} rows", variants.size(), N));
    JuiceSelection out;
    const std::set<int64_t> present(variants.begin(), variants.end());
    out.variants.assign(present.begin(), present.end());
    for (int64_t c = 1; c < S; ++c)
        if (std::find(out.factors.begin(), out.factors.end(), factors[c]) == out.factors.end())
            out.factors.push_back(factors[c]);
    const int64_t V = static_cast<int64_t>(out.variants.size()), F = static_cast<int64_t>(out.factors.size());
    const double nan = std::numeric_limits<double>::quiet_NaN();
    // Mean metric per configuration and variant [S, V].
    auto vid = torch::empty({N}, torch::kLong);
    for (int64_t i = 0; i < N; ++i)
        vid[i] = std::lower_bound(out.variants.begin(), out.variants.end(), variants[i]) - out.variants.begin();
    auto onehot = torch::zeros({N, V}, torch::kDouble).scatter_(1, vid.unsqueeze(1), 1.0);
    auto per_variant = rows.matmul(onehot) / onehot.sum(0);  // [S, V] (NaN rows: configurations not run)
    out.delta = torch::full({V, L, H, F}, nan, torch::kDouble);
    auto base = per_variant[0];
    for (int64_t c = 1; c < S; ++c) {
        auto nz = masks[c].nonzero();
        if (nz.size(0) != 1)
            throw ConfigError(fmt::format("JUICE selection: configuration {} scales {} heads, not one", c, nz.size(0)));
        const int64_t l = nz[0][0].item<int64_t>(), h = nz[0][1].item<int64_t>();
        const int64_t f = std::find(out.factors.begin(), out.factors.end(), factors[c]) - out.factors.begin();
        out.delta.select(1, l).select(1, h).select(1, f).copy_(per_variant[c] - base);
    }
    auto mean_over = [&](bool up) {
        std::vector<int64_t> idx;
        for (int64_t f = 0; f < F; ++f)
            if (up ? out.factors[f] > 1 : out.factors[f] < 1) idx.push_back(f);
        if (idx.empty()) return torch::full({V, L, H}, nan, torch::kDouble);
        return out.delta.index_select(3, torch::tensor(idx, torch::kLong)).mean(3);
    };
    out.up = mean_over(true);
    out.down = mean_over(false);
    auto select = [&](const at::Tensor& x) {  // NaN (not run) compares false: not selected
        auto all_pos = x.gt(0).all(0);
        return torch::where(all_pos, x.sum(0), torch::full({L, H}, nan, torch::kDouble));
    };
    out.enhance = select(out.up);
    out.suppress = select(out.down);
    return out;
}

}  // namespace hs
