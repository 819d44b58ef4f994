// One forward per family, each reading top to bottom. Internal header.
#pragma once

#include "model.h"

namespace hs {

namespace blocks {
struct Pass;  // blocks.h: one forward call (model, hooks, cache, options)
}

// Llama, Mistral, Qwen2, Qwen3 and llama2.c checkpoints (pre-norm RMSNorm, RoPE, gated MLP).
at::Tensor forward_llama(const blocks::Pass& p, const at::Tensor& tokens);

// GPT-2: learned positions, LayerNorm, no RoPE (gpt2.cpp).
at::Tensor forward_gpt2(const blocks::Pass& p, const at::Tensor& tokens);
// GPT-NeoX / Pythia: partial rotary, parallel residual (gpt_neox.cpp).
at::Tensor forward_gpt_neox(const blocks::Pass& p, const at::Tensor& tokens);
// Gemma 1/2/3 text: scaled embeddings, (1 + w) norms, sandwich norms, soft-caps, local RoPE (gemma.cpp).
at::Tensor forward_gemma(const blocks::Pass& p, const at::Tensor& tokens);
// OLMo-2: post-sublayer norms only, full-projection q/k norms (olmo2.cpp).
at::Tensor forward_olmo2(const blocks::Pass& p, const at::Tensor& tokens);

}  // namespace hs
