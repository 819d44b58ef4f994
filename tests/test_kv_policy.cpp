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

TEST_CASE("kv policy: the registry holds each policy once and finds it by the name --kv-compare lists") {
    CHECK(kv_policy_names() == "full, snapkv, headkv, duo, razor, stream:SCORE");
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
