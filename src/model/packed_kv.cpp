// A compressed KV cache (packed_kv.h): packing a whole cache by a policy's kept positions, and the
// attention of the decode steps over it.
#include "packed_kv.h"

#include "errors.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace hs {

int64_t PackedKV::bytes() const {
    int64_t n = 0;
    for (const auto& l : layers)
        for (const at::Tensor* t : {&l.k, &l.v, &l.pos})
            if (t->defined()) n += static_cast<int64_t>(t->storage().nbytes());
    return n;
}

int64_t packed_length(const PackedKV& p) { return p.layers.empty() ? 0 : p.layers.front().length; }

std::shared_ptr<PackedKV> clone_packed(const PackedKV& p) {
    auto c = std::make_shared<PackedKV>(p);
    for (auto& l : c->layers) l.k = l.k.clone(), l.v = l.v.clone(), l.pos = l.pos.clone();
    return c;
}

namespace {

// One segment's prompt entries before packing: the positions it keeps and whether it adds a mean token.
struct SegPlan {
    PackedSegment seg;
    at::Tensor idx;      // [n] int64 (CPU): kept positions, ascending
    at::Tensor dropped;  // [m] int64 (CPU): positions averaged into the mean token (compensate), else undefined
};

std::vector<SegPlan> plan_row_layer(const PackRow& r, int layer, int64_t row, int64_t H, int64_t K, int64_t F) {
    const int64_t g = H / K;
    const bool per_q = r.per_query_head;
    std::vector<SegPlan> out;
    at::Tensor keep = r.keep.defined() ? r.keep[layer].to(torch::kCPU).to(torch::kBool) : at::Tensor();  // [H, F]
    HS_REQUIRE(!keep.defined() || (keep.size(0) == H && keep.size(1) == F), "pack_kv_cache: a keep mask of another shape");
    at::Tensor win = r.window.defined() ? r.window[layer].to(torch::kCPU).to(torch::kBool) : at::Tensor();  // [H]
    HS_REQUIRE(!(keep.defined() && win.defined() && win.any().item<bool>()), "pack_kv_cache: a row both keeps positions and streams");
    const int64_t n_seg = per_q ? H : K;
    for (int64_t c = 0; c < n_seg; ++c) {
        SegPlan sp;
        sp.seg.row = row;
        sp.seg.kv_head = per_q ? c / g : c;
        sp.seg.h0 = per_q ? c : c * g;
        sp.seg.nh = per_q ? 1 : g;
        at::Tensor kept = torch::ones({F}, torch::kBool);
        if (keep.defined()) {
            kept = keep[sp.seg.h0];
            if (!per_q)
                HS_REQUIRE(keep.narrow(0, sp.seg.h0, g).eq(kept.unsqueeze(0)).all().item<bool>(),
                           "pack_kv_cache: the query heads of a KV group keep different positions in a cache shared by the group");
        }
        if (win.defined()) {
            const bool w = win[sp.seg.h0].item<bool>();
            HS_REQUIRE(win.narrow(0, sp.seg.h0, sp.seg.nh).eq(w).all().item<bool>(),
                       "pack_kv_cache: a KV group partly streaming in a cache shared by the group");
            if (w) {
                HS_REQUIRE(r.recent >= 1 && r.sink >= 0, "pack_kv_cache: a window needs recent >= 1 and sink >= 0");
                // The first query past F (at F) sees s < sink and s > F - recent: the rest is never seen again.
                auto s = torch::arange(F, torch::kLong);
                kept = (s < r.sink) | (s > F - r.recent);
                sp.seg.sink = r.sink, sp.seg.recent = r.recent;
            }
        }
        sp.idx = kept.nonzero().view(-1);
        if (r.compensate && sp.idx.size(0) < F) sp.dropped = kept.logical_not().nonzero().view(-1);
        sp.seg.len = sp.idx.size(0) + (sp.dropped.defined() ? 1 : 0);
        out.push_back(std::move(sp));
    }
    return out;
}

}  // namespace

std::shared_ptr<PackedKV> pack_kv_cache(const ModelConfig& cfg, const KVCache& full, const std::vector<PackRow>& rows,
                                        int64_t room) {
    torch::NoGradGuard ng;
    HS_REQUIRE(!full.packed, "pack_kv_cache: the cache is packed already");
    const int64_t H = cfg.n_heads, K = cfg.n_kv_heads, F = full.length();
    HS_REQUIRE(room >= 0 && F > 0, "pack_kv_cache: an empty cache or negative room");
    auto p = std::make_shared<PackedKV>();
    p->layers.resize(full.k.size());
    for (size_t l = 0; l < full.k.size(); ++l) {
        const at::Tensor& k = full.k[l];  // [B, F, K, d]
        const at::Tensor& v = full.v[l];
        HS_REQUIRE(k.defined() && k.size(1) == F && k.size(0) == static_cast<int64_t>(rows.size()),
                   "pack_kv_cache: one PackRow a batch row, every layer cached to the same length");
        const int64_t d = k.size(3);
        std::vector<SegPlan> plans;
        for (int64_t b = 0; b < k.size(0); ++b)
            for (auto& sp : plan_row_layer(rows[static_cast<size_t>(b)], static_cast<int>(l), b, H, K, F)) plans.push_back(std::move(sp));
        int64_t N = 0;
        for (auto& sp : plans) sp.seg.off = N, sp.seg.cap = sp.seg.len + room, N += sp.seg.cap;
        PackedLayer& pl = p->layers[l];
        pl.k = at::empty({N, d}, k.options()), pl.v = at::empty({N, d}, v.options());
        auto pos = torch::full({N}, std::numeric_limits<int64_t>::max(), torch::kLong);  // room: not yet a position
        const auto acc = k.device().is_mps() ? torch::kFloat : torch::kDouble;
        for (auto& sp : plans) {
            const auto kh = k[sp.seg.row].select(1, sp.seg.kv_head), vh = v[sp.seg.row].select(1, sp.seg.kv_head);  // [F, d]
            int64_t w = sp.seg.off;
            if (sp.dropped.defined()) {  // RazorAttention's mean token: the unweighted means of the dropped keys and values
                const auto di = sp.dropped.to(k.device());
                pl.k[w].copy_(kh.index_select(0, di).to(acc).mean(0));
                pl.v[w].copy_(vh.index_select(0, di).to(acc).mean(0));
                pos[w] = -1;
                ++w;
            }
            const int64_t n = sp.idx.size(0);
            const auto ii = sp.idx.to(k.device());
            pl.k.narrow(0, w, n).copy_(kh.index_select(0, ii));
            pl.v.narrow(0, w, n).copy_(vh.index_select(0, ii));
            pos.narrow(0, w, n).copy_(sp.idx);
            pl.segs.push_back(sp.seg);
        }
        pl.pos = pos.to(k.device());
        pl.length = F;
    }
    return p;
}

