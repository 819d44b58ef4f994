#include "copy_suppression.h"

#include "blocks.h"
#include "errors.h"
#include "progress.h"
#include "weight_circuits.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

namespace hs {

using namespace torch::indexing;

static at::Tensor f32(const at::Tensor& t) { return t.to(torch::kFloat); }

at::Tensor effective_embedding_rows(const Model& m, const at::Tensor& ids) {
    torch::NoGradGuard ng;
    const auto& c = m.config;
    const auto& lw = m.weights.layers.at(0);
    const int64_t n = ids.size(0);
    auto x = embed_rows(m, ids);  // [n, D]
    auto v = torch::matmul(attn_input(m, 0, x), f32(lw.wv).t()).view({n, c.n_kv_heads, c.d_head});
    // A token attending only to itself: z = its own v; query head h reads kv head h / g.
    auto z = v.repeat_interleave(c.kv_group(), 1).reshape({n, c.d_q()});  // [n, H*d]
    auto attn = torch::matmul(z, f32(lw.wo).t());                         // [n, D]
    if (c.sandwich_norm || c.post_norm_only)
        attn = f32(blocks::norm(c, attn.to(m.options.dtype), lw.post_attn_norm_w, lw.post_attn_norm_b));
    auto r = x + attn;
    return r + mlp_output(m, 0, c.parallel_residual ? x : r);
}

at::Tensor effective_embedding(const Model& m, int64_t row_block) {
    if (row_block <= 0) throw UsageError(fmt::format("block size must be positive, got {}", row_block));
    torch::NoGradGuard ng;
    const int64_t V = m.config.vocab_size;
    auto out = torch::empty({V, m.config.d_model}, torch::TensorOptions().dtype(torch::kFloat).device(m.options.device));
    for (int64_t a = 0; a < V; a += row_block) {
        const int64_t b = std::min(V, a + row_block);
        out.index_put_({Slice(a, b)}, effective_embedding_rows(m, torch::arange(a, b, torch::TensorOptions().dtype(torch::kLong).device(m.options.device))));
    }
    return out;
}

at::Tensor folded_unembed(const Model& m) {
    torch::NoGradGuard ng;
    auto u = fold_final_norm(m, m.weights.unembed);  // [V, D]
    return u - u.mean(0, true);  // logits shift by a per-position constant only
}

// One head's q (or its kv head's k) for every row: [N, d], with the per-head (Qwen3) or full
// (OLMo-2; the whole projection is formed then) QK norm as the forward applies it, RoPE left out
// (position-free by construction). `w` is wq or wk, `slot` the query head or kv head.
static at::Tensor project_qk_head(const Model& m, const at::Tensor& x, const at::Tensor& w, const at::Tensor& norm_w,
                                  int64_t slot) {
    const auto& c = m.config;
    const int64_t d = c.d_head;
    if (c.qk_norm_full) {
        auto y = blocks::rms_norm(torch::matmul(x, f32(w).t()), f32(norm_w), c.norm_eps, false);
        return y.index({Slice(), Slice(slot * d, (slot + 1) * d)});
    }
    auto y = torch::matmul(x, f32(w.index({Slice(slot * d, (slot + 1) * d)})).t());  // [N, d]
    // Gemma 3's q/k norms are (1 + w) RMSNorms (families/gemma.cpp); Qwen3's plain ones.
    return c.qk_norm ? blocks::rms_norm(y, f32(norm_w), c.norm_eps, c.family == Family::kGemma) : y;
}

at::Tensor copy_suppression_qk(const Model& m, int layer, const at::Tensor& x, bool key, int64_t slot) {
    const auto& lw = m.weights.layers[layer];
    return key ? project_qk_head(m, f32(x), lw.wk, lw.k_norm_w, slot) : project_qk_head(m, f32(x), lw.wq, lw.q_norm_w, slot);
}

// Rows `tok` of x without a copy when tok is every row in order (the default: all tokens).
static at::Tensor rows_of(const at::Tensor& x, const at::Tensor& tok) {
    const bool all = tok.size(0) == x.size(0) && torch::equal(tok, torch::arange(x.size(0), tok.options()));
    return all ? x : x.index_select(0, tok);
}

// Memory: the layer's norm1(W_EE) and norm1(W_U rows) ([V, D] each) plus one head's [V, d]
// factors; everything per head is formed inside the loop and dropped after it.
LayerRanks copy_suppression_layer_ranks(const Model& m, int layer, const at::Tensor& w_ee, const at::Tensor& u_f,
                                        const at::Tensor& tokens, int64_t row_block) {
    torch::NoGradGuard ng;
    const auto& c = m.config;
    const auto& lw = m.weights.layers.at(layer);
    const int64_t H = c.n_heads, d = c.d_head, n = tokens.size(0);
    auto tok = tokens.to(w_ee.device(), torch::kLong);
    auto key_in = attn_input(m, layer, w_ee);                                          // [V, D]
    auto q_in = attn_input(m, layer, rows_of(f32(m.weights.unembed), tok));            // [n, D]
    auto src_in = rows_of(key_in, tok);                                                // [n, D]
    LayerRanks r{torch::empty({H, n}, torch::kLong), torch::empty({H, n}, torch::kLong)};
    for (int64_t h = 0; h < H; ++h) {
        const int64_t kv = h / c.kv_group();
        // OV: M_ij = v_i W_O^h . W_U_f[j]; rank = how many outputs sit at or below the source token.
        auto v = torch::matmul(src_in, f32(lw.wv.index({Slice(kv * d, (kv + 1) * d)})).t());        // [n, d]
        auto uo = torch::matmul(u_f, f32(lw.wo.index({Slice(), Slice(h * d, (h + 1) * d)})));       // [V, d]
        r.ov[h] = blocked_target_ranks(v, uo, tok, row_block, RankSide::kAscending).second;
        // QK: query = the unembedding of token i, keys = every token's W_EE; rank = keys scored at least as high.
        auto q = project_qk_head(m, q_in, lw.wq, lw.q_norm_w, h);                                  // [n, d]
        auto k = project_qk_head(m, key_in, lw.wk, lw.k_norm_w, kv);                               // [V, d]
        r.qk[h] = blocked_target_ranks(q, k, tok, row_block, RankSide::kDescending).first;
    }
    return r;
}

static void fill_stats(RankStats& s, int layer, const at::Tensor& ranks, int64_t V) {
    auto r = ranks.to(torch::kFloat);  // [H, n]
    s.median[layer] = std::get<0>(r.median(1));  // lower median for an even count
    s.frac_rank0[layer] = (r == 0).to(torch::kFloat).mean(1);
    s.frac_lt10[layer] = (r < 10).to(torch::kFloat).mean(1);
    s.summary[layer] = torch::log(r + 1).mean(1) - (std::log(static_cast<double>(V)) - 1.0);
}

static RankStats empty_stats(int L, int H) {
    return {torch::zeros({L, H}), torch::zeros({L, H}), torch::zeros({L, H}), torch::zeros({L, H})};
}

CopySuppressionScores copy_suppression_weights(const Model& m, const CopySuppressionOptions& o) {
    torch::NoGradGuard ng;
    const auto& c = m.config;
    const int64_t V = c.vocab_size;
    CopySuppressionScores s{empty_stats(c.n_layers, c.n_heads), empty_stats(c.n_layers, c.n_heads), {}};
    if (o.n_tokens < 0 || o.n_tokens > V)
        throw UsageError(fmt::format("{} tokens: outside [0, {}] (0 = every token)", o.n_tokens, V), "n_tokens");
    if (o.n_tokens == 0) {
        s.tokens = torch::arange(V, torch::kLong);
    } else {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed));
        s.tokens = std::get<0>(torch::randperm(V, gen, torch::kLong).index({Slice(0, o.n_tokens)}).sort());
    }
    auto w_ee = effective_embedding(m, o.block_size);  // [V, D]
    auto u_f = folded_unembed(m);                      // [V, D]
    Progress bar("copy-suppression (layers)", c.n_layers);  // drawn only when stderr is a terminal
    for (int l = 0; l < c.n_layers; ++l) {
        auto r = copy_suppression_layer_ranks(m, l, w_ee, u_f, s.tokens, o.block_size);
        fill_stats(s.ov, l, r.ov, V);
        fill_stats(s.qk, l, r.qk, V);
        bar.update(l + 1);
    }
    bar.finish();
    return s;
}

