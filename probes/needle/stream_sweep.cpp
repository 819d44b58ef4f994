// The streaming-heads sweep (stream_sweep.h).
#include "stream_sweep.h"

#include "errors.h"
#include "heads.h"
#include "progress.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace hs {

std::vector<double> parse_full_fractions(const std::string& text) {
    std::vector<double> out;
    for (const auto& part : split(text, ',')) {
        const auto p = trim(part);
        if (p.empty()) continue;
        const auto v = parse_double(p);
        if (!v || !(*v >= 0 && *v <= 1)) throw UsageError(fmt::format("'{}' is not a fraction in [0, 1]", p), "full_fractions");
        out.push_back(*v);
    }
    if (out.empty()) throw UsageError("no value given", "full_fractions");
    return out;
}

StreamSweep run_stream_sweep(const NeedleTest& test, int n_layers, int n_heads, const StreamSweepSpec& spec) {
    const int64_t H = n_heads, LH = int64_t{n_layers} * H;
    StreamSweep out;
    out.fractions = spec.fractions;
    out.orders = {rank_heads(spec.score.to(torch::kCPU, torch::kDouble), true)};
    std::vector<int64_t> all(LH);
    for (int64_t i = 0; i < LH; ++i) all[i] = i;
    for (int64_t r = 0; r < spec.random_orders; ++r)
        out.orders.push_back(random_subset(all, LH, spec.seed + 3 + static_cast<uint64_t>(r)));
    const int64_t R = static_cast<int64_t>(out.orders.size()), F = static_cast<int64_t>(out.fractions.size());
    const auto& trials = test.ablation_trials();
    const int64_t N = static_cast<int64_t>(trials.size());

    // Configurations: the streaming heads of (order, fraction); identical sets decode once, the
    // distinct sets as rows of shared forwards.
    out.full_heads.assign(F, 0);
    out.masks.assign(R * F * LH, 0);
    std::map<std::vector<int64_t>, size_t> index;  // sorted streaming heads -> its set in `sets`
    std::vector<HeadSet> sets;
    std::vector<size_t> set_of(R * F);  // configuration (r, f) -> its set
    for (int64_t f = 0; f < F; ++f) {
        out.full_heads[f] = std::min<int64_t>(LH, std::llround(out.fractions[f] * static_cast<double>(LH)));
        for (int64_t r = 0; r < R; ++r) {
            std::vector<int64_t> st(out.orders[r].begin() + out.full_heads[f], out.orders[r].end());
            std::sort(st.begin(), st.end());
            for (auto i : st) out.masks[(r * F + f) * LH + i] = 1;
            auto [it, fresh] = index.emplace(st, sets.size());
            if (fresh) {
                HeadSet hs;
                hs.mode = Intervention::kStream;
                hs.window = spec.window;
                for (auto i : st) hs.heads.push_back({static_cast<int>(i / H), static_cast<int>(i % H)});
                sets.push_back(std::move(hs));
            }
            set_of[r * F + f] = it->second;
        }
    }
    out.distinct_sets = static_cast<int64_t>(sets.size());
    Progress prog("streaming sweep trials", static_cast<int64_t>(sets.size()) * N);
    const auto res = test.run_ablated_sets(sets, spec.sweep_rows, [&prog] { prog.tick(); });
    prog.finish();
    out.accuracy.assign(R * F, 0), out.rougeL_f.assign(R * F, 0);
    for (int64_t c = 0; c < R * F; ++c) {
        double acc = 0, rl = 0;
        for (const auto& t : res[set_of[c]]) acc += t.passed, rl += t.rougeL_f;
        out.accuracy[c] = static_cast<float>(acc / N), out.rougeL_f[c] = static_cast<float>(rl / N);
    }
    const auto& w = spec.window;
    const double W = static_cast<double>(w.sink + w.recent + (w.compensate ? 1 : 0));
    out.kv_budget.assign(F, 0);
    for (int64_t f = 0; f < F; ++f) {
        const double rho = static_cast<double>(out.full_heads[f]) / static_cast<double>(LH);
        double total = 0;
        for (const auto& t : trials) total += rho + (1 - rho) * std::min(1.0, W / static_cast<double>(t.prompt.size()));
        out.kv_budget[f] = static_cast<float>(total / static_cast<double>(N));
    }
    return out;
}

}  // namespace hs
