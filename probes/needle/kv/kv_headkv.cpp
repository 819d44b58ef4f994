// KV policy "headkv" (FYYFU/HeadKV ReasonSnapKVCluster): SnapKV's selection (kv_snapkv.cpp) with a
// capacity per query head from an importance score (R2 by default), one pool across layers.
#include "kv_policy.h"

#include "errors.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <cmath>

namespace hs {

at::Tensor headkv_caps(const at::Tensor& scores, int64_t base, int64_t window, double beta, double temp) {
    auto s = torch::nan_to_num(scores.to(torch::kCPU, torch::kDouble), 0.0);
    if ((s < 0).any().item<bool>()) throw UsageError("headkv: the importance score has negative entries", "kv_score");
    const double sum = s.sum().item<double>();
    if (!(sum > 0)) throw UsageError("headkv: the importance score is 0 everywhere", "kv_score");
    s = s / sum;
    s = torch::pow(s, temp);
    s = s / s.sum();
    const double Bp = static_cast<double>(base - window);
    if (Bp <= 0) return torch::zeros_like(s, torch::kLong);
    const double p = std::floor(Bp / beta);  // Python's float //
    const double pool = p * static_cast<double>(s.numel()), m = Bp - p;
    auto caps = torch::empty_like(s, torch::kLong);
    auto sa = s.accessor<double, 2>();
    auto ca = caps.accessor<int64_t, 2>();
    for (int64_t l = 0; l < s.size(0); ++l)
        for (int64_t h = 0; h < s.size(1); ++h) ca[l][h] = static_cast<int64_t>(std::nearbyint(sa[l][h] * pool + m));  // half to even
    return caps;
}

namespace {

class HeadKV final : public KvPolicy {
public:
    const char* name() const override { return "headkv"; }
    KvScoreFrom score_from() const override { return KvScoreFrom::kImportance; }
    std::string refuse_score(NeedleScore s) const override {
        if (s != NeedleScore::kLocos) return {};
        return "HeadKV's allocation needs a non-negative importance and LOCOS is signed (use r2, retrieval or a FILE.h5:DATASET)";
    }
    bool needs_snapkv() const override { return true; }
    void check_settings(const KvCompareSpec& s) const override {
        if (!(s.headkv_temp > 0)) throw UsageError(fmt::format("{} is not above 0", s.headkv_temp), "headkv_temp");
    }
    // The allocation at a small budget: a negative or all-zero importance fails before any decode.
    void check_score(const KvPolicySpec& p, const KvCompareSpec& s) const override {
        headkv_caps(p.score, 2 * s.snap.window + 2, s.snap.window, s.headkv_beta, s.headkv_temp);
    }
    Attrs attrs(const KvCompareSpec& s) const override { return {{"headkv_beta", s.headkv_beta}, {"headkv_temp", s.headkv_temp}}; }
    KvConfig config(const KvPolicySpec& p, double budget, const KvContext& ctx) const override {
        const at::Tensor score = p.score;
        const int64_t w = ctx.spec.snap.window;
        const double beta = ctx.spec.headkv_beta, temp = ctx.spec.headkv_temp;
        return snapkv_config(
            p.name, budget, ctx, [score, w, beta, temp](int64_t B) { return headkv_caps(score, B, w, beta, temp); }, kv_headkv_whole);
    }
};

}  // namespace

const KvPolicy& kv_headkv() {
    static const HeadKV p;
    return p;
}

}  // namespace hs
