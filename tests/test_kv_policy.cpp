// KV-cache policies (probes/needle/kv/kv_policy.h, issue 35): the kept-positions forward (Hooks::keep) and the
// windows that act from a position (StreamWindow::from) against the whole reference
// (blocks::attention_reference) and against an independent recomputation over the kept keys alone,
// in double; SnapKV's pooled scores against a recomputation from the captured q and k; HeadKV's
// capacities and SnapKV's and RazorAttention's kept positions on hand-made cases; the policies'
// registry (kv_registry.cpp) by the names --kv-compare lists.
#include <doctest/doctest.h>

#include "blocks.h"
#include "errors.h"
#include "kv_policy.h"
#include "model.h"

#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>

using namespace hs;

namespace {

// Blocked vs whole reference: as tests/test_stream.cpp (1e-6 of the largest magnitude); against the
// recomputation over the kept keys in double: 1e-5.
constexpr double kBlockTol = 1e-6;
constexpr double kIndependentTol = 1e-5;

// No soft-capping and no sliding windows (the recomputation below has neither); GQA: olmo2, qwen3.
const std::vector<std::string> kFixtures = {"gpt2", "olmo2", "qwen3", "llama3_rope"};

std::string fixture(const std::string& name) { return std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + name; }

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

// z of one query head over the keys `seen` (plus the mean of `mean_of` as one more key and value when
// it is not empty): softmax(q k^T scale) v in double. q [d], k, v [S, d].
at::Tensor head_z(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<int64_t>& seen,
                  const std::vector<int64_t>& mean_of, double scale) {
    auto idx = torch::tensor(seen, torch::kLong);
    auto ks = k.index_select(0, idx).to(torch::kDouble), vs = v.index_select(0, idx).to(torch::kDouble);
    if (!mean_of.empty()) {
        auto mi = torch::tensor(mean_of, torch::kLong);
        ks = torch::cat({ks, k.index_select(0, mi).to(torch::kDouble).mean(0, true)});
        vs = torch::cat({vs, v.index_select(0, mi).to(torch::kDouble).mean(0, true)});
    }
    auto w = torch::softmax(torch::mv(ks, q.to(torch::kDouble)) * scale, 0);
    return torch::mv(vs.t(), w);
}

}  // namespace

TEST_CASE("kv policy: a compressed prompt cache equals attention over the kept keys alone (GQA, compensation, rows)") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        const auto& cfg = m->config;
        const int L = cfg.n_layers, H = cfg.n_heads;
        const int64_t g = H / cfg.n_kv_heads, d = cfg.d_head, F = 14, T = 20;
        const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
        torch::manual_seed(5);
        auto tokens = torch::randint(cfg.vocab_size, {2, T}, torch::kLong);
        // Row 0: random kept positions, no compensation; row 1: random kept positions + the mean token.
        std::vector<at::Tensor> keep0(L), keep1(L);
        Hooks h;
        for (int l = 0; l < L; ++l) {
            keep0[l] = torch::rand({H, F}) < 0.4, keep1[l] = torch::rand({H, F}) < 0.5;
            h.keep({l, 0, F, keep0[l], false});
            h.keep({l, 1, F, keep1[l], true});
        }
        torch::NoGradGuard ng;
        KVCache cache;
        ForwardOptions fo;
        fo.attn_block = 4;
        // The prefill (queries before `from`) is untouched: each row bit-identical to its plain unbatched run
        // (rows with their own interventions run per-row GEMMs, docs/forward.md).
        const auto pre = m->forward(tokens.narrow(1, 0, F), &h, &cache, fo);
        for (int64_t r = 0; r < 2; ++r) CHECK(torch::equal(pre[r], m->forward(tokens.narrow(0, r, 1).narrow(1, 0, F), nullptr, nullptr, fo)[0]));
        std::vector<at::Tensor> q(L), k(L), v(L), z(L);
        h.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { q[l] = x.clone(); });
        h.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { k[l] = x.clone(); });
        h.capture(Point::kAttnV, [&](int l, const at::Tensor& x) { v[l] = x.clone(); });
        h.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = x.clone(); });
        m->forward(tokens.narrow(1, F, T - F), &h, &cache, fo);  // 6 queries past the compressed prompt
        for (int l = 0; l < L; ++l) {
            CAPTURE(l);
            const auto lk = h.keeps(l, 2, H, torch::kCPU);
            CHECK(rel_diff(z[l], blocks::attention_reference(cfg, l, q[l], k[l], v[l], nullptr, &lk)) < kBlockTol);
            double worst = 0;
            for (int64_t b = 0; b < 2; ++b)
                for (int64_t hh = 0; hh < H; ++hh)
                    for (int64_t t = 0; t < T - F; ++t) {
                        const auto& kp = b == 0 ? keep0[l] : keep1[l];
                        std::vector<int64_t> seen, dropped;
                        for (int64_t s = 0; s < F; ++s) (kp[hh][s].item<bool>() ? seen : dropped).push_back(s);
                        for (int64_t s = F; s <= F + t; ++s) seen.push_back(s);
                        const auto ref = head_z(q[l][b][t][hh], k[l][b].select(1, hh / g), v[l][b].select(1, hh / g), seen,
                                                b == 1 ? dropped : std::vector<int64_t>{}, scale);
                        worst = std::max(worst, (z[l][b][t][hh].to(torch::kDouble) - ref).abs().max().item<double>());
                    }
            CHECK(worst < kIndependentTol);
        }
    }
}

