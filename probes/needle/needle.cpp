#include "needle.h"

#include "errors.h"
#include "guard.h"
#include "reference_rng.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>

namespace hs {

using torch::indexing::None;
using torch::indexing::Slice;

// ---- ablation ----

const std::vector<Intervention>& needle_ablations() {
    static const std::vector<Intervention> v = {Intervention::kZeroQuery, Intervention::kMeanQuery, Intervention::kZero,
                                                Intervention::kStream};
    return v;
}

void HeadSet::apply(Hooks& hooks, int64_t row, const Trial* trial) const {
    HS_REQUIRE(trial || (!keep && !window_after_prompt), "HeadSet::apply: kept positions need the row's trial");
    const int64_t P = !trial ? 0 : kv_from ? kv_from(*trial) : static_cast<int64_t>(trial->prompt.size());
    if (!heads.empty()) {
        // The study's mean-query is LOCOS's pre-RoPE mean: intervention.h's mean-query-pre-rope.
        const Intervention m = mode == Intervention::kMeanQuery ? Intervention::kMeanQueryPreRope : mode;
        StreamWindow w = window;
        if (window_after_prompt) w.from = P;
        apply_intervention(hooks, InterventionSpec{m, 1.0, q_mean, w}, heads, row,
                           {Intervention::kZeroQuery, Intervention::kMeanQueryPreRope, Intervention::kZero, Intervention::kStream});
    }
    if (!keep) return;
    const at::Tensor k = keep(*trial);  // [L, H, P]
    HS_REQUIRE(k.dim() == 3 && k.size(2) == P, "HeadSet::apply: a keep mask of another length than kv_from");
    for (int l = 0; l < k.size(0); ++l)
        if (!k[l].all().item<bool>()) hooks.keep({l, row, P, k[l], keep_compensate});
}

at::Tensor calibrate_query_mean(const Model& m, const std::vector<std::vector<int64_t>>& prompts, int64_t prefill_chunk,
                                const std::function<void()>& after_each) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    HS_REQUIRE(!prompts.empty(), "calibrate_query_mean: no prompt");
    auto total = torch::zeros({cfg.n_layers, cfg.n_heads, cfg.d_head}, torch::kDouble);
    at::Tensor sum;  // this prompt's per-position sum, on the model's device, in double
    Hooks hooks;
    hooks.capture(Point::kAttnQPreRope, [&sum](int l, const at::Tensor& q) {  // q [1, T, H, d]
        sum[l].add_(q.to(torch::kDouble).sum(at::IntArrayRef{0, 1}));
    });
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    const int64_t chunk = std::max<int64_t>(1, prefill_chunk);
    for (const auto& p : prompts) {
        const int64_t P = static_cast<int64_t>(p.size());
        HS_REQUIRE(P > 0, "calibrate_query_mean: empty prompt");
        sum = torch::zeros({cfg.n_layers, cfg.n_heads, cfg.d_head}, torch::TensorOptions(torch::kDouble).device(m.options.device));
        auto ids = torch::tensor(p, torch::kLong).view({1, P}).to(m.options.device);
        KVCache cache;
        for (int64_t p0 = 0; p0 < P; p0 += chunk)
            m.forward(ids.index({Slice(), Slice(p0, std::min(P, p0 + chunk))}), &hooks, &cache, no_logits);
        total.add_(sum.to(torch::kCPU) / static_cast<double>(P));  // this prompt's mean, weight 1
        if (after_each) after_each();
    }
    return (total / static_cast<double>(prompts.size())).to(torch::kFloat);
}

// ---- scoring ----

// HeadKV's R2 credit of one step (retrieval_head_detection_r2.py lines 218-229, commit 0862a09):
//   topk = needle_end - needle_start; values, idx = row.topk(topk)
//   for v, i in zip(values, idx): if needle_start <= i < needle_end: score += v * 1 / topk
// over the whole row a [H, S] (double). torch's topk leaves the order of equal weights open; here
// the first indices win: every key above the k-th largest weight, then as many of the keys equal to
// it as the top k holds, by position. The span's weights taken are summed by position, then / N.
// Cost: one topk over the row and a pass over the span (the prefix too only when a span key ties).
static at::Tensor r2_step(const at::Tensor& a, int64_t start, int64_t end) {
    const int64_t H = a.size(0), S = a.size(1);
    const int64_t n = end - start, lo = std::max<int64_t>(0, start), hi = std::min(end, S);
    if (start < 0 || n <= 0 || hi <= lo) return torch::zeros({H}, torch::kDouble);
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
    return ((span * taken).sum(1) / static_cast<double>(n)).to(torch::kCPU);
}

StepScores score_step(const at::Tensor& pattern, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
                      const std::vector<int64_t>& prompt, const StepSpans& sp, int64_t y) {
    const int64_t H = pattern.size(0), S = pattern.size(1), K = v.size(1), d = v.size(2), g = H / K;
    const int64_t ns = sp.needle_start, ne = sp.needle_end, as = sp.answer_start, ae = sp.answer_end;
    auto a = pattern.to(torch::kDouble);
    // Retrieval: argmax key (first of ties) in the answer's span holding the generated token.
    auto jstar = a.argmax(1).to(torch::kCPU);
    auto credit = torch::zeros({H}, torch::kDouble);
    auto js = jstar.accessor<int64_t, 1>();
    for (int64_t h = 0; h < H; ++h) {
        const int64_t j = js[h];
        if (j >= as && j < ae && j < static_cast<int64_t>(prompt.size()) && prompt[j] == y)
            credit[h] = 1.0 / static_cast<double>(ae - as);
    }
    const double n = static_cast<double>(ne - ns);
    // LOCOS: phi[h, j] = a[h, j] * (W_O^h^T u) . v[j, h / g], in float32 (or wider) without
    // expanding v to H heads: [K, S, d] x [K, d, g] -> [K, S, g] -> [H, S]. O(H x S) memory.
    const auto ct = v.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    auto uproj = u.to(ct).matmul(wo.to(ct)).view({K, g, d});                             // [K, g, d]
    auto contrib = torch::bmm(v.to(ct).permute({1, 0, 2}), uproj.transpose(1, 2))        // [K, S, g]
                       .permute({0, 2, 1})
                       .reshape({H, S})
                       .to(torch::kDouble);
    auto phi = a * contrib;
    auto lplus = phi.index({Slice(), Slice(ns, ne)}).sum(1);
    // The other keys the heads can see: all S, or the sliding window's; 0 when there are none.
    const int64_t lo = std::max<int64_t>(0, sp.first_visible);
    const int64_t others = (S - lo) - std::max<int64_t>(0, std::min(ne, S) - std::max(ns, lo));
    auto lminus = others > 0 ? (phi.sum(1) - lplus) * (n / static_cast<double>(others)) : torch::zeros({H}, torch::kDouble);
    return {credit, lplus.to(torch::kCPU), lminus.to(torch::kCPU), r2_step(a, as, ae)};
}