namespace {

struct DynamicAccum {
    at::Tensor n_pairs, n_rank0, effect;  // [L, H] float64
};

// One layer's contribution: pattern [H, T, T], v [T, K, d], tokens [T], inv_scale [T].
void accumulate_layer(const Model& m, int layer, const at::Tensor& pattern, const at::Tensor& v,
                      const at::Tensor& tokens, const at::Tensor& inv_scale, const at::Tensor& u_f, double threshold,
                      DynamicAccum& acc) {
    const auto& c = m.config;
    const int64_t d = c.d_head, T = tokens.size(0);
    auto uo = torch::matmul(u_f, f32(m.weights.layers[layer].wo));  // [V, H*d]
    auto u_tok = uo.index_select(0, tokens);                          // [T, H*d]
    for (int64_t h = 0; h < c.n_heads; ++h) {
        auto a = pattern[h];                                           // [T_q, T_k]
        auto mask = (a > threshold).to(torch::kDouble);
        mask.index_put_({Slice(), 0}, 0.0);                            // key 0 (BOS / sink) excluded
        auto vh = v.index({Slice(), h / c.kv_group()});                // [T, d]
        auto right = uo.index({Slice(), Slice(h * d, (h + 1) * d)});   // [V, d]
        auto rank = blocked_target_ranks(vh, right, tokens, T, RankSide::kAscending).second;  // [T]
        auto ck = (vh * u_tok.index({Slice(), Slice(h * d, (h + 1) * d)})).sum(-1).to(torch::kDouble);  // [T]
        auto per_key = mask.sum(0);                                    // qualifying queries per key
        acc.n_pairs[layer][h] += per_key.sum();
        acc.n_rank0[layer][h] += (per_key * (rank == 0).to(torch::kDouble).to(per_key.device())).sum();
        auto w = a.to(torch::kDouble) * mask * inv_scale.to(torch::kDouble).unsqueeze(1);
        acc.effect[layer][h] += (w * ck.unsqueeze(0)).sum();
    }
}

}  // namespace