TEST_CASE("kv policy: a window from a position leaves the prefill whole and slides past it (DuoAttention's deployment)") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        const auto& cfg = m->config;
        const int L = cfg.n_layers, H = cfg.n_heads;
        const int64_t g = H / cfg.n_kv_heads, d = cfg.d_head, F = 12, T = 20, sink = 2, recent = 3;
        const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
        torch::manual_seed(9);
        auto tokens = torch::randint(cfg.vocab_size, {1, T}, torch::kLong);
        Hooks h;
        for (int l = 0; l < L; ++l)
            for (int hh = 0; hh < H; hh += 2) h.window({l, hh, -1, StreamWindow{sink, recent, false, F}, {}});
        torch::NoGradGuard ng;
        KVCache cache, plain;
        CHECK(torch::equal(m->forward(tokens.narrow(1, 0, F), &h, &cache), m->forward(tokens.narrow(1, 0, F), nullptr, &plain)));
        std::vector<at::Tensor> q(L), k(L), v(L), z(L);
        h.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { q[l] = x.clone(); });
        h.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { k[l] = x.clone(); });
        h.capture(Point::kAttnV, [&](int l, const at::Tensor& x) { v[l] = x.clone(); });
        h.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = x.clone(); });
        for (int64_t p = F; p < T; ++p) {  // decode one token at a time
            m->forward(tokens.narrow(1, p, 1), &h, &cache);
            for (int l = 0; l < L; ++l) {
                const auto w = h.windows(l, 1, H, torch::kCPU);
                CHECK(rel_diff(z[l], blocks::attention_reference(cfg, l, q[l], k[l], v[l], &w)) < kBlockTol);
                for (int64_t hh = 0; hh < H; ++hh) {
                    std::vector<int64_t> seen;
                    for (int64_t s = 0; s <= p; ++s)
                        if (hh % 2 == 1 || s < sink || s > p - recent) seen.push_back(s);
                    const auto ref = head_z(q[l][0][0][hh], k[l][0].select(1, hh / g), v[l][0].select(1, hh / g), seen, {}, scale);
                    CHECK((z[l][0][0][hh].to(torch::kDouble) - ref).abs().max().item<double>() < kIndependentTol);
                }
            }
        }
    }
}

