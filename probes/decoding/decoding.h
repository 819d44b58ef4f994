// Decoding under head interventions: several rows decode one prompt in lockstep, one batched forward
// a step with one KV cache holding every row, each row with its own head interventions (the one
// vocabulary of src/interp/intervention.h), and the rows' next-token distributions combined per step by a
// named rule:
//   independent  every row decodes greedily on its own (row 0 is the plain model);
//   decore       DeCoRe (aryopg/DeCoRe): row 0 the plain model, row 1 with the retrieval heads masked;
//                next = argmax[(1 + a) log p_base - a log p_masked], a = the entropy of p_base in nats
//                (capped at alpha_max) or a constant; both rows are fed the chosen token;
//   juice        JUICE (GaotangLi/JUICE): row 0 the plain run, row 1 the steered run whose chosen heads'
//                outputs get + alpha_enhance o_h (enhance heads) or - alpha_suppress o_h (suppress
//                heads), o_h being row 0's output of that head at the same layer and step (a peer-row
//                intervention on attn.z); next = row 1's argmax, fed to both rows.
// Methods and the reference codes' lines: docs/methods.md ("Decoding under head interventions").
#pragma once

#include "heads.h"
#include "intervention.h"
#include "model.h"
#include "names.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace hs {

// One decoding row: heads and what is done to them (none, zero, zero-query or scale).
struct DecodingRow {
    std::vector<Head> heads;
    Intervention mode = Intervention::kNone;
    double factor = 1.0;  // scale
};
// "MODE:HEADS" with MODE zero, zero-query or scale=F (e.g. "zero-query:L1H0,L1H1", "scale=2:L0H1");
// "none" for a plain row. UsageError naming the problem.
DecodingRow parse_decoding_row(const std::string& spec, int L, int H);
std::string format_decoding_row(const DecodingRow& r);
// The interventions a decoding row can carry, in the order --help lists them.
const std::vector<Intervention>& decoding_row_modes();  // zero, zero-query, scale

enum class CombineRule { kIndependent, kDecore, kJuice };
const NameTable<CombineRule>& combine_rule_names();  // independent, decore, juice

struct DecodingSpec {
    CombineRule rule = CombineRule::kIndependent;
    std::vector<DecodingRow> rows;  // independent: any number (row 0 = rows[0]); decore/juice: built by the helpers below
    // decore
    bool alpha_entropy = true;  // a = H(p_base) in nats, else a = alpha
    double alpha = 0.0;
    double alpha_max = std::numeric_limits<double>::infinity();
    // juice
    std::vector<Head> enhance, suppress;
    double alpha_enhance = 0.0, alpha_suppress = 0.0;
    int64_t max_new_tokens = 32;
    bool keep_logits = false;  // DecodingOut::logits (tests, analysis)
    // Per-row GEMMs: every row bit-identical to its unbatched run (docs/forward.md), at the price of
    // reading the weights once per row each step. Off (default): one folded GEMM for all rows, the
    // weights read once a step (a decode step is weight-bound), rows equal to their unbatched runs
    // up to fp rounding.
    bool exact_rows = false;
};
// DeCoRe's two rows: the plain model and `heads` masked by zero-query (the reference's flash path:
// a zero query, so uniform attention over the visible prefix).
DecodingSpec decore_spec(const std::vector<Head>& heads, bool alpha_entropy, double alpha, double alpha_max);
// JUICE's two rows (plain, steered), the steering a peer-row intervention on row 1.
DecodingSpec juice_spec(const std::vector<Head>& enhance, double alpha_enhance, const std::vector<Head>& suppress,
                        double alpha_suppress);

struct DecodingOut {
    std::vector<int64_t> tokens;                  // the combined output (independent: row 0's)
    std::vector<std::vector<int64_t>> row_tokens;  // per row: its own argmax at each step
    std::vector<double> alphas;                   // decore: a at each step
    // Per step: the chosen token's score minus the best other token's, under the rule's combined
    // scores (independent: row 0's logits; decore: the contrast; juice: row 1's logits).
    std::vector<double> margins;
    std::vector<at::Tensor> logits;  // keep_logits: per step, every row's next-token logits [R, V] float
    // The first step's scores under the rule ([V] double: independent and juice the deciding row's
    // logits, decore the contrast) and row 0's (the plain model's) logits [V] double.
    at::Tensor first_scores, first_base;
};
// The score of token y minus the best other token's, in a [V] score vector.
double token_margin(const at::Tensor& scores, int64_t y);

// Greedy decoding of `prompt` (at least one token) for at most spec.max_new_tokens steps: the prompt
// but its last token is prefilled in chunks of `prefill_chunk`, then one token a step through the KV
// cache. `stop(id)` ends the decode before the token is kept (independent rule: a row that stops
// keeps being fed its last token until every row has stopped; its output is not extended).
DecodingOut decode_rows(const Model& m, const std::vector<int64_t>& prompt, const DecodingSpec& spec,
                        const std::function<bool(int64_t)>& stop = {}, int64_t prefill_chunk = 512);

}  // namespace hs
