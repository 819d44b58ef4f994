#include "blocks.h"

#include "errors.h"
#include "torch_compat.h"

#include <cmath>
#include <limits>
#include <tuple>

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
                               const at::Tensor& v, const LayerWindows* windows) {
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
    const double inf = std::numeric_limits<double>::infinity();
    if (!windows || !windows->defined()) {
        scores = scores.masked_fill(visible.logical_not().to(q.device()), -inf);
        auto pattern = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());  // [B, H, T, S]
        return torch::einsum("bhts,bshd->bthd", {pattern, vh});                            // z [B, T, H, d]
    }
    // Attention windows: head h of row b at query position p also needs key s < sink[b, h] or
    // s > p - recent[b, h]. With compensation, the keys the window hides (visible to the layer, not
    // to the window) are averaged into one more key and value, scored like any key.
    const int64_t B = q.size(0);
    auto layer_vis = visible.to(q.device()).view({1, 1, T, S});
    auto sink = windows->sink.view({B, H, 1, 1}), recent = windows->recent.view({B, H, 1, 1});
    auto kp = kpos.to(q.device()).view({1, 1, 1, S}), qp = qpos.to(q.device()).view({1, 1, T, 1});
    auto seen = layer_vis & ((kp < sink) | (kp > qp - recent));  // [B, H, T, S]
    scores = scores.masked_fill(seen.logical_not(), -inf);
    if (!windows->any_compensate) {
        auto pattern = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());
        return torch::einsum("bhts,bshd->bthd", {pattern, vh});
    }
    auto hidden = (layer_vis & seen.logical_not()).to(torch::kDouble);        // [B, H, T, S]
    auto count = hidden.sum(-1, true);                                          // [B, H, T, 1]
    auto kbar = torch::einsum("bhts,bshd->bhtd", {hidden, kh.to(torch::kDouble)}) / count.clamp_min(1);
    auto vbar = torch::einsum("bhts,bshd->bhtd", {hidden, vh.to(torch::kDouble)}) / count.clamp_min(1);
    auto extra = (q.permute({0, 2, 1, 3}).to(torch::kDouble) * kbar).sum(-1, true) * scale;  // [B, H, T, 1]
    if (cfg.attn_softcap > 0) extra = cfg.attn_softcap * torch::tanh(extra / cfg.attn_softcap);
    auto use = (count > 0) & windows->compensate.view({B, H, 1, 1});
    extra = extra.masked_fill(use.logical_not(), -inf);
    auto pattern = torch::softmax(torch::cat({scores.to(torch::kDouble), extra}, -1), -1);  // [B, H, T, S + 1]
    auto z = torch::einsum("bhts,bshd->bthd", {pattern.narrow(3, 0, S), vh.to(torch::kDouble)}) +
             (pattern.narrow(3, S, 1) * vbar).permute({0, 2, 1, 3});
    return z.to(q.scalar_type());
}

static at::Tensor attention_output(const Model& m, int layer, at::Tensor z, const Hooks* hooks, bool per_row);

bool uses_fused_attention(const Model& m, int layer, const Hooks* hooks, bool per_row) {
    if (!fused_attention_enabled(m.options) || m.config.attn_softcap > 0 || per_row) return false;
    return !(hooks && (hooks->wants(Point::kAttnScores, layer) || hooks->wants(Point::kAttnPattern, layer) ||
                       hooks->has_windows(layer)));
}