TEST_CASE("kv policy: SnapKV's pooled scores equal a recomputation from the captured queries and keys") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        const auto& cfg = m->config;
        const int L = cfg.n_layers, H = cfg.n_heads;
        const int64_t g = H / cfg.n_kv_heads, d = cfg.d_head, P = 23;
        const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
        torch::manual_seed(3);
        auto tokens = torch::randint(cfg.vocab_size, {1, P}, torch::kLong);
        std::vector<int64_t> prompt(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + P);
        for (const SnapKVSettings s : {SnapKVSettings{8, 7}, SnapKVSettings{4, 3}, SnapKVSettings{5, 1}}) {
            CAPTURE(s.window);
            const auto got = snapkv_scores(*m, prompt, s, 6);  // [L, H, P - w], the prefill in chunks of 6
            const int64_t w = s.window, n = P - w;
            REQUIRE(got.sizes() == at::IntArrayRef({L, H, n}));
            std::vector<at::Tensor> q(L), k(L);
            Hooks h;
            h.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { q[l] = x.clone(); });
            h.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { k[l] = x.clone(); });
            torch::NoGradGuard ng;
            m->forward(tokens, &h);
            double worst = 0;
            for (int l = 0; l < L; ++l)
                for (int64_t hh = 0; hh < H; ++hh) {
                    auto kk = k[l][0].select(1, hh / g).to(torch::kDouble);                          // [P, d]
                    auto qq = q[l][0].select(1, hh).narrow(0, n, w).to(torch::kDouble);              // [w, d]
                    auto logits = torch::mm(qq, kk.t()) * scale;                                     // [w, P]
                    auto causal = torch::arange(P).view({1, P}) > torch::arange(n, P).view({w, 1});  // key after query
                    auto mean = torch::softmax(logits.masked_fill(causal, -INFINITY), 1).narrow(1, 0, n).mean(0);
                    for (int64_t i = 0; i < n; ++i) {  // max over the kernel's neighbourhood
                        double best = -INFINITY;
                        for (int64_t j = std::max<int64_t>(0, i - s.kernel / 2); j <= std::min(n - 1, i + s.kernel / 2); ++j)
                            best = std::max(best, mean[j].item<double>());
                        worst = std::max(worst, std::abs(got[l][hh][i].item<double>() - best));
                    }
                }
            CHECK(worst < kIndependentTol);
        }
    }
}

TEST_CASE("kv policy: SnapKV's kept positions, HeadKV's capacities and RazorAttention's compressed heads on hand-made cases") {
    // Best scores first, the earlier of tied positions first, the window always.
    auto k1 = snapkv_keep(torch::tensor({0.1, 0.5, 0.5, 0.2}, torch::kFloat).view({1, 4}), {2}, 6, 2);
    CHECK(torch::equal(k1, torch::tensor({false, true, true, false, true, true}).view({1, 6})));
    auto k2 = snapkv_keep(torch::tensor({0.3, 0.3, 0.3, 0.1, 0.2, 0.2}, torch::kFloat).view({2, 3}), {2, 9}, 4, 1);
    CHECK(torch::equal(k2, torch::tensor({true, true, false, true, true, true, true, true}).view({2, 4})));
    auto k0 = snapkv_keep(torch::tensor({0.3, 0.7}, torch::kFloat).view({1, 2}), {0}, 3, 1);
    CHECK(torch::equal(k0, torch::tensor({false, false, true}).view({1, 3})));

    // HeadKV (snapkv_utils.py:387-389): B' = 120, p = floor(120 / 1.005) = 119, pool = 119 x 4, m = 1.
    auto uniform = headkv_caps(torch::ones({2, 2}), 128, 8, 1.005, 1.0);
    CHECK(torch::equal(uniform, torch::full({2, 2}, 120, torch::kLong)));
    auto one = headkv_caps(torch::tensor({1.0, 0.0, 0.0, 0.0}).view({2, 2}), 128, 8, 1.005, 1.0);
    CHECK(torch::equal(one, torch::tensor({477, 1, 1, 1}, torch::kLong).view({2, 2})));
    // B' = 10, p = 5, pool = 20, m = 5: 0.125 x 20 + 5 = 7.5 -> 8 and 0.375 x 20 + 5 = 12.5 -> 12 (half to even).
    auto half = headkv_caps(torch::tensor({1.0, 1.0, 3.0, 3.0}).view({2, 2}), 10, 0, 2.0, 1.0);
    CHECK(torch::equal(half, torch::tensor({8, 8, 12, 12}, torch::kLong).view({2, 2})));
    // temp 2: s^2 renormalised: (1, 9) / 10; NaN counts as 0.
    auto sq = headkv_caps(torch::tensor({1.0, 3.0, std::nan(""), 0.0}).view({2, 2}), 10, 0, 2.0, 2.0);
    CHECK(torch::equal(sq, torch::tensor({7, 23, 5, 5}, torch::kLong).view({2, 2})));
    CHECK_THROWS_AS(headkv_caps(torch::tensor({1.0, -1.0}).view({1, 2}), 10, 2, 1.5, 1.0), UsageError);
    CHECK_THROWS_AS(headkv_caps(torch::zeros({1, 2}), 10, 2, 1.5, 1.0), UsageError);

    // RazorAttention: the heads not kept whole keep [0, sink) and [P - recent, P); P <= sink + recent + 1 stays whole.
    auto full = torch::tensor({true, false}).view({1, 2});
    auto r = razor_keep_mask(full, 10, 2, 3, true);
    CHECK(r[0][0].all().item<bool>());
    CHECK(torch::equal(r[0][1], torch::tensor({true, true, false, false, false, false, false, true, true, true})));
    CHECK(razor_keep_mask(full, 6, 2, 3, true).all().item<bool>());
    CHECK(!razor_keep_mask(full, 6, 2, 3, false).all().item<bool>());
}

