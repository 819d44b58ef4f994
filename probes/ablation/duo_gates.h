// DuoAttention's learned head gates (Xiao et al. 2024; mit-han-lab/duo-attention, duo_attn/train.py
// and duo_attn/patch/llama.py, llama_duo_attention_forward_two_way). A gate alpha in [0, 1] per
// key/value head mixes the head's full attention with its streaming attention (the first `sink` keys
// and the last `recent` up to the query):
//   z_h = alpha z_full,h + (1 - alpha) z_stream,h
// at every layer of a second copy of the model, while the first copy runs unchanged; z_full comes
// from the unchanged copy's residual stream (the reference computes it on the first half of the
// batch, under no_grad), z_stream from the gated copy's own. The model is frozen and the gates fit
//   loss = sum over scored positions of mean over d_model of (h_gated - h_full)^2 / #positions
//          + lambda * mean |alpha|
// where h is the final hidden state after the final norm (LlamaModel's output) and the scored
// positions are the study's metric positions (the reference: the labelled answer tokens). As the
// reference: alpha initialised to 1, clamped to [0, 1] before every step, Adam(W) without weight
// decay, lr 0.02 and lambda 0.05 (scripts/run_train.sh), the learning rate warmed up over the first
// fifth of the steps from 0.1x and cooled down over the last fifth to 0.1x (its LambdaLR). With GQA
// one gate per key/value head, shared by the query heads that read it (the reference's view/expand).
//
// Cost: the unchanged copy is the same every step, so its z at every layer and its final hidden
// states are computed once (no grad) and kept: L x N x T x d_model floats. Each step is then one
// forward of the gated copy and one backward.
//
// A high alpha = the head needs the whole context (a retrieval head). The learned alphas rank heads
// for the streaming sweep (`retrieval --stream-sweep --order FILE.h5:/ablation/<study>/duo/alpha`).
#pragma once

#include "ablation.h"
#include "intervention.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace hs {

struct DuoGateOptions {
    // The streaming attention the fit mixes in: sink, recent, and block (> 1: the reference's training
    // window, block_streaming_attn_func's 128-token blocks; hooks.h StreamWindow), compensate
    // (RazorAttention's token, token windows only).
    StreamWindow window;
    int64_t steps = 200;     // optimiser steps (one forward + backward over the data each)
    double lr = 0.02;
    double lambda = 0.05;    // weight of mean |alpha|
    double init = 1.0;       // the reference's initial_value
    // When set, each step fits on sample(step), a fresh sample (the reference draws one a step:
    // duo_data.h), and the unchanged copy runs on it that step (one more forward a step, no grad);
    // empty: the study's fixed prompts every step. The losses at alpha = 1, 0 and the fitted alpha
    // (distill_full, _stream, _final) are on the study's prompts either way.
    std::function<Ablator::ScoredRows(int64_t step)> sample;
};

struct DuoGateResult {
    at::Tensor alpha;       // [L, H] float32 after the fit, clamped to [0, 1] (a kv head's gate on each of its query heads)
    at::Tensor alpha_kv;    // [L, K] float32: the fitted parameters
    at::Tensor history;     // [steps, 2] float64: distillation loss and mean |alpha| at each step (before its update)
    double distill_full = 0;   // the distillation loss at alpha = 1 (0 up to rounding: a check)
    double distill_stream = 0; // at alpha = 0 (every head streaming)
    double distill_final = 0;  // at the fitted alpha
};

// step_fn(step, loss) after every step (progress).
DuoGateResult fit_duo_gates(const Model& m, const Ablator& ab, const DuoGateOptions& o,
                            const std::function<void(int64_t, double)>& step_fn = {});

// The distillation loss (without the lambda term) of gates alpha_kv [L, K] (no grad), for checks.
double duo_distillation_loss(const Model& m, const Ablator& ab, const DuoGateOptions& o, const at::Tensor& alpha_kv);
// Its gradient with respect to alpha_kv by autograd ([L, K] float32 CPU), as the fit computes it.
at::Tensor duo_distillation_grad(const Model& m, const Ablator& ab, const DuoGateOptions& o, const at::Tensor& alpha_kv);

// How fitted gates are deployed: which key/value heads stream (the others keep full attention).
struct DuoDeploy {
    // true: the reference's deployment, sparsify_attention_heads at sparsity `value` (duo_sparsity.h:
    // numpy's quantile over all layers' alpha_kv with U(0, 1e-6) tie noise, gate >= quantile kept
    // full); false: the KV heads with alpha_kv < `value` stream (the reference's --threshold default 0.5).
    bool sparsity = true;
    double value = 0.5;
    uint64_t noise_seed = 0;  // the tie noise: duo_tie_noise(L K, noise_seed), over alpha_kv row-major
};

struct DuoDeployment {
    DuoDeploy how;
    at::Tensor streamed_kv;        // [L, K] uint8: 1 = streams
    at::Tensor streamed;           // [L, H] uint8: the query heads of the streamed KV heads
    double threshold = 0;          // what the gates were compared with (sparsity: the quantile, or 2 / -1 at sparsity 1 / 0)
    double returned_sparsity = 0;  // the share of KV heads streamed (the reference's returned 1 - mean(full))
};

// ConfigError for a value outside [0, 1].
DuoDeployment duo_deploy(const DuoGateResult& r, const DuoDeploy& d);

// The configurations a duo-gates study evaluates with its stream window: the baseline, the heads the
// deployment streams (kind duo), and `controls` random sets of as many heads (std::mt19937_64 from
// seed * 1000003 + 1009 + i).
StudyConfigs duo_configs(const DuoGateResult& r, const DuoDeployment& d, int64_t controls, int64_t seed);

}  // namespace hs
