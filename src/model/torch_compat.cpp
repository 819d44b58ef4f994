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

namespace hs::compat {

bool has_fused_attention() { return HS_FUSED_ATTENTION != 0; }

at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool causal, double scale) {
#if HS_FUSED_ATTENTION
    c10::optional<at::Tensor> m;
    if (mask.defined()) m = mask;
    return at::scaled_dot_product_attention(q, k, v, m, 0.0, causal, scale);
#else
    (void)q, (void)k, (void)v, (void)mask, (void)causal, (void)scale;
    throw ConfigError(fmt::format("fused attention needs libtorch 2.1 or later; this build has {}", TORCH_VERSION));
#endif
}

}  // namespace hs::compat
