// The needle scan's per-step scoring (see needle_scoring.h).
#include "needle_scoring.h"

#include "qrhead.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <limits>
#include <cmath>
#include <map>
#include <utility>

namespace hs {

using torch::indexing::Slice;

// The layer's step arithmetic runs on the scored rows of a batch at once, each (row, head) computed
// as the row alone computed it: comparisons (argmax, topk, ties) on the pattern in its own dtype
// (its conversion to double is exact and monotone: the same keys, the same first index of ties), the
// same per-row vector-matrix product W_O^T u, the same per-matrix products over the values, and
// each sum a reduction over one (row, head)'s keys of the same length as the row alone took.

namespace {

// Rows grouped by a key (ascending key; each group's rows in their order): the rows sharing one
// reduction shape.
std::map<int64_t, std::vector<int64_t>> group_rows(const std::vector<int64_t>& key) {
    std::map<int64_t, std::vector<int64_t>> g;
    for (size_t r = 0; r < key.size(); ++r) g[key[r]].push_back(static_cast<int64_t>(r));
    return g;
}

// The given rows of x [R, ...] (x itself when they are all of its rows, in order).
at::Tensor take_rows(const at::Tensor& x, const std::vector<int64_t>& rs) {
    bool all = static_cast<int64_t>(rs.size()) == x.size(0);
    for (size_t i = 0; all && i < rs.size(); ++i) all = rs[i] == static_cast<int64_t>(i);
    return all ? x : x.index_select(0, torch::tensor(rs, torch::kLong).to(x.device()));
}

// Per row r, the sum of x[r] [H, S] over its keys Slice(from[r], to[r]) -> [R, H]: each row's slice
// as the row alone takes it, the rows whose slices have one width stacked into one reduction over
// the last dimension (each (row, head) summed over the same keys in the same way).
at::Tensor slice_sums(const at::Tensor& x, const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
    const int64_t R = x.size(0);
    std::vector<at::Tensor> slices(static_cast<size_t>(R));
    std::vector<int64_t> width(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) {
        slices[r] = x[r].index({Slice(), Slice(from[r], to[r])});
        width[r] = slices[r].size(1);
    }
    const auto groups = group_rows(width);
    if (groups.size() == 1) return torch::stack(slices).sum(2);
    auto out = at::empty({R, x.size(1)}, x.options());
    for (const auto& [w, rs] : groups) {
        std::vector<at::Tensor> g;
        for (auto r : rs) g.push_back(slices[r]);
        out.index_copy_(0, torch::tensor(rs, torch::kLong).to(x.device()), torch::stack(g).sum(2));
    }
    return out;
}

// f(0, n) cut into `threads` parts on the intra-op threads (this file is compiled with OpenMP, as
// blocks.cpp: CMakeLists.txt), each part in the caller's thread-local state (InferenceMode, grad mode);
// the first error is rethrown. ATen ops inside run on their part's thread alone.
void split_work(int64_t n, int64_t threads, const std::function<void(int64_t, int64_t)>& f) {
    const int64_t T = std::min(threads, n);
    if (T <= 1) return f(0, n);
    const at::ThreadLocalState state;
    at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
        at::ThreadLocalStateGuard guard(state);
        for (int64_t t = t0; t < t1; ++t) f(n * t / T, n * (t + 1) / T);
    });
}

}  // namespace

// x [R, H, S] -> [R, H] int64: the first index of the largest value along S, a NaN counting as the
// largest (at::argmax's answer). A float32 CPU tensor: one pass a (row, head) split over the threads
// (at::argmax's reduction took 11 ms of the bench grid's 24-row decode step, issue 44); else at::argmax.
at::Tensor first_argmax(const at::Tensor& x) {
    if (!x.is_cpu() || x.scalar_type() != torch::kFloat || x.size(2) == 0) return x.argmax(2).to(torch::kCPU);
    const auto xc = x.contiguous();
    const int64_t R = x.size(0), H = x.size(1), S = x.size(2);
    auto out = at::empty({R, H}, torch::kLong);
    const float* xp = xc.data_ptr<float>();
    int64_t* op = out.data_ptr<int64_t>();
    split_work(R * H, at::get_num_threads(), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const float* p = xp + i * S;
            int64_t best = 0;
            float top = p[0];
            for (int64_t j = 1; j < S && !std::isnan(top); ++j)
                if (p[j] > top || std::isnan(p[j])) top = p[j], best = j;
            op[i] = best;
        }
    });
    return out;
}