// decode_batch and decode_batch_sets: `ablate` acts on every row, or `per_row[b]` on row b alone.
static int64_t common_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b, int64_t limit) {
    int64_t n = 0;
    const int64_t end = std::min({limit, static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size())});
    while (n < end && a[static_cast<size_t>(n)] == b[static_cast<size_t>(n)]) ++n;
    return n;
}

// The bytes a cache's buffers take (its views may show less).
static int64_t cache_bytes(const KVCache& c) {
    int64_t n = 0;
    for (size_t l = 0; l < c.k.size(); ++l)
        if (c.k[l].defined())
            n += static_cast<int64_t>(c.k[l].storage().nbytes() + c.v[l].storage().nbytes());
    return n;
}

void PrefixCache::release(const Trial* t) {
    keep.erase(t);
    if (auto it = entries.find(t); it != entries.end()) it->second.pinned = false;
}

bool PrefixCache::put(const Trial* t, const KVCache& cache, std::vector<int64_t> ends) {
    if (auto it = entries.find(t); it != entries.end()) bytes -= it->second.bytes, entries.erase(it);
    const int64_t need = cache_bytes(cache);
    if (max_bytes > 0) {
        if (need > max_bytes) return false;
        while (bytes + need > max_bytes) {
            auto lru = entries.end();
            for (auto it = entries.begin(); it != entries.end(); ++it)
                if (!it->second.pinned && (lru == entries.end() || it->second.used < lru->second.used)) lru = it;
            if (lru == entries.end()) return false;  // all pinned
            bytes -= lru->second.bytes;
            entries.erase(lru);
        }
    }
    entries[t] = Entry{cache, std::move(ends), need, ++clock, keep.count(t) > 0};
    bytes += need;
    return true;
}

// A trial's prefill boundaries: the multiples of `chunk` below E, its cuts below E, and E.
static std::vector<int64_t> chunk_ends(const Trial& t, int64_t chunk) {
    const int64_t E = static_cast<int64_t>(t.prompt.size()) - 1;
    std::vector<int64_t> ends;
    for (int64_t e = chunk; e < E; e += chunk) ends.push_back(e);
    for (auto c : t.cuts)
        if (c > 0 && c < E) ends.push_back(c);
    if (E > 0) ends.push_back(E);
    std::sort(ends.begin(), ends.end());
    ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
    return ends;
}

// One trial's prefill (its prompt but the last token) at batch 1, in chunks ending at chunk_ends;
// with `prefix`, the longest run it shares with a kept prefill is taken from there up to the last
// chunk end both have (below it both computed the same chunks: PrefixCache), and this prefill is
// kept in turn.
static KVCache prefill_trial(const Model& m, const Trial& t, int64_t chunk, const Hooks* h, const ForwardOptions& opts,
                             PrefixCache* prefix) {
    const int64_t E = static_cast<int64_t>(t.prompt.size()) - 1;
    if (prefix)
        if (auto it = prefix->entries.find(&t); it != prefix->entries.end()) {
            prefix->reused += E;
            it->second.used = ++prefix->clock;
            return it->second.cache;  // a copy sharing the views: its appends go to buffers of its own
        }
    const auto ends = chunk_ends(t, chunk);
    KVCache cache;
    cache.reserve(E);
    int64_t u = 0;
    PrefixCache::Entry* from = nullptr;
    if (prefix)
        for (auto& [k, e] : prefix->entries) {
            const int64_t ek = static_cast<int64_t>(k->prompt.size()) - 1;
            const int64_t shared = common_prefix(k->prompt, t.prompt, std::min(E, ek));
            if (shared <= u) continue;
            int64_t best = 0;
            for (auto x : ends)
                if (x <= shared && std::binary_search(e.ends.begin(), e.ends.end(), x)) best = x;
            if (best > u) u = best, from = &e;
        }
    if (from) {
        from->used = ++prefix->clock;
        cache.k.assign(from->cache.k.size(), at::Tensor());
        cache.v.assign(from->cache.v.size(), at::Tensor());
        for (size_t l = 0; l < from->cache.k.size(); ++l)
            if (from->cache.k[l].defined())
                cache.k[l] = from->cache.k[l].narrow(1, 0, u), cache.v[l] = from->cache.v[l].narrow(1, 0, u);
    }
    if (E > 0) {
        const auto ids = torch::tensor(std::vector<int64_t>(t.prompt.begin(), t.prompt.begin() + E), torch::kLong)
                             .view({1, E})
                             .to(m.options.device);
        int64_t q0 = u;
        for (auto e : ends)
            if (e > u) m.forward(ids.index({Slice(), Slice(q0, e)}), h, &cache, opts), q0 = e;
    }
    if (!prefix) return cache;
    prefix->reused += u;
    prefix->computed += E - u;
    prefix->put(&t, cache, ends);
    return cache;
}

