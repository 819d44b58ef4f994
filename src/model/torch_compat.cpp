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

}  // namespace hs::compat
