// Causal head gating (Nam et al. 2025, arXiv 2505.13737; andrewnam/causal_head_gating): learned gates
// G = sigmoid(logits) [L, H] multiply each head's z (its slice of o_proj's input, as the package's
// pre-hook does), fitted with the model frozen to
//   loss = objective(G) - lambda * mean(clamp(logits, -4, 4))
// where the objective is the study's metric made "lower is better" (loss, kl as they are; logit-diff
// and prob negated). Three fits as the paper: lambda = 0 from a uniform(0, 1) gate draw (the
// package's create_masks), then lambda = +0.1 (G+: the regulariser pulls gates to 1, so only heads
// that hurt the task close) and lambda = -0.1 (G-: gates pulled to 0, so only heads the task needs
// stay open), both from the lambda = 0 fit. Adam, lr 1.0, the gradient norm clipped to 1.0 per start.
// Several random starts are fitted at once as batch rows (Ablator::gated_metric).
//
// Roles (the paper's text and the package's code; its README states the signs the other way):
// facilitating = G+ and G- both open (>= 0.5), interfering = both closed, irrelevant = G+ open and
// G- closed (the head follows the regulariser); G+ closed with G- open contradicts itself and is
// labelled "unstable".
#pragma once

#include "ablation.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hs {

enum class HeadRole : int8_t { kIrrelevant = 0, kFacilitating = 1, kInterfering = 2, kUnstable = 3 };
const char* head_role_name(HeadRole r);  // irrelevant, facilitating, interfering, unstable

struct GatingOptions {
    int64_t starts = 5;       // random starts, fitted together as batch rows
    int64_t steps = 200;      // Adam steps per fit (three fits)
    double lambda = 0.1;      // |lambda| of the G+ and G- fits
    double lr = 1.0;
    double clip = 1.0;        // gradient norm clip, per start
    uint64_t seed = 0;        // the uniform(0, 1) initial gates
    bool higher_is_better = false;  // the metric's direction (logit-diff, prob: true)
};

struct GatingResult {
    at::Tensor g0, g_plus, g_minus;  // [S, L, H] float32 gates after each fit
    at::Tensor objective;            // [3, S] float64: the metric at the end of each fit (lambda 0, +, -)
    at::Tensor roles;                // [S, L, H] int8 HeadRole per start
    at::Tensor role;                 // [L, H] int8: the most frequent role over the starts (ties: lower value)
    at::Tensor role_counts;          // [4, L, H] int64: starts giving each role
};

// step_fn(fit 0..2, step, mean loss over starts) after each step (progress, logging).
GatingResult fit_head_gates(const Ablator& ab, int L, int H, const GatingOptions& o,
                            const std::function<void(int, int64_t, double)>& step_fn = {});

// The configurations a gating study evaluates with zero ablation (the paper's causal checks): the
// baseline, then per start the G- circuit (every head with G- < 0.5 zeroed: what the task needs
// should suffice) and the G+ removal (every head with G+ < 0.5 zeroed: the interfering ones).
StudyConfigs gating_configs(const GatingResult& r);

// The roles rule on gates [.., L, H] (threshold 0.5).
at::Tensor head_roles(const at::Tensor& g_plus, const at::Tensor& g_minus);

}  // namespace hs
