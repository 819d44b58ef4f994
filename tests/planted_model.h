// A two-layer Llama-family model with identity-like weights for planted-circuit tests: embed =
// unembed = Q (orthonormal rows, from the seeded generator), d_head = d_model so a head's OV can
// be any D x D matrix, v = x for every kv head, all norm weights 1, random q/k and gated MLP.
// Shared by the weight-probe and needle suites, which plant their circuits on top.
#pragma once

#include "model.h"

#include <torch/torch.h>

#include <memory>

namespace planted {

constexpr int64_t kV = 64, kD = 64, kH = 4, kK = 2, kHd = 64;

// wo_scale 0: every head's OV starts at 0 (no generator draw); else W_O ~ N(0, wo_scale^2).
// Draw order (fixed, so a seed gives the same weights): Q, then per layer wq, wk, [wo], gate, up, down.
inline std::unique_ptr<hs::Model> model(uint64_t seed, double wo_scale, double down_scale) {
    torch::manual_seed(seed);
    auto m = std::make_unique<hs::Model>();
    auto& c = m->config;
    c.architecture = "planted";
    c.n_layers = 2, c.n_heads = kH, c.n_kv_heads = kK, c.d_model = kD, c.d_head = kHd, c.d_ff = 32;
    c.vocab_size = kV, c.max_seq_len = 64, c.norm_eps = 1e-6;
    c.validate("planted");
    auto q = std::get<0>(torch::linalg_qr(torch::randn({kV, kD}, torch::kDouble))).to(torch::kFloat);
    m->weights.embed = q;
    m->weights.unembed = q;
    m->weights.final_norm_w = torch::ones({kD});
    for (int l = 0; l < c.n_layers; ++l) {
        hs::LayerWeights lw;
        lw.attn_norm_w = torch::ones({kD});
        lw.mlp_norm_w = torch::ones({kD});
        lw.wq = torch::randn({kH * kHd, kD}) * 0.1;
        lw.wk = torch::randn({kK * kHd, kD}) * 0.1;
        lw.wv = torch::eye(kD).repeat({kK, 1});  // every kv head: v = x
        lw.wo = wo_scale == 0 ? torch::zeros({kD, kH * kHd}) : torch::randn({kD, kH * kHd}) * wo_scale;
        lw.w_gate = torch::randn({c.d_ff, kD}) * 0.3;
        lw.w_up = torch::randn({c.d_ff, kD}) * 0.3;
        lw.w_down = torch::randn({kD, c.d_ff}) * down_scale;
        m->weights.layers.push_back(lw);
    }
    return m;
}

}  // namespace planted