at::Tensor attention(const Model& m, int layer, at::Tensor q, at::Tensor k, at::Tensor v, const Hooks* hooks,
                     KVCache* cache, int64_t attn_block, bool per_row) {
    const ModelConfig& cfg = m.config;
    const int64_t B = q.size(0), T = q.size(1), H = cfg.n_heads, K = cfg.n_kv_heads, d = cfg.d_head;
    if (cache) std::tie(k, v) = cache->append(layer, k, v);  // [B, S, K, d] views of [B, K, capacity, d] buffers
    const int64_t S = k.size(1), past = S - T;
    if (hooks && hooks->has_q_interventions(layer)) q = hooks->apply_q(layer, q);
    q = hook(hooks, Point::kAttnQ, layer, q);  // [B, T, H, d]
    k = hook(hooks, Point::kAttnK, layer, k);  // [B, S, K, d]
    v = hook(hooks, Point::kAttnV, layer, v);

    if (uses_fused_attention(m, layer, hooks, per_row)) {
        // libtorch's fused kernel: [B, H, T, d] against the kv heads repeated to H (GQA), the causal
        // mask as a flag when there is no cache, else as [T, S] with the sliding window folded in.
        const int window = cfg.is_sliding(layer) ? cfg.sliding_window : 0;
        auto q4 = q.permute({0, 2, 1, 3});
        auto k4 = k.permute({0, 2, 1, 3}), v4 = v.permute({0, 2, 1, 3});
        if (H != K) k4 = k4.repeat_interleave(H / K, 1), v4 = v4.repeat_interleave(H / K, 1);
        const at::Tensor mask = S > T || window > 0 ? visible_mask(T, S, S - T, window, q.device()) : at::Tensor();
        const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
        auto z = compat::fused_attention(q4, k4, v4, mask, !mask.defined(), scale).permute({0, 2, 1, 3});  // [B, T, H, d]
        return attention_output(m, layer, z, hooks, per_row);
    }

    // Query head h reads kv head h / g (grouped-query attention). The g query heads of a kv head
    // are stacked into one product against that kv head's keys, [g*n, d] x [d, S], so k and v
    // are never expanded to H heads; products are [B*K, g*n, .], which is [B, H, n, .] in memory.
    // q, k, v are made contiguous once per layer, so each block's products read them in place.
    const int64_t g = H / K;
    // k3, v3 [B*K, S, d] are made on first use: a block whose groups all stream (below) reads its
    // few keys straight from k and v, and a decode step of such a layer never copies the cache.
    at::Tensor k3, v3;
    // A KV cache's views are already [B*K] matrices of [S, d] rows (KVCache: [B, K, capacity, d]
    // buffers): the reshape is then a view and nothing is copied; a fresh k is copied once.
    auto as_kv3 = [&](const at::Tensor& x) {
        auto r = x.permute({0, 2, 1, 3}).reshape({B * K, S, d});
        return r.stride(2) == 1 && r.stride(1) == d ? r : r.contiguous();
    };
    auto need_kv3 = [&] {
        if (k3.defined()) return;
        k3 = as_kv3(k), v3 = as_kv3(v);
    };
    auto q3 = q.permute({0, 2, 1, 3}).reshape({B * K, g, T, d}).contiguous();
    const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
    // A power-of-two scale (d_head 64: 1/8) is applied to q before the product: scaling by 2^k is
    // exact, so the scores are bit-identical to (q k^T) * scale, at a [T, d] pass instead of [T, S].
    int exponent = 0;
    const bool scale_in_q = std::frexp(scale, &exponent) == 0.5;
    if (scale_in_q) q3 = q3 * scale;
    const int window = cfg.is_sliding(layer) ? cfg.sliding_window : 0;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // Attention windows (Intervention::kStream, docs/forward.md "Attention windows"): a [B, H, n, m]
    // mask per block on top of the layer's own; with compensation, prefix sums of the keys and values
    // give each query the means of the keys its window hides, one more column of the softmax.
    const LayerWindows win = hooks && hooks->has_windows(layer) ? hooks->windows(layer, B, H, q.device()) : LayerWindows{};
    const auto acc = q.device().is_mps() ? torch::kFloat : torch::kDouble;  // prefix sums: double where there is one
    at::Tensor pk, pv;  // [B*K, S + 1, d]: sums of the first s keys / values
    if (win.any_compensate) {
        need_kv3();
        auto zero = torch::zeros({B * K, 1, d}, k3.options().dtype(acc));
        pk = torch::cat({zero, k3.to(acc).cumsum(1)}, 1);
        pv = torch::cat({zero, v3.to(acc).cumsum(1)}, 1);
    }
    const auto pos_opts = torch::TensorOptions().dtype(torch::kLong).device(q.device());
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
    // Streaming groups read only the keys their windows show. When nobody observes the scores or the
    // pattern and no window compensates, the (row, kv head) groups whose every query head has a
    // window (idx_s) run their own product over the block's sink keys [lo, gap_lo) and recent keys
    // [gap_hi, hi), skipping the keys between, which no head of theirs can see; the other groups
    // (idx_f) run over [lo, hi) as usual. The same scores, masks and softmax over fewer columns.
    at::Tensor idx_s, idx_f, sink_s, recent_s, sink_f, recent_f;
    at::Tensor b_s, kv_s, b_f, kv_f;  // each group's (row, kv head), to read its keys from k and v [B, S, K, d]
    int64_t smax = 0, rmax = 0;
    if (win.defined() && !win.any_compensate && !whole && !see_scores && !see_pattern) {
        auto rec = win.recent.to(torch::kCPU).reshape({B * K, g}), snk = win.sink.to(torch::kCPU).reshape({B * K, g});
        auto streams = (rec < LayerWindows::kNoWindow).all(1);  // [B*K]
        if (streams.any().item<bool>()) {
            auto is = streams.nonzero().view(-1), isf = streams.logical_not().nonzero().view(-1);
            smax = snk.index_select(0, is).max().item<int64_t>();
            rmax = rec.index_select(0, is).max().item<int64_t>();
            auto dev = [&](const at::Tensor& t) { return t.to(q.device()); };
            sink_s = dev(snk.index_select(0, is)), recent_s = dev(rec.index_select(0, is));
            sink_f = dev(snk.index_select(0, isf)), recent_f = dev(rec.index_select(0, isf));
            b_s = dev(at::div(is, K, "floor")), kv_s = dev(is.remainder(K));
            b_f = dev(at::div(isf, K, "floor")), kv_f = dev(isf.remainder(K));
            idx_s = dev(is), idx_f = dev(isf);
        }
    }
    // One part's attention: qp [P, g*n, d] against keys kp, vp [P, m', d] at absolute positions kpos [m'],
    // masked causally, by the layer's sliding window and by the part's windows [P, g].
    auto part = [&](const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& kpos,
                    const at::Tensor& snk, const at::Tensor& rec, int64_t first, int64_t n) {
        const int64_t P = qp.size(0), mk = kp.size(1);
        auto sc = at::bmm(qp, kp.transpose(1, 2));
        if (!scale_in_q) sc.mul_(scale);
        if (cfg.attn_softcap > 0) sc.div_(cfg.attn_softcap).tanh_().mul_(cfg.attn_softcap);
        auto kk = kpos.view({1, 1, 1, mk}), qq = torch::arange(first, first + n, pos_opts).view({1, 1, n, 1});
        auto hide = kk > qq;
        if (window > 0) hide = hide | (kk <= qq - window);
        hide = hide | ((kk >= snk.view({P, g, 1, 1})) & (kk <= qq - rec.view({P, g, 1, 1})));
        sc.view({P, g, n, mk}).masked_fill_(hide, neg_inf);
        return at::bmm(torch::softmax(sc.to(torch::kFloat), -1).to(q.scalar_type()), vp);  // [P, g*n, d]
    };
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
        const int64_t gap_lo = std::min(std::max(smax, lo), hi), gap_hi = std::min(hi, std::max(gap_lo, first - rmax + 1));
        if (idx_s.defined() && gap_hi > gap_lo) {
            auto kv4 = k.permute({0, 2, 1, 3}), vv4 = v.permute({0, 2, 1, 3});  // [B, K, S, d] views
            auto cols = [&](const at::Tensor& x4) {  // the streaming groups' keys: [lo, gap_lo) and [gap_hi, hi)
                auto recent = x4.narrow(2, gap_hi, hi - gap_hi);
                auto c = gap_lo > lo ? torch::cat({x4.narrow(2, lo, gap_lo - lo), recent}, 2) : recent;
                return c.index({b_s, kv_s});  // [P_s, keys, d]
            };
            auto kpos_s = gap_lo > lo ? torch::cat({torch::arange(lo, gap_lo, pos_opts), torch::arange(gap_hi, hi, pos_opts)})
                                      : torch::arange(gap_hi, hi, pos_opts);
            auto zb = at::empty({B * K, g * n, d}, qb.options());
            zb.index_copy_(0, idx_s, part(qb.index_select(0, idx_s), cols(kv4), cols(vv4), kpos_s, sink_s, recent_s, first, n));
            if (idx_f.numel() > 0) {
                auto kf = kv4.narrow(2, lo, m).index({b_f, kv_f}), vf = vv4.narrow(2, lo, m).index({b_f, kv_f});
                zb.index_copy_(0, idx_f, part(qb.index_select(0, idx_f), kf, vf, torch::arange(lo, hi, pos_opts), sink_f,
                                              recent_f, first, n));
            }
            zs.push_back(zb.view({B, H, n, d}));
            continue;
        }
        need_kv3();
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
        at::Tensor extra, vbar;  // compensation: [B*K, g*n] scores and [B*K, g*n, d] mean values
        if (win.defined()) {
            auto kpos = torch::arange(lo, hi, pos_opts).view({1, 1, 1, m});
            auto qpos = torch::arange(first, first + n, pos_opts).view({1, 1, n, 1});
            auto sink = win.sink.view({B, H, 1, 1}), recent = win.recent.view({B, H, 1, 1});
            scores.view({B, H, n, m}).masked_fill_((kpos >= sink) & (kpos <= qpos - recent), neg_inf);
            if (win.any_compensate) {
                // Hidden keys of query p: [a, e) with a = max(sink, p - window + 1), e = p - recent + 1.
                auto qp = qpos.view({1, 1, n});
                auto a = win.sink.view({B, H, 1}).expand({B, H, n});
                if (window > 0) a = torch::maximum(a, qp - window + 1);
                auto e = qp - win.recent.view({B, H, 1}) + 1;
                auto count = e - a;
                auto use = ((count > 0) & win.compensate.view({B, H, 1})).reshape({B * K, g * n});
                // Only when some query of the block has hidden keys: otherwise (a window as long as
                // the context) no extra column, and the block is computed exactly as without it.
                if (use.any().item<bool>()) {
                    auto at_ = [&](const at::Tensor& P, const at::Tensor& i) {
                        return P.gather(1, i.clamp(0, S).reshape({B * K, g * n, 1}).expand({B * K, g * n, d}));
                    };
                    auto cnt = count.clamp_min(1).reshape({B * K, g * n, 1}).to(acc);
                    auto kbar = (at_(pk, e) - at_(pk, a)) / cnt;
                    vbar = (at_(pv, e) - at_(pv, a)) / cnt;
                    extra = (qb.to(acc) * kbar).sum(-1);  // qb carries the scale when scale_in_q
                    if (!scale_in_q) extra.mul_(scale);
                    if (cfg.attn_softcap > 0) extra.div_(cfg.attn_softcap).tanh_().mul_(cfg.attn_softcap);
                    extra = extra.to(torch::kFloat).masked_fill(use.logical_not(), neg_inf);
                }
            }
        }
        if (whole) scores = hook(hooks, Point::kAttnScores, layer, scores.view({B, H, n, m})).reshape({B * K, g * n, m});
        else if (see_scores) hooks->run_rows(Point::kAttnScores, layer, q0, full_width(scores, n, lo, neg_inf));
        at::Tensor pattern;  // [B*K, g*n, m], softmax in fp32
        at::Tensor extra_w;  // compensation: the weight of the mean key [B*K, g*n, 1]
        if (extra.defined()) {
            auto p = torch::softmax(torch::cat({scores.to(torch::kFloat), extra.unsqueeze(-1)}, -1), -1);
            pattern = p.narrow(2, 0, m).contiguous().to(q.scalar_type());
            extra_w = p.narrow(2, m, 1);
        } else if (reuse && fp32) {
            pattern = from(pattern_buf, {B * K, g * n, m});
            at::_softmax_out(pattern, scores, -1, false);
        } else {
            pattern = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());
        }
        scores = at::Tensor();
        if (whole) pattern = hook(hooks, Point::kAttnPattern, layer, pattern.view({B, H, n, m})).reshape({B * K, g * n, m});
        else if (see_pattern) hooks->run_rows(Point::kAttnPattern, layer, q0, full_width(pattern, n, lo, 0.0f));
        auto zb = at::bmm(pattern, m == S ? v3 : v3.narrow(1, lo, m));
        if (extra_w.defined()) zb = (zb.to(acc) + extra_w.to(acc) * vbar).to(zb.scalar_type());
        zs.push_back(zb.view({B, H, n, d}));
    }
    auto z = (zs.empty() ? torch::zeros({B, H, 0, d}, q.options()) : zs.size() == 1 ? zs[0] : torch::cat(zs, 2))
                 .permute({0, 2, 1, 3});  // [B, T, H, d]
    zs.clear();
    return attention_output(m, layer, z, hooks, per_row);
}

// z [B, T, H, d] -> attn_out [B, T, D]: z interventions, attn.z, W_O (per head where attn.head_out is
// observed), attn_out.
static at::Tensor attention_output(const Model& m, int layer, at::Tensor z, const Hooks* hooks, bool per_row) {
    const ModelConfig& cfg = m.config;
    const LayerWeights& lw = m.weights.layers[layer];
    const int64_t B = z.size(0), T = z.size(1), H = cfg.n_heads, d = cfg.d_head;
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

namespace hs {

bool fused_attention_enabled(const LoadOptions& o) {
    if (!compat::has_fused_attention()) return false;
    return o.attention == AttentionKernel::kFused || (o.attention == AttentionKernel::kAuto && o.device.is_cuda());
}

}  // namespace hs
