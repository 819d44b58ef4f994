#include "blocks.h"

#include "errors.h"

#include <cmath>
#include <limits>

namespace hs::blocks {

using namespace torch::indexing;

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, bool plus_one) {
    auto xf = x.to(torch::kFloat);
    auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
    if (plus_one) return (y * (1.0 + w.to(torch::kFloat))).to(x.scalar_type());  // Gemma: cast after scaling
    return w.defined() ? w * y.to(x.scalar_type()) : y.to(x.scalar_type());
}

at::Tensor norm(const ModelConfig& cfg, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    switch (cfg.norm) {
        case NormKind::kRms: return rms_norm(x, w, cfg.norm_eps, false);
        case NormKind::kRmsPlusOne: return rms_norm(x, w, cfg.norm_eps, true);
        case NormKind::kLayerNorm: {
            auto y = torch::layer_norm(x.to(torch::kFloat), {x.size(-1)}, w.defined() ? w.to(torch::kFloat) : w,
                                       b.defined() ? b.to(torch::kFloat) : b, cfg.norm_eps);
            return y.to(x.scalar_type());
        }
    }
    return x;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool per_row) {
    if (x.dim() == 3 && x.size(0) > 1 && per_row) {
        // One GEMM per batch row: BLAS picks kernels by matrix size, so in a folded GEMM a row's
        // last bits depend on what else is in the batch. Each row goes through the very call an
        // unbatched run ([1, T, D], folded to [T, D]) makes, so a row of a batch whose other rows
        // carry interventions equals its unbatched run bit for bit, whatever the BLAS (a batched
        // bmm is another kernel: MKL's differs from its plain GEMM in the last bits).
        std::vector<at::Tensor> rows;
        rows.reserve(x.size(0));
        for (int64_t r = 0; r < x.size(0); ++r) rows.push_back(b.defined() ? at::linear(x[r], w, b) : torch::matmul(x[r], w.t()));
        return torch::stack(rows);
    }
    // Folded: [B*T, D] x [D, N] in one GEMM (addmm with the bias).
    return b.defined() ? at::linear(x, w, b) : torch::matmul(x, w.t());
}

int Pass::last_layer() const { return opts.stop_after_layer >= 0 ? opts.stop_after_layer : m.config.n_layers - 1; }

at::Tensor Pass::finish(const at::Tensor& x) const {
    if (!opts.compute_logits || opts.stop_after_layer >= 0) return {};
    return unembed(m, x, per_row_gemm);
}

at::Tensor unembed(const Model& m, const at::Tensor& resid, bool per_row) {
    auto logits = linear(m.final_norm(resid), m.weights.unembed, m.weights.unembed_b, per_row);
    if (m.config.final_softcap > 0) logits = torch::tanh(logits / m.config.final_softcap) * m.config.final_softcap;
    return logits;
}

at::Tensor Pass::linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
    return blocks::linear(x, w, b, per_row_gemm);
}

at::Tensor Pass::mlp(const LayerWeights& lw, const at::Tensor& x) const { return blocks::mlp(m.config, lw, x, per_row_gemm); }

at::Tensor Pass::attention(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
    return blocks::attention(m, layer, q, k, v, hooks, cache, opts.attn_block, per_row_gemm);
}

at::Tensor Pass::query_pre_rope(int layer, at::Tensor q) const { return blocks::query_pre_rope(hooks, layer, std::move(q)); }

at::Tensor Pass::hook(Point p, int layer, at::Tensor x) const { return blocks::hook(hooks, p, layer, std::move(x)); }

at::Tensor activation(Activation a, const at::Tensor& x, bool per_row) {
    if (x.dim() == 3 && x.size(0) > 1 && per_row) {
        // Per row too, like linear(): libtorch 2.x's vectorized SiLU/GELU and its scalar tail loop
        // round differently (one float step in ~4% of elements), and which elements fall in the
        // tail depends on the tensor's size, so a batch row's last bits would depend on the batch.
        std::vector<at::Tensor> rows;
        for (int64_t r = 0; r < x.size(0); ++r) rows.push_back(activation(a, x.narrow(0, r, 1), false));
        return torch::cat(rows, 0);
    }
    switch (a) {
        case Activation::kSilu: return torch::silu(x);
        case Activation::kGeluTanh: return torch::gelu(x, "tanh");
        case Activation::kGeluExact: return torch::gelu(x);
        case Activation::kRelu: return torch::relu(x);
    }
    return x;
}

