#include "heads.h"

#include "errors.h"
#include "store.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

namespace hs {

std::string format_head(int layer, int head) { return fmt::format("L{}H{}", layer, head); }

std::string format_heads(const std::vector<Head>& hs) {
    std::string s;
    for (auto [l, h] : hs) s += (s.empty() ? "" : ",") + format_head(l, h);
    return s;
}

bool parse_head_name(const std::string& s, int& layer, int& head) {
    // L<digits>H<digits>
    if (s.size() < 4 || s[0] != 'L') return false;
    const auto hpos = s.find('H');
    if (hpos == std::string::npos || hpos < 2 || hpos + 1 >= s.size()) return false;
    auto digits = [](const std::string& t) { return !t.empty() && t.size() < 7 && std::all_of(t.begin(), t.end(), ::isdigit); };
    const std::string a = s.substr(1, hpos - 1), b = s.substr(hpos + 1);
    if (!digits(a) || !digits(b)) return false;
    layer = std::atoi(a.c_str());
    head = std::atoi(b.c_str());
    return true;
}

std::vector<Head> parse_head_list(const std::string& s, int L, int H) {
    std::vector<Head> out;
    for (const auto& part : split(s, ',')) {
        const std::string p = trim(part);
        if (p.empty()) continue;
        int l = -1, h = -1;
        if (!parse_head_name(p, l, h))
            throw UsageError(fmt::format("'{}' is not a head (expected L<layer>H<head>, e.g. L1H0)", p));
        if (l >= L || h >= H) throw UsageError(fmt::format("{} is outside the model ({} layers x {} heads)", p, L, H));
        if (std::find(out.begin(), out.end(), Head{l, h}) == out.end()) out.push_back({l, h});
    }
    if (out.empty()) throw UsageError("no head named");
    return out;
}

std::vector<int64_t> rank_heads(const at::Tensor& score, bool descending) {
    auto s = score.to(torch::kCPU, torch::kDouble).contiguous();
    const int64_t n = s.numel();
    std::vector<int64_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    const double* p = s.data_ptr<double>();
    std::stable_sort(idx.begin(), idx.end(), [p, descending](int64_t a, int64_t b) {
        const bool na = std::isnan(p[a]), nb = std::isnan(p[b]);
        if (na || nb) return !na && nb;
        return descending ? p[a] > p[b] : p[a] < p[b];
    });
    return idx;
}

std::vector<Head> top_heads(const at::Tensor& score, int64_t k) {
    const int64_t H = score.size(1);
    const auto idx = rank_heads(score, true);
    std::vector<Head> out;
    for (int64_t i = 0; i < std::min<int64_t>(k, static_cast<int64_t>(idx.size())); ++i)
        out.push_back({static_cast<int>(idx[i] / H), static_cast<int>(idx[i] % H)});
    return out;
}

std::vector<std::vector<Head>> random_head_sets(int L, int H, const std::vector<Head>& exclude, int64_t n_sets,
                                                uint64_t seed, int64_t* possible) {
    std::vector<Head> pool;
    for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
            if (std::find(exclude.begin(), exclude.end(), Head{l, h}) == exclude.end()) pool.push_back({l, h});
    const size_t k = exclude.size();
    if (pool.size() < k)
        throw UsageError(fmt::format("{} heads outside the ablated set, fewer than the {} a control needs", pool.size(), k));
    // How many distinct sets the pool holds: C(|pool|, k), counted up to n_sets + 1.
    int64_t distinct = 1;
    for (size_t i = 0; i < k && distinct <= n_sets; ++i)
        distinct = static_cast<int64_t>(static_cast<double>(distinct) * static_cast<double>(pool.size() - i) / static_cast<double>(i + 1) + 0.5);
    if (possible) *possible = std::min(distinct, n_sets + 1);
    std::vector<std::vector<Head>> out;
    if (distinct <= n_sets) {
        // Every set the pool holds, in order (k-combinations of the pool's order).
        std::vector<size_t> idx(k);
        for (size_t i = 0; i < k; ++i) idx[i] = i;
        while (true) {
            std::vector<Head> set;
            for (auto i : idx) set.push_back(pool[i]);
            out.push_back(set);
            size_t i = k;
            while (i > 0 && idx[i - 1] == pool.size() - k + (i - 1)) --i;
            if (i == 0) break;
            ++idx[i - 1];
            for (size_t j = i; j < k; ++j) idx[j] = idx[j - 1] + 1;
        }
        return out;
    }
    std::mt19937_64 rng(seed);
    std::set<std::vector<Head>> seen;
    while (static_cast<int64_t>(out.size()) < n_sets) {
        auto p = pool;
        for (size_t i = 0; i < k; ++i) {  // partial Fisher-Yates
            std::uniform_int_distribution<size_t> d(i, p.size() - 1);
            std::swap(p[i], p[d(rng)]);
        }
        p.resize(k);
        std::sort(p.begin(), p.end());
        if (seen.insert(p).second) out.push_back(p);  // a set drawn before is drawn again
    }
    return out;
}

std::vector<int64_t> random_subset(const std::vector<int64_t>& pool, int64_t k, uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto p = pool;
    std::shuffle(p.begin(), p.end(), rng);
    p.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(p.size()))));
    return p;
}

HeadScoreRef split_head_score_ref(const std::string& spec) {
    const auto c = spec.rfind(".h5:");
    const auto c2 = spec.rfind(':');
    const size_t cut = c != std::string::npos ? c + 3 : c2;
    if (cut == std::string::npos || cut == 0 || cut + 1 >= spec.size())
        throw UsageError(fmt::format("'{}': expected FILE.h5:DATASET, e.g. scores.h5:scores/locos/score", spec));
    HeadScoreRef r{spec.substr(0, cut), spec.substr(cut + 1)};
    if (r.dataset.front() != '/') r.dataset = "/" + r.dataset;
    return r;
}

at::Tensor read_head_score(const HeadScoreRef& ref, int L, int H) {
    ResultReader r(ref.file);
    if (!r.exists(ref.dataset) || r.is_group(ref.dataset))
        throw UsageError(fmt::format("{} has no dataset {}", ref.file, ref.dataset));
    auto d = r.read_numbers(ref.dataset);
    if (d.is_string || d.shape.size() != 2 || d.shape[0] != L || d.shape[1] != H)
        throw UsageError(fmt::format("{}:{} is {}, expected [{}, {}] (this model's layers x heads)", ref.file, ref.dataset,
                                     shape_str(d.shape), L, H));
    return torch::tensor(d.values, torch::kDouble).view({L, H});
}

}  // namespace hs
