// Direct logit attribution (methods-reference.md section 7): how much each head's output, read
// straight through the final norm (at the clean run's scale) and the unembedding, moves
// logit(correct) - logit(incorrect) at the last position.
//
//   DLA_{l,h} = inv_scale * (z_{l,h} W_O^{l,h}) . fold(W_U[correct] - W_U[incorrect])
//
// inv_scale is the final norm's per-position factor from the clean run (RMSNorm: rsqrt(mean x^2 +
// eps); LayerNorm: rsqrt(var + eps) after centring) and fold() multiplies by the norm weight (and
// centres over D for LayerNorm). The residual is a sum of the embedding, every head, every
// attention-output bias and every MLP, so those terms plus the final norm / unembedding biases
// add up to the actual logit difference: DlaResult carries all of them. Families with norms after
// the attention or MLP outputs (Gemma 2/3 sandwich, OLMo-2) have no such sum and are refused.
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

struct DlaPrompt {
    std::string prompt, correct, incorrect;
};
// A JSON list of {"prompt": str, "correct": str, "incorrect": str}; DataError naming the file.
std::vector<DlaPrompt> read_dla_prompts(const std::string& path);

struct DlaItem {
    std::vector<int64_t> tokens;  // the prompt, BOS as the tokenizer adds it
    int64_t correct = 0, incorrect = 0;
};
// Answers are whole words after a space (word_token in maps.h); one that is not exactly one
// token is a DataError naming the file, the prompt's index and the answer.
std::vector<DlaItem> tokenize_dla_prompts(const std::vector<DlaPrompt>& prompts, const Tokenizer& tok,
                                          const std::string& path);

struct DlaResult {
    at::Tensor heads;         // [L, H] float32
    at::Tensor per_position;  // [L, H, T] float32 per key position (undefined unless asked)
    at::Tensor mlp;           // [L]
    at::Tensor attn_bias;     // [L] attention-output bias (zero when the family has none)
    double embed = 0;         // token (and position) embedding
    double final_bias = 0;    // final-norm bias and unembedding bias
    double logit_diff = 0;    // the model's actual logit(correct) - logit(incorrect)
};

// One clean run with captures; refuses families without a linear residual decomposition.
DlaResult dla_one(const Model& m, const DlaItem& item, bool per_position);

}  // namespace hs