at::Tensor mlp(const ModelConfig& cfg, const LayerWeights& lw, const at::Tensor& x, bool per_row) {
    if (cfg.gated_mlp) {
        auto g = activation(cfg.act, linear(x, lw.w_gate, lw.b_gate, per_row), per_row);
        return linear(g * linear(x, lw.w_up, lw.b_up, per_row), lw.w_down, lw.b_down, per_row);
    }
    return linear(activation(cfg.act, linear(x, lw.w_up, lw.b_up, per_row), per_row), lw.w_down, lw.b_down, per_row);
}

// Inverse frequencies [rot_dim / 2], with Hugging Face's "linear" and "llama3" scalings.
static at::Tensor inv_freq(const ModelConfig& cfg, int64_t rot_dim, double theta) {
    auto idx = torch::arange(0, rot_dim, 2, torch::kLong).to(torch::kFloat);
    auto f = 1.0 / torch::pow(theta, idx / static_cast<double>(rot_dim));
    const auto& s = cfg.rope_scaling;
    if (s.type == "linear") return f / s.factor;
    if (s.type == "llama3") {
        const double low_wavelen = s.original_max_position / s.low_freq_factor;
        const double high_wavelen = s.original_max_position / s.high_freq_factor;
        auto wavelen = 2 * M_PI / f;
        auto scaled = torch::where(wavelen > low_wavelen, f / s.factor, f);
        auto smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
        auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
        return torch::where(medium, smoothed, scaled);
    }
    return f;
}

Rope rope_tables(const ModelConfig& cfg, const at::Tensor& positions, double theta, c10::ScalarType dtype) {
    Rope r;
    r.rot_dim = static_cast<int64_t>(cfg.d_head * cfg.rotary_pct);
    r.rot_dim -= r.rot_dim % 2;
    if (r.rot_dim == 0) return r;
    auto f = inv_freq(cfg, r.rot_dim, theta).to(positions.device());
    auto ang = torch::outer(positions.to(torch::kFloat), f);  // [T, rot/2]
    auto emb = torch::cat({ang, ang}, -1);                    // [T, rot]
    r.cos = emb.cos().to(dtype);
    r.sin = emb.sin().to(dtype);
    return r;
}

at::Tensor query_pre_rope(const Hooks* hooks, int layer, at::Tensor q) {
    if (!hooks) return q;
    if (hooks->has_q_pre_rope_interventions(layer)) q = hooks->apply_q_pre_rope(layer, q);
    return hook(hooks, Point::kAttnQPreRope, layer, std::move(q));
}

at::Tensor apply_rope(const at::Tensor& x, const Rope& rope) {
    if (rope.rot_dim == 0) return x;
    const int64_t d = x.size(-1), half = rope.rot_dim / 2;
    auto xr = rope.rot_dim == d ? x : x.index({"...", Slice(0, rope.rot_dim)});
    auto cos = rope.cos.view({1, -1, 1, rope.rot_dim});
    auto sin = rope.sin.view({1, -1, 1, rope.rot_dim});
    auto rotated = torch::cat({-xr.index({"...", Slice(half, None)}), xr.index({"...", Slice(0, half)})}, -1);
    auto out = xr * cos + rotated * sin;
    if (rope.rot_dim == d) return out;
    return torch::cat({out, x.index({"...", Slice(rope.rot_dim, None)})}, -1);
}

