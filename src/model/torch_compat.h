// The one place where the libtorch versions headscope builds against differ (Debian's 1.13, CPU;
// PyPI's 2.x, CUDA): everything else compiles against both as it is. Keep <torch/torch.h> out of
// here (this header is included widely); the definitions live in torch_compat.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace hs::compat {

// Whether this libtorch has fused scaled-dot-product attention with an explicit scale (2.1 and later).
bool has_fused_attention();

// softmax(q k^T * scale + mask) v through libtorch's fused kernels (flash / memory-efficient / math,
// libtorch's choice). q [B, H, T, d], k and v [B, K, S, d] with K dividing H (GQA: query head h reads
// kv head h / (H / K); libtorch 2.5 and later read them as they are, `enable_gqa`, earlier ones get
// them repeated to H heads here, the same bits). mask: undefined with causal = true (T == S, query t
// sees keys <= t), or bool [T, S] (true = visible). Throws ConfigError where has_fused_attention()
// is false.
at::Tensor fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool causal, double scale);

}  // namespace hs::compat
