// What the order policies share (duo, razor, stream: kv_policy.h KvOrderPolicy): the KV groups ranked
// by a score, the most whole groups a budget holds, and the random orders at the same count.
#include "kv_policy.h"

#include "heads.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <limits>

namespace hs {

namespace {

// KV groups ranked best first by the max of `score` over each group's query heads (NaN last).
std::vector<int64_t> group_order(const at::Tensor& score, const KvShape& sh) {
    auto gs = score.to(torch::kCPU, torch::kDouble).reshape({sh.L, sh.K, sh.g});
    gs = torch::where(torch::isnan(gs), torch::full_like(gs, -std::numeric_limits<double>::infinity()), gs).amax(2);
    return rank_heads(gs, true);  // flat l * K + k
}

}  // namespace

// The configuration keeping the first n groups of `order` whole and compressing the others.
KvConfig KvOrderPolicy::keep_whole(const std::vector<int64_t>& order, int64_t n, const KvContext& ctx) const {
    const KvShape& sh = ctx.sh;
    const KvCompareSpec& s = ctx.spec;
    KvConfig c;
    c.full_groups = n;
    std::vector<char> full(static_cast<size_t>(sh.M), 0);
    for (int64_t i = 0; i < n; ++i) full[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
    std::vector<Head> streamed;
    for (int64_t grp = 0; grp < sh.M; ++grp)
        if (!full[static_cast<size_t>(grp)])
            for (int64_t j = 0; j < sh.g; ++j)
                streamed.push_back({static_cast<int>(grp / sh.K), static_cast<int>((grp % sh.K) * sh.g + j)});
    c.key = std::string(key_name());
    for (const auto& hd : streamed) c.key += fmt::format(" {}.{}", hd.first, hd.second);
    for (const auto& t : ctx.trials) {
        const int64_t P = s.compress_at(t);
        const double e = static_cast<double>(n * P + (sh.M - n) * entries(s, P));
        c.frac.push_back(e / static_cast<double>(sh.M * P));
    }
    if (streamed.empty()) return c;  // every group whole: the full model
    c.set.kv_from = [s](const Trial& t) { return s.compress_at(t); };
    compress(streamed, ctx, &c);
    return c;
}

// The most groups kept whole whose mean measured cache stays within the budget (0 when even none does).
int64_t KvOrderPolicy::groups_within(double budget, const KvContext& ctx) const {
    const KvShape& sh = ctx.sh;
    int64_t best = 0;
    for (int64_t n = 0; n <= sh.M; ++n) {
        double f = 0;
        for (const auto& t : ctx.trials) {
            const int64_t P = ctx.spec.compress_at(t);
            f += static_cast<double>(n * P + (sh.M - n) * entries(ctx.spec, P)) / static_cast<double>(sh.M * P);
        }
        if (f / static_cast<double>(ctx.trials.size()) <= budget + 1e-12) best = n;
    }
    return best;
}

KvConfig KvOrderPolicy::config(const KvPolicySpec& p, double budget, const KvContext& ctx) const {
    return keep_whole(group_order(p.score, ctx.sh), groups_within(budget, ctx), ctx);
}

std::vector<KvConfig> KvOrderPolicy::controls(const KvPolicySpec&, double budget, const KvContext& ctx) const {
    return random_controls(groups_within(budget, ctx), ctx);
}

std::vector<KvConfig> KvOrderPolicy::random_controls(int64_t n, const KvContext& ctx) const {
    const int64_t M = ctx.sh.M;
    std::vector<int64_t> all_groups(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) all_groups[static_cast<size_t>(i)] = i;
    std::vector<KvConfig> out;
    for (int64_t r = 0; r < ctx.spec.random_orders; ++r)
        out.push_back(keep_whole(random_subset(all_groups, M, ctx.spec.seed + 3 + static_cast<uint64_t>(r)), n, ctx));
    return out;
}

}  // namespace hs
