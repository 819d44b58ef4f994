// AttentionInfluence (Hua, Wu, Zhang & Shen 2025, "AttentionInfluence: Adopting Attention Head
// Influence for Weak-to-Strong Pretraining Data Selection"): a small model ranks pretraining samples
// by how much its loss on each rises when its retrieval heads are masked,
//   score_i = (L_masked,i - L_i) / L_i,
// L the mean next-token loss over the sample's tokens. Methods and the choices headscope makes where
// the paper leaves one open: docs/methods.md, "AttentionInfluence".
//
// Every head set (the named heads, random controls) and the unmasked model run as rows of shared
// forwards through the ablation engine (probes/ablation/ablation.h: per-row masks, shared layers below the
// first masked layer, the loss read from the final residual a piece at a time, so memory is linear in
// the sample's length).
#pragma once

#include "heads.h"
#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

struct CorpusSample {
    std::vector<int64_t> tokens;  // as scored (truncated to max_tokens)
    std::string preview;          // the text's first characters (or the tokens decoded), for tables
    int64_t line = 0;             // the corpus line it came from
    bool truncated = false;
};

// A JSONL corpus: one object a line, {"text": "..."} (encoded with the tokenizer's special tokens,
// BOS as the tokenizer adds it) or {"tokens": [ids]} (as given). Each sample is cut to its first
// max_tokens tokens. DataError "FILE:LINE: ..." for a line that is not JSON, has neither a string
// "text" nor an integer list "tokens", an id outside the vocabulary, text without a tokenizer, or
// fewer than 2 tokens (no next-token loss); for an empty corpus "FILE: no samples".
std::vector<CorpusSample> read_corpus(const std::string& path, const Tokenizer* tok, int64_t vocab, int64_t max_tokens);

struct InfluenceResult {
    at::Tensor loss;         // [N] float32: mean next-token loss of each sample, no head masked
    at::Tensor masked_loss;  // [S, N] float32: the same with set s's heads masked
    at::Tensor score;        // [S, N] float32: (masked_loss - loss) / loss
    std::vector<int64_t> n_tokens;  // [N] tokens scored (length - 1; 1 with last_only)
    int64_t forwards = 0;
};
struct InfluenceOptions {
    int64_t max_rows = 64;   // rows a forward (samples x sets)
    bool last_only = false;  // the loss of each sample's last token alone (a task model trained on an
                             // answer, like the toy recall model), not the paper's every token
};
// Masking = zeroing the heads' attention output z (what zeroing their attention weights gives).
InfluenceResult attention_influence(const Model& m, const std::vector<CorpusSample>& corpus,
                                    const std::vector<std::vector<Head>>& sets, const InfluenceOptions& o);

}  // namespace hs
