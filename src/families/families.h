// One forward per family, each reading top to bottom. Internal header.
#pragma once

#include "../model.h"

namespace hs {

// Llama, Mistral, Qwen2, Qwen3 and llama2.c checkpoints (pre-norm RMSNorm, RoPE, gated MLP).
at::Tensor forward_llama(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                         const ForwardOptions& opts);

// GPT-2: learned positions, LayerNorm, no RoPE (gpt2.cpp).
at::Tensor forward_gpt2(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                        const ForwardOptions& opts);
// GPT-NeoX / Pythia: partial rotary, parallel residual (gpt_neox.cpp).
at::Tensor forward_gpt_neox(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                            const ForwardOptions& opts);
// Gemma 1/2/3 text: scaled embeddings, (1 + w) norms, sandwich norms, soft-caps, local RoPE (gemma.cpp).
at::Tensor forward_gemma(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                         const ForwardOptions& opts);
// OLMo-2: post-sublayer norms only, full-projection q/k norms (olmo2.cpp).
at::Tensor forward_olmo2(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                         const ForwardOptions& opts);

}  // namespace hs
