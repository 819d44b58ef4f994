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

// Whether chunk_attention() exists here (libtorch 2.5 and later: the CPU flash kernel's log-sum-exp).
bool has_chunk_attention();

// A prefill chunk's attention on the CPU: the queries are the last T of the S positions (S > T), each
// sees the keys at and before its own. Computed in two fused calls merged by their log-sum-exps
// (exactly softmax over all S keys, up to rounding): the S - T cached keys, which every query sees, with
// the g = H / K query heads of a kv head stacked along the queries ([B, K, g T, d]: no mask to read and
// add, no block the mask would hide computed, no kv head repeated, and the CPU kernel's 256-query blocks
// once g T >= 768), then the T x T diagonal block with the causal flag (its empty blocks skipped).
// q [B, H, T, d], k and v [B, K, S, d] -> [B, H, T, d]. Measured against the masked call it replaces:
// docs/performance.md, "Prefill chunks without a mask" (blocks.h: where blocks::attention takes it).
at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

}  // namespace hs::compat