namespace {

// golden-stick attention_wrappers.py _compress (AW:188-204) transcribed on the positions of a T-entry
// cache: the kept positions, and the positions averaged into the virtual (mean) token.
std::pair<std::vector<int64_t>, std::vector<int64_t>> golden_stick_compress(int64_t T, int64_t sink_size, int64_t local_capacity,
                                                                            bool use_virtual_token) {
    std::vector<int64_t> cache(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) cache[static_cast<size_t>(i)] = i;
    if (T <= local_capacity) return {cache, {}};                         // if cache_len <= local_capacity: return cache
    auto slice = [&](int64_t a, int64_t b) {                             // cache[a:b,] (non-negative a <= b here)
        return std::vector<int64_t>(cache.begin() + std::min(a, T), cache.begin() + std::min(b, T));
    };
    std::vector<int64_t> kept = slice(0, sink_size), middle;            // left = cache[:sink_size,]
    int64_t drop_cache_len;
    if (!use_virtual_token) {
        drop_cache_len = T - local_capacity;                             // cache_len - local_capacity
    } else {
        drop_cache_len = T - local_capacity + 1;                         // cache_len - local_capacity + 1
        middle = slice(sink_size, drop_cache_len + sink_size);           // cache[sink_size:drop_cache_len+sink_size,]
    }
    const auto right = slice(drop_cache_len + sink_size, T);             // cache[drop_cache_len + sink_size:,]
    kept.insert(kept.end(), right.begin(), right.end());
    return {kept, middle};
}

Trial trial_of(int64_t P, int needle = 0) {
    Trial t;
    t.prompt.assign(static_cast<size_t>(P), 1);
    t.needle = needle;
    return t;
}

}  // namespace

TEST_CASE("kv policy: razor's compressed heads keep what golden-stick's _compress keeps: 256 with or without the mean token") {
    // ra_config.py:57-58 sink_size 4, local_capacity 256; headscope's defaults (KvCompareSpec, and the tool's
    // when --razor-window is not given) are the reference's with the mean token and without it.
    CHECK(KvCompareSpec{}.razor_sink == 4);
    CHECK(KvCompareSpec{}.razor_recent == 251);
    CHECK(KvCompareSpec{}.razor_compensate);
    CHECK(razor_reference_recent(true) == 251);
    CHECK(razor_reference_recent(false) == 252);
    CHECK(KvCompareSpec{}.razor_preset == "reference");
    auto full = torch::tensor({false, true}).view({1, 2});  // head 0 compressed, head 1 kept whole
    for (const bool virt : {false, true})
        for (const auto& [sink, local] : std::vector<std::pair<int64_t, int64_t>>{{4, 256}, {1, 5}, {2, 9}, {0, 7}}) {
            const int64_t recent = sink == 4 && local == 256 ? razor_reference_recent(virt) : local - sink - (virt ? 1 : 0);
            for (int64_t T = 1; T <= local + 40; ++T) {
                CAPTURE(virt);
                CAPTURE(local);
                CAPTURE(T);
                const auto [kept, middle] = golden_stick_compress(T, sink, local, virt);
                const auto mask = razor_keep_mask(full, T, sink, recent, virt);
                REQUIRE(mask.sizes() == at::IntArrayRef({1, 2, T}));
                CHECK(mask[0][1].all().item<bool>());
                std::vector<int64_t> got, dropped;
                const auto row = mask[0][0].contiguous();
                for (int64_t p = 0; p < T; ++p) (row.data_ptr<bool>()[p] ? got : dropped).push_back(p);
                CHECK(got == kept);
                // The mean token averages exactly what the cache drops (Hooks::keep's compensation: the dropped keys).
                if (virt && T > local) CHECK(dropped == middle);
                // What the cache holds: min(T, local_capacity) entries, the mean token among them.
                CHECK(static_cast<int64_t>(kept.size()) + (virt && T > local ? 1 : 0) == std::min(T, local));
            }
        }
}