// The rows' prefill into `cache` [D, P - 1]: each trial's own (prefill_trial), stacked.
static void prefill_rows(const Model& m, const std::vector<const Trial*>& trials, int64_t chunk, const Hooks* h,
                         const ForwardOptions& opts, PrefixCache* prefix, KVCache& cache) {
    std::vector<KVCache> each;
    for (const Trial* t : trials) each.push_back(prefill_trial(m, *t, chunk, h, opts, prefix));
    if (each.size() == 1) {
        cache = std::move(each.front());
        return;
    }
    const size_t L = each.front().k.size();
    cache.k.assign(L, at::Tensor()), cache.v.assign(L, at::Tensor());
    for (size_t l = 0; l < L; ++l) {
        if (!each.front().k[l].defined()) continue;
        std::vector<at::Tensor> ks, vs;
        for (const auto& c : each) ks.push_back(c.k[l]), vs.push_back(c.v[l]);
        cache.k[l] = torch::cat(ks, 0), cache.v[l] = torch::cat(vs, 0);
    }
}

// A decode batch's prefill into `cache` (rows x prompt[:-1]). Rows whose prefill is the same
// computation share it: with per-row head sets (`sets`) and an unablated prefill (scope decode) each
// distinct trial is prefilled once (prefill_rows, from the kept prefills where `prefix` has them) and
// its cache copied to its rows; sets acting in the prefill (`scope_all`) prefill every row with its
// own interventions (`prefill`). `reserve`: the keys the decode will reach.
static void prefill_decode_rows(const Model& m, const std::vector<const Trial*>& trials, const at::Tensor& ids, bool sets,
                                bool scope_all, int64_t chunk, Hooks& prefill, const ForwardOptions& no_logits,
                                PrefixCache* prefix, int64_t reserve, KVCache& cache) {
    const int64_t B = ids.size(0), P = ids.size(1);
    if (sets && scope_all) {
        for (int64_t p0 = 0; p0 < P - 1; p0 += chunk)
            m.forward(ids.index({Slice(), Slice(p0, std::min(P - 1, p0 + chunk))}), &prefill, &cache, no_logits);
    } else {
        std::vector<int64_t> row_of;  // row -> index of its trial among the distinct ones
        std::vector<int64_t> firsts;  // distinct trials' first rows
        std::map<const Trial*, int64_t> seen;
        for (int64_t b = 0; b < B; ++b) {
            const Trial* t = sets ? trials[static_cast<size_t>(b)] : nullptr;  // without sets every row is its own
            auto [it, fresh] = sets ? seen.emplace(t, static_cast<int64_t>(firsts.size())) : std::make_pair(seen.end(), true);
            if (fresh) firsts.push_back(b);
            row_of.push_back(sets ? it->second : b);
        }
        std::vector<const Trial*> distinct;
        for (auto b : firsts) distinct.push_back(trials[static_cast<size_t>(b)]);
        const int64_t D = static_cast<int64_t>(distinct.size());
        prefill_rows(m, distinct, chunk, sets ? nullptr : &prefill, no_logits, prefix, cache);
        cache.reserve(reserve);
        if (D < B) {
            auto expand = torch::tensor(row_of, torch::kLong).to(m.options.device);
            for (size_t l = 0; l < cache.k.size(); ++l)
                if (cache.k[l].defined())
                    cache.k[l] = cache.k[l].index_select(0, expand), cache.v[l] = cache.v[l].index_select(0, expand);
        }
    }
}

// Row b's scores of one decode step that generated y (score_step on every layer's captured
// pattern row and values; `keys` visible in all): credit, L+, L-, R2 each [L, H] double.
static StepScores score_row(const Model& m, const std::vector<at::Tensor>& rows, const std::vector<at::Tensor>& vals,
                            int64_t b, const Trial& tr, int64_t keys, int64_t y) {
    const auto& cfg = m.config;
    const int L = cfg.n_layers;
    auto c = torch::zeros({L, cfg.n_heads}, torch::kDouble), lp = c.clone(), lm = c.clone(), r2 = c.clone();
    auto u = m.weights.unembed[y];
    for (int l = 0; l < L; ++l) {
        StepSpans sp{tr.needle_start, tr.needle_end, tr.answer_start, tr.answer_end, 0};
        if (cfg.is_sliding(l)) sp.first_visible = std::max<int64_t>(0, keys - cfg.sliding_window);
        auto sc = score_step(rows[l][b], vals[l][b], m.weights.layers[l].wo, u, tr.prompt, sp, y);
        c[l] = sc.credit, lp[l] = sc.lplus, lm[l] = sc.lminus, r2[l] = sc.r2;
    }
    return {c, lp, lm, r2};
}