at::Tensor positions_for(const at::Tensor& tokens, const KVCache* cache) {
    const int64_t past = cache ? cache->length() : 0;
    return torch::arange(past, past + tokens.size(1), torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
}

// [T, S] true where query i (absolute past + i) may attend to key j.
static at::Tensor visible_mask(int64_t T, int64_t S, int64_t past, int window, c10::Device dev) {
    auto qi = torch::arange(past, past + T, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(1);
    auto kj = torch::arange(0, S, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(0);
    auto vis = kj <= qi;
    if (window > 0) vis = vis & (kj > qi - window);
    return vis;
}

int64_t attention_block_rows(int64_t requested, int64_t B, int64_t H, int64_t T, int64_t S) {
    if (requested > 0) return std::min(requested, std::max<int64_t>(T, 1));
    // At most 128 query rows a block, so a causal block skips the keys it cannot see (T = 512 in
    // blocks of 128 computes 62.5% of the full T x T scores), and at most ~32 MiB of fp32 scores
    // per block (2^23 elements); never below 16 rows, never above T.
    constexpr int64_t kBudget = int64_t{1} << 23, kMaxRows = 128;
    const int64_t per_row = std::max<int64_t>(1, B * H * S);
    return std::max<int64_t>(1, std::min({T, kMaxRows, std::max<int64_t>(16, kBudget / per_row)}));
}

at::Tensor attention_reference(const ModelConfig& cfg, int layer, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v) {
    const int64_t T = q.size(1), S = k.size(1), H = q.size(2), K = k.size(2), d = q.size(3);
    // Query head h reads key/value head h / (H / K) (grouped-query attention).
    auto kh = k.repeat_interleave(H / K, 2), vh = v.repeat_interleave(H / K, 2);  // [B, S, H, d]
    const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
    auto scores = torch::einsum("bthd,bshd->bhts", {q, kh}) * scale;  // [B, H, T, S]
    if (cfg.attn_softcap > 0) scores = cfg.attn_softcap * torch::tanh(scores / cfg.attn_softcap);
    // Query t sits at absolute position past + t: it sees key s <= past + t, and on a sliding-window
    // layer only the last `window` of those.
    const int64_t past = S - T;
    auto qpos = torch::arange(past, S, torch::kLong).unsqueeze(1), kpos = torch::arange(S, torch::kLong).unsqueeze(0);
    auto visible = kpos <= qpos;
    if (cfg.is_sliding(layer)) visible = visible & (kpos > qpos - cfg.sliding_window);
    scores = scores.masked_fill(visible.logical_not().to(q.device()), -std::numeric_limits<double>::infinity());
    auto pattern = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());  // [B, H, T, S]
    return torch::einsum("bhts,bshd->bthd", {pattern, vh});                            // z [B, T, H, d]
}

at::Tensor attention(const Model& m, int layer, at::Tensor q, at::Tensor k, at::Tensor v, const Hooks* hooks,
                     KVCache* cache, int64_t attn_block, bool per_row) {
    const ModelConfig& cfg = m.config;
    const LayerWeights& lw = m.weights.layers[layer];
    const int64_t B = q.size(0), T = q.size(1), H = cfg.n_heads, K = cfg.n_kv_heads, d = cfg.d_head;
    int64_t past = 0;
    if (cache) {
        if (static_cast<int>(cache->k.size()) < cfg.n_layers) {
            cache->k.resize(cfg.n_layers);
            cache->v.resize(cfg.n_layers);
        }
        if (cache->k[layer].defined()) {
            past = cache->k[layer].size(1);
            k = torch::cat({cache->k[layer], k}, 1);  // [B, S, K, d]
            v = torch::cat({cache->v[layer], v}, 1);
        }
        cache->k[layer] = k;
        cache->v[layer] = v;
    }
    const int64_t S = k.size(1);
    if (hooks && hooks->has_q_interventions(layer)) q = hooks->apply_q(layer, q);
    q = hook(hooks, Point::kAttnQ, layer, q);  // [B, T, H, d]
    k = hook(hooks, Point::kAttnK, layer, k);  // [B, S, K, d]
    v = hook(hooks, Point::kAttnV, layer, v);

    // Query head h reads kv head h / g (grouped-query attention). The g query heads of a kv head
    // are stacked into one product against that kv head's keys, [g*n, d] x [d, S], so k and v
    // are never expanded to H heads; products are [B*K, g*n, .], which is [B, H, n, .] in memory.
    // q, k, v are made contiguous once per layer, so each block's products read them in place.
    const int64_t g = H / K;
    auto k3 = k.permute({0, 2, 1, 3}).reshape({B * K, S, d}).contiguous();
    auto v3 = v.permute({0, 2, 1, 3}).reshape({B * K, S, d}).contiguous();
    auto q3 = q.permute({0, 2, 1, 3}).reshape({B * K, g, T, d}).contiguous();
    const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
    // A power-of-two scale (d_head 64: 1/8) is applied to q before the product: scaling by 2^k is
    // exact, so the scores are bit-identical to (q k^T) * scale, at a [T, d] pass instead of [T, S].
    int exponent = 0;
    const bool scale_in_q = std::frexp(scale, &exponent) == 0.5;
    if (scale_in_q) q3 = q3 * scale;
    const int window = cfg.is_sliding(layer) ? cfg.sliding_window : 0;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // Whole [B, H, T, S] scores only when someone needs them whole; otherwise query blocks, each
    // against only the keys some row of the block can see: keys [lo, hi) with hi = the block's
    // last position + 1 (causal) and lo = its first position - window + 1 (sliding window). Row i
    // of a block is row q0 + i of the whole, computed the same way (the skipped keys are the ones
    // the mask sets to -inf, whose softmax weight is exactly 0); observers are handed rows of full
    // width S, padded with -inf (scores) or 0 (pattern).
    const bool whole = hooks && (hooks->needs_whole(Point::kAttnScores, layer) ||
                                 hooks->needs_whole(Point::kAttnPattern, layer));
    const bool see_scores = !whole && hooks && hooks->wants(Point::kAttnScores, layer);
    const bool see_pattern = !whole && hooks && hooks->wants(Point::kAttnPattern, layer);
    const int64_t rows = whole ? T : attention_block_rows(attn_block, B, H, T, S);
    // Blocks reuse one scratch buffer per tensor for the whole layer (allocated once, at the largest
    // block), instead of allocating, page-faulting and freeing fresh [B, H, rows, m] tensors block
    // after block: at T = 4096 that was ~4 x 25 MiB x 32 blocks per layer. Row observers are told
    // not to keep what they are handed (src/hooks.h); whole-tensor hooks get fresh tensors.
    const bool reuse = !whole && T > rows;
    const bool fp32 = q.scalar_type() == at::kFloat;
    const int64_t cap = B * H * rows * S;
    at::Tensor scores_buf, pattern_buf, wide_buf;
    if (reuse) {
        scores_buf = at::empty({cap}, q3.options());
        if (fp32) pattern_buf = at::empty({cap}, q3.options());
    }
    auto from = [](const at::Tensor& buf, at::IntArrayRef shape) {
        return buf.narrow(0, 0, c10::multiply_integers(shape)).view(shape);
    };
    // Observers see rows of full width S: the block's columns [lo, hi), the rest -inf or 0.
    auto full_width = [&](const at::Tensor& block, int64_t n, int64_t lo, float fill) {
        const int64_t m = block.size(2);
        auto b4 = block.view({B, H, n, m});
        if (lo == 0 && m == S) return b4;
        if (!wide_buf.defined()) wide_buf = at::empty({cap}, b4.options());
        auto out = from(wide_buf, {B, H, n, S});
        if (lo > 0) out.narrow(3, 0, lo).fill_(fill);
        if (lo + m < S) out.narrow(3, lo + m, S - lo - m).fill_(fill);
        out.narrow(3, lo, m).copy_(b4);
        return out;
    };
    at::Tensor upper;  // the causal corner mask, built once per block height
    std::vector<at::Tensor> zs;
    for (int64_t q0 = 0; q0 < T; q0 += rows) {
        const int64_t n = std::min(rows, T - q0);
        const int64_t first = past + q0;  // absolute position of the block's first query
        int64_t lo = 0, hi = S;
        if (!whole) {
            hi = std::min(S, first + n);
            if (window > 0) lo = std::max<int64_t>(0, first - window + 1);
        }
        const int64_t m = hi - lo;
        auto qb = (n == T ? q3 : q3.narrow(2, q0, n)).reshape({B * K, g * n, d});
        auto kt = (m == S ? k3 : k3.narrow(1, lo, m)).transpose(1, 2);
        at::Tensor scores;  // [B*K, g*n, m] = [B, H, n, m]
        if (reuse) {
            scores = from(scores_buf, {B * K, g * n, m});
            at::bmm_out(scores, qb, kt);
        } else {
            scores = at::bmm(qb, kt);
        }
        if (!scale_in_q) scores.mul_(scale);
        if (cfg.attn_softcap > 0) scores.div_(cfg.attn_softcap).tanh_().mul_(cfg.attn_softcap);
        if (window == 0 && hi == first + n && n >= 1) {
            // Causal only: the masked entries all lie in the last n columns, above the diagonal.
            if (n > 1) {
                if (!upper.defined() || upper.size(0) != n)
                    upper = torch::ones({n, n}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
                scores.view({B * K, g, n, m}).narrow(3, m - n, n).masked_fill_(upper, neg_inf);
            }
        } else {
            auto vis = visible_mask(n, m, first - lo, window, q.device());
            scores.view({B * K, g, n, m}).masked_fill_(vis.logical_not(), neg_inf);
        }
        if (whole) scores = hook(hooks, Point::kAttnScores, layer, scores.view({B, H, n, m})).reshape({B * K, g * n, m});
        else if (see_scores) hooks->run_rows(Point::kAttnScores, layer, q0, full_width(scores, n, lo, neg_inf));
        at::Tensor pattern;  // [B*K, g*n, m], softmax in fp32
        if (reuse && fp32) {
            pattern = from(pattern_buf, {B * K, g * n, m});
            at::_softmax_out(pattern, scores, -1, false);
        } else {
            pattern = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());
        }
        scores = at::Tensor();
        if (whole) pattern = hook(hooks, Point::kAttnPattern, layer, pattern.view({B, H, n, m})).reshape({B * K, g * n, m});
        else if (see_pattern) hooks->run_rows(Point::kAttnPattern, layer, q0, full_width(pattern, n, lo, 0.0f));
        zs.push_back(at::bmm(pattern, m == S ? v3 : v3.narrow(1, lo, m)).view({B, H, n, d}));
    }
    auto z = (zs.empty() ? torch::zeros({B, H, 0, d}, q.options()) : zs.size() == 1 ? zs[0] : torch::cat(zs, 2))
                 .permute({0, 2, 1, 3});  // [B, T, H, d]
    zs.clear();
    if (hooks && hooks->has_z_interventions(layer)) z = hooks->apply_z(layer, z);
    z = hook(hooks, Point::kAttnZ, layer, z);

    at::Tensor out;
    if (hooks && hooks->wants(Point::kAttnHeadOut, layer)) {
        // Per (row, head) GEMMs [T, d] x [d, D], batch-independent like per-row linear().
        auto wo_h = lw.wo.view({cfg.d_model, H, d}).permute({1, 2, 0});     // [H, d, D]
        auto zb = z.permute({0, 2, 1, 3}).reshape({B * H, T, d});
        auto head_out = torch::bmm(zb, wo_h.unsqueeze(0).expand({B, H, d, cfg.d_model}).reshape({B * H, d, cfg.d_model}))
                            .view({B, H, T, cfg.d_model})
                            .permute({0, 2, 1, 3});                         // [B, T, H, D]
        head_out = hooks->run(Point::kAttnHeadOut, layer, head_out);
        out = head_out.sum(2);
        if (lw.bo.defined()) out = out + lw.bo;
    } else {
        out = linear(z.reshape({B, T, H * d}), lw.wo, lw.bo, per_row);  // [B, T, D]
    }
    return hook(hooks, Point::kAttnOut, layer, out);
}

}  // namespace hs::blocks
