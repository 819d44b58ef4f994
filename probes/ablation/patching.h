// Activation, attribution and path patching of attention heads (`headscope patch`; methods:
// docs/methods.md, "Patching"). Clean and corrupted prompts come in pairs of equal token length;
// the metric is read at each pair's last position and averaged over the pairs:
//   logit-diff = logit(answer) - logit(wrong),  prob = p(answer),  loss = -log p(answer).
// Scores are normalised as (M_patched - M_corrupt) / (M_clean - M_corrupt), each M first averaged
// over the pairs: 1 = the patch restores the clean behaviour fully, 0 = no effect (the sign
// convention of Wang et al. 2022 and TransformerLens's patching module; it holds for loss too,
// whose clean value is the lower one).
//
// Exact patching runs the corrupted prompts with one site of the clean run put in: many patches per
// batched forward (configuration j of a forward owns rows j*N .. j*N+N-1), the layers below the
// patched one computed once (ForwardOptions::start_layer). Attribution patching (Nanda 2023,
// Syed et al. 2023) estimates every patch at once from one clean forward, one corrupted forward and
// one backward: (a_clean - a_corrupt) . dM/da at the corrupted activations.
#pragma once

#include "experiment.h"  // MetricKind
#include "heads.h"
#include "hooks.h"       // Point
#include "model.h"
#include "names.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

// The metrics patching reads (src/experiment/experiment.h's MetricKind: one vocabulary with the ablation
// studies), at each pair's last position: logit-diff, loss, prob.
const NameTable<MetricKind>& patch_metric_names();  // logit-diff, loss, prob
// Where a head's activation is patched: a hooks.h point, under the short name `--what` takes: z,
// q (after RoPE), k, v (after RoPE, per key/value head: with GQA a k or v patch changes every query
// head of the group), pattern (the head's attention rows), head-out (z_h W_O^h).
const NameTable<Point>& patch_site_names();  // z, q, k, v, pattern, head-out
inline const char* patch_site_name(Point s) { return name_in(patch_site_names(), s); }

struct PatchPairs {
    at::Tensor clean, corrupt;           // [N, T] int64 (right-padded with 0 past each pair's length)
    std::vector<int64_t> lengths;        // [N]; a pair's clean and corrupted prompts have this length
    std::vector<int64_t> answer, wrong;  // [N] token ids (wrong: -1 where the metric needs none)
    int64_t rows() const { return static_cast<int64_t>(lengths.size()); }
};

// One JSONL line each: {"clean": TEXT | [ids], "corrupt": TEXT | [ids], "answer": TEXT | id,
// "wrong": TEXT | id} (wrong only for logit-diff; a text answer must encode to one token). Texts are
// encoded with BOS; token lists are taken as given. DataError naming FILE:LINE for a bad line,
// unequal clean/corrupt lengths, ids out of range, a text answer of several tokens; `tok` may be
// null when every field is ids.
class Tokenizer;
PatchPairs read_patch_pairs(const std::string& path, const Model& m, const Tokenizer* tok, MetricKind metric);

struct PatchOptions {
    MetricKind metric = MetricKind::kLogitDiff;
    Point site = Point::kAttnZ;
    bool each_position = false;  // one patch per (head, position) instead of per head (all positions)
    int64_t max_rows = 64;       // rows per forward (patches x pairs), at least one patch
    // A fixed source instead of each pair's clean run (Todd et al.'s mean head activations, function
    // vectors): mean_source[l] is layer l's site value per unit, [U, d] (mean_site_at_last), and is put
    // at each corrupted row's last position only. The clean prompts are not run: metric_clean is NaN
    // and scores are the raw change patched - M_corrupt (the indirect effect, unnormalised). Sites
    // z, q, k, v, head-out; not with each_position.
    std::vector<at::Tensor> mean_source;
};

struct PatchResult {
    // [L, U] (all positions) or [L, U, T] (each): U = H heads, or K key/value heads for k and v.
    at::Tensor scores;   // float64, normalised (1 = fully restored)
    at::Tensor patched;  // float64, the mean metric with the patch (attribution: M_corrupt + the estimate)
    double metric_clean = 0, metric_corrupt = 0;
    int64_t forwards = 0;  // forward passes run (benchmarks)
};

// The site's value at each prompt's last position (lengths[i] - 1), averaged over the prompts: one
// [U, d] float64 tensor a layer (Todd et al.'s get_mean_head_activations at the final token), with
// the prompts' mean p(answer[i]) and top-1 accuracy at that position. tokens [N, T] right-padded.
struct MeanAtLast {
    std::vector<at::Tensor> mean;  // [L] of [U, d]
    double prob = 0, top1 = 0;
    int64_t forwards = 0;
};
MeanAtLast mean_site_at_last(const Model& m, const at::Tensor& tokens, const std::vector<int64_t>& lengths,
                             const std::vector<int64_t>& answer, Point site, int64_t max_rows);

// Every head (and position) patched clean -> corrupted, one at a time. UsageError when
// each_position is asked for pairs of unequal lengths.
PatchResult exact_patching(const Model& m, const PatchPairs& pairs, const PatchOptions& o);
// The same table estimated to first order (2 forwards + 1 backward).
PatchResult attribution_patching(const Model& m, const PatchPairs& pairs, const PatchOptions& o);

// Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): the senders' clean-minus-corrupted
// output enters only the receivers' q, k or v input, everything else stays corrupted (the receivers'
// own changed outputs then flow on as usual). The receiver layer's input norm keeps the corrupted
// run's scale (frozen): with x the corrupted resid_pre and y = x + delta, the receiver's input is
// (y - mean) / sigma_x * w + b instead of / sigma_y, which is s_0 + (sigma_y / sigma_x)(s(y) - s_0) for
// s = q, k or v computed from resid y through the layer (s_0: from resid 0, the biases' part; RoPE is
// linear). Families with a q/k norm (Qwen3, Gemma 3, OLMo-2) renormalise q and k after the
// projection, so there the frozen and live scales give the same q and k. Every receiver's layer must
// be after every sender's (UsageError otherwise).
struct PathSpec {
    std::vector<Head> senders, receivers;
    Point input = Point::kAttnK;  // q, k or v
    std::string label() const;        // "L0H2->L1H0,L1H1:k"
};
// "L0H2,L0H3->L1H0:k" (UsageError naming the part that is wrong).
PathSpec parse_path_spec(const std::string& s, int L, int H);
struct PathResult {
    double score = 0, metric_patched = 0, metric_clean = 0, metric_corrupt = 0;
    int64_t forwards = 0;
};
PathResult path_patching(const Model& m, const PatchPairs& pairs, const PathSpec& p, MetricKind metric);

}  // namespace hs
