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
#include "intervention.h"
#include "model.h"
#include "names.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

struct CorpusSample {
    std::vector<int64_t> tokens;  // as scored (truncated to max_tokens)
    int64_t length = 0;           // tokens in the corpus, before the max_tokens cut (BOS included for text):
                                  // what a selection by token share counts
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
// How a head is masked: a kind of the intervention vocabulary (src/interp/intervention.h), per row.
//   zero-query (the default): the head's query zeroed after RoPE, so its pre-softmax scores are 0 on
//     every key the causal (and sliding-window) mask shows: uniform attention over the prefix. The
//     retrieval-head lineage's masking (FYYFU/HeadKV Important_Head/source/modeling_llama.py lines
//     554-557, the flash-attention path its detection runs; docs/methods.md, "AttentionInfluence").
//   zero: the head's attention output z set to 0 (headscope's earlier, figure-based reading).
// The kinds that need a reference dataset (mean, mean-query, resample) are left out: a reference
// drawn from a chunk of the corpus would make a sample's score depend on its chunk.
const std::vector<Intervention>& influence_maskings();
const NameTable<Intervention>& influence_masking_names();

struct InfluenceOptions {
    int64_t max_rows = 64;   // rows a forward (samples x sets)
    bool last_only = false;  // the loss of each sample's last token alone (a task model trained on an
                             // answer, like the toy recall model), not the paper's every token
    Intervention masking = Intervention::kZeroQuery;  // one of influence_maskings()
};
// The heads of each set masked as o.masking says, every other head intact.
InfluenceResult attention_influence(const Model& m, const std::vector<CorpusSample>& corpus,
                                    const std::vector<std::vector<Head>>& sets, const InfluenceOptions& o);

// ---- Selection: the top share of the ranking, counted in tokens (the paper's 73B of 241B) or samples.
enum class SelectBy { kTokens, kSamples };
const NameTable<SelectBy>& select_by_names();  // "tokens", "samples"

struct Selection {
    std::vector<uint8_t> selected;  // [N]
    int64_t n_selected = 0, n_done = 0;
    int64_t tokens_selected = 0, tokens_done = 0;  // the selected and done samples' lengths summed
};
// Walks `rank` (sample indices, best first) over the done samples and marks the shortest prefix of
// them whose share reaches `fraction` (in [0, 1]): by samples, the first ceil(fraction x n_done); by
// tokens, samples are added while the tokens selected so far are below fraction x tokens_done (the
// sample that reaches the budget is kept whole: a document is selected or not). With equal lengths
// the two agree. `length` [N] >= 1 each (CorpusSample::length).
Selection select_top_share(const std::vector<int64_t>& rank, const std::vector<uint8_t>& done,
                           const std::vector<int64_t>& length, double fraction, SelectBy by);

}  // namespace hs
