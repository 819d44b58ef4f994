// The needle scan's per-step scoring (see needle_scoring.h).
#include "needle_scoring.h"

#include "qrhead.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <utility>

namespace hs {

using torch::indexing::Slice;

// Retrieval: the argmax key (first of ties) in the answer's span holding the generated token.
std::vector<at::Tensor> retrieval_step(const NeedleStepInput& in) {
    const int64_t H = in.a.size(0), as = in.spans.answer_start, ae = in.spans.answer_end;
    auto jstar = in.a.argmax(1).to(torch::kCPU);
    auto credit = torch::zeros({H}, torch::kDouble);
    auto js = jstar.accessor<int64_t, 1>();
    for (int64_t h = 0; h < H; ++h) {
        const int64_t j = js[h];
        if (j >= as && j < ae && j < static_cast<int64_t>(in.prompt.size()) && in.prompt[j] == in.y)
            credit[h] = 1.0 / static_cast<double>(ae - as);
    }
    return {credit};
}

std::vector<at::Tensor> locos_step(const NeedleStepInput& in) {
    const at::Tensor &a = in.a, &v = in.v;
    const int64_t H = a.size(0), S = a.size(1), K = v.size(1), d = v.size(2), g = H / K;
    const int64_t ns = in.spans.needle_start, ne = in.spans.needle_end;
    const double n = static_cast<double>(ne - ns);
    // phi[h, j] = a[h, j] * (W_O^h^T u) . v[j, h / g], in float32 (or wider) without expanding v to
    // H heads: [K, S, d] x [K, d, g] -> [K, S, g] -> [H, S]. O(H x S) memory.
    const auto ct = v.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    auto uproj = in.u.to(ct).matmul(in.wo.to(ct)).view({K, g, d});                      // [K, g, d]
    auto contrib = torch::bmm(v.to(ct).permute({1, 0, 2}), uproj.transpose(1, 2))        // [K, S, g]
                       .permute({0, 2, 1})
                       .reshape({H, S})
                       .to(torch::kDouble);
    auto phi = a * contrib;
    auto lplus = phi.index({Slice(), Slice(ns, ne)}).sum(1);
    // The other keys the heads can see: all S, or the sliding window's; 0 when there are none.
    const int64_t lo = std::max<int64_t>(0, in.spans.first_visible);
    const int64_t others = (S - lo) - std::max<int64_t>(0, std::min(ne, S) - std::max(ns, lo));
    auto lminus = others > 0 ? (phi.sum(1) - lplus) * (n / static_cast<double>(others)) : torch::zeros({H}, torch::kDouble);
    return {lplus.to(torch::kCPU), lminus.to(torch::kCPU)};
}

// HeadKV's R2 credit of one step (retrieval_head_detection_r2.py lines 218-229, commit 0862a09):
//   topk = needle_end - needle_start; values, idx = row.topk(topk)
//   for v, i in zip(values, idx): if needle_start <= i < needle_end: score += v * 1 / topk
// over the whole row a [H, S] (double). torch's topk leaves the order of equal weights open; here
// the first indices win: every key above the k-th largest weight, then as many of the keys equal to
// it as the top k holds, by position. The span's weights taken are summed by position, then / N.
// Cost: one topk over the row and a pass over the span (the prefix too only when a span key ties).
std::vector<at::Tensor> r2_step(const NeedleStepInput& in) {
    const at::Tensor& a = in.a;
    const int64_t start = in.spans.answer_start, end = in.spans.answer_end;
    const int64_t H = a.size(0), S = a.size(1);
    const int64_t n = end - start, lo = std::max<int64_t>(0, start), hi = std::min(end, S);
    if (start < 0 || n <= 0 || hi <= lo) return {torch::zeros({H}, torch::kDouble)};
    const int64_t k = std::min(n, S);
    const auto top = std::get<0>(a.topk(k, 1));  // [H, k] descending
    const auto kth = top.narrow(1, k - 1, 1);    // [H, 1] the k-th largest weight
    const auto span = a.narrow(1, lo, hi - lo);
    auto taken = span > kth;
    const auto tie = span == kth;
    if (tie.any().item<bool>()) {  // a tie's rank: the equal keys before it, the span's before it, itself
        const auto room = (top == kth).sum(1, true);
        const auto before = (a.narrow(1, 0, lo) == kth).sum(1, true);
        taken = taken.logical_or(tie.logical_and(before + tie.cumsum(1) <= room));
    }
    return {((span * taken).sum(1) / static_cast<double>(n)).to(torch::kCPU)};
}

StepScores score_step(const at::Tensor& pattern, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
                      const std::vector<int64_t>& prompt, const StepSpans& sp, int64_t y) {
    const auto a = pattern.to(torch::kDouble);
    const NeedleStepInput in{a, v, wo, u, prompt, sp, y};
    StepScores s;
    for (const auto& row : needle_scores()) s.of.push_back(row.step(in));
    return s;
}

PerNeedleScore<at::Tensor> score_row(const Model& m, const std::vector<at::Tensor>& rows, const std::vector<at::Tensor>& vals,
                                     int64_t b, const Trial& tr, int64_t keys, int64_t y) {
    const auto& cfg = m.config;
    const int L = cfg.n_layers;
    auto out = per_needle_score_steps<at::Tensor>();
    for (auto& parts : out)
        for (auto& t : parts) t = torch::zeros({L, cfg.n_heads}, torch::kDouble);
    auto u = m.weights.unembed[y];
    for (int l = 0; l < L; ++l) {
        StepSpans sp{tr.needle_start, tr.needle_end, tr.answer_start, tr.answer_end, 0};
        if (cfg.is_sliding(l)) sp.first_visible = std::max<int64_t>(0, keys - cfg.sliding_window);
        const auto sc = score_step(rows[l][b], vals[l][b], m.weights.layers[l].wo, u, tr.prompt, sp, y);
        for (size_t s = 0; s < out.size(); ++s)
            for (size_t p = 0; p < out[s].size(); ++p) out[s][p][l] = sc.of[s][p];
    }
    return out;
}

std::vector<at::Tensor> retrieval_trial(const NeedleTrialSteps& in) { return {in.steps[0].sum(0)}; }

std::vector<at::Tensor> locos_trial(const NeedleTrialSteps& in) {
    const auto &lplus = in.steps[0], &lminus = in.steps[1];
    if (in.answer_steps.empty() || !in.needle_found) {  // no answer step, or the needle's span was not found
        const auto nan = torch::full({in.L, in.H}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble);
        return {nan, nan, nan};
    }
    const auto idx = torch::tensor(in.answer_steps, torch::kLong);
    auto lp = lplus.index_select(0, idx).mean(0);
    auto lm = lminus.index_select(0, idx).mean(0);
    return {(lplus - lminus).index_select(0, idx).mean(0), lp, lm};
}

// R2 sums the first len(answer_tokens) steps (retrieval_head_detection_r2.py lines 245, 255).
std::vector<at::Tensor> r2_trial(const NeedleTrialSteps& in) {
    const int64_t n = std::min<int64_t>(in.steps[0].size(0), in.answer_tokens);
    return {in.steps[0].narrow(0, 0, n).sum(0)};
}

std::vector<at::Tensor> qrhead_step(const NeedleStepInput&) { return {}; }

std::vector<at::Tensor> qrhead_trial(const NeedleTrialSteps& in) {
    if (!in.query_cal || !in.needle_found)
        return {torch::full({in.L, in.H}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble)};
    return {qrhead_span_scores(*in.query_cal, in.needle_start, in.needle_end)};
}

std::vector<int64_t> answer_steps(const Tokenizer& tok, const std::vector<int64_t>& gen, const std::string& answer) {
    std::vector<int64_t> out;
    const auto enc = tok.encode(answer, false);
    const std::vector<int64_t> a(enc.begin(), enc.end());
    const int64_t n = static_cast<int64_t>(gen.size()), k = static_cast<int64_t>(a.size());
    if (k > 0)
        for (int64_t i = 0; i + k <= n; ++i)
            if (std::equal(a.begin(), a.end(), gen.begin() + i)) {
                for (int64_t j = i; j < i + k; ++j) out.push_back(j);
                return out;
            }
    std::string all;
    std::vector<std::pair<size_t, size_t>> range;
    for (auto id : gen) {
        const size_t b = all.size();
        all += tok.decode({static_cast<int32_t>(id)}, false);  // contrastive.py: tokenizer.decode([tid]) keeps specials
        range.push_back({b, all.size()});
    }
    auto lower = [](std::string s) {
        for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    const std::string al = lower(answer);
    const size_t at = lower(all).find(al);
    if (at == std::string::npos || al.empty()) return out;
    for (int64_t i = 0; i < n; ++i)
        if (range[i].second > at && range[i].first < at + al.size()) out.push_back(i);
    return out;
}

}  // namespace hs
