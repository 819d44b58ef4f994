// KV policy "adakv" (Ada-KV, Feng et al. 2024; NVIDIA/kvpress AdaKVPress over SnapKV's scores): a
// layer keeps the best entries across all its KV heads instead of the same count per head, each head
// keeping at least the safeguard share alpha of the mean; and the selection and configuration it
// shares with critical-adakv (kv_adakv.h).
#include "kv_adakv.h"

#include "errors.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace hs {

namespace {

// The positions of a [K, P] key in descending order, the earlier flat (head, position) index first among
// ties (a stable sort). [K P] int64, flat indices.
at::Tensor flat_order(const at::Tensor& key) {
    return std::get<1>(key.reshape({-1}).sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
}

// Each row's positions in descending order of `key` [K, P], ties to the earlier position. [K, P] int64.
at::Tensor row_order(const at::Tensor& key) { return std::get<1>(key.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true)); }

// The safeguard (adakv_press.py l. 64-67): each head's n_safe best positions, [K, P] bool.
at::Tensor safeguard(const at::Tensor& scores, int64_t n_safe) {
    auto safe = torch::zeros(scores.sizes(), torch::kBool);
    if (n_safe > 0) safe.scatter_(1, row_order(scores).narrow(1, 0, n_safe), true);
    return safe;
}

int64_t safe_count(int64_t C, double alpha) {
    return static_cast<int64_t>(static_cast<double>(C) * alpha);  // int(n_kept * alpha_safeguard): both doubles, truncated
}

}  // namespace

at::Tensor adakv_kv_scores(const at::Tensor& pooled, int64_t g, int64_t P) {
    const int64_t H = pooled.size(0), n = pooled.size(1);
    HS_REQUIRE(g >= 1 && H % g == 0 && n <= P, "adakv_kv_scores: shapes");
    auto s = pooled.to(torch::kCPU, torch::kFloat).reshape({H / g, g, n}).mean(1);  // snapkv_press.py l. 99-100
    // l. 103: F.pad(scores, (0, window), value=scores.max().item() + 1), the sum in Python's double
    const double top = n > 0 ? static_cast<double>(s.max().item<float>()) + 1.0 : 1.0;
    return torch::cat({s, torch::full({H / g, P - n}, static_cast<float>(top), torch::kFloat)}, 1);
}

at::Tensor adakv_keep(const at::Tensor& scores, int64_t C, double alpha) {
    const int64_t K = scores.size(0), P = scores.size(1);
    C = std::clamp<int64_t>(C, 0, P);
    // l. 64-67: the safeguard's entries set above every score.
    auto key = scores.to(torch::kFloat).clone().masked_fill_(safeguard(scores, safe_count(C, alpha)), INFINITY);
    // l. 69-71: the K (P - C) lowest across the heads pruned, i.e. the K C highest kept.
    auto keep = torch::zeros({K * P}, torch::kBool);
    if (C > 0) keep.index_fill_(0, flat_order(key).narrow(0, 0, K * C), true);
    return keep.view({K, P});
}

at::Tensor critical_adakv_keep(const at::Tensor& scores, const at::Tensor& vo, int64_t C, double alpha, double epsilon,
                               double first_stage) {
    const int64_t K = scores.size(0), P = scores.size(1);
    HS_REQUIRE(vo.sizes() == scores.sizes(), "critical_adakv_keep: scores and norms of other shapes");
    C = std::clamp<int64_t>(C, 0, P);
    auto s = scores.to(torch::kFloat);
    const auto safe = safeguard(s, safe_count(C, alpha));
    auto key = s.clone().masked_fill_(safe, INFINITY);
    // l. 159-164: each head's budget, its count among the layer's K C best safeguarded scores.
    auto in_top = torch::zeros({K * P}, torch::kLong);
    if (C > 0) in_top.index_fill_(0, flat_order(key).narrow(0, 0, K * C), 1);
    const auto budgets = in_top.view({K, P}).sum(1);
    // l. 167-171: stage 1, each head's int(b first_stage) best safeguarded scores promoted (the float32
    // product of torch's (head_budgets * ratio).to(int64)), beside the safeguard's.
    const auto order1 = row_order(key);
    // l. 174-175: stage 2, the rest weighted by CriticalKV's value norm.
    auto weighted = ((s + epsilon) * vo.to(torch::kFloat)).masked_fill_(safe, INFINITY);
    auto keep = torch::zeros({K, P}, torch::kBool);
    for (int64_t k = 0; k < K; ++k) {
        const int64_t b = budgets[k].item<int64_t>();
        const auto p1 = static_cast<int64_t>(static_cast<float>(b) * static_cast<float>(first_stage));
        if (p1 > 0) weighted[k].index_fill_(0, order1[k].narrow(0, 0, p1), INFINITY);
        // l. 176-179: the head's b best stage-2 scores (the promoted first) are what the final cut of
        // l. 185-187 keeps: exactly the K C entries set to the maximum.
        if (b > 0) keep[k].index_fill_(0, row_order(weighted[k].unsqueeze(0))[0].narrow(0, 0, b), true);
    }
    return keep;
}