// Retrieval: the argmax key (first of ties) in the answer's span holding the generated token.
std::vector<at::Tensor> retrieval_step(const NeedleStepInput& in) {
    const int64_t R = in.a.size(0), H = in.a.size(1);
    const auto jstar = first_argmax(in.a);  // [R, H]
    auto credit = torch::zeros({R, H}, torch::kDouble);
    const auto js = jstar.accessor<int64_t, 2>();
    auto cr = credit.accessor<double, 2>();
    for (int64_t r = 0; r < R; ++r) {
        const auto& prompt = *in.prompts[r];
        const int64_t as = in.spans[r].answer_start, ae = in.spans[r].answer_end;
        for (int64_t h = 0; h < H; ++h) {
            const int64_t j = js[r][h];
            if (j >= as && j < ae && j < static_cast<int64_t>(prompt.size()) && prompt[j] == in.y[r])
                cr[r][h] = 1.0 / static_cast<double>(ae - as);
        }
    }
    return {credit};
}

// contrib [R, H, S] double: contrib[r, h, j] = (W_O^h^T u_r) . v[rows[r], j, h / g], in float32 (or
// wider) without expanding v to H heads: row r's uproj = u_r W_O (a vector-matrix product, shared by
// the rows of one y), then its K products [S, d] x [d, g], the rows' R*K products split between the
// intra-op threads (reading the values is the cost: memory bandwidth one core does not fill), each
// run of consecutive batch rows a view of the cache's [B, K, capacity, d] buffer (no copy).
// O(R x H x S) memory.
static at::Tensor locos_contrib(const NeedleStepInput& in) {
    HS_REQUIRE(in.v.defined(), "locos_contrib: no values captured (the score's registry row must set step_reads_values)");
    const int64_t R = in.a.size(0), H = in.a.size(1), S = in.a.size(2), K = in.v.size(2), d = in.v.size(3), g = H / K;
    const auto ct = in.v.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    const auto v = in.v.to(ct), wo = in.wo.to(ct);
    std::vector<at::Tensor> run_of(static_cast<size_t>(R));  // row r -> the values of its run of rows [n*K, S, d]
    std::vector<int64_t> run_start(static_cast<size_t>(R));  // row r -> its run's first row
    for (int64_t r0 = 0; r0 < R;) {
        int64_t n = 1;
        while (r0 + n < R && in.rows[r0 + n] == in.rows[r0] + n) ++n;
        const auto vr = v.narrow(0, in.rows[r0], n).permute({0, 2, 1, 3}).reshape({n * K, S, d});
        for (int64_t r = r0; r < r0 + n; ++r) run_of[r] = vr, run_start[r] = r0;
        r0 += n;
    }
    // Each distinct y's uproj (rows of one y share it), [Y, H*d]; then the R*K products.
    std::vector<int64_t> first, slot(static_cast<size_t>(R));  // each y's first row; row r -> its y's
    std::map<int64_t, int64_t> of_y;
    for (int64_t r = 0; r < R; ++r) {
        const auto [it, fresh] = of_y.emplace(in.y[r], static_cast<int64_t>(first.size()));
        if (fresh) first.push_back(r);
        slot[r] = it->second;
    }
    const int64_t threads = v.is_cpu() ? at::get_num_threads() : 1;
    const int64_t Y = static_cast<int64_t>(first.size());
    auto up = at::empty({Y, H * d}, v.options());
    split_work(Y, threads, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) up[i].copy_(in.u[first[i]].to(ct).matmul(wo));
    });
    const auto uproj =  // [R*K, d, g]
        up.index_select(0, torch::tensor(slot, torch::kLong).to(v.device())).view({R * K, g, d}).transpose(1, 2);
    auto out = at::empty({R * K, S, g}, v.options());
    split_work(R * K, threads, [&](int64_t m0, int64_t m1) {  // products [m0, m1), by runs of rows
        for (int64_t m = m0; m < m1;) {
            const int64_t r = m / K, base = run_start[r] * K;  // the run's first product
            const int64_t me = std::min(m1, base + run_of[r].size(0));
            auto dst = out.narrow(0, m, me - m);
            at::bmm_out(dst, run_of[r].narrow(0, m - base, me - m), uproj.narrow(0, m, me - m));
            m = me;
        }
    });
    return out.view({R, K, S, g}).permute({0, 1, 3, 2}).reshape({R, H, S}).to(torch::kDouble);
}

