// AttentionInfluence's head detection (Hua et al. 2025, section 4.1): the synthetic key -> value
// retrieval task (probes/needle/key_value_trials.h) decoded by the needle study (NeedleTest, the
// baseline pass), each head scored by Wu et al.'s retrieval score (the needle score registry's
// `retrieval`: copy-paste credit per decoding step, summed per trial, averaged over the passing
// trials), and the top share of the heads by it kept: "we select the heads ranked in the top 5% as
// specifically important heads" (section 4.1; appendix D's masking table uses the same 5%). The
// choices the paper leaves open: docs/methods.md, "AttentionInfluence".
#pragma once

#include "heads.h"
#include "key_value_trials.h"
#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

// The paper's share of heads (section 4.1: "the heads ranked in the top 5%").
constexpr double kInfluenceTopShare = 0.05;

// The heads a share of n_heads keeps: ceil(share x n_heads) (at least 1; a product within 1e-9 of an
// integer counts as that integer, so 0.05 of 320 heads is 16). share in (0, 1].
int64_t top_share_count(double share, int64_t n_heads);

struct RetrievalDetection {
    at::Tensor score;          // [L, H] double: the retrieval score, NaN when no trial passed
    std::vector<Head> heads;   // the top share by it (rank_heads: NaN last, ties in (layer, head) order),
                               // listed in (layer, head) order
    KeyValueFormat format = KeyValueFormat::kJson;
    std::string values;        // where the values came from (KeyValueTrials::values)
    int64_t trials = 0, passed = 0;
    int64_t max_prompt = 0, min_pairs = 0, max_pairs = 0;  // the longest prompt; pairs a context held
    int64_t max_new_tokens = 0;
};

// Builds the task's trials for the model's tokenizer (key_value_trials), decodes every one greedily
// with the retrieval score (prompts prefilled in chunks of prefill_chunk; the task's stop rule), and
// keeps the top_share_count(top_share, L x H) heads. A progress bar over the trials on stderr (drawn
// only on a terminal: src/base/progress.h), and tick() after each trial. UsageError when a trial does
// not fit the model's context; DataError when no trial passes (the score would be NaN: the model
// cannot do the task at this length, so no head is a retrieval head by it).
RetrievalDetection detect_retrieval_heads(const Model& m, const Tokenizer& tok, const KeyValueTask& task, double top_share,
                                          int64_t prefill_chunk = 512, const std::function<void()>& tick = {});

}  // namespace hs
