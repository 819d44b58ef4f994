// QRHead (Zhang et al., EMNLP 2025, "Query-Focused Retrieval Heads"; princeton-pli/QRHead at 7a668e7,
// src/qrretriever/attn_retriever.py): a head's attention from the query's tokens to a span of the
// prompt, calibrated by the same prompt with a null query ("N/A"), and the re-ranker that scores
// documents by the top heads' calibrated mass. The needle scan's `qrhead` score (scores.cpp) and
// `headscope rerank` (rerank.h) both call these. Methods: docs/methods.md, "QRHead".
#pragma once

#include "heads.h"
#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace hs {

// The null query QRHead calibrates with (attn_retriever.py line 32, null_query="N/A").
extern const char* const kQrheadNullQuery;

// A prompt's first n tokens prefilled in chunks of `chunk` (no hooks): the KV cache the query passes
// start from.
KVCache qrhead_prefill(const Model& m, const std::vector<int64_t>& tokens, int64_t n, int64_t chunk);

// The query tokens fed after `prefix` (copied, not changed; its S0 positions are the prompt's first
// S0 tokens): every layer's attention rows of those tokens, softmax over all S0 + Q keys the causal
// mask lets each see, averaged over the Q query tokens (attn_retriever.py lines 323-353: the cached
// post-RoPE queries against every key, `attn_weights.mean(1)`): [L, H, S0 + Q] double on the CPU.
at::Tensor qrhead_query_rows(const Model& m, const KVCache& prefix, const std::vector<int64_t>& query);

// score_docs' calibration (lines 197-217): the query's rows minus the null query's, both after the
// same prefix, over the first min(S0 + Q, S0 + Q_null) keys: [L, H, min] double.
at::Tensor qrhead_calibrated(const Model& m, const KVCache& prefix, const std::vector<int64_t>& query,
                             const std::vector<int64_t>& null_query);

// A span's per-head score (score_docs_per_head_for_detection, lines 301-312): the calibrated values
// x of the span's tokens [start, end) (end exclusive here; the reference's spans are inclusive), the
// tokens with x > mean(x) - 2 std(x) (torch.std: unbiased; one token: NaN, nothing kept) summed:
// [L, H] double. NaN for an empty span or one outside cal.
at::Tensor qrhead_span_scores(const at::Tensor& cal, int64_t start, int64_t end);

// The re-ranker's document scores (score_docs, lines 229-247): cal summed over `heads` per token
// first, then each document's span [start, end) thresholded and summed as above. One score a span.
std::vector<double> qrhead_doc_scores(const at::Tensor& cal, const std::vector<Head>& heads,
                                      const std::vector<std::pair<int64_t, int64_t>>& spans);

}  // namespace hs