namespace {

// Makes room for T more entries in every segment of `pl` (a decode longer than the room packed for).
void grow(PackedLayer& pl, int64_t T) {
    bool need = false;
    for (const auto& s : pl.segs) need |= s.len + T > s.cap;
    if (!need) return;
    int64_t N = 0;
    std::vector<int64_t> offs;
    for (auto& s : pl.segs) offs.push_back(N), N += s.len + T > s.cap ? s.len + T + std::max<int64_t>(T, 16) : s.cap;
    auto k = at::empty({N, pl.k.size(1)}, pl.k.options()), v = at::empty({N, pl.v.size(1)}, pl.v.options());
    auto pos = torch::full({N}, std::numeric_limits<int64_t>::max(), pl.pos.options());
    for (size_t i = 0; i < pl.segs.size(); ++i) {
        auto& s = pl.segs[i];
        k.narrow(0, offs[i], s.len).copy_(pl.k.narrow(0, s.off, s.len));
        v.narrow(0, offs[i], s.len).copy_(pl.v.narrow(0, s.off, s.len));
        pos.narrow(0, offs[i], s.len).copy_(pl.pos.narrow(0, s.off, s.len));
        const int64_t next = i + 1 < pl.segs.size() ? offs[i + 1] : N;
        s.off = offs[i], s.cap = next - offs[i];
    }
    pl.k = k, pl.v = v, pl.pos = pos;
}

}  // namespace

at::Tensor packed_attention(const ModelConfig& cfg, int layer, PackedKV& p, const at::Tensor& q, const at::Tensor& k_new,
                            const at::Tensor& v_new) {
    HS_REQUIRE(layer >= 0 && static_cast<size_t>(layer) < p.layers.size(), "packed_attention: a layer the cache does not hold");
    PackedLayer& pl = p.layers[static_cast<size_t>(layer)];
    const int64_t B = q.size(0), T = q.size(1), d = q.size(3);
    HS_REQUIRE(k_new.size(0) == B && k_new.size(1) == T, "packed_attention: queries and keys of other shapes");
    grow(pl, T);
    const int64_t p0 = pl.length;
    const auto pos_opts = torch::TensorOptions().dtype(torch::kLong).device(q.device());
    const auto new_pos = torch::arange(p0, p0 + T, pos_opts);
    // Append: every segment gets its KV head's T new entries.
    for (auto& s : pl.segs) {
        pl.k.narrow(0, s.off + s.len, T).copy_(k_new[s.row].select(1, s.kv_head));
        pl.v.narrow(0, s.off + s.len, T).copy_(v_new[s.row].select(1, s.kv_head));
        pl.pos.narrow(0, s.off + s.len, T).copy_(new_pos);
        s.len += T;
    }
    pl.length = p0 + T;
    const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
    const int window = cfg.is_sliding(layer) ? cfg.sliding_window : 0;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    auto z = at::empty({B, T, q.size(2), d}, q.options());
    const auto qpos = new_pos.view({1, T, 1});  // [1, T, 1] against entries [1, 1, n]
    for (const auto& s : pl.segs) {
        const auto ks = pl.k.narrow(0, s.off, s.len), vs = pl.v.narrow(0, s.off, s.len);
        const auto qs = q[s.row].narrow(1, s.h0, s.nh).permute({1, 0, 2}).reshape({s.nh * T, d});  // [nh T, d]
        auto sc = at::mm(qs, ks.t()).mul_(scale);
        if (cfg.attn_softcap > 0) sc.div_(cfg.attn_softcap).tanh_().mul_(cfg.attn_softcap);
        // A mask only where something can be hidden: several queries (causal among the new ones), a
        // sliding-window layer, a streaming segment. Entries at position -1 (the mean token) are seen by all.
        if (T > 1 || window > 0 || s.recent > 0) {
            const auto kp = pl.pos.narrow(0, s.off, s.len).view({1, 1, s.len});
            auto hide = kp > qpos;
            if (window > 0) hide = hide | (kp <= qpos - window);
            if (s.recent > 0) hide = hide | ((kp >= s.sink) & (kp <= qpos - s.recent));
            hide = hide & (kp >= 0);
            sc.view({s.nh, T, s.len}).masked_fill_(hide, neg_inf);
        }
        const auto pat = torch::softmax(sc.to(torch::kFloat), -1).to(q.scalar_type());
        z[s.row].narrow(1, s.h0, s.nh).copy_(at::mm(pat, vs).view({s.nh, T, d}).permute({1, 0, 2}));
    }
    return z;
}

}  // namespace hs
