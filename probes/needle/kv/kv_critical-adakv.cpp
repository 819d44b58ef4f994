// KV policy "critical-adakv" (CriticalKV, Feng et al. 2025; NVIDIA/kvpress CriticalAdaKVPress over
// SnapKV's scores): Ada-KV's budgets across a layer's KV heads (kv_adakv.cpp), each head then keeping
// half its budget by score and the rest by the score weighted by ||v W_O||_1, the size of what the entry
// would add to the output; and those value norms, one prefill per trial (critical_vo_norms).
#include "kv_adakv.h"

#include "errors.h"
#include "model.h"
#include "weight_circuits.h"

#include <torch/torch.h>

#include <algorithm>

namespace hs {

using torch::indexing::Slice;

at::Tensor critical_vo_norms(const Model& m, const std::vector<int64_t>& prompt, int64_t chunk) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    const int64_t P = static_cast<int64_t>(prompt.size());
    auto out = torch::zeros({cfg.n_layers, cfg.n_kv_heads, P}, torch::kFloat);
    if (P == 0) return out;
    std::vector<at::Tensor> o_out;  // per layer [H, d, D]: each query head's W_O
    for (int l = 0; l < cfg.n_layers; ++l) {
        std::vector<at::Tensor> heads;
        for (int h = 0; h < cfg.n_heads; ++h) heads.push_back(head_o_out(m, l, h));
        o_out.push_back(torch::stack(heads));
    }
    auto ids = torch::tensor(prompt, torch::kLong).view({1, P}).to(m.options.device);
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    KVCache cache;
    chunk = std::max<int64_t>(1, chunk);
    const int64_t last = ((P - 1) / chunk) * chunk;  // the last chunk's forward sees every value
    for (int64_t p0 = 0; p0 < last; p0 += chunk) m.forward(ids.index({Slice(), Slice(p0, p0 + chunk)}), nullptr, &cache, no_logits);
    Hooks h;
    h.capture(Point::kAttnV, [&](int l, const at::Tensor& v) { out[l] = vo_l1_norms(v[0], o_out[static_cast<size_t>(l)]); });  // v [1, P, K, d]
    m.forward(ids.index({Slice(), Slice(last, P)}), &h, &cache, no_logits);
    return out;
}

namespace {

class CriticalAdaKV final : public KvPolicy {
public:
    const char* name() const override { return "critical-adakv"; }
    bool needs_snapkv() const override { return true; }
    bool needs_vo_norms() const override { return true; }
    Attrs attrs(const KvCompareSpec&) const override {
        return {{"critical_epsilon", kCriticalEpsilon}, {"critical_first_stage_ratio", kCriticalFirstStage}};
    }
    KvConfig config(const KvPolicySpec& p, double budget, const KvContext& ctx) const override {
        HS_REQUIRE(ctx.vo_norms != nullptr, "critical-adakv: the driver computes the value norms (needs_vo_norms)");
        return adakv_config(p.name, budget, ctx, [vo = ctx.vo_norms](const Trial& t, int64_t l, const at::Tensor& scores, int64_t C) {
            return critical_adakv_keep(scores, vo->at(&t)[l], C, kAdaKvAlpha, kCriticalEpsilon, kCriticalFirstStage);
        });
    }
};

}  // namespace

const KvPolicy& kv_critical_adakv() {
    static const CriticalAdaKV p;
    return p;
}

}  // namespace hs
