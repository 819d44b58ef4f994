// Ada-KV's selection (Feng et al. 2024) as kvpress runs it, AdaKVPress (adakv_press.py) and
// CriticalAdaKVPress (criticalkv_press.py), over SnapKV's observation-window scores: the two policies
// adakv (kv_adakv.cpp) and critical-adakv (kv_critical-adakv.cpp), and the functions they share
// (tests/test_kv_policy.cpp compares them with tests/adakv_reference.py, kvpress's code line by line).
// docs/methods.md, "KV-cache policies", Ada-KV.
#pragma once

#include "kv_policy.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

namespace hs {

// kvpress's defaults (AdaKVPress.alpha_safeguard, CriticalAdaKVPress.epsilon and first_stage_ratio);
// FFY0/AdaKV's scripts use floor_alpha 0.2 too (experiments/LongBench/pred.py l. 27).
constexpr double kAdaKvAlpha = 0.2;
constexpr double kCriticalEpsilon = 1e-4;
constexpr double kCriticalFirstStage = 0.5;

// One layer's scores per KV head as kvpress's SnapKVPress.score hands them on (snapkv_press.py l. 98-103):
// the pooled prefix scores [H, n] (snapkv_scores' layer) averaged over each group's g query heads, then
// the last P - n positions (the observation window) appended at the layer's maximum + 1. [K, P] float.
at::Tensor adakv_kv_scores(const at::Tensor& pooled, int64_t g, int64_t P);

// AdaKVPress.compress (adakv_press.py l. 59-77) on one layer's scores [K, P]: each KV head's
// n_safe = int(C alpha) best positions are kept (the safeguard), and the rest of the K C entries the
// layer keeps are its best scores across all its heads. Ties go to the earlier (head, position). [K, P] bool.
at::Tensor adakv_keep(const at::Tensor& scores, int64_t C, double alpha);

// CriticalAdaKVPress.compress (criticalkv_press.py l. 145-193): the safeguard as adakv_keep; each head's
// budget b_k = its count among the layer's K C best safeguarded scores; each head keeps its
// max(n_safe, int(b_k first_stage)) best by score (stage 1) and fills b_k by (score + epsilon) vo
// (stage 2). vo [K, P]: critical_vo_norms' layer. Ties to the earlier position. [K, P] bool.
at::Tensor critical_adakv_keep(const at::Tensor& scores, const at::Tensor& vo, int64_t C, double alpha, double epsilon,
                               double first_stage);

// CriticalKVPress.vwl1norm (criticalkv_press.py l. 57-76) for one layer: values v [P, K, d], o_out
// [H, d, D] (each query head's W_O, row-vector convention, weight_circuits.h head_o_out): per KV head and
// position, ||v W_O^h||_1 averaged over the group's query heads. [K, P] float.
at::Tensor vo_l1_norms(const at::Tensor& v, const at::Tensor& o_out);

// A KV head's budget C from SnapKV's capacity B per query head (snapkv_config's: round(budget P K / H)
// at a budget, the column's capacity at --kv-capacity): g max(B, w), at most P, so that a layer's K C
// entries are the memory snapkv's H query heads hold, each B or at least its window w (P < B, which
// SnapKV leaves whole: C = P).
int64_t adakv_capacity(int64_t B, int64_t P, const KvShape& sh, int64_t window);

// adakv / critical-adakv at one column (a budget, or ctx.capacity): per trial and layer, select(trial, layer, scores [K, P], C) ->
// [K, P] bool, each KV head's mask given to its g query heads.
using AdaKvSelect = std::function<at::Tensor(const Trial&, int64_t layer, const at::Tensor& scores, int64_t C)>;
KvConfig adakv_config(const std::string& key_name, double budget, const KvContext& ctx, AdaKvSelect select);

}  // namespace hs