static std::vector<DecodeOut> decode_rows_impl(const Model& m, const std::vector<const Trial*>& trials,
                                               const DecodeSettings& s, const std::function<bool(int64_t)>& stop,
                                               const HeadSet* ablate, const std::vector<const HeadSet*>* per_row,
                                               PrefixCache* prefix) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    const int L = cfg.n_layers;
    const int64_t B = static_cast<int64_t>(trials.size());
    if (B == 0) return {};
    const int64_t P = static_cast<int64_t>(trials[0]->prompt.size());
    std::vector<int64_t> flat;
    for (const Trial* t : trials) {
        HS_REQUIRE(static_cast<int64_t>(t->prompt.size()) == P, "decode_batch: every trial of a batch needs the same prompt length");
        flat.insert(flat.end(), t->prompt.begin(), t->prompt.end());
    }
    auto dev = m.options.device;
    auto ids = torch::tensor(flat, torch::kLong).view({B, P}).to(dev);

    Hooks prefill, step;
    if (ablate) {
        if (ablate->keep || ablate->window_after_prompt) {  // per trial: each row its own
            for (int64_t b = 0; b < B; ++b) {
                if (s.scope == AblationScope::kAll) ablate->apply(prefill, b, trials[b]);
                ablate->apply(step, b, trials[b]);
            }
        } else {
            if (s.scope == AblationScope::kAll) ablate->apply(prefill);
            ablate->apply(step);
        }
    }
    ForwardOptions fold;  // rows with their own head sets still share each GEMM (decode steps are weight-bound)
    if (per_row) {
        HS_REQUIRE(static_cast<int64_t>(per_row->size()) == B, "decode_batch_sets: one head set (or none) per row");
        for (int64_t b = 0; b < B; ++b)
            if (const HeadSet* hs = (*per_row)[static_cast<size_t>(b)]) {
                if (s.scope == AblationScope::kAll) hs->apply(prefill, b, trials[b]);
                hs->apply(step, b, trials[b]);
            }
        fold.gemm = GemmMode::kFolded;
    }
    std::vector<at::Tensor> rows(L), vals(L);
    if (s.score) {
        step.capture(Point::kAttnPattern, [&rows](int l, const at::Tensor& a) { rows[l] = a.select(2, 0); });  // [B, H, S]
        step.capture(Point::kAttnV, [&vals](int l, const at::Tensor& v) { vals[l] = v; });                     // [B, S, K, d]
    }

    KVCache cache;
    cache.reserve(P - 1 + s.max_new_tokens);
    ForwardOptions no_logits = fold;
    no_logits.compute_logits = false;
    const int64_t chunk = std::max<int64_t>(1, s.prefill_chunk);
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    const auto t_prefill = Clock::now();
    prefill_decode_rows(m, trials, ids, per_row != nullptr, s.scope == AblationScope::kAll, chunk, prefill, no_logits, prefix,
                        P - 1 + s.max_new_tokens, cache);
    if (s.times) s.times->prefill += since(t_prefill);
    std::vector<DecodeOut> out(B);
    std::vector<std::vector<at::Tensor>> credit(B), lplus(B), lminus(B), r2(B);
    std::vector<char> done(B, 0);
    std::vector<int64_t> next(B);
    for (int64_t b = 0; b < B; ++b) next[b] = trials[b]->prompt[P - 1];
    int64_t active = B;
    for (int64_t t = 0; t < s.max_new_tokens && active > 0; ++t) {
        const auto t_step = Clock::now();
        auto in = torch::tensor(next, torch::kLong).view({B, 1}).to(dev);
        auto logits = m.forward(in, &step, &cache, fold);  // [B, 1, V]
        auto ys = logits.select(1, 0).argmax(-1).to(torch::kCPU);
        if (s.times) s.times->decode += since(t_step);
        const auto t_score = Clock::now();
        const int64_t keys = cache.length();
        for (int64_t b = 0; b < B; ++b) {
            if (done[b]) continue;  // a finished row keeps feeding its last token, unscored
            const int64_t y = ys[b].item<int64_t>();
            out[b].peak_keys = keys;
            const bool stops = stop(y);
            if (stops && !s.keep_stop) {
                done[b] = 1, --active;
                continue;
            }
            out[b].generated.push_back(y);
            next[b] = y;
            if (stops) done[b] = 1, --active;  // kept and scored below, then the row ends (Wu's order)
            if (!s.score) continue;
            auto sc = score_row(m, rows, vals, b, *trials[b], keys, y);
            credit[b].push_back(sc.credit), lplus[b].push_back(sc.lplus), lminus[b].push_back(sc.lminus);
            r2[b].push_back(sc.r2);
        }
        std::fill(rows.begin(), rows.end(), at::Tensor());
        std::fill(vals.begin(), vals.end(), at::Tensor());
        if (s.times) s.times->score += since(t_score);
    }
    auto stack = [&](const std::vector<at::Tensor>& v) {
        return v.empty() ? torch::zeros({0, L, cfg.n_heads}, torch::kDouble) : torch::stack(v);
    };
    for (int64_t b = 0; b < B; ++b) {
        out[b].credit = stack(credit[b]), out[b].lplus = stack(lplus[b]), out[b].lminus = stack(lminus[b]);
        out[b].r2 = stack(r2[b]);
    }
    return out;
}

std::vector<DecodeOut> decode_batch(const Model& m, const std::vector<const Trial*>& trials, const DecodeSettings& s,
                                    const std::function<bool(int64_t)>& stop, const HeadSet* ablate, PrefixCache* prefix) {
    return decode_rows_impl(m, trials, s, stop, ablate, nullptr, prefix);
}

std::vector<DecodeOut> decode_batch_sets(const Model& m, const std::vector<const Trial*>& trials,
                                         const std::vector<const HeadSet*>& sets, const DecodeSettings& s,
                                         const std::function<bool(int64_t)>& stop, PrefixCache* prefix) {
    HS_REQUIRE(!prefix || s.scope == AblationScope::kDecode, "decode_batch_sets: kept prefills need an unablated prefill");
    return decode_rows_impl(m, trials, s, stop, nullptr, &sets, prefix);
}

