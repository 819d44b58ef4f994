#include "torch_compat.h"

#include "errors.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define HS_FUSED_ATTENTION 1
#else
#define HS_FUSED_ATTENTION 0
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define HS_SDPA_GQA 1
#else
#define HS_SDPA_GQA 0
#endif

namespace hs::compat {

bool has_fused_attention() { return HS_FUSED_ATTENTION != 0; }

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool causal, double scale) {
#if HS_FUSED_ATTENTION
    c10::optional<at::Tensor> m;
    if (mask.defined()) m = mask;
    const int64_t H = q.size(1), K = k.size(1);
    if (H == K) return at::scaled_dot_product_attention(q, k, v, m, 0.0, causal, scale);
    HS_REQUIRE(K > 0 && H % K == 0 && v.size(1) == K, "fused_attention: kv heads that do not divide the query heads");
#if HS_SDPA_GQA
    // The kernels read a query head's kv head in place: no copy of the whole cache a call (at 8k keys
    // and 4 query heads a kv head, ~130 MiB a layer and chunk before).
    return at::scaled_dot_product_attention(q, k, v, m, 0.0, causal, scale, /*enable_gqa=*/true);
#else
    return at::scaled_dot_product_attention(q, k.repeat_interleave(H / K, 1), v.repeat_interleave(H / K, 1), m, 0.0,
                                            causal, scale);
#endif
#else
    (void)q, (void)k, (void)v, (void)mask, (void)causal, (void)scale;
    throw ConfigError(fmt::format("fused attention needs libtorch 2.1 or later; this build has {}", TORCH_VERSION));
#endif
}

bool has_chunk_attention() { return HS_SDPA_GQA != 0; }

at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
#if HS_SDPA_GQA
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = q.size(3), K = k.size(1), S = k.size(2), P = S - T;
    HS_REQUIRE(q.device().is_cpu(), "chunk_attention: the CPU kernel's log-sum-exp; this tensor is on another device");
    HS_REQUIRE(K > 0 && H % K == 0 && v.size(1) == K && v.size(2) == S, "chunk_attention: kv heads that do not divide the query heads");
    HS_REQUIRE(P > 0, "chunk_attention: no cached keys before the chunk");
    const int64_t g = H / K;
    // Query head h = kv * g + j reads kv head kv (repeat_interleave's order): row j * T + t of group kv.
    auto past = at::_scaled_dot_product_flash_attention_for_cpu(q.reshape({B, K, g * T, d}), k.narrow(2, 0, P),
                                                                 v.narrow(2, 0, P), 0.0, false, {}, scale);
    auto kd = k.narrow(2, P, T), vd = v.narrow(2, P, T);
    if (g > 1) kd = kd.repeat_interleave(g, 1), vd = vd.repeat_interleave(g, 1);  // T keys: small
    auto diag = at::_scaled_dot_product_flash_attention_for_cpu(q, kd, vd, 0.0, true, {}, scale);
    auto l1 = std::get<1>(past).reshape({B, H, T, 1}).to(at::kFloat), l2 = std::get<1>(diag).view({B, H, T, 1}).to(at::kFloat);
    auto top = at::maximum(l1, l2);
    auto w1 = (l1 - top).exp_(), w2 = (l2 - top).exp_();
    auto den = w1 + w2;
    auto o = std::get<0>(past).reshape({B, H, T, d}).to(at::kFloat).mul_(w1.div_(den));
    o.addcmul_(std::get<0>(diag).to(at::kFloat), w2.div_(den));
    return o.to(q.scalar_type());
#else
    (void)q, (void)k, (void)v, (void)scale;
    throw ConfigError(fmt::format("chunk attention needs libtorch 2.5 or later; this build has {}", TORCH_VERSION));
#endif
}

}  // namespace hs::compat
