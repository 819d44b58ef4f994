// QRHead's re-ranker (`headscope rerank`): each example's documents scored by the chosen heads'
// calibrated attention mass from the query (qrhead.h qrhead_doc_scores), ranked, and judged against
// the gold document (recall@1, reciprocal rank). The prompt follows QRHead's get_prompt
// (princeton-pli/QRHead attn_retriever.py lines 107-140) in token space: each piece encoded on its own
// without specials, so the documents' and the query's spans are exact. Methods: docs/methods.md, "QRHead".
#pragma once

#include "heads.h"
#include "model.h"
#include "tokenizer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hs {

// One line of a --docs file: {"query": str, "docs": [str, ...], "gold": int} (0-based index of the
// relevant document).
struct RerankExample {
    std::string query;
    std::vector<std::string> docs;
    int64_t gold = 0;
    int line = 0;  // 1-based
};
// DataError "FILE:LINE: ..." for a line that is not such an object (a missing or mistyped field, no
// document, a gold index outside the documents), and for a file without an example.
std::vector<RerankExample> read_rerank_examples(const std::string& path);

// The prompt's pieces (attn_retriever.py lines 109-138 with an empty chat prefix and suffix by
// default): instruction, then per document separator + doc (doc with {i} = its 1-based index and
// {doc} = its text), then separator + query (query with {query} = the query and {sep} = the separator).
struct RerankFormat {
    std::string prefix;                                       // prompt_prefix (a chat header), default none
    std::string instruction = " Here are some paragraphs:";  // line 124
    std::string separator = " \n\n";                          // line 118 (Llama)
    std::string doc = "[{i}] {doc}";                          // line 134
    std::string query = "Please find information that are relevant to the following query in the paragraphs above.{sep}Query: {query}";  // lines 125, 137-138
    std::string suffix;                                       // prompt_suffix, default none
    std::string null_query = "N/A";                           // line 32
};
// UsageError naming the field for a doc format without {doc} or a query format without {query}.
void check_rerank_format(const RerankFormat& f);

struct RerankPrompt {
    std::vector<int64_t> tokens;
    int64_t query_start = 0;                          // the query piece's first token (lines 177-178)
    std::vector<int64_t> null_query;                  // the query piece with the null query
    std::vector<std::pair<int64_t, int64_t>> spans;  // each document's [start, end)
};
// DataError naming the example's line when a document or the query encodes to no token.
RerankPrompt build_rerank_prompt(const Tokenizer& tok, const RerankFormat& f, const RerankExample& e,
                                 const std::string& where);

struct RerankResult {
    std::vector<double> scores;    // per document (qrhead_doc_scores)
    std::vector<int64_t> ranking;  // documents by score, highest first (ties: the earlier document)
    int64_t gold_rank = 0;         // 1-based rank of the gold document
    double reciprocal_rank = 0;
    bool hit1 = false;             // recall@1 (one gold document)
    at::Tensor per_head;           // [D, L, H] double: each document's per-head score (qrhead_span_scores)
};
RerankResult rerank_example(const Model& m, const RerankPrompt& p, const std::vector<Head>& heads, int64_t gold,
                            int64_t prefill_chunk);

}  // namespace hs