DecodeOut decode_trial(const Model& m, const Trial& trial, const DecodeSettings& s, const std::function<bool(int64_t)>& stop,
                       const HeadSet* ablate) {
    return std::move(decode_batch(m, {&trial}, s, stop, ablate).front());
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

// ---- the experiment ----

NeedleTest::NeedleTest(const Model& m, const Tokenizer& tok, TrialBuilder builder, NeedleConfig config)
    : m_(m), tok_(tok), builder_(std::move(builder)), c_(std::move(config)) {
    const auto& p = builder_.protocol();
    separate_ = p.ablation_assembly != p.assembly || c_.ablation_tmpl.text != c_.tmpl.text ||
                c_.ablation_max_new_tokens != c_.decode.max_new_tokens;
    auto check_fits = [&](const Trial& t, int64_t steps) {
        const int64_t positions = static_cast<int64_t>(t.prompt.size()) + steps - 1;
        if (c_.max_positions > 0 && positions > c_.max_positions)
            throw UsageError(fmt::format("length {}: the prompt ({} tokens) plus {} new tokens needs {} positions, beyond the "
                                         "model's context of {}",
                                         t.length, t.prompt.size(), steps, positions, c_.max_positions));
    };
    for (auto len : c_.lengths)
        if (c_.max_positions > 0 && len - p.buffer > c_.max_positions)
            throw UsageError(fmt::format("length {}: {} context tokens are beyond the model's context of {}", len,
                                         len - p.buffer, c_.max_positions));
    for (auto len : c_.lengths)
        for (auto dep : c_.depths)
            for (size_t ni = 0; ni < needles().size(); ++ni) {
                trials_.push_back(builder_.build(len, dep, static_cast<int>(ni), p.assembly, c_.tmpl));
                check_fits(trials_.back(), c_.decode.max_new_tokens);
                if (!separate_) continue;
                abl_trials_.push_back(builder_.build(len, dep, static_cast<int>(ni), p.ablation_assembly, c_.ablation_tmpl));
                check_fits(abl_trials_.back(), c_.ablation_max_new_tokens);
            }
    set_cuts(trials_);
    set_cuts(abl_trials_);
    groups_ = make_groups(trials_);
    if (separate_) abl_groups_ = make_groups(abl_trials_);
}

// With the prompts sorted, the common prefix of two is the least of the neighbours' common prefixes
// between them, so a prompt's distinct values are the chains of strictly smaller neighbour values
// to its left and to its right (nearest-smaller links: linear in the grid but for the chains).
std::vector<std::vector<int64_t>> prefill_cuts(const std::vector<const std::vector<int64_t>*>& prompts) {
    const int64_t N = static_cast<int64_t>(prompts.size());
    auto at = [](const auto& v, int64_t i) -> decltype(auto) { return v[static_cast<size_t>(i)]; };
    std::vector<int64_t> order(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const auto &pa = *at(prompts, a), &pb = *at(prompts, b);
        return std::lexicographical_compare(pa.begin(), pa.end(), pb.begin(), pb.end());
    });
    std::vector<int64_t> adj(static_cast<size_t>(N), -1);  // adj[k]: common prefix of sorted k-1 and k
    for (int64_t k = 1; k < N; ++k) {
        const auto &a = *at(prompts, at(order, k - 1)), &b = *at(prompts, at(order, k));
        adj[static_cast<size_t>(k)] = common_prefix(a, b, static_cast<int64_t>(std::min(a.size(), b.size())));
    }
    std::vector<int64_t> prev(static_cast<size_t>(N), 0), next(static_cast<size_t>(N), N);  // nearest strictly smaller
    std::vector<int64_t> st;
    for (int64_t k = 1; k < N; ++k) {
        while (!st.empty() && at(adj, st.back()) >= at(adj, k)) st.pop_back();
        prev[static_cast<size_t>(k)] = st.empty() ? 0 : st.back();
        st.push_back(k);
    }
    st.clear();
    for (int64_t k = N - 1; k >= 1; --k) {
        while (!st.empty() && at(adj, st.back()) >= at(adj, k)) st.pop_back();
        next[static_cast<size_t>(k)] = st.empty() ? N : st.back();
        st.push_back(k);
    }
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(N));
    for (int64_t k = 0; k < N; ++k) {
        std::vector<int64_t> cuts;
        for (int64_t i = k; i >= 1; i = at(prev, i)) cuts.push_back(at(adj, i));
        for (int64_t i = k + 1; i < N; i = at(next, i)) cuts.push_back(at(adj, i));
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        out[static_cast<size_t>(at(order, k))] = std::move(cuts);
    }
    return out;
}

void NeedleTest::set_cuts(std::vector<Trial>& trials) {
    std::vector<const std::vector<int64_t>*> prompts;
    for (const auto& t : trials) prompts.push_back(&t.prompt);
    auto cuts = prefill_cuts(prompts);
    for (size_t i = 0; i < trials.size(); ++i) trials[i].cuts = std::move(cuts[i]);
}

void NeedleTest::keep_scan_prefills(const std::function<bool(int64_t)>& keep) const {
    PrefixCache* pc = prefix_for(nullptr, false);
    if (!pc) return;
    for (size_t i = 0; i < trials_.size(); ++i)
        if (keep(static_cast<int64_t>(i))) pc->keep.insert(&trials_[i]);
}

// Batches of up to config.batch trials of equal prompt length (rows of one forward), taken in the
// order of the prompts (lexicographic by token): a trial then shares the longest possible prefix with
// the trial before it, and the prefills it takes shared positions from (PrefixCache) are recent.
std::vector<std::vector<int64_t>> NeedleTest::make_groups(const std::vector<Trial>& trials) const {
    std::vector<int64_t> order(trials.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const auto &pa = trials[static_cast<size_t>(a)].prompt, &pb = trials[static_cast<size_t>(b)].prompt;
        return std::lexicographical_compare(pa.begin(), pa.end(), pb.begin(), pb.end());
    });
    std::vector<std::vector<int64_t>> groups;
    std::map<size_t, std::vector<int64_t>> open;
    for (auto i : order) {
        auto& g = open[trials[static_cast<size_t>(i)].prompt.size()];
        g.push_back(i);
        if (static_cast<int64_t>(g.size()) == std::max<int64_t>(1, c_.batch)) groups.push_back(std::move(g)), g.clear();
    }
    std::vector<std::vector<int64_t>> rest;
    for (auto& [len, g] : open)
        if (!g.empty()) rest.push_back(std::move(g));
    std::sort(rest.begin(), rest.end(), [&](const auto& a, const auto& b) {
        const auto &pa = trials[static_cast<size_t>(a[0])].prompt, &pb = trials[static_cast<size_t>(b[0])].prompt;
        return std::lexicographical_compare(pa.begin(), pa.end(), pb.begin(), pb.end());
    });
    groups.insert(groups.end(), rest.begin(), rest.end());
    return groups;
}

DecodeSettings NeedleTest::ablation_settings() const {
    DecodeSettings s = c_.decode;
    s.score = false;
    s.times = &times_;
    s.max_new_tokens = c_.ablation_max_new_tokens;
    return s;
}

