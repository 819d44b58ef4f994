// The one vocabulary of head interventions: what is done to a head's activation, and where, and the
// one applier that turns an intervention into hook calls. `headscope run` / `ablate` (YAML `mode:`),
// `headscope retrieval --ablation`, `generate --rows`, the toy trainer's checks and every later
// experiment name interventions from this table, so a name means one thing.
//
//   name                 acts on                       the head's activation becomes
//   zero                 attn.z (before W_O)           0
//   mean                 attn.z                        the mean over a reference dataset
//   resample             attn.z                        another row's activation (a reference row)
//   scale                attn.z                        factor x itself
//   zero-query           attn.q (after RoPE)           0: uniform attention over the visible keys
//   mean-query           attn.q (after RoPE)           the mean over a reference dataset (per position
//                                                      or pooled), as `mean` does for z
//   mean-query-pre-rope  attn.q_pre_rope               a given pre-RoPE query (LOCOS's calibration
//                                                      mean), which RoPE then rotates at each position
//   stream               the attention mask (keys)     its attention over a window: the first `sink`
//                                                      keys and the last `recent` up to the query
//                                                      (StreamWindow; DuoAttention's streaming heads,
//                                                      RazorAttention's compensation token as an option)
//
// (`retrieval --ablation mean-query` keeps the LOCOS study's word for LOCOS's pre-RoPE mean, as its
// result files and the reference scripts name it: the needle harness's HeadSet::apply hands it to
// apply_intervention as mean-query-pre-rope, the one meaning that code runs.)
//
// apply_intervention() below is the one place an Intervention becomes hook calls, in two forms that
// do the same operation: on a list of heads in one batch row or all (Hooks::intervene_z / intervene_q
// / intervene_q_pre_rope / window: the decoding rows, the needle harness's HeadSet), or per batch row
// on one layer through a [R, H] mask (the ablation engine's configurations, DuoAttention's gates).
// Each caller passes the interventions it allows.
#pragma once

#include "heads.h"
#include "hooks.h"
#include "names.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace hs {

enum class Intervention { kNone, kZero, kMean, kResample, kScale, kZeroQuery, kMeanQuery, kMeanQueryPreRope, kStream };

// Every intervention a user can name, in the order help texts and messages list them.
const NameTable<Intervention>& intervention_names();
const char* intervention_name(Intervention i);  // "none" for kNone
// `s` as one of `allowed` (all of them when empty). UsageError "WHAT 's': expected a, b or c".
Intervention parse_intervention(const std::string& s, const std::string& what = "mode",
                                const std::vector<Intervention>& allowed = {});
std::vector<std::string> intervention_name_list(const std::vector<Intervention>& allowed = {});
// The interventions an ablation study runs (YAML `mode:`, `ablate --mode`: the ablation engine's
// per-row masks), in the table's order: every one but mean-query-pre-rope.
const std::vector<Intervention>& study_interventions();
const NameTable<Intervention>& study_intervention_names();

// The capture point whose activation the intervention replaces (attn.z, attn.q or attn.q_pre_rope);
// stream edits no activation (it acts on the mask) and kNone nothing: Point::kCount for both.
Point intervention_point(Intervention i);
// Needs a clean run over a study's reference dataset (mean, mean-query, resample).
bool needs_reference(Intervention i);

// What an intervention needs besides its kind; each field is read only by the kinds named.
struct InterventionSpec {
    Intervention mode = Intervention::kNone;
    double factor = 1.0;  // scale: the factor (per head); the per-row form may give one per row
    // mean, mean-query, mean-query-pre-rope on heads: [L, H, d], the replacement of head (l, h) at
    // every position. On one layer's rows: that layer's [H, d] (pooled) or [T, H, d] (per position,
    // its first T rows), or for resample [R, T, H, d] (row r's replacement).
    at::Tensor value{};
    StreamWindow window{};  // stream
};

// `heads` in batch row `row` (-1: every row), through the head-level hooks. HS_REQUIRE (a caller's
// bug) for a mode outside `allowed` or one with no head-level form (resample).
void apply_intervention(Hooks& hooks, const InterventionSpec& spec, const std::vector<Head>& heads, int64_t row,
                        const std::vector<Intervention>& allowed);

// One layer's per-row form: row r of the forward's batch has head h intervened where mask[r][h] is
// nonzero ([R, H], on the model's device). The activation x becomes x + d (v - x) with d the row's
// mask ([R, 1, H, 1]): zero and zero-query as x (1 - d), scale as x (1 + d (factor - 1)), mean,
// mean-query and resample with v = spec.value; stream gives those (row, head) pairs the window.
// row_factors (scale, optional): [R] one factor per row (a scale grid), else spec.factor.
// per_position (mean, mean-query): spec.value is [T, H, d] rather than [H, d].
struct LayerRows {
    int layer = 0;
    at::Tensor mask;         // [R, H]
    at::Tensor row_factors;  // [R] double, optional
    bool per_position = false;
};
void apply_intervention(Hooks& hooks, const InterventionSpec& spec, const LayerRows& rows,
                        const std::vector<Intervention>& allowed);

}  // namespace hs
