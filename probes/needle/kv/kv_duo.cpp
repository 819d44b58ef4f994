// KV policy "duo" (mit-han-lab/duo-attention): the KV groups the gates select kept whole, the others
// streaming: a sink and a recent window sliding with the query, past a whole prefill. By default the
// selection is the reference's deployment at sparsity 1 - b (duo_sparsity.h: a quantile over all the
// gates, with tie noise); --duo-select budget keeps the most groups in the gates' order within the
// budget. The streaming deployment (KvStreamingPolicy) is stream:S's too (kv_stream.cpp).
#include "kv_policy.h"

#include "duo_sparsity.h"
#include "errors.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace hs {

int64_t KvStreamingPolicy::entries(const KvCompareSpec& s, int64_t P) const { return std::min(P, s.duo_sink + s.duo_recent); }

void KvStreamingPolicy::compress(const std::vector<Head>& streamed, const KvContext& ctx, KvConfig* c) const {
    const KvCompareSpec& s = ctx.spec;
    c->set.heads = streamed;
    c->set.mode = Intervention::kStream;
    // The cache holds sink + recent keys; the query sees them and itself (duo_attn/patch/llama.py:234-290).
    c->set.window = StreamWindow{s.duo_sink, s.duo_recent + 1, false, 0};
    c->set.window_after_prompt = true;
    c->key += fmt::format(" duo {} {}", s.duo_sink, s.duo_recent);
}

namespace {

// Each KV group's gate: the max over its query heads of the [L, H] gates (a duo-gates study's alpha
// repeats its KV head's gate over them), flat l * K + k.
std::vector<double> group_gates(const at::Tensor& score, const KvShape& sh) {
    auto gs = score.to(torch::kCPU, torch::kDouble).reshape({sh.L, sh.K, sh.g}).amax(2).contiguous();
    return std::vector<double>(gs.data_ptr<double>(), gs.data_ptr<double>() + sh.M);
}

class Duo final : public KvStreamingPolicy {
public:
    const char* name() const override { return "duo"; }
    KvScoreFrom score_from() const override { return KvScoreFrom::kGates; }
    Attrs attrs(const KvCompareSpec& s) const override {
        return {{"duo_sink", s.duo_sink},
                {"duo_recent", s.duo_recent},
                {"duo_select", s.duo_select},
                {"duo_noise_seed", static_cast<int64_t>(duo_noise_seed(s))}};
    }
    void check_settings(const KvCompareSpec& s) const override {
        if (s.duo_select != "sparsity" && s.duo_select != "budget")
            throw UsageError(fmt::format("'{}' is not sparsity or budget", s.duo_select), "duo_select");
    }
    void check_score(const KvPolicySpec& p, const KvCompareSpec&) const override {
        if (torch::isnan(p.score).any().item<bool>())
            throw UsageError(fmt::format("{}: the gates {} hold NaN", p.name, p.source), "kv_compare");
    }
    KvConfig config(const KvPolicySpec& p, double budget, const KvContext& ctx) const override {
        if (ctx.spec.duo_select == "budget") return KvStreamingPolicy::config(p, budget, ctx);
        const auto full = select(p, budget, ctx);
        std::vector<int64_t> order;  // the selected groups first (kept whole), then the others
        for (int pass = 1; pass >= 0; --pass)
            for (int64_t grp = 0; grp < ctx.sh.M; ++grp)
                if (full[static_cast<size_t>(grp)] == pass) order.push_back(grp);
        return keep_whole(order, std::count(full.begin(), full.end(), 1), ctx);
    }
    std::vector<KvConfig> controls(const KvPolicySpec& p, double budget, const KvContext& ctx) const override {
        if (ctx.spec.duo_select == "budget") return KvStreamingPolicy::controls(p, budget, ctx);
        const auto full = select(p, budget, ctx);
        return random_controls(std::count(full.begin(), full.end(), 1), ctx);
    }

private:
    static uint64_t duo_noise_seed(const KvCompareSpec& s) { return s.seed + 2; }
    // The reference's selection at sparsity 1 - budget (the share of KV groups streamed).
    static std::vector<char> select(const KvPolicySpec& p, double budget, const KvContext& ctx) {
        const double sparsity = std::clamp(1.0 - budget, 0.0, 1.0);
        return duo_sparsify(group_gates(p.score, ctx.sh), sparsity, duo_tie_noise(ctx.sh.M, duo_noise_seed(ctx.spec))).full;
    }
};

}  // namespace

const KvPolicy& kv_duo() {
    static const Duo p;
    return p;
}

}  // namespace hs