std::function<bool(int64_t)> NeedleTest::stopper() const {
    const TokenFacts* f = &builder_.facts();
    return [f](int64_t id) { return f->stop(id); };
}

PrefixCache* NeedleTest::prefix_for(const HeadSet* ablate, bool ablation_trials) const {
    if (!c_.decode.reuse_prefix) return nullptr;
    // What the prefill runs under: nothing (the baseline, or any pass with scope decode), or the set;
    // and which trials (the scan's, or the ablation passes' own).
    std::string key = ablation_trials && separate_ ? "ablation-trials " : "scan-trials ";
    if (ablate && c_.decode.scope == AblationScope::kAll && !ablate->empty()) {
        HS_REQUIRE(!ablate->keep && !ablate->window_after_prompt, "prefix_for: a KV policy's prefill is not keyed");
        key += fmt::format("{} {} {} {} {} {}", intervention_name(ablate->mode), ablate->window.sink, ablate->window.recent,
                           ablate->window.compensate, ablate->q_mean.defined() ? ablate->q_mean.data_ptr() : nullptr,
                           ablate->heads.size());
        for (auto [l, h] : ablate->heads) key += fmt::format(" {}.{}", l, h);
    } else {
        key += "none";
    }
    if (key != prefix_key_) {
        prefix_reused_ += prefix_.reused, prefix_computed_ += prefix_.computed;
        prefix_ = PrefixCache{};
        prefix_.max_bytes = c_.prefix_max_bytes;
        prefix_key_ = key;
    }
    return &prefix_;
}

std::pair<int64_t, int64_t> NeedleTest::prefix_stats() const {
    return {prefix_reused_ + prefix_.reused, prefix_computed_ + prefix_.computed};
}

TrialResult NeedleTest::judge(int64_t i, const std::vector<int64_t>& generated) const {
    TrialResult r;
    r.generated = generated;
    // The response as the protocol's reference decodes it: decode(ids, skip_special_tokens=True).strip()
    // through the tokenizers crate (which keeps a special token stored normalized), or headscope's
    // decode without specials.
    std::vector<int32_t> ids;
    for (auto id : generated)
        if (builder_.protocol().protocol == Protocol::kHeadscope || !tok_.crate_skips(static_cast<int32_t>(id)))
            ids.push_back(static_cast<int32_t>(id));
    r.response = trim(tok_.decode(ids, builder_.protocol().protocol == Protocol::kHeadscope));
    const std::string& answer = needles()[static_cast<size_t>(trials_[static_cast<size_t>(i)].needle)].answer;
    r.rouge1_recall = rouge1(answer, r.response).recall;
    r.rougeL_f = rougeL(answer, r.response).fmeasure;
    r.passed = r.rouge1_recall > c_.pass_threshold;
    return r;
}

std::vector<TrialResult> NeedleTest::run_baseline(const std::function<void()>& tick) const {
    std::vector<TrialResult> out(trials_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
        auto rs = run_baseline_batch(static_cast<int64_t>(g));
        for (size_t k = 0; k < rs.size(); ++k) {
            out[static_cast<size_t>(groups_[g][k])] = std::move(rs[k]);
            if (tick) tick();
        }
    }
    return out;
}

TrialResult NeedleTest::scored(int64_t i, const DecodeOut& d) const {
    const int L = m_.config.n_layers, H = m_.config.n_heads;
    const Trial& t = trials_[static_cast<size_t>(i)];
    TrialResult r = judge(i, d.generated);
    r.retrieval = d.credit.sum(0);
    const std::string& answer = needles()[static_cast<size_t>(t.needle)].answer;
    // R2 sums the first len(answer_tokens) steps (retrieval_head_detection_r2.py lines 245, 255).
    const int64_t r2_steps = std::min<int64_t>(d.r2.size(0), static_cast<int64_t>(tok_.encode(answer, false).size()));
    r.r2 = d.r2.narrow(0, 0, r2_steps).sum(0);
    const auto steps = answer_steps(tok_, d.generated, answer);
    r.answer_steps = static_cast<int64_t>(steps.size());
    const auto nan = torch::full({L, H}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble);
    if (steps.empty() || t.needle_start < 0) {  // no answer step, or the needle's span was not found
        r.locos = r.lplus = r.lminus = nan;
    } else {
        const auto idx = torch::tensor(steps, torch::kLong);
        r.lplus = d.lplus.index_select(0, idx).mean(0);
        r.lminus = d.lminus.index_select(0, idx).mean(0);
        r.locos = (d.lplus - d.lminus).index_select(0, idx).mean(0);
    }
    if (c_.keep_steps) {
        r.steps_credit = d.credit;
        r.steps_r2 = d.r2;
        const bool found = t.needle_start >= 0;
        r.steps_lplus = found ? d.lplus : torch::full_like(d.lplus, std::numeric_limits<double>::quiet_NaN());
        r.steps_lminus = found ? d.lminus : torch::full_like(d.lminus, std::numeric_limits<double>::quiet_NaN());
    }
    return r;
}

std::vector<TrialResult> NeedleTest::run_baseline_batch(int64_t batch) const {
    const auto& g = groups_.at(static_cast<size_t>(batch));
    std::vector<const Trial*> ptrs;
    for (auto i : g) ptrs.push_back(&trials_[static_cast<size_t>(i)]);
    DecodeSettings s = c_.decode;
    s.score = true;
    s.times = &times_;
    const auto outs = decode_batch(m_, ptrs, s, stopper(), nullptr, prefix_for(nullptr, false));
    std::vector<TrialResult> res;
    for (size_t k = 0; k < g.size(); ++k) res.push_back(scored(g[k], outs[k]));
    return res;
}

