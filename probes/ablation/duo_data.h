// A fresh training sample per step for DuoAttention's gates (duo_gates.h DuoGateOptions::sample), the
// reference's data shape: mit-han-lab/duo-attention@fe93c31 `duo_attn/data.py`
// MultiplePasskeyRetrievalDataset draws, for every item, new passkeys at new depths in a haystack
// (l. 193-208), asks for each of them after the context and labels every token after the context,
// the questions with their passkeys (`labels = [-100] * len(context_tokens) + qa_tokens`, l. 244-270);
// `train.py` takes one such sample a step (batch size 1, l. 84-88, 340-342), so none repeats.
//
// On the CI toy models' vocabulary (datasets/toy_tasks.h) the generator is toy::recall_batch's
// training rows: 1..12 key -> value pairs spread in filler (the passkeys in their haystack), then
// 1..8 queries "? k V" (the retrieval questions with their answers); the labelled positions are every
// token from the first '?' on (the padding after the queries excepted). A passkey is one token here
// (the reference's: 32 words), and the rows are `rows` of T tokens, not one of 1000..32000.
#pragma once

#include "ablation.h"

#include <cstdint>

namespace hs {

// Step `step`'s sample: toy::recall_batch(std::mt19937_64(seed + step), rows, T, training rows) on
// `device`, its tokens and labelled (row, position) pairs. T >= 8 (ConfigError otherwise).
Ablator::ScoredRows duo_recall_sample(uint64_t seed, int64_t step, int64_t rows, int64_t T, c10::Device device);

}  // namespace hs
