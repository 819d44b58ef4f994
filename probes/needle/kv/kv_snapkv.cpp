// KV policy "snapkv" (FYYFU/HeadKV SnapKVCluster, the uniform baseline): every query head keeps the
// same capacity, its best prefix positions by SnapKV's pooled observation-window attention and the
// window. Also SnapKV's scores and selection, which headkv (kv_headkv.cpp) reuses.
#include "kv_policy.h"

#include "errors.h"
#include "model.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace hs {

using torch::indexing::Slice;

at::Tensor snapkv_scores(const Model& m, const std::vector<int64_t>& prompt, const SnapKVSettings& s, int64_t chunk) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    const int64_t P = static_cast<int64_t>(prompt.size()), w = s.window, n = std::max<int64_t>(0, P - w);
    auto out = torch::zeros({cfg.n_layers, cfg.n_heads, n}, torch::kFloat);
    if (n == 0) return out;
    auto ids = torch::tensor(prompt, torch::kLong).view({1, P}).to(m.options.device);
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    KVCache cache;
    chunk = std::max<int64_t>(1, chunk);
    for (int64_t p0 = 0; p0 < n; p0 += chunk) m.forward(ids.index({Slice(), Slice(p0, std::min(n, p0 + chunk))}), nullptr, &cache, no_logits);
    // The window's queries against every key: [1, H, w, P] (snapkv_utils.py:393-405: softmax over all
    // P keys, causal inside the window, then the prefix columns averaged over the window's queries).
    Hooks h;
    h.capture(Point::kAttnPattern, [&](int l, const at::Tensor& a) {
        auto mean = a[0].narrow(2, 0, n).to(torch::kFloat).mean(1);  // [H, n]
        // max_pool1d(kernel, stride 1, padding kernel / 2): -inf padding, the length kept (odd kernel).
        out[l] = torch::max_pool1d(mean.unsqueeze(1), {s.kernel}, {1}, {s.kernel / 2}).squeeze(1).to(torch::kCPU);
    });
    m.forward(ids.index({Slice(), Slice(n, P)}), &h, &cache, no_logits);
    return out;
}

at::Tensor snapkv_keep(const at::Tensor& pooled, const std::vector<int64_t>& caps, int64_t P, int64_t w) {
    const int64_t H = pooled.size(0), n = pooled.size(1);
    HS_REQUIRE(static_cast<int64_t>(caps.size()) == H && n == std::max<int64_t>(0, P - w), "snapkv_keep: shapes");
    auto keep = torch::zeros({H, P}, torch::kBool);
    keep.narrow(1, n, P - n).fill_(true);
    if (n == 0) return keep;
    // Descending score; a stable sort puts the earlier of tied positions first.
    auto order = std::get<1>(pooled.to(torch::kCPU).sort(/*stable=*/true, /*dim=*/1, /*descending=*/true));
    for (int64_t h = 0; h < H; ++h) {
        const int64_t c = std::clamp<int64_t>(caps[static_cast<size_t>(h)], 0, n);
        if (c > 0) keep[h].index_fill_(0, order[h].narrow(0, 0, c), true);
    }
    return keep;
}

bool kv_snapkv_whole(int64_t B, int64_t P) { return P < B; }
bool kv_headkv_whole(int64_t B, int64_t P) { return B > P; }  // B - w > P - w

int64_t snapkv_capacity(double budget, int64_t capacity, int64_t P, const KvShape& sh) {
    return capacity > 0 ? capacity : std::llround(budget * static_cast<double>(P * sh.K) / static_cast<double>(sh.H));
}

std::string kv_column_key(const std::string& key_name, double budget, int64_t capacity) {
    return capacity > 0 ? fmt::format("{} capacity {}", key_name, capacity) : fmt::format("{} {}", key_name, budget);
}

KvConfig snapkv_config(const std::string& key_name, double budget, const KvContext& ctx,
                       std::function<at::Tensor(int64_t B)> caps, std::function<bool(int64_t B, int64_t P)> whole) {
    KvConfig c;
    const int64_t capacity = ctx.capacity;
    c.key = kv_column_key(key_name, budget, capacity);
    const KvCompareSpec s = ctx.spec;  // copied: the head set's functions keep what they read
    const KvShape sh = ctx.sh;
    const int64_t w = s.snap.window;
    if (!whole) whole = kv_snapkv_whole;
    auto caps_for = [caps, budget, capacity, sh, whole](int64_t P) -> at::Tensor {  // [L, H] prefix caps; undefined: whole
        const int64_t B = snapkv_capacity(budget, capacity, P, sh);
        if (whole(B, P)) return {};  // the reference leaves this prompt whole
        return caps(B);
    };
    for (const auto& t : ctx.trials) {
        const int64_t P = s.compress_at(t);
        const auto cp = caps_for(P);
        if (!cp.defined()) {
            c.frac.push_back(1.0);
            continue;
        }
        const double kept = (cp.clamp(0, std::max<int64_t>(0, P - w)) + std::min(w, P)).sum().item<double>();
        c.frac.push_back(kept / static_cast<double>(sh.L * sh.K * P));
    }
    c.set.kv_from = [s](const Trial& t) { return s.compress_at(t); };
    c.set.keep_query_heads = true;  // selected per query head after repeat_kv: the cache holds H heads
    c.set.keep = [caps_for, pooled = ctx.pooled, w, s](const Trial& t) {
        const int64_t P = s.compress_at(t);
        const at::Tensor& sc = pooled->at(&t);  // [L, H, P - w]
        auto cp = caps_for(P);
        if (!cp.defined()) return torch::ones({sc.size(0), sc.size(1), P}, torch::kBool);
        std::vector<at::Tensor> layers;
        for (int64_t l = 0; l < sc.size(0); ++l) {
            auto cl = cp[l].contiguous();
            std::vector<int64_t> cv(cl.data_ptr<int64_t>(), cl.data_ptr<int64_t>() + cl.numel());
            layers.push_back(snapkv_keep(sc[l], cv, P, w));
        }
        return torch::stack(layers);
    };
    return c;
}

namespace {

class SnapKV final : public KvPolicy {
public:
    const char* name() const override { return "snapkv"; }
    bool needs_snapkv() const override { return true; }
    void check_settings(const KvCompareSpec& s) const override {
        if (s.snap.kernel % 2 == 0) throw UsageError(fmt::format("{} is even (the pooled length must stay)", s.snap.kernel), "snapkv_kernel");
    }
    Attrs attrs(const KvCompareSpec& s) const override { return {{"snapkv_window", s.snap.window}, {"snapkv_kernel", s.snap.kernel}}; }
    KvConfig config(const KvPolicySpec& p, double budget, const KvContext& ctx) const override {
        const KvShape sh = ctx.sh;
        const int64_t w = ctx.spec.snap.window;
        return snapkv_config(
            p.name, budget, ctx, [sh, w](int64_t B) { return torch::full({sh.L, sh.H}, std::max<int64_t>(0, B - w), torch::kLong); },
            kv_snapkv_whole);
    }
};

}  // namespace

const KvPolicy& kv_snapkv() {
    static const SnapKV p;
    return p;
}

}  // namespace hs