std::vector<at::Tensor> locos_step(const NeedleStepInput& in) {
    const int64_t R = in.a.size(0), S = in.a.size(2);
    auto phi = locos_contrib(in);  // [R, H, S] double
    phi.mul_(in.a);                // a * contrib (a converted to double: exact)
    std::vector<int64_t> ns(R), ne(R);
    std::vector<double> scale(R);
    std::vector<int64_t> none;  // rows where no key outside the needle is visible: L- = 0
    for (int64_t r = 0; r < R; ++r) {
        const auto& sp = in.spans[r];
        ns[r] = sp.needle_start, ne[r] = sp.needle_end;
        // The other keys the heads can see: all S, or the sliding window's.
        const int64_t lo = std::max<int64_t>(0, sp.first_visible);
        const int64_t others = (S - lo) - std::max<int64_t>(0, std::min(ne[r], S) - std::max(ns[r], lo));
        scale[r] = others > 0 ? static_cast<double>(ne[r] - ns[r]) / static_cast<double>(others) : 0.0;
        if (others <= 0) none.push_back(r);
    }
    const auto lplus = slice_sums(phi, ns, ne);
    auto lminus = (phi.sum(2) - lplus) * torch::tensor(scale, torch::kDouble).view({R, 1}).to(phi.device());
    if (!none.empty()) lminus.index_fill_(0, torch::tensor(none, torch::kLong).to(phi.device()), 0.0);
    return {lplus.to(torch::kCPU), lminus.to(torch::kCPU)};
}

// HeadKV's R2 credit of one step (retrieval_head_detection_r2.py lines 218-229, commit 0862a09):
//   topk = needle_end - needle_start; values, idx = row.topk(topk)
//   for v, i in zip(values, idx): if needle_start <= i < needle_end: score += v * 1 / topk
// over a row's whole pattern [H, S]. torch's topk leaves the order of equal weights open; here the
// first indices win: every key above the k-th largest weight, then as many of the keys equal to it
// as the top k holds, by position. The span's weights taken are summed by position (in double),
// then / N (r2_step). The rows of one k and one span width [lo, lo + w) share each op: one topk over
// their rows and a pass over their spans (their prefixes too only when a span key ties) -> the sums
// [R, H] double.
static at::Tensor r2_group(const at::Tensor& a, const std::vector<int64_t>& lo, int64_t k, int64_t w) {
    const int64_t R = a.size(0), S = a.size(2);
    const auto top = std::get<0>(a.topk(k, 2));  // [R, H, k] descending
    const auto kth = top.narrow(2, k - 1, 1);    // [R, H, 1] the k-th largest weight
    std::vector<at::Tensor> spans;
    for (int64_t r = 0; r < R; ++r) spans.push_back(a[r].narrow(1, lo[r], w));
    const auto span = torch::stack(spans);  // [R, H, w]
    auto taken = span > kth;
    const auto tie = span == kth;
    if (tie.any().item<bool>()) {  // a tie's rank: the equal keys before it, the span's before it, itself
        const auto room = (top == kth).sum(2, true);
        const auto lo_t = torch::tensor(lo, torch::kLong).to(a.device()).view({R, 1, 1});
        const auto before = ((a == kth) & (torch::arange(S, lo_t.options()).view({1, 1, S}) < lo_t)).sum(2, true);
        taken = taken.logical_or(tie.logical_and(before + tie.cumsum(2) <= room));
    }
    return (span.to(torch::kDouble) * taken).sum(2);
}

