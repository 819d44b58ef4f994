// The needle scan's per-step scoring: what one decode step gives each head for every score of the
// registry (probes/needle/scores.h), the scores' step and trial functions, and the decode steps that
// produced the answer. Methods: docs/methods.md ("Retrieval heads and LOCOS").
#pragma once

#include "model.h"
#include "needle_trials.h"
#include "scores.h"
#include "tokenizer.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hs {

// The spans one step is scored on (prompt positions, [start, end)) and the first key the layer's
// heads can see (0, or the sliding window's start).
struct StepSpans {
    int64_t needle_start = 0, needle_end = 0, answer_start = 0, answer_end = 0;
    int64_t first_visible = 0;
};

// One layer's decode step as the step functions read it, for the R rows of a batch it scores
// (every row of the batch that is not done): a [R, H, S] (their pattern rows, the model's dtype),
// v [B, S, K, d] (the layer's values, every row of the batch), rows (each scored row's index into
// v, ascending), wo [D, H*d], u [R, D] (the raw unembedding rows of their y), and per scored row
// the prompt ids (positions >= its size never count), the spans and the generated token y. A step
// function returns its arrays [R, H] double on the CPU, row r of each computed as one row alone
// would be (the same arithmetic, the same bits: score_step runs it on R = 1).
struct NeedleStepInput {
    const at::Tensor& a;
    const at::Tensor& v;
    const std::vector<int64_t>& rows;
    const at::Tensor& wo;
    const at::Tensor& u;
    const std::vector<const std::vector<int64_t>*>& prompts;
    const std::vector<StepSpans>& spans;
    const std::vector<int64_t>& y;
};

// One trial's decode as the trial functions read it: the row's step arrays [steps, L, H] double, the
// steps that produced the answer (answer_steps), the answer's token count (encoded without
// specials) and whether the needle's span was found.
struct NeedleTrialSteps {
    const std::vector<at::Tensor>& steps;
    const std::vector<int64_t>& answer_steps;
    int64_t answer_tokens = 0;
    bool needle_found = false;
    int64_t L = 0, H = 0;
    // QRHead: the question's calibrated attention rows [L, H, S'] (qrhead.h qrhead_calibrated; nullptr:
    // not computed) and the needle's span [needle_start, needle_end).
    const at::Tensor* query_cal = nullptr;
    int64_t needle_start = -1, needle_end = -1;
};

// Every score's step arrays of one layer's decode step ([score][part], scores.h PerNeedleScore),
// each [R, H] double: the registry's step functions on `in`.
// Retrieval credit: 1/|answer| when the argmax key (first of ties) lies in the answer span and holds
// y (Wu et al., retrieval_head_detection.py lines 221-227). LOCOS: L+ = sum of phi over the needle,
// L- = the sum over the other keys times n / (keys visible - needle keys visible)
// (logit_contrib.py compute_logit_contribution_per_step; 0 when no other key is visible).
// R2 (HeadKV, FYYFU/HeadKV Important_Head/retrieval_head_detection_r2.py lines 218-229): with
// N = |answer span| (r2's needle span is its real_needle, the answer), the top N keys of the whole
// row (every key S, BOS and generated tokens included; ties: the first indices), and (1/N) times
// the sum of the weights of those inside the span; no copy condition. 0 without a span.
// Only the scores in `which` are computed; the others' arrays are left undefined.
PerNeedleScore<at::Tensor> score_layer(const NeedleStepInput& in, NeedleScoreSet which = NeedleScoreSet::all());

// score_layer on one row, exposed for the tests: pattern [H, S] (one query row), v [S, K, d], u [D],
// the rest as NeedleStepInput; every array [H] double.
struct StepScores {
    PerNeedleScore<at::Tensor> of;  // [score][part]
    const at::Tensor& step(NeedleScore s, size_t part = 0) const { return of[static_cast<size_t>(s)][part]; }
};
StepScores score_step(const at::Tensor& pattern, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
                      const std::vector<int64_t>& prompt, const StepSpans& spans, int64_t y);

// The scores of one decode step for the batch rows `scored` (ascending; rows done before this step
// are left out), row scored[r] having generated ys[r] in trial *trials[r]: score_layer on every
// layer's captured pattern rows (rows[l] [B, H, S]) and values (vals[l] [B, S, K, d]), scored row r
// seeing keys[r] keys (ragged rows: fewer than S, the rest weigh 0; KVCache::ragged). Per scored row, [score][part] each [L, H] double; undefined for the scores not in
// `which` (the run's --score: a scan asking for retrieval alone does not pay for LOCOS's value products).
std::vector<PerNeedleScore<at::Tensor>> score_rows(const Model& m, const std::vector<at::Tensor>& rows,
                                                   const std::vector<at::Tensor>& vals, const std::vector<int64_t>& scored,
                                                   const std::vector<const Trial*>& trials, const std::vector<int64_t>& keys,
                                                   const std::vector<int64_t>& ys, NeedleScoreSet which = NeedleScoreSet::all());

// The registry's step functions (scores.cpp's rows), on the rows of one layer: retrieval credit;
// LOCOS L+ then L- (already scaled by n/(K-n)); R2 credit.
std::vector<at::Tensor> retrieval_step(const NeedleStepInput& in);
// x [R, H, S] -> [R, H] int64 on the CPU: at::argmax(x, 2) (the first index of the largest value, a NaN
// the largest), in one pass a (row, head) over the threads for float32 CPU tensors.
at::Tensor first_argmax(const at::Tensor& x);
std::vector<at::Tensor> locos_step(const NeedleStepInput& in);
std::vector<at::Tensor> r2_step(const NeedleStepInput& in);
std::vector<at::Tensor> qrhead_step(const NeedleStepInput& in);  // none: QRHead reads the prefill, not the steps
// The trial functions: retrieval, the sum of the per-step credit; LOCOS, the mean of L+ - L- over
// the answer steps, then the means of L+ and L- (NaN without an answer step, or when the needle's
// span was not found); R2, the sum of the per-step credit over the first min(steps, answer tokens)
// steps (the reference stops after len(answer_tokens) steps, retrieval_head_detection_r2.py lines
// 245, 255; not normalised).
std::vector<at::Tensor> retrieval_trial(const NeedleTrialSteps& in);
std::vector<at::Tensor> locos_trial(const NeedleTrialSteps& in);
std::vector<at::Tensor> r2_trial(const NeedleTrialSteps& in);
// QRHead: qrhead_span_scores over the needle's span of in.query_cal (NaN without it or without the span).
std::vector<at::Tensor> qrhead_trial(const NeedleTrialSteps& in);

// Decode steps that produced the gold answer (the LOCOS rule): the first contiguous run of the
// answer's own tokens (encoded without specials); else the tokens whose decoded text overlaps the
// first case-insensitive occurrence of the answer in the concatenated decoded pieces.
std::vector<int64_t> answer_steps(const Tokenizer& tok, const std::vector<int64_t>& generated, const std::string& answer);

}  // namespace hs