std::vector<TrialResult> NeedleTest::run_ablated_batch(const HeadSet& ablate, int64_t batch) const {
    const auto& g = ablation_batches().at(static_cast<size_t>(batch));
    const auto& trials = ablation_trials();
    std::vector<const Trial*> ptrs;
    for (auto i : g) ptrs.push_back(&trials[static_cast<size_t>(i)]);
    const HeadSet* set = ablate.empty() ? nullptr : &ablate;
    const auto outs = decode_batch(m_, ptrs, ablation_settings(), stopper(), set, prefix_for(set, true));
    std::vector<TrialResult> res;
    for (size_t k = 0; k < g.size(); ++k) res.push_back(judge(g[k], outs[k].generated));
    return res;
}

std::vector<TrialResult> NeedleTest::run_ablated(const HeadSet& ablate, const std::function<void()>& tick) const {
    std::vector<TrialResult> out(trials_.size());
    const auto& groups = ablation_batches();
    for (size_t g = 0; g < groups.size(); ++g) {
        auto rs = run_ablated_batch(ablate, static_cast<int64_t>(g));
        for (size_t k = 0; k < rs.size(); ++k) {
            out[static_cast<size_t>(groups[g][k])] = std::move(rs[k]);
            if (tick) tick();
        }
    }
    return out;
}

std::vector<std::vector<TrialResult>> NeedleTest::run_ablated_sets_batch(const std::vector<const HeadSet*>& sets,
                                                                         int64_t batch, int64_t max_rows,
                                                                         std::optional<AblationScope> scope) const {
    const int64_t S = static_cast<int64_t>(sets.size());
    const auto& g = ablation_batches().at(static_cast<size_t>(batch));
    const auto& trials = ablation_trials();
    DecodeSettings s = ablation_settings();
    if (scope) s.scope = *scope;
    const int64_t n = static_cast<int64_t>(g.size());
    const int64_t per = std::max<int64_t>(1, max_rows / n);  // sets per forward
    std::vector<std::vector<TrialResult>> out(static_cast<size_t>(S));
    for (int64_t s0 = 0; s0 < S; s0 += per) {
        const int64_t s1 = std::min(S, s0 + per);
        std::vector<const Trial*> ptrs;
        std::vector<const HeadSet*> hs;
        for (int64_t j = s0; j < s1; ++j)
            for (auto i : g) {
                ptrs.push_back(&trials[static_cast<size_t>(i)]);
                const HeadSet* set = sets[static_cast<size_t>(j)];
                hs.push_back(set && !set->empty() ? set : nullptr);
            }
        // Unablated prefills (scope decode) share the kept chunks of the trials before.
        PrefixCache* prefix = s.scope == AblationScope::kDecode ? prefix_for(nullptr, true) : nullptr;
        const auto outs = decode_batch_sets(m_, ptrs, hs, s, stopper(), prefix);
        for (int64_t j = s0; j < s1; ++j)
            for (int64_t k = 0; k < n; ++k)
                out[static_cast<size_t>(j)].push_back(
                    judge(g[static_cast<size_t>(k)], outs[static_cast<size_t>((j - s0) * n + k)].generated));
    }
    if (s.scope == AblationScope::kDecode)
        if (PrefixCache* prefix = prefix_for(nullptr, true))
            for (auto i : g) prefix->release(&trials[static_cast<size_t>(i)]);  // its last use (keep_scan_prefills)
    return out;
}

std::vector<std::vector<TrialResult>> NeedleTest::run_ablated_sets(const std::vector<HeadSet>& sets, int64_t max_rows,
                                                                   const std::function<void()>& tick,
                                                                   std::optional<AblationScope> scope) const {
    const int64_t S = static_cast<int64_t>(sets.size());
    std::vector<std::vector<TrialResult>> out(static_cast<size_t>(S), std::vector<TrialResult>(trials_.size()));
    std::vector<const HeadSet*> ptrs;
    for (const auto& hs : sets) ptrs.push_back(&hs);
    const auto& groups = ablation_batches();
    for (size_t g = 0; g < groups.size(); ++g) {
        auto rs = run_ablated_sets_batch(ptrs, static_cast<int64_t>(g), max_rows, scope);
        for (int64_t j = 0; j < S; ++j)
            for (size_t k = 0; k < groups[g].size(); ++k) {
                out[static_cast<size_t>(j)][static_cast<size_t>(groups[g][k])] = std::move(rs[static_cast<size_t>(j)][k]);
                if (tick) tick();
            }
    }
    return out;
}

std::vector<NeedleTest::Decoded> NeedleTest::run_decoding(DecodingSpec spec, const std::function<void()>& tick) const {
    spec.max_new_tokens = c_.ablation_max_new_tokens;
    const auto stop = stopper();
    const auto& trials = ablation_trials();
    std::vector<Decoded> out;
    out.reserve(trials.size());
    for (size_t i = 0; i < trials.size(); ++i) {
        const Trial& t = trials[i];
        const DecodingOut d = decode_rows(m_, t.prompt, spec, stop, c_.decode.prefill_chunk);
        Decoded r;
        r.result = judge(static_cast<int64_t>(i), d.tokens);
        // The answer's first token as the needle holds it (no span found: the margin is NaN).
        const int64_t a = t.answer_start;
        const bool found = a >= 0 && a < static_cast<int64_t>(t.prompt.size());
        r.answer_margin = found ? token_margin(d.first_scores, t.prompt[static_cast<size_t>(a)]) : std::numeric_limits<double>::quiet_NaN();
        r.base_margin = found ? token_margin(d.first_base, t.prompt[static_cast<size_t>(a)]) : std::numeric_limits<double>::quiet_NaN();
        out.push_back(std::move(r));
        if (tick) tick();
    }
    return out;
}