std::vector<at::Tensor> r2_step(const NeedleStepInput& in) {
    const int64_t R = in.a.size(0), H = in.a.size(1), S = in.a.size(2);
    auto credit = torch::zeros({R, H}, torch::kDouble);
    std::vector<int64_t> lo(R), key(R, -1), n(R), width(R);
    for (int64_t r = 0; r < R; ++r) {
        const int64_t start = in.spans[r].answer_start, end = in.spans[r].answer_end;
        n[r] = end - start, lo[r] = std::max<int64_t>(0, start);
        const int64_t hi = std::min(end, S);
        if (start < 0 || n[r] <= 0 || hi <= lo[r]) continue;  // no span: 0
        width[r] = hi - lo[r];
        key[r] = std::min(n[r], S) * (S + 1) + width[r];  // rows of one (k, span width)
    }
    for (const auto& [kw, rs] : group_rows(key)) {
        if (kw < 0) continue;
        std::vector<int64_t> glo, gn;
        for (auto r : rs) glo.push_back(lo[r]), gn.push_back(n[r]);
        const auto sums = r2_group(take_rows(in.a, rs), glo, kw / (S + 1), kw % (S + 1)).to(torch::kCPU);
        const auto div = torch::tensor(gn, torch::kLong).to(torch::kDouble).view({-1, 1});
        credit.index_copy_(0, torch::tensor(rs, torch::kLong), sums / div);
    }
    return {credit};
}

PerNeedleScore<at::Tensor> score_layer(const NeedleStepInput& in, NeedleScoreSet which) {
    PerNeedleScore<at::Tensor> out;
    for (const auto& row : needle_scores())
        out.push_back(which.has(row.id) ? row.step(in) : std::vector<at::Tensor>(row.step_arrays.size()));
    return out;
}

StepScores score_step(const at::Tensor& pattern, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
                      const std::vector<int64_t>& prompt, const StepSpans& sp, int64_t y) {
    const std::vector<int64_t> rows{0}, ys{y};
    const std::vector<const std::vector<int64_t>*> prompts{&prompt};
    const std::vector<StepSpans> spans{sp};
    const auto a = pattern.unsqueeze(0), vb = v.unsqueeze(0), ub = u.unsqueeze(0);
    StepScores s;
    for (const auto& parts : score_layer(NeedleStepInput{a, vb, rows, wo, ub, prompts, spans, ys})) {
        s.of.emplace_back();
        for (const auto& t : parts) s.of.back().push_back(t[0]);
    }
    return s;
}

std::vector<PerNeedleScore<at::Tensor>> score_rows(const Model& m, const std::vector<at::Tensor>& rows,
                                                   const std::vector<at::Tensor>& vals, const std::vector<int64_t>& scored,
                                                   const std::vector<const Trial*>& trials, const std::vector<int64_t>& keys,
                                                   const std::vector<int64_t>& ys, NeedleScoreSet which) {
    const auto& cfg = m.config;
    const int L = cfg.n_layers;
    const int64_t R = static_cast<int64_t>(scored.size());
    const auto& unembed = m.weights.unembed;
    const auto u = unembed.index_select(0, torch::tensor(ys, torch::kLong).to(unembed.device()));  // [R, D]
    std::vector<const std::vector<int64_t>*> prompts;
    for (const Trial* t : trials) prompts.push_back(&t->prompt);
    std::vector<PerNeedleScore<at::Tensor>> layers(static_cast<size_t>(L));  // [l][score][part] [R, H]
    for (int l = 0; l < L; ++l) {
        std::vector<StepSpans> spans;
        for (size_t r = 0; r < trials.size(); ++r) {
            const Trial* t = trials[r];
            StepSpans sp{t->needle_start, t->needle_end, t->answer_start, t->answer_end, 0};
            if (cfg.is_sliding(l)) sp.first_visible = std::max<int64_t>(0, keys.at(r) - cfg.sliding_window);
            spans.push_back(sp);
        }
        const auto a = take_rows(rows[l], scored);  // [R, H, S]
        layers[l] = score_layer(NeedleStepInput{a, vals[l], scored, m.weights.layers[l].wo, u, prompts, spans, ys}, which);
    }
    std::vector<PerNeedleScore<at::Tensor>> out(static_cast<size_t>(R), per_needle_score_steps<at::Tensor>());
    if (R == 0) return out;
    for (size_t s = 0; s < out.front().size(); ++s)
        for (size_t p = 0; p < out.front()[s].size(); ++p) {
            if (!layers.front()[s][p].defined()) continue;  // not in `which`
            std::vector<at::Tensor> per_layer;
            for (const auto& layer : layers) per_layer.push_back(layer[s][p]);
            const auto all = torch::stack(per_layer);  // [L, R, H]
            for (int64_t r = 0; r < R; ++r) out[r][s][p] = all.select(1, r);
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
