#include "qk_spectrum.h"

#include "errors.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

namespace hs {

using namespace torch::indexing;

// The scale a q/k norm weight applies per dimension: [d] (per-head norm, shared by the heads) or
// [n, d] (OLMo-2's norm over the whole projection, one row per head); undefined without a norm.
static at::Tensor norm_scale(const Model& m, const at::Tensor& w, int64_t n_heads) {
    const auto& c = m.config;
    if (!(c.qk_norm || c.qk_norm_full)) return {};
    HS_REQUIRE(w.defined(), "q/k norm weight missing for a family with q/k norms");
    auto s = w.to(torch::kDouble);
    if (c.family == Family::kGemma) s = s + 1.0;  // Gemma 3's (1 + w) RMSNorm (families/gemma.cpp)
    return c.qk_norm_full ? s.reshape({n_heads, c.d_head}) : s;
}

// [n*d, D] projection rows -> [n, D, d] row-vector factors, with the norm scale on the columns.
static at::Tensor factors(const at::Tensor& w, int64_t n, int64_t d, const at::Tensor& scale) {
    auto f = w.to(torch::kDouble).reshape({n, d, -1}).transpose(1, 2);  // [n, D, d]
    if (!scale.defined()) return f.contiguous();
    return (f * (scale.dim() == 1 ? scale.view({1, 1, d}) : scale.unsqueeze(1))).contiguous();
}

std::pair<at::Tensor, at::Tensor> qk_head_factors(const Model& m, int layer) {
    const auto& c = m.config;
    HS_REQUIRE(layer >= 0 && layer < c.n_layers, "layer out of range");
    const auto& lw = m.weights.layers[layer];
    const int64_t d = c.d_head;
    auto a = factors(lw.wq, c.n_heads, d, norm_scale(m, lw.q_norm_w, c.n_heads));     // [H, D, d]
    auto b = factors(lw.wk, c.n_kv_heads, d, norm_scale(m, lw.k_norm_w, c.n_kv_heads));  // [K, D, d]
    return {a, b};
}

at::Tensor effective_rank(const at::Tensor& singular_values) {
    auto s = singular_values.to(torch::kDouble);
    auto p = s / s.sum(-1, true);  // 0 / 0 = NaN for a zero form, and it propagates
    return torch::exp(-torch::xlogy(p, p).sum(-1));
}

QkSpectrum qk_spectrum(const Model& m) {
    torch::NoGradGuard ng;
    const auto& c = m.config;
    const int64_t L = c.n_layers, H = c.n_heads, g = c.kv_group();
    const int64_t r = std::min<int64_t>(c.d_head, c.d_model);
    auto sv = torch::empty({L, H, r}, torch::kDouble);
    // Query head h reads kv head h / g.
    std::vector<int64_t> kv(H);
    for (int64_t h = 0; h < H; ++h) kv[h] = h / g;
    auto kv_of = torch::tensor(kv, torch::kLong).to(m.options.device);
    for (int64_t l = 0; l < L; ++l) {
        auto [a, b] = qk_head_factors(m, static_cast<int>(l));
        auto r1 = std::get<1>(torch::linalg_qr(a, "reduced"));                    // [H, r, d]
        auto r2 = std::get<1>(torch::linalg_qr(b, "reduced")).index_select(0, kv_of);  // [H, r, d]
        // M_h = Q1 R1 R2^T Q2^T: the singular values of the [r, r] core.
        auto core = torch::matmul(r1, r2.transpose(1, 2));                         // [H, r, r]
        sv[l].copy_(torch::linalg_svdvals(core).cpu());
    }
    return {sv, effective_rank(sv)};
}

}  // namespace hs