at::Tensor NeedleTest::calibrate(int64_t n, uint64_t seed, int64_t max_tokens, std::vector<int64_t>* chosen,
                                 const std::function<void()>& tick) const {
    const int64_t N = static_cast<int64_t>(trials_.size());
    n = std::min(n, N);
    std::vector<int64_t> order(N);
    for (int64_t i = 0; i < N; ++i) order[i] = i;
    if (builder_.protocol().rng == RngKind::kReference) {
        // nolima_ablation.py lines 322-325: rng = random.Random(seed); rng.shuffle(trials); [:n]
        PythonRandom rng(seed);
        order = rng.shuffle_order(N);
    } else {
        std::mt19937_64 rng(seed);
        for (int64_t i = 0; i < n; ++i) {  // partial Fisher-Yates
            std::uniform_int_distribution<int64_t> pick(i, N - 1);
            std::swap(order[i], order[pick(rng)]);
        }
    }
    order.resize(n);
    std::vector<std::vector<int64_t>> prompts;
    const Assembly a = builder_.protocol().ablation_assembly;
    for (auto i : order) {
        const Trial& t = trials_[static_cast<size_t>(i)];
        const bool same = a == builder_.protocol().assembly && t.length <= max_tokens;
        auto p = same ? t.prompt : builder_.build(std::min(t.length, max_tokens), t.depth, t.needle, a, c_.tmpl).prompt;
        if (static_cast<int64_t>(p.size()) > max_tokens) p.resize(max_tokens);
        prompts.push_back(std::move(p));
    }
    if (chosen) *chosen = order;
    return calibrate_query_mean(m_, prompts, c_.decode.prefill_chunk, tick);
}

// ---- bootstrap ----

std::vector<std::vector<int64_t>> bootstrap_indices(int64_t n, int64_t resamples, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int64_t>> out(resamples, std::vector<int64_t>(n));
    for (auto& draw : out)
        for (auto& i : draw) {
            const double u = std::generate_canonical<double, 53>(rng);
            i = std::min<int64_t>(n - 1, static_cast<int64_t>(u * static_cast<double>(n)));
        }
    return out;
}

double percentile_linear(std::vector<double> v, double q) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::sort(v.begin(), v.end());
    const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
    return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

std::pair<at::Tensor, at::Tensor> bootstrap_ci(const at::Tensor& samples, int64_t resamples, uint64_t seed) {
    const int64_t N = samples.size(0);
    int64_t C = 1;
    for (int64_t i = 1; i < samples.dim(); ++i) C *= samples.size(i);
    auto flat = samples.to(torch::kDouble).reshape({N, C}).contiguous();
    auto low = torch::full({C}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble), high = low.clone();
    if (N > 0 && resamples > 0) {
        const auto idx = bootstrap_indices(N, resamples, seed);
        auto means = torch::empty({resamples, C}, torch::kDouble);
        for (int64_t r = 0; r < resamples; ++r)
            means[r] = flat.index_select(0, torch::tensor(idx[r], torch::kLong)).mean(0);
        auto acc = means.accessor<double, 2>();
        for (int64_t c = 0; c < C; ++c) {
            std::vector<double> col(resamples);
            for (int64_t r = 0; r < resamples; ++r) col[r] = acc[r][c];
            low[c] = percentile_linear(col, 2.5);
            high[c] = percentile_linear(col, 97.5);
        }
    }
    auto shape = samples.sizes().slice(1).vec();
    return {low.view(shape), high.view(shape)};
}

std::pair<at::Tensor, at::Tensor> bootstrap_ci_numpy(const at::Tensor& samples, int64_t resamples, uint32_t seed) {
    const int64_t N = samples.size(0);
    int64_t C = 1;
    for (int64_t i = 1; i < samples.dim(); ++i) C *= samples.size(i);
    auto flat = samples.to(torch::kFloat).reshape({N, C}).contiguous();
    const float* x = flat.data_ptr<float>();
    auto low = torch::full({C}, std::numeric_limits<float>::quiet_NaN(), torch::kFloat), high = low.clone();
    if (N > 0 && resamples > 0) {
        NumpyRandomState rng(seed);
        std::vector<float> means(static_cast<size_t>(resamples * C));
        std::vector<float> acc(static_cast<size_t>(C));
        for (int64_t r = 0; r < resamples; ++r) {
            const auto idx = rng.randint(0, N, N);  // rng.randint(0, len(S_arr), size=len(S_arr))
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (auto i : idx)  // S_arr[idx].mean(axis=0): float32 sums in draw order, then / N
                for (int64_t c = 0; c < C; ++c) acc[static_cast<size_t>(c)] += x[i * C + c];
            for (int64_t c = 0; c < C; ++c) means[static_cast<size_t>(r * C + c)] = acc[static_cast<size_t>(c)] / static_cast<float>(N);
        }
        // np.percentile(boot_means, q, axis=0), method "linear": virtual index (n - 1) * (q / 100),
        // numpy's _lerp in float64 between the float32 neighbours (from the upper one when the
        // fraction is >= 0.5), then .astype(np.float32).
        auto pct = [&](std::vector<float>& col, double q) {
            const double index = static_cast<double>(resamples - 1) * (q / 100.0);
            const int64_t lo = static_cast<int64_t>(std::floor(index)), hi = std::min<int64_t>(lo + 1, resamples - 1);
            const double t = index - static_cast<double>(lo);
            const float a = col[static_cast<size_t>(lo)], b = col[static_cast<size_t>(hi)];
            const float diff = b - a;
            const double v = t >= 0.5 ? static_cast<double>(b) - static_cast<double>(diff) * (1.0 - t)
                                      : static_cast<double>(a) + static_cast<double>(diff) * t;
            return static_cast<float>(v);
        };
        auto lo_a = low.accessor<float, 1>(), hi_a = high.accessor<float, 1>();
        std::vector<float> col(static_cast<size_t>(resamples));
        for (int64_t c = 0; c < C; ++c) {
            for (int64_t r = 0; r < resamples; ++r) col[static_cast<size_t>(r)] = means[static_cast<size_t>(r * C + c)];
            std::sort(col.begin(), col.end());
            lo_a[c] = pct(col, 2.5);
            hi_a[c] = pct(col, 97.5);
        }
    }
    auto shape = samples.sizes().slice(1).vec();
    return {low.view(shape), high.view(shape)};
}

}  // namespace hs