TEST_CASE("kv policy: SnapKV and HeadKV leave a prompt whole exactly where their references do (HeadKV compresses at C = F)") {
    for (int64_t w : {1, 2, 8})
        for (int64_t B = w + 1; B <= 40; ++B)
            for (int64_t P = w; P <= 45; ++P) {
                CAPTURE(B);
                CAPTURE(P);
                CHECK(kv_snapkv_whole(B, P) == (P < B));                           // SnapKV: if q_len < max_capacity_prompt
                const int64_t base_capacity = B - w, attn_score_len = P - w;        // HeadKV: self.base_capacity, attn_score.size(-1)
                CHECK(kv_headkv_whole(B, P) == (base_capacity > attn_score_len));   // if self.base_capacity > attn_score.size(-1)
            }
    // Through the policies: one layer, two heads (K = H), window 2, prompts of 10 and 20 tokens.
    KvCompareSpec spec;
    spec.snap = SnapKVSettings{2, 1};
    spec.headkv_beta = 2.0;
    const std::vector<Trial> trials = {trial_of(10), trial_of(20)};
    const KvShape sh{1, 2, 2, 1, 2};
    KvContext ctx{spec, sh, trials, nullptr};
    KvPolicySpec snap{find_kv_policy("snapkv"), "snapkv", {}, ""};
    KvPolicySpec head{find_kv_policy("headkv"), "headkv", torch::tensor({3.0, 1.0}).view({1, 2}), ""};
    // Budget 1 with K = H: C = F for every trial. SnapKV's selection keeps everything; HeadKV (B' = C - 2, p =
    // floor(B' / 2), caps = round(s p 2 + B' - p), s = (0.75, 0.25)) gives head 1 fewer than F - w.
    CHECK(snap.policy->config(snap, 1.0, ctx).frac == std::vector<double>{1.0, 1.0});
    // F = 10: B' = 8, p = 4, caps round(6 + 4) = 10 -> 8 (all of F - w), round(2 + 4) = 6: kept 10 + 8 of 20.
    // F = 20: B' = 18, p = 9, caps round(13.5 + 9) = 22 -> 18, round(4.5 + 9) = 14 (half to even): kept 20 + 16 of 40.
    const auto hf = head.policy->config(head, 1.0, ctx).frac;
    REQUIRE(hf.size() == 2);
    CHECK(hf[0] == doctest::Approx(18.0 / 20.0));
    CHECK(hf[1] == doctest::Approx(36.0 / 40.0));
    // A fixed capacity of 10 tokens a head: the 10-token prompt is compressed by HeadKV (C = F), the same caps.
    ctx.capacity = 10;
    const auto hc = head.policy->config(head, kv_capacity_fraction(spec, trials, 10, 2, 2), ctx).frac;
    CHECK(hc[0] == doctest::Approx(18.0 / 20.0));
    // F = 20, C = 10: B' = 8, p = 4, caps 10 and 6 (below F - w = 18): (10 + 2) + (6 + 2) = 20 of 40.
    CHECK(hc[1] == doctest::Approx(20.0 / 40.0));
    // Capacity 11: the 10-token prompt is left whole by both (C > F).
    ctx.capacity = 11;
    const auto h11 = head.policy->config(head, 0.5, ctx).frac;
    CHECK(h11[0] == 1.0);
    const auto s11 = snap.policy->config(snap, 0.5, ctx).frac;
    CHECK(s11[0] == 1.0);
    CHECK(s11[1] == doctest::Approx(22.0 / 40.0));  // SnapKV: C = 11 positions a head of F = 20
    // The configurations of a capacity and of a budget are told apart (identical keys decode once).
    CHECK(snap.policy->config(snap, 0.5, ctx).key != snap.policy->config(snap, 0.5, KvContext{spec, sh, trials, nullptr}).key);
}