DynamicCopySuppression copy_suppression_dynamic(const Model& m, const std::vector<std::vector<int64_t>>& windows,
                                                double threshold) {
    torch::NoGradGuard ng;
    const int L = m.config.n_layers, H = m.config.n_heads;
    auto u_f = folded_unembed(m);
    DynamicAccum acc{torch::zeros({L, H}, torch::kDouble), torch::zeros({L, H}, torch::kDouble),
                     torch::zeros({L, H}, torch::kDouble)};
    ForwardOptions fo;
    fo.compute_logits = false;
    for (const auto& win : windows) {
        if (win.size() < 2) continue;
        auto tokens = torch::tensor(win, torch::kLong).to(m.options.device);
        at::Tensor inv_scale;  // [T]: the final norm's factor, from a first clean run
        Hooks first;
        first.capture(Point::kResidPost, [&](int, const at::Tensor& x) { inv_scale = final_norm_inv_scale(m, x[0]); },
                      L - 1);
        m.forward(tokens.unsqueeze(0), &first, nullptr, fo);
        at::Tensor v;
        Hooks second;
        second.capture(Point::kAttnV, [&](int, const at::Tensor& x) { v = f32(x[0]); });
        second.capture(Point::kAttnPattern, [&](int l, const at::Tensor& p) {
            accumulate_layer(m, l, f32(p[0]), v, tokens, inv_scale, u_f, threshold, acc);
        });
        m.forward(tokens.unsqueeze(0), &second, nullptr, fo);
    }
    DynamicCopySuppression out;
    out.n_pairs = acc.n_pairs.to(torch::kFloat);
    out.frac_rank0 = (acc.n_rank0 / acc.n_pairs).to(torch::kFloat);  // NaN where no pair qualified
    out.mean_effect = (acc.effect / acc.n_pairs).to(torch::kFloat);
    return out;
}

}  // namespace hs