at::Tensor vo_l1_norms(const at::Tensor& v, const at::Tensor& o_out) {
    const int64_t P = v.size(0), K = v.size(1), H = o_out.size(0);
    HS_REQUIRE(H % K == 0 && o_out.size(1) == v.size(2), "vo_l1_norms: shapes");
    const int64_t g = H / K;
    auto vf = v.to(torch::kFloat);
    auto out = torch::empty({K, P}, torch::kFloat);
    for (int64_t k = 0; k < K; ++k) {
        auto vk = vf.select(1, k);  // [P, d]
        at::Tensor sum;
        for (int64_t j = 0; j < g; ++j) {  // one query head at a time, as vwl1norm (l. 67-71)
            auto n = torch::mm(vk, o_out[k * g + j].to(vk.device(), torch::kFloat)).abs().sum(1);  // [P]
            sum = sum.defined() ? sum + n : n;
        }
        out[k] = (sum / static_cast<double>(g)).to(torch::kCPU);  // l. 75: the group's mean
    }
    return out;
}

int64_t adakv_capacity(int64_t B, int64_t P, const KvShape& sh, int64_t window) {
    if (B >= P) return P;  // P < B: left whole (kv_snapkv_whole); P = B: SnapKV's selection keeps every position
    return std::min(P, sh.g * std::max(B, window));
}

KvConfig adakv_config(const std::string& key_name, double budget, const KvContext& ctx, AdaKvSelect select) {
    KvConfig c;
    const int64_t capacity = ctx.capacity;
    c.key = kv_column_key(key_name, budget, capacity);
    const KvCompareSpec s = ctx.spec;  // copied: the head set's functions keep what they read
    const KvShape sh = ctx.sh;
    const int64_t w = s.snap.window;
    auto C_for = [budget, capacity, sh, w](int64_t P) {  // snapkv_config's B, then the KV head's budget
        const int64_t B = snapkv_capacity(budget, capacity, P, sh);
        return adakv_capacity(B, P, sh, w);
    };
    for (const auto& t : ctx.trials) {
        const int64_t P = s.compress_at(t);
        c.frac.push_back(static_cast<double>(C_for(P)) / static_cast<double>(P));  // K C of the layer's K P
    }
    c.set.kv_from = [s](const Trial& t) { return s.compress_at(t); };
    c.set.keep = [select, C_for, pooled = ctx.pooled, sh, s](const Trial& t) {
        const int64_t P = s.compress_at(t);
        const int64_t C = C_for(P);
        if (C >= P) return torch::ones({sh.L, sh.H, P}, torch::kBool);
        const at::Tensor& sc = pooled->at(&t);  // [L, H, P - w]
        std::vector<at::Tensor> layers;
        for (int64_t l = 0; l < sh.L; ++l)
            layers.push_back(select(t, l, adakv_kv_scores(sc[l], sh.g, P), C).repeat_interleave(sh.g, 0));  // KV head -> its queries
        return torch::stack(layers);
    };
    return c;
}

namespace {

class AdaKV final : public KvPolicy {
public:
    const char* name() const override { return "adakv"; }
    bool needs_snapkv() const override { return true; }
    Attrs attrs(const KvCompareSpec&) const override { return {{"adakv_alpha", kAdaKvAlpha}}; }
    KvConfig config(const KvPolicySpec& p, double budget, const KvContext& ctx) const override {
        return adakv_config(p.name, budget, ctx,
                            [](const Trial&, int64_t, const at::Tensor& scores, int64_t C) { return adakv_keep(scores, C, kAdaKvAlpha); });
    }
};

}  // namespace

const KvPolicy& kv_adakv() {
    static const AdaKV p;
    return p;
}

}  // namespace hs