TEST_CASE("kv policy: a fixed capacity per head as a column, and the fraction of the cache it is") {
    KvCompareSpec spec;
    spec.budgets = {0.25, 1.0};
    spec.capacities = {8, 64};
    const std::vector<Trial> trials = {trial_of(16), trial_of(32), trial_of(128)};
    // H = 8 query heads, K = 2 KV heads (GQA): C H / (K P), at most 1.
    CHECK(kv_capacity_fraction(spec, trials, 8, 8, 2) == doctest::Approx((1.0 + 1.0 + 32.0 / 128.0) / 3.0));
    CHECK(kv_capacity_fraction(spec, trials, 8, 4, 4) == doctest::Approx((8.0 / 16 + 8.0 / 32 + 8.0 / 128) / 3.0));
    const auto cols = kv_columns(spec, trials, 4, 4);
    REQUIRE(cols.size() == 4);
    CHECK(cols[0].budget == 0.25);
    CHECK(cols[0].capacity == 0);
    CHECK(cols[1].budget == 1.0);
    CHECK(cols[2].capacity == 8);
    CHECK(cols[2].budget == doctest::Approx((0.5 + 0.25 + 0.0625) / 3.0));
    CHECK(cols[3].capacity == 64);
    CHECK(cols[3].budget == doctest::Approx((1.0 + 1.0 + 0.5) / 3.0));
    // Compressed before the question (4 question tokens): the fraction of the context's cache.
    spec.question_tokens = {4};
    CHECK(kv_capacity_fraction(spec, trials, 8, 4, 4) == doctest::Approx((8.0 / 12 + 8.0 / 28 + 8.0 / 124) / 3.0));
    // DuoAttention's LongBench setting (pred.py l. 125: simulation_start_idx = len - decoding_simulation_length):
    // compressed before the prompt's last tail_tokens (at least one position compressed).
    spec.question_tokens.clear();
    spec.tail_tokens = 50;
    CHECK(std::string(spec.compress_at_name()) == "tail");
    CHECK(!spec.compresses_prompt_end());
    CHECK(spec.compress_at(trials[2]) == 78);
    CHECK(spec.compress_at(trials[0]) == 1);
    spec.tail_tokens = 0;
    CHECK(std::string(spec.compress_at_name()) == "prompt");
    CHECK(spec.compress_at(trials[2]) == 128);
}

TEST_CASE("kv policy: the registry holds each policy once and finds it by the name --kv-compare lists") {
    CHECK(kv_policy_names() == "full, snapkv, headkv, duo, razor, stream:SCORE, adakv, critical-adakv");
    std::set<std::string> seen;
    for (const KvPolicy* p : kv_policies()) CHECK(seen.insert(p->name()).second);
    for (const KvPolicy* p : kv_policies())
        if (p->score_from() != KvScoreFrom::kArgument) CHECK(find_kv_policy(p->name()) == p);
    std::string arg;
    const KvPolicy* stream = find_kv_policy("stream:scores.h5:scores/locos/score", &arg);
    REQUIRE(stream != nullptr);
    CHECK(std::string(stream->name()) == "stream");
    CHECK(arg == "scores.h5:scores/locos/score");
    for (const char* bad : {"stream", "stream:", "full:x", "h2o", ""}) {
        CAPTURE(bad);
        CHECK(find_kv_policy(bad) == nullptr);
    }
    // Only HeadKV refuses a signed importance (LOCOS); stream orders by any score.
    CHECK(!find_kv_policy("headkv")->refuse_score(NeedleScore::kLocos).empty());
    CHECK(find_kv_policy("headkv")->refuse_score(NeedleScore::kR2).empty());
    CHECK(stream->refuse_score(NeedleScore::kLocos).empty());
}
