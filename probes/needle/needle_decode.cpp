// The needle test's decode (see needle_decode.h): head sets, the prefix cache, the mean-query
// calibration and the decode loop.
#include "needle_decode.h"

#include "errors.h"
#include "needle_scoring.h"
#include "packed_kv.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>

namespace hs {

using torch::indexing::Slice;

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

// How many leading ids a and b share, up to limit.
static int64_t common_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b, int64_t limit) {
    int64_t n = 0;
    const int64_t end = std::min({limit, static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size())});
    while (n < end && a[static_cast<size_t>(n)] == b[static_cast<size_t>(n)]) ++n;
    return n;
}

// The bytes a cache's buffers take (its views may show less), its shared prompt caches' once each.
static int64_t cache_bytes(const KVCache& c) {
    int64_t n = 0;
    for (size_t l = 0; l < c.k.size(); ++l)
        if (c.k[l].defined())
            n += static_cast<int64_t>(c.k[l].storage().nbytes() + c.v[l].storage().nbytes());
    if (c.shared)
        for (const auto& s : *c.shared) n += cache_bytes(s);
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
    cache.content_id = KVCache::new_content_id();
    if (from) {
        from->used = ++prefix->clock;
        // Its first u positions are the kept prefill's (copied bit for bit by the first append), so the
        // decode reads them once for both where both trials decode together (blocks' shared prefixes).
        for (const auto& [id, n] : from->cache.origins) cache.origins.emplace_back(id, std::min(n, u));
        if (from->cache.content_id != 0) cache.origins.emplace_back(from->cache.content_id, u);
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
// `ids` [B, P]: the rows' prompts, read where each row prefills alone (sets with `scope_all`); undefined
// for ragged rows (prompts of different lengths), which read their trials' prefills in place (`share`).
static void prefill_decode_rows(const Model& m, const std::vector<const Trial*>& trials, const at::Tensor& ids, bool sets,
                                bool scope_all, bool share, int64_t chunk, Hooks& prefill, const ForwardOptions& no_logits,
                                PrefixCache* prefix, int64_t reserve, KVCache& cache) {
    const int64_t B = static_cast<int64_t>(trials.size());
    if (sets && scope_all) {
        const int64_t P = ids.size(1);
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
        if (share) {
            // The rows read their trial's prefill where it is (the kept prefill itself: no copy).
            auto each = std::make_shared<std::vector<KVCache>>();
            for (const Trial* t : distinct) each->push_back(prefill_trial(m, *t, chunk, sets ? nullptr : &prefill, no_logits, prefix));
            cache = KVCache();
            cache.shared = std::move(each);
            cache.shared_rows = row_of;
            cache.reserve(reserve);
            return;
        }
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

// The rows' head sets as pack_kv_cache reads them (DecodeSettings::pack_kv): each row's kept positions
// or streaming heads, compressed at the prompt's end (the cache's length F). A set that does anything
// else cannot be packed (HS_REQUIRE).
static std::vector<PackRow> pack_rows(const ModelConfig& cfg, const std::vector<const Trial*>& trials,
                                      const std::function<const HeadSet*(int64_t)>& set_of, int64_t F) {
    std::vector<PackRow> rows(trials.size());
    for (size_t b = 0; b < trials.size(); ++b) {
        const HeadSet* hs = set_of(static_cast<int64_t>(b));
        if (!hs || hs->empty()) continue;
        PackRow& r = rows[b];
        const int64_t from = hs->kv_from ? hs->kv_from(*trials[b]) : static_cast<int64_t>(trials[b]->prompt.size());
        HS_REQUIRE(from == F, "decode: a packed cache is compressed at the prompt's end (kv_from the prompt's length)");
        if (!hs->heads.empty()) {
            HS_REQUIRE(hs->mode == Intervention::kStream && hs->window_after_prompt && hs->window.block == 1 && !hs->window.compensate,
                       "decode: a packed cache realises kept positions and DuoAttention's windows only");
            r.window = torch::zeros({cfg.n_layers, cfg.n_heads}, torch::kBool);
            for (const auto& h : hs->heads) r.window[h.first][h.second] = true;
            r.sink = hs->window.sink, r.recent = hs->window.recent;
        }
        if (hs->keep) {
            r.keep = hs->keep(*trials[b]);
            // A prompt the policy leaves whole (SnapKV's P < C) keeps the model's KV heads.
            if (r.keep.all().item<bool>()) r.keep = at::Tensor();
            r.per_query_head = hs->keep_query_heads && r.keep.defined();
            r.compensate = hs->keep_compensate;
        }
    }
    return rows;
}

// The bytes of the cache's allocated buffers.
static int64_t held_bytes(const KVCache& c) { return c.packed ? c.packed->bytes() : cache_bytes(c); }

bool reads_prompts_in_place(const DecodeSettings& s) {
    return s.share_prompt && !(s.score && needle_scores_read_values(s.scores));
}

// Whether the rows read their trials' prompt caches where they are (DecodeSettings::share_prompt): no
// step score reads the values (the attn.v capture wants every row's keys and values gathered) and no
// set hides keys by position (kept positions, windows, a packed cache).
static bool shares_prompt(const DecodeSettings& s, const HeadSet* ablate, const std::vector<const HeadSet*>* per_row) {
    if (!reads_prompts_in_place(s)) return false;
    auto hides = [](const HeadSet* hs) {
        return hs && (hs->keep || hs->pack_cache || hs->window_after_prompt || hs->mode == Intervention::kStream);
    };
    if (hides(ablate)) return false;
    if (per_row)
        for (const HeadSet* hs : *per_row)
            if (hides(hs)) return false;
    return true;
}

// One decode step's scores of the rows it scores (score_rows: all rows at once), appended to the
// rows' steps ([row][score][part] a tensor [L, H] per step).
static void append_scores(const Model& m, const std::vector<at::Tensor>& rows, const std::vector<at::Tensor>& vals,
                          const std::vector<int64_t>& scored, const std::vector<const Trial*>& trials, const std::vector<int64_t>& keys,
                          const std::vector<int64_t>& ys, NeedleScoreSet which,
                          std::vector<PerNeedleScore<std::vector<at::Tensor>>>& steps) {
    if (scored.empty()) return;
    const auto sc = score_rows(m, rows, vals, scored, trials, keys, ys, which);
    for (size_t r = 0; r < scored.size(); ++r)
        for (size_t k = 0; k < sc[r].size(); ++k)
            for (size_t p = 0; p < sc[r][k].size(); ++p)
                if (sc[r][k][p].defined()) steps[static_cast<size_t>(scored[r])][k][p].push_back(sc[r][k][p]);
}

// decode_batch and decode_batch_sets: `ablate` acts on every row, or `per_row[b]` on row b alone.
static std::vector<DecodeOut> decode_rows_impl(const Model& m, const std::vector<const Trial*>& trials,
                                               const DecodeSettings& s, const std::function<bool(int64_t)>& stop,
                                               const HeadSet* ablate, const std::vector<const HeadSet*>* per_row,
                                               PrefixCache* prefix) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    const int L = cfg.n_layers;
    const int64_t B = static_cast<int64_t>(trials.size());
    if (B == 0) return {};
    // Prompts of different lengths decode as one ragged batch where the rows read their trials' prompt
    // caches in place (KVCache::ragged: each row its own positions; docs/forward.md "Ragged rows"),
    // else as one batch a length.
    std::map<int64_t, std::vector<int64_t>> by_length;  // prompt length -> its rows
    int64_t P = 0;  // the longest prompt
    for (int64_t b = 0; b < B; ++b) {
        const auto n = static_cast<int64_t>(trials[static_cast<size_t>(b)]->prompt.size());
        HS_REQUIRE(n > 0, "decode_batch: an empty prompt");
        by_length[n].push_back(b), P = std::max(P, n);
    }
    const bool ragged = by_length.size() > 1;
    if (ragged && (!shares_prompt(s, ablate, per_row) || (per_row && s.scope == AblationScope::kAll))) {
        std::vector<DecodeOut> out(static_cast<size_t>(B));
        for (const auto& [n, rows] : by_length) {
            std::vector<const Trial*> ts;
            std::vector<const HeadSet*> sets;
            for (auto b : rows) {
                ts.push_back(trials[static_cast<size_t>(b)]);
                if (per_row) sets.push_back((*per_row)[static_cast<size_t>(b)]);
            }
            auto part = decode_rows_impl(m, ts, s, stop, ablate, per_row ? &sets : nullptr, prefix);
            for (size_t i = 0; i < rows.size(); ++i) out[static_cast<size_t>(rows[i])] = std::move(part[i]);
        }
        return out;
    }
    auto dev = m.options.device;
    at::Tensor ids;  // [B, P] (one length)
    if (!ragged) {
        std::vector<int64_t> flat;
        for (const Trial* t : trials) flat.insert(flat.end(), t->prompt.begin(), t->prompt.end());
        ids = torch::tensor(flat, torch::kLong).view({B, P}).to(dev);
    }

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
        if (needle_scores_read_values(s.scores))  // LOCOS's value products
            step.capture(Point::kAttnV, [&vals](int l, const at::Tensor& v) { vals[l] = v; });  // [B, S, K, d]
    }

    KVCache cache;
    cache.reserve(P - 1 + s.max_new_tokens);
    ForwardOptions no_logits = fold;
    no_logits.compute_logits = false;
    const int64_t chunk = std::max<int64_t>(1, s.prefill_chunk);
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    const auto t_prefill = Clock::now();
    prefill_decode_rows(m, trials, ids, per_row != nullptr, s.scope == AblationScope::kAll, shares_prompt(s, ablate, per_row), chunk,
                        prefill, no_logits, prefix, P - 1 + s.max_new_tokens, cache);
    if (s.times) s.times->prefill += since(t_prefill);
    std::vector<DecodeOut> out(B);
    std::vector<PerNeedleScore<std::vector<at::Tensor>>> steps(B, per_needle_score_steps<std::vector<at::Tensor>>());
    std::vector<char> done(B, 0);
    std::vector<int64_t> next(B);
    for (int64_t b = 0; b < B; ++b) next[b] = trials[b]->prompt.back();
    int64_t active = B;
    auto set_of = [&](int64_t b) { return per_row ? (*per_row)[static_cast<size_t>(b)] : ablate; };
    bool pack = false;
    for (int64_t b = 0; b < B; ++b) pack |= set_of(b) && set_of(b)->pack_cache;
    HS_REQUIRE(!pack || (s.scope == AblationScope::kDecode && !s.score),
               "decode: a packed cache needs an unablated prefill and no per-step scores");
    const Hooks none;  // the packed cache's steps: its sets' kept positions and windows are in the cache
    for (int64_t t = 0; t < s.max_new_tokens && active > 0; ++t) {
        if (pack && t == 1) {  // the first token came from the whole cache: compress it
            const auto t_pack = Clock::now();
            cache.unshare();  // (a packed batch shares nothing: pack_rows sets hide keys)
            auto packed = pack_kv_cache(cfg, cache, pack_rows(cfg, trials, set_of, cache.length()), s.max_new_tokens - 1);
            cache.clear();
            cache.packed = std::move(packed);
            if (s.cache_log) s.cache_log->pack_seconds += since(t_pack);
        }
        const auto t_step = Clock::now();
        auto in = torch::tensor(next, torch::kLong).view({B, 1}).to(dev);
        auto logits = m.forward(in, cache.packed ? &none : &step, &cache, fold);  // [B, 1, V]
        auto ys = logits.select(1, 0).argmax(-1).to(torch::kCPU);
        if (s.times) s.times->step(since(t_step), B);
        if (s.cache_log) {
            s.cache_log->step_seconds.push_back(since(t_step));
            s.cache_log->cache_bytes.push_back(held_bytes(cache));
            s.cache_log->packed.push_back(cache.packed ? 1 : 0);
            if (s.cache_log->keep_logits) s.cache_log->logits.push_back(logits.select(1, 0).to(torch::kCPU).clone());
        }
        const auto t_score = Clock::now();
        std::vector<int64_t> scored, scored_y, scored_keys;  // the rows this step scores, all at once below
        std::vector<const Trial*> scored_trials;
        for (int64_t b = 0; b < B; ++b) {
            if (done[b]) continue;  // a finished row keeps feeding its last token, unscored
            const int64_t y = ys[b].item<int64_t>(), keys = cache.row_length(b);
            out[b].peak_keys = keys;
            const bool stops = stop(y);
            if (stops && !s.keep_stop) {
                done[b] = 1, --active;
                continue;
            }
            out[b].generated.push_back(y);
            next[b] = y;
            if (stops) done[b] = 1, --active;  // kept and scored below, then the row ends (Wu's order)
            if (s.score) scored.push_back(b), scored_y.push_back(y), scored_keys.push_back(keys), scored_trials.push_back(trials[b]);
        }
        append_scores(m, rows, vals, scored, scored_trials, scored_keys, scored_y, s.scores, steps);
        std::fill(rows.begin(), rows.end(), at::Tensor());
        std::fill(vals.begin(), vals.end(), at::Tensor());
        if (s.times) s.times->score += since(t_score);
    }
    auto stack = [&](const std::vector<at::Tensor>& v) {
        return v.empty() ? torch::zeros({0, L, cfg.n_heads}, torch::kDouble) : torch::stack(v);
    };
    for (int64_t b = 0; b < B; ++b) {
        out[b].steps = per_needle_score_steps<at::Tensor>();
        for (size_t k = 0; k < steps[b].size(); ++k)
            for (size_t p = 0; p < steps[b][k].size(); ++p) out[b].steps[k][p] = stack(steps[b][k][p]);
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

}  // namespace hs
