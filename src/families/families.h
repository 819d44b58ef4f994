// One forward per family, each reading top to bottom. Internal header.
#pragma once

#include "../model.h"

namespace hs {

// Llama, Mistral, Qwen2, Qwen3 and llama2.c checkpoints (pre-norm RMSNorm, RoPE, gated MLP).
at::Tensor forward_llama(const Model& m, const at::Tensor& tokens, const Hooks* hooks, KVCache* cache,
                         const ForwardOptions& opts);

}  // namespace hs
