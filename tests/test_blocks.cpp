// The forward's two speed/memory paths against the plain ones, on every family fixture:
// attention in query blocks equals whole attention (patterns, scores, logits; with a KV cache and
// sliding windows), folded GEMMs equal per-row GEMMs, and the pattern reductions computed from row
// blocks equal their whole-pattern forms.
#include <doctest/doctest.h>

#include "attention_detectors.h"
#include "blocks.h"
#include "cpu_attention.h"
#include "errors.h"
#include "model.h"
#include "patterns.h"
#include "system.h"
#include "torch_compat.h"

#include <torch/torch.h>

#include <array>

using namespace hs;
using namespace torch::indexing;

namespace {

// Blocked vs whole attention: the same products on fewer rows (a 1-row block is a matrix-vector
// product, another kernel). On the same inputs (layer 0) patterns agree within 1e-6 absolute and
// scores within 1e-6 of their largest magnitude; later layers and the logits also carry the
// earlier layers' last-bit differences forward (measured up to 3.2e-6): 1e-5.
constexpr double kBlockTol = 1e-6;
constexpr double kCarriedTol = 1e-5;
// Folded vs per-row GEMM: different BLAS kernels, same products: within 1e-5 of the largest logit.
constexpr double kFoldTol = 1e-5;

const std::vector<std::string> kFixtures = {"gpt2",   "gpt_neox", "gpt_neox_sequential", "gemma",
                                            "gemma2", "gemma3",   "olmo2",               "qwen3",
                                            "llama3_rope", "mistral_window", "qwen2_bias"};

std::string fixture(const std::string& name) { return std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + name; }

at::Tensor tokens_for(const Model& m, int64_t B, int64_t T, uint64_t seed) {
    torch::manual_seed(seed);
    return torch::randint(m.config.vocab_size, {B, T}, torch::kLong);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
// Relative to the larger of 1 and the reference's largest magnitude (scores and logits reach ~10-100).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
    return max_diff(a, b) / std::max(1.0, b.abs().max().item<double>());
}

struct Observed {
    at::Tensor logits;
    std::vector<at::Tensor> scores, pattern;  // per layer [B, H, T, S]
};

// A forward whose scores and pattern are observed in row blocks of `block` rows (0: whole
// captures), assembled here into whole tensors for comparison.
Observed observe(const Model& m, const at::Tensor& tokens, int64_t block, KVCache* cache = nullptr) {
    const int L = m.config.n_layers;
    Observed o;
    std::vector<std::vector<at::Tensor>> sc(L), pa(L);
    std::vector<int64_t> next_s(L, 0), next_p(L, 0);
    Hooks hooks;
    if (block > 0) {
        hooks.capture_rows(Point::kAttnScores, [&](int l, int64_t q0, const at::Tensor& x) {
            CHECK(q0 == next_s[l]);  // blocks arrive in order, back to back
            next_s[l] = q0 + x.size(2);
            sc[l].push_back(x.clone());
        });
        hooks.capture_rows(Point::kAttnPattern, [&](int l, int64_t q0, const at::Tensor& x) {
            CHECK(q0 == next_p[l]);
            next_p[l] = q0 + x.size(2);
            CHECK(x.size(2) <= block);
            pa[l].push_back(x.clone());
        });
    } else {
        hooks.capture(Point::kAttnScores, [&](int l, const at::Tensor& x) { sc[l].push_back(x.clone()); });
        hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& x) { pa[l].push_back(x.clone()); });
    }
    ForwardOptions fo;
    fo.attn_block = block;
    torch::NoGradGuard ng;
    o.logits = m.forward(tokens, &hooks, cache, fo);
    for (int l = 0; l < L; ++l) {
        o.scores.push_back(torch::cat(sc[l], 2));
        o.pattern.push_back(torch::cat(pa[l], 2));
    }
    return o;
}

void check_same(const Observed& a, const Observed& b) {
    CHECK(rel_diff(a.logits, b.logits) < kCarriedTol);
    for (size_t l = 0; l < a.pattern.size(); ++l) {
        CAPTURE(l);
        const double tol = l == 0 ? kBlockTol : kCarriedTol;
        REQUIRE(a.pattern[l].sizes() == b.pattern[l].sizes());
        CHECK(max_diff(a.pattern[l], b.pattern[l]) < tol);
        // -inf where masked in both: compare the finite entries and the mask itself.
        auto fa = torch::isfinite(a.scores[l]), fb = torch::isfinite(b.scores[l]);
        CHECK(torch::equal(fa, fb));
        CHECK(rel_diff(a.scores[l].masked_select(fa), b.scores[l].masked_select(fb)) < tol);
    }
}

}  // namespace

TEST_CASE("attention in query blocks equals whole attention on every family fixture") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto tokens = tokens_for(*m, 2, 23, 7);
        const auto whole = observe(*m, tokens, 0);
        for (int64_t block : {1, 5, 8, 23, 100}) {  // 5 does not divide 23; 100 > T is one block
            CAPTURE(block);
            check_same(whole, observe(*m, tokens, block));
        }
        // With a KV cache: 9 tokens prefilled, then 14 in blocks of 4; the second call's rows are
        // queries 9..22 (q0 counts from the call's first query) against all 23 keys.
        KVCache c0, c1;
        auto first = tokens.narrow(1, 0, 9), rest = tokens.narrow(1, 9, 14);
        observe(*m, first, 0, &c0);
        observe(*m, first, 4, &c1);
        const auto w2 = observe(*m, rest, 0, &c0), b2 = observe(*m, rest, 4, &c1);
        check_same(w2, b2);
        CHECK(rel_diff(w2.logits, whole.logits.narrow(1, 9, 14)) < 1e-5);
        CHECK(max_diff(w2.pattern[0], whole.pattern[0].narrow(2, 9, 14)) < 1e-5);
    }
}

TEST_CASE("the blocked attention equals the whole reference attention (GQA, windows, soft-cap, a KV cache)") {
    // attention() (blocked, cached, scratch-reusing) against blocks::attention_reference, fed the
    // q, k, v the forward captured at the same layer: the same products in another order, so
    // within kBlockTol of z's largest magnitude.
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto tokens = tokens_for(*m, 2, 23, 11);
        KVCache cache;
        torch::NoGradGuard ng;
        for (auto part : {tokens.narrow(1, 0, 9), tokens.narrow(1, 9, 14)}) {  // prefill, then 14 more
            std::vector<at::Tensor> q(m->config.n_layers), k(q), v(q), z(q);
            Hooks h;
            h.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { q[l] = x.clone(); });
            h.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { k[l] = x.clone(); });
            h.capture(Point::kAttnV, [&](int l, const at::Tensor& x) { v[l] = x.clone(); });
            h.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = x.clone(); });
            ForwardOptions fo;
            fo.attn_block = 4;
            m->forward(part, &h, &cache, fo);
            for (int l = 0; l < m->config.n_layers; ++l) {
                CAPTURE(l);
                REQUIRE(k[l].size(1) == cache.k[l].size(1));  // every key seen so far
                CHECK(rel_diff(z[l], blocks::attention_reference(m->config, l, q[l], k[l], v[l])) < kBlockTol);
            }
        }
    }
}

TEST_CASE("automatic attention blocks bound the scratch and cover every query") {
    CHECK(blocks::attention_block_rows(0, 1, 12, 512, 512) == 128);     // at most 128 rows
    CHECK(blocks::attention_block_rows(0, 1, 12, 100, 100) == 100);     // small: one block
    CHECK(blocks::attention_block_rows(0, 1, 12, 4096, 4096) == 128);   // 2^23 / (12 * 4096) = 170, capped
    CHECK(blocks::attention_block_rows(0, 4, 12, 4096, 4096) == 42);    // 2^23 / (48 * 4096)
    CHECK(blocks::attention_block_rows(0, 64, 32, 8192, 8192) == 16);   // never below 16 rows
    CHECK(blocks::attention_block_rows(7, 1, 1, 5, 5) == 5);            // a request above T: T
    CHECK(blocks::attention_block_rows(3, 1, 1, 5, 5) == 3);
}

TEST_CASE("folded GEMMs equal per-row GEMMs on every family fixture; row interventions keep rows exact") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto tokens = tokens_for(*m, 3, 17, 11);
        torch::NoGradGuard ng;
        ForwardOptions folded, per_row;
        folded.gemm = GemmMode::kFolded;
        per_row.gemm = GemmMode::kPerRow;
        auto a = m->forward(tokens, nullptr, nullptr, folded), b = m->forward(tokens, nullptr, nullptr, per_row);
        CHECK(rel_diff(a, b) < kFoldTol);
        CHECK(max_diff(a, m->forward(tokens)) == 0.0);  // automatic without interventions: folded
        // Automatic with an intervention on row 2: per-row, so rows 0 and 1 equal their unbatched runs.
        Hooks hooks;
        hooks.intervene_z({0, 1, 2, HeadOp::kZero, 0.0, {}});
        auto c = m->forward(tokens, &hooks);
        for (int64_t r = 0; r < 2; ++r) CHECK(torch::equal(c[r], m->forward(tokens.narrow(0, r, 1))[0]));
        CHECK(max_diff(c[2], b[2]) > 1e-4);  // the intervention did act
    }
}

TEST_CASE("stripe and detector scores from row blocks equal their whole-pattern forms") {
    auto m = load_model(fixture("qwen3"));
    const int64_t n = 9, T = 2 * n + 1, L = m->config.n_layers, H = m->config.n_heads;
    auto body = tokens_for(*m, 3, n, 5);
    auto tokens = torch::cat({torch::full({3, 1}, 1, torch::kLong), body, body}, 1);
    const std::vector<StripeKind> kinds = {StripeKind::kInduction, StripeKind::kPreviousToken,
                                           StripeKind::kDuplicateToken, StripeKind::kAttentionSink};
    auto whole = observe(*m, tokens, 0);
    for (int64_t block : std::vector<int64_t>{1, 4, 7, T}) {
        CAPTURE(block);
        std::vector<at::Tensor> samples;
        for (size_t k = 0; k < kinds.size(); ++k) samples.push_back(torch::zeros({3, L, H}));
        Hooks hooks;
        hooks.capture_rows(Point::kAttnPattern, stripe_capture(kinds, n, samples, 0));
        ForwardOptions fo;
        fo.attn_block = block;
        fo.compute_logits = false;
        torch::NoGradGuard ng;
        m->forward(tokens, &hooks, nullptr, fo);
        for (size_t k = 0; k < kinds.size(); ++k)
            for (int64_t l = 0; l < L; ++l)
                CHECK(max_diff(samples[k].select(1, l), stripe_scores_layer(whole.pattern[l], kinds[k], n)) < (l == 0 ? kBlockTol : kCarriedTol));
    }
    // Detection-pattern scores (both measures, both exclusions) summed over row blocks.
    for (auto measure : {ErrorMeasure::kMul, ErrorMeasure::kAbs})
        for (bool ex : {false, true}) {
            DetectorOptions opts{measure, ex, ex};
            auto det = detection_pattern(tokens[0], StripeKind::kInduction);
            auto p = whole.pattern[1].narrow(0, 0, 1);
            auto want = detector_scores_layer(p, det, opts);
            at::Tensor sums;
            for (int64_t q0 = 0; q0 < T; q0 += 4) {
                auto part = detector_sums_rows(p.narrow(2, q0, std::min<int64_t>(4, T - q0)), q0, det, opts);
                sums = sums.defined() ? sums + part : part;
            }
            CHECK(max_diff(detector_score_finish(sums, T, opts), want) < kBlockTol);
        }
}

TEST_CASE("row-block reductions: hand-made pattern, ranges that straddle blocks") {
    // A[q, k] = 100 q + k on a [1, 1, 6, 6] grid: every reduction is a known sum.
    auto a = (torch::arange(6).unsqueeze(1) * 100 + torch::arange(6).unsqueeze(0)).to(torch::kFloat).view({1, 1, 6, 6});
    auto total = [&](const std::function<at::Tensor(const at::Tensor&, int64_t)>& f) {
        double s = 0;
        for (int64_t q0 = 0; q0 < 6; q0 += 4) s += f(a.narrow(2, q0, std::min<int64_t>(4, 6 - q0)), q0).item<double>();
        return s;
    };
    // A[q, q-1] for q in 2..5: 201 + 302 + 403 + 504
    CHECK(total([](const at::Tensor& r, int64_t q0) { return diagonal_sum_rows(r, q0, 2, 5, 1); }) == 1410);
    // A[q, 0] for q in 1..4
    CHECK(total([](const at::Tensor& r, int64_t q0) { return column_sum_rows(r, q0, 1, 4, 0); }) == 1000);
    // picks A[5, 2] (row 5 lies in the second block)
    CHECK(total([](const at::Tensor& r, int64_t q0) {
              return pick_rows(r, q0, torch::tensor({5}, torch::kLong), torch::tensor({2}, torch::kLong));
          }) == 502);
}

TEST_CASE("fused attention (libtorch >= 2.1) equals the blocked attention on every family fixture") {
    if (!compat::has_fused_attention()) {
        MESSAGE("skipped: this libtorch (" << TORCH_VERSION << ") has no fused attention; the torch-2 build runs it");
        return;
    }
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto tokens = tokens_for(*m, 2, 23, 11);
        torch::NoGradGuard ng;
        m->options.attention = AttentionKernel::kBlocked;
        const auto blocked = m->forward(tokens);
        KVCache cb;
        m->forward(tokens.narrow(1, 0, 9), nullptr, &cb);
        const auto blocked_rest = m->forward(tokens.narrow(1, 9, 14), nullptr, &cb);
        m->options.attention = AttentionKernel::kFused;
        // Gemma 2 soft-caps its scores: the fused kernel cannot, so that family stays blocked.
        CHECK(blocks::uses_fused_attention(*m, 0, nullptr) == (m->config.attn_softcap <= 0));
        const auto fused = m->forward(tokens);
        CHECK(rel_diff(fused, blocked) < kCarriedTol);
        // With a KV cache (the mask path: queries 9..22 against 23 keys, sliding windows folded in).
        KVCache cf;
        m->forward(tokens.narrow(1, 0, 9), nullptr, &cf);
        CHECK(rel_diff(m->forward(tokens.narrow(1, 9, 14), nullptr, &cf), blocked_rest) < kCarriedTol);
        // Whoever observes the pattern, or streams a head, gets the blocked attention.
        Hooks h;
        h.capture_rows(Point::kAttnPattern, [](int, int64_t, const at::Tensor&) {}, 0);
        CHECK_FALSE(blocks::uses_fused_attention(*m, 0, &h));
        Hooks w;
        w.window({0, 0, -1, 1, 2, false, {}});
        CHECK(rel_diff(m->forward(tokens, &w), [&] {
                  m->options.attention = AttentionKernel::kBlocked;
                  auto r = m->forward(tokens, &w);
                  m->options.attention = AttentionKernel::kFused;
                  return r;
              }()) < kCarriedTol);
    }
}

TEST_CASE("fused attention reads GQA's kv heads in place: the bits of the repeated heads") {
    if (!compat::has_fused_attention()) {
        MESSAGE("skipped: this libtorch (" << TORCH_VERSION << ") has no fused attention; the torch-2 build runs it");
        return;
    }
    torch::manual_seed(3);
    const int64_t B = 2, H = 8, K = 2, T = 5, S = 13, d = 16;
    auto q = torch::randn({B, H, T, d}), k = torch::randn({B, K, S, d}), v = torch::randn({B, K, S, d});
    auto kr = k.repeat_interleave(H / K, 1), vr = v.repeat_interleave(H / K, 1);
    auto mask = torch::ones({T, S}, torch::kBool).tril(S - T);  // a chunk after 8 cached keys
    CHECK(torch::equal(compat::fused_attention(q, k, v, mask, false, 0.25), compat::fused_attention(q, kr, vr, mask, false, 0.25)));
    auto qc = torch::randn({B, H, S, d});
    CHECK(torch::equal(compat::fused_attention(qc, k, v, {}, true, 0.25), compat::fused_attention(qc, kr, vr, {}, true, 0.25)));
    CHECK_THROWS(compat::fused_attention(q, torch::randn({B, 3, S, d}), torch::randn({B, 3, S, d}), mask, false, 0.25));
}

TEST_CASE("a prefill without logits stops at the last layer's keys and values: the next call's bits unchanged") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto tokens = tokens_for(*m, 2, 21, 17);
        torch::NoGradGuard ng;
        ForwardOptions no_logits;
        no_logits.compute_logits = false;
        // The same prefill with logits (every layer whole) and without (the last layer's keys and values only).
        KVCache whole, keys;
        m->forward(tokens.narrow(1, 0, 15), nullptr, &whole);
        CHECK_FALSE(m->forward(tokens.narrow(1, 0, 15), nullptr, &keys, no_logits).defined());
        const int last = m->config.n_layers - 1;
        CHECK(torch::equal(keys.k[last], whole.k[last]));
        CHECK(torch::equal(keys.v[last], whole.v[last]));
        CHECK(torch::equal(m->forward(tokens.narrow(1, 15, 6), nullptr, &keys), m->forward(tokens.narrow(1, 15, 6), nullptr, &whole)));
        // A hook at the last layer sees the whole layer: it runs.
        Hooks h;
        int seen = 0;
        h.capture(Point::kMlpOut, [&](int, const at::Tensor&) { ++seen; }, last);
        KVCache hooked;
        m->forward(tokens.narrow(1, 0, 15), &h, &hooked, no_logits);
        CHECK(seen == 1);
    }
}

TEST_CASE("chunk attention: a GQA chunk after cached keys, two fused calls merged, equals the masked call") {
    if (!compat::has_chunk_attention()) {
        MESSAGE("skipped: this libtorch (" << TORCH_VERSION << ") has no CPU flash log-sum-exp; the torch-2 build runs it");
        return;
    }
    torch::manual_seed(5);
    // (query heads, kv heads, chunk, cached keys): stacked heads 1, 2 and 4 a kv head, a cache shorter
    // and longer than the chunk, batch rows with their own keys.
    for (auto [H, K, T, P] : std::vector<std::array<int64_t, 4>>{{8, 2, 200, 57}, {4, 2, 64, 300}, {6, 6, 33, 1}, {8, 2, 5, 3}}) {
        CAPTURE(H);
        CAPTURE(K);
        CAPTURE(T);
        CAPTURE(P);
        const int64_t B = 2, S = T + P, d = 32;
        auto q = torch::randn({B, H, T, d}), k = torch::randn({B, K, S, d}), v = torch::randn({B, K, S, d});
        auto mask = torch::ones({T, S}, torch::kBool).tril(P);
        const auto want = compat::fused_attention(q, k, v, mask, false, 0.2);
        const auto got = compat::chunk_attention(q, k, v, 0.2);
        CHECK(got.sizes() == want.sizes());
        // Two softmaxes merged by their log-sum-exps in float32: rounding, nothing more.
        CHECK((got - want).abs().max().item<double>() < 1e-5);
        if (cpu_gemm_supported(c10::kBFloat16)) {
            const auto bf = compat::chunk_attention(q.to(torch::kBFloat16), k.to(torch::kBFloat16), v.to(torch::kBFloat16), 0.2);
            CHECK((bf.scalar_type() == c10::kBFloat16));
            CHECK((bf.to(torch::kFloat) - want).abs().max().item<double>() < 3e-2);
        }
    }
    CHECK_THROWS(compat::chunk_attention(torch::randn({1, 4, 3, 8}), torch::randn({1, 2, 3, 8}), torch::randn({1, 2, 3, 8}), 0.3));
    CHECK_THROWS(compat::chunk_attention(torch::randn({1, 4, 3, 8}), torch::randn({1, 3, 5, 8}), torch::randn({1, 3, 5, 8}), 0.3));
}

TEST_CASE("a long prefill chunk takes the chunk attention and keeps the blocked attention's logits") {
    if (!compat::has_chunk_attention()) {
        MESSAGE("skipped: this libtorch (" << TORCH_VERSION << ") has no CPU flash log-sum-exp; the torch-2 build runs it");
        return;
    }
    // 2, 1 and 4 query heads a kv head; RoPE families, so any position is defined (the fixtures' 64
    // positions are their checkpoints' field).
    for (const std::string name : {"llama3_rope", "gpt_neox", "gemma"}) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        m->config.max_seq_len = 2048;
        const int64_t T = blocks::kChunkAttentionQueries;  // the smallest chunk that takes it after a short past
        auto tokens = tokens_for(*m, 2, 100 + T, 13);
        torch::NoGradGuard ng;
        auto rest = [&](AttentionKernel a) {
            m->options.attention = a;
            KVCache c;
            m->forward(tokens.narrow(1, 0, 100), nullptr, &c);
            return m->forward(tokens.narrow(1, 100, T), nullptr, &c);
        };
        const auto blocked = rest(AttentionKernel::kBlocked), fused = rest(AttentionKernel::kFused);
        CHECK(rel_diff(fused, blocked) < kCarriedTol);
        CHECK(rel_diff(fused, m->forward(tokens).narrow(1, 100, T)) < kCarriedTol);  // the whole prompt at once
    }
}

namespace {
// softmax(q k^T * scale) v over the keys each query sees (query t at S - T + t), in `dt`: z [B, T, H, d].
at::Tensor causal_z(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, c10::ScalarType dt) {
    const int64_t T = q.size(1), S = k.size(1), H = q.size(2), K = k.size(2);
    auto qd = q.to(dt), kd = k.to(dt).repeat_interleave(H / K, 2), vd = v.to(dt).repeat_interleave(H / K, 2);
    auto s = torch::einsum("bthd,bshd->bhts", {qd, kd}) * scale;
    auto seen = torch::arange(S).view({1, S}) <= torch::arange(S - T, S).view({T, 1});
    s = s.masked_fill(seen.logical_not(), -std::numeric_limits<double>::infinity());
    return torch::einsum("bhts,bshd->bthd", {torch::softmax(s, -1), vd});
}
}  // namespace

TEST_CASE("the lane attention (AVX2 or AVX-512) equals float64 attention; a query's bits do not depend on its chunk, row or neighbours") {
    const auto q0 = torch::randn({1, 40, 4, 64}), k0 = torch::randn({1, 40, 4, 64});
    if (!blocks::cpu_attention_applies(q0, k0, k0)) {
        MESSAGE("skipped: this CPU has neither AVX2 with FMA nor AVX-512 (the forward keeps libtorch's kernels)");
        return;
    }
    torch::manual_seed(17);
    torch::NoGradGuard ng;
    // (query heads, kv heads, chunk T, cached keys P, head dim): a task's 32 queries whole, cut (T = 1,
    // 25, 33, 200), GQA 1/2/4 a kv head, no past, a past across key blocks of 128, head dims that leave
    // a tail of the 12-key and 8-column tiles, the largest head.
    for (auto [H, K, T, P, d] : std::vector<std::array<int64_t, 5>>{
             {4, 4, 32, 0, 64}, {8, 2, 200, 57, 32}, {6, 6, 25, 300, 80}, {8, 2, 33, 1, 16}, {4, 1, 1, 129, 64},
             {2, 2, 70, 128, 256}, {12, 12, 311, 1, 64}, {3, 3, 7, 0, 5}}) {
        CAPTURE(H);
        CAPTURE(K);
        CAPTURE(T);
        CAPTURE(P);
        CAPTURE(d);
        const int64_t B = 2, S = P + T;
        // Keys and values as the cache holds them: [B, K, capacity, d] buffers seen as [B, S, K, d].
        auto kbuf = torch::randn({B, K, S + 9, d}), vbuf = torch::randn({B, K, S + 9, d});
        auto k = kbuf.narrow(2, 0, S).permute({0, 2, 1, 3}), v = vbuf.narrow(2, 0, S).permute({0, 2, 1, 3});
        auto q = torch::randn({B, T, H, d}) * 2;  // peaked softmaxes too
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        REQUIRE(blocks::cpu_attention_applies(q, k, v));
        const auto z = blocks::cpu_attention_z(q, k, v, scale);
        CHECK(z.sizes() == q.sizes());
        // Against float64: within twice the plain float32 computation's own error (einsum, softmax,
        // einsum: measured 1.5-3e-6 here) plus 1e-6, and under 1e-5.
        const auto exact = causal_z(q, k, v, scale, torch::kDouble);
        const double err = max_diff(z.to(torch::kDouble), exact), plain = max_diff(causal_z(q, k, v, scale, torch::kFloat).to(torch::kDouble), exact);
        CAPTURE(plain);
        CHECK(err <= 2 * plain + 1e-6);
        CHECK(err < 1e-5);
        // Row 1 alone equals row 1 of the batch; the chunk's last queries after a cut (the first ones
        // prefilled before them) equal themselves in the whole chunk, bit for bit.
        CHECK(torch::equal(blocks::cpu_attention_z(q.narrow(0, 1, 1), k.narrow(0, 1, 1), v.narrow(0, 1, 1), scale), z.narrow(0, 1, 1)));
        if (T > 1) {
            const int64_t cut = T / 3 + 1, rest = T - cut;
            const auto tail = blocks::cpu_attention_z(q.narrow(1, cut, rest), k, v, scale);
            CHECK(torch::equal(tail, z.narrow(1, cut, rest)));
            const auto head = blocks::cpu_attention_z(q.narrow(1, 0, cut), k.narrow(1, 0, P + cut), v.narrow(1, 0, P + cut), scale);
            CHECK(torch::equal(head, z.narrow(1, 0, cut)));
        }
    }
    // Outside the kernel: bfloat16, more queries than keys, a head past 256, kv heads not dividing.
    CHECK_FALSE(blocks::cpu_attention_applies(q0.to(torch::kBFloat16), k0.to(torch::kBFloat16), k0.to(torch::kBFloat16)));
    CHECK_FALSE(blocks::cpu_attention_applies(q0, k0.narrow(1, 0, 39), k0.narrow(1, 0, 39)));
    CHECK_FALSE(blocks::cpu_attention_applies(torch::randn({1, 4, 2, 300}), torch::randn({1, 4, 2, 300}), torch::randn({1, 4, 2, 300})));
    CHECK_FALSE(blocks::cpu_attention_applies(torch::randn({1, 4, 6, 8}), torch::randn({1, 4, 4, 8}), torch::randn({1, 4, 4, 8})));
    CHECK_THROWS(blocks::cpu_attention_z(q0, k0.narrow(1, 0, 39), k0.narrow(1, 0, 39), 0.1));
}

TEST_CASE("the lane attention in the forward: a prefill's logits equal the blocked attention's, chunked or whole") {
    const auto probe = torch::randn({1, 32, 2, 16});
    if (!blocks::cpu_attention_applies(probe, probe, probe)) {
        MESSAGE("skipped: this CPU has neither AVX2 with FMA nor AVX-512");
        return;
    }
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto tokens = tokens_for(*m, 2, 32, 23);  // GPT-2's fixture has 32 positions
        torch::NoGradGuard ng;
        m->options.attention = AttentionKernel::kBlocked;
        CHECK_FALSE(blocks::uses_lane_attention(*m, 0, nullptr));
        const auto blocked = m->forward(tokens);
        m->options.attention = AttentionKernel::kAuto;
        // Soft-capped (Gemma 2) and sliding-window layers stay off the kernel; a pattern observer too.
        CHECK(blocks::uses_lane_attention(*m, 0, nullptr) == (m->config.attn_softcap <= 0 && !m->config.is_sliding(0)));
        Hooks h;
        h.capture_rows(Point::kAttnPattern, [](int, int64_t, const at::Tensor&) {}, 0);
        CHECK_FALSE(blocks::uses_lane_attention(*m, 0, &h));
        const auto lane = m->forward(tokens);
        CHECK(rel_diff(lane, blocked) < kCarriedTol);
        // A cache of 8 positions, then a chunk of 24 through the kernel: the whole prompt's logits.
        KVCache c;
        m->forward(tokens.narrow(1, 0, 8), nullptr, &c);
        CHECK(rel_diff(m->forward(tokens.narrow(1, 8, 24), nullptr, &c), lane.narrow(1, 8, 24)) < kCarriedTol);
    }
}

TEST_CASE("fused attention in bfloat16 is as close to float32 as the blocked attention in bfloat16") {
    if (!compat::has_fused_attention() || !cpu_gemm_supported(c10::kBFloat16)) {
        MESSAGE("skipped: no fused attention or no bfloat16 products in this libtorch");
        return;
    }
    for (const std::string name : {"llama3_rope", "mistral_window", "gpt2"}) {
        CAPTURE(name);
        auto ref = load_model(fixture(name));
        LoadOptions lo;
        lo.dtype = c10::kBFloat16;
        auto m = load_model(fixture(name), lo);
        auto tokens = tokens_for(*ref, 2, 23, 11);
        torch::NoGradGuard ng;
        const auto want = ref->forward(tokens);
        m->options.attention = AttentionKernel::kBlocked;
        const double blocked = rel_diff(m->forward(tokens).to(torch::kFloat), want);
        m->options.attention = AttentionKernel::kFused;
        const double fused = rel_diff(m->forward(tokens).to(torch::kFloat), want);
        MESSAGE(name << ": bf16 vs fp32, relative to the largest logit: blocked " << blocked << ", fused " << fused);
        CHECK(fused <= 2 * blocked + 1e-3);
        CHECK(fused < 5e-2);
    }
}

TEST_CASE("bmm_small: a decode step's small products split over the threads, equal to at::bmm") {
    // The split runs where there are threads to split over (tests run with every core; at least 2 here).
    // Each matrix is its own product on one thread. OpenBLAS then gives at::bmm's bits; MKL picks its
    // kernel by the batch a thread gets (a batch of one matrix-vector product takes another kernel),
    // which moves the last bits: measured 3.8e-6 on values ~20 (N 2, M 48, n 1). Within 1e-5 relative.
    const int threads = at::get_num_threads();
    at::set_num_threads(std::max(2, threads));
    torch::manual_seed(11);
    auto same = [&](const at::Tensor& a, const at::Tensor& b) {
        const auto y = blocks::bmm_small(a, b), ref = at::bmm(a, b);
        return (y - ref).abs().max().item<double>() <= 1e-5 * std::max(1.0, ref.abs().max().item<double>());
    };
    for (int64_t N : {1, 2, 3, 12, 13, 72}) {
        for (int64_t M : {1, 6, 48}) {
            for (int64_t n : {1, 37, 1100}) {
                const auto a = torch::randn({N, M, 64});
                const auto b = torch::randn({N, n, 64}).transpose(1, 2);  // keys [N, S, d] read transposed
                CHECK(same(a, b));
                const auto v = torch::randn({N, n, 64});  // the pattern against values
                const auto p = torch::softmax(torch::randn({N, M, n}), -1);
                CHECK(same(p, v));
            }
        }
    }
    {  // under InferenceMode (the commands' forwards): the other threads run in it too
        c10::InferenceMode im;
        const auto a = torch::randn({12, 1, 64}), b = torch::randn({12, 64, 300});
        CHECK(same(a, b));
    }
    // Larger products go to at::bmm whole (the BLAS threads them itself); autograd keeps its graph.
    const auto big = torch::randn({2, 512, 64}), kt = torch::randn({2, 64, 512});
    CHECK(torch::equal(blocks::bmm_small(big, kt), at::bmm(big, kt)));
    const auto g = torch::randn({4, 1, 8}).requires_grad_(true);
    blocks::bmm_small(g, torch::randn({4, 8, 5})).sum().backward();
    CHECK(g.grad().defined());
    at::set_num_threads(threads);
}

TEST_CASE("gemv_rows: a decode step's few rows equal the GEMM, each row's bits independent of the rows beside it") {
    // The kernel sums in another order than BLAS: within 1e-5 of the output's largest magnitude.
    // Up to 16 rows on every machine; float32 up to 64 where the CPU has AVX-512 or AVX2 with FMA (each
    // its own kernel, which then takes every row count) or AVX2 alone (the portable kernel's AVX2
    // clone): the 17-64 rows below run there and nowhere else.
    torch::manual_seed(7);
    // D = 4100: 15 weight rows a block (256 KiB), so more than 6 rows run in groups over several blocks.
    for (int64_t D : {5, 8, 16, 17, 64, 77, 4100}) {
        const auto w = torch::randn({300, D}), b = torch::randn({300});
        const auto x = torch::randn({64, D});
        for (int64_t R : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 31, 48, 64}) {
            const auto xs = x.narrow(0, 0, R);
            for (bool bias : {false, true}) {
                const auto ref = torch::matmul(xs.to(torch::kDouble), w.to(torch::kDouble).t()) +
                                 (bias ? b.to(torch::kDouble) : torch::zeros({300}, torch::kDouble));
                const auto y = blocks::gemv_rows(xs.view({R, 1, D}), w, bias ? b : at::Tensor());
                if (R > 16 && !y.defined()) continue;  // neither AVX2 nor AVX-512 here: the GEMM's rows
                REQUIRE(y.defined());
                CHECK(y.sizes() == std::vector<int64_t>{R, 1, 300});
                const double err = (y.view({R, 300}).to(torch::kDouble) - ref).abs().max().item<double>();
                CHECK(err <= 1e-5 * std::max(1.0, ref.abs().max().item<double>()));
                for (int64_t r = 0; r < R; ++r)  // alone == in the batch, bit for bit
                    CHECK(torch::equal(blocks::gemv_rows(xs.narrow(0, r, 1), w, bias ? b : at::Tensor())[0],
                                       y.view({R, 300})[r]));
                // and linear() takes it for such rows
                CHECK(torch::equal(blocks::linear(xs, w, bias ? b : at::Tensor(), false), y.view({R, 300})));
            }
        }
    }
    // bfloat16 weights and rows (a bf16 decode step): widened exactly, summed in float32, rounded once;
    // within bf16's rounding (2^-8 relative) of the float64 product of the same bf16 values.
    for (int64_t D : {7, 64, 130}) {
        const auto w = torch::randn({300, D}).to(torch::kBFloat16), b = torch::randn({300}).to(torch::kBFloat16);
        const auto x = torch::randn({16, D}).to(torch::kBFloat16);
        for (int64_t R : {1, 3, 8, 13, 16}) {
            const auto xs = x.narrow(0, 0, R);
            const auto ref = torch::matmul(xs.to(torch::kDouble), w.to(torch::kDouble).t()) + b.to(torch::kDouble);
            const auto y = blocks::gemv_rows(xs, w, b);
            REQUIRE(y.defined());
            CHECK((y.scalar_type() == torch::kBFloat16));
            const double err = (y.to(torch::kDouble) - ref).abs().max().item<double>();
            CHECK(err <= std::pow(2.0, -8) * std::max(1.0, ref.abs().max().item<double>()));
            for (int64_t r = 0; r < R; ++r) CHECK(torch::equal(blocks::gemv_rows(xs.narrow(0, r, 1), w, b)[0], y[r]));
        }
    }
    // Where it does not apply, the caller's GEMM runs: 65 rows (17 in bfloat16), float64, autograd, a
    // transposed weight.
    const auto w = torch::randn({16, 8});
    CHECK_FALSE(blocks::gemv_rows(torch::randn({65, 8}), w, {}).defined());
    CHECK_FALSE(blocks::gemv_rows(torch::randn({17, 8}).to(torch::kBFloat16), w.to(torch::kBFloat16), {}).defined());
    CHECK_FALSE(blocks::gemv_rows(torch::randn({2, 8}, torch::kDouble), w.to(torch::kDouble), {}).defined());
    CHECK_FALSE(blocks::gemv_rows(torch::randn({2, 8}).requires_grad_(true), w, {}).defined());
    CHECK_FALSE(blocks::gemv_rows(torch::randn({2, 16}), w.t(), {}).defined());
    CHECK_FALSE(blocks::gemv_rows(torch::randn({2, 8}), w.to(torch::kBFloat16), {}).defined());  // mixed dtypes
    CHECK_FALSE(blocks::gemv_rows(torch::randn({2, 8}, torch::kHalf), w.to(torch::kHalf), {}).defined());
}

TEST_CASE("bmm_items: at::bmm's bits on every operand layout, degenerate sizes included") {
    // Where at::bmm loops over its items (Debian's libtorch), bmm_items makes each item's BLAS call itself;
    // elsewhere it is at::bmm_out. Either way the bits are at::bmm's into the same output. (With MKL, at::bmm's
    // last bits depend on the output's address: libtorch 2.15's bmm into a buffer at an offset differs from its
    // bmm into a fresh one by up to 3e-6 on these shapes; so the reference is at::bmm_out into an output placed
    // as this one is, the CPU allocator aligning both buffers to 64 bytes.)
    torch::manual_seed(5);
    for (int64_t N : {1, 3})
        for (int64_t M : {1, 7, 33})
            for (int64_t K : {1, 16, 40})
                for (int64_t P : {1, 9, 50})
                    for (int layout = 0; layout < 4; ++layout) {
                        const auto a = layout & 1 ? torch::randn({N, K, M}).transpose(1, 2) : torch::randn({N, M, K});
                        const auto b = layout & 2 ? torch::randn({N, P, K}).transpose(1, 2) : torch::randn({N, K, P});
                        CAPTURE(N);
                        CAPTURE(M);
                        CAPTURE(K);
                        CAPTURE(P);
                        CAPTURE(layout);
                        CHECK(torch::equal(blocks::bmm_items(a, b), at::bmm(a, b)));
                        auto out = torch::empty({2 * N, M, P}).narrow(0, N, N);  // into part of a larger buffer
                        blocks::bmm_items(out, a, b);
                        auto ref = torch::empty({2 * N, M, P}).narrow(0, N, N);
                        at::bmm_out(ref, a, b);
                        CHECK(torch::equal(out, ref));
                    }
}

TEST_CASE("the training attention (CausalCore) keeps autograd's bits: outputs and the gradients of q, k, v") {
    // Under autograd the blocked attention's causal blocks run as one function (forward and backward split
    // over the threads); the plain ops' autograd (set_autograd_attention_core(false)) is the reference. Where
    // at::bmm loops over its items (a libtorch without MKL: Debian's) every item takes the same BLAS call in
    // both, so the bits are equal; with MKL, a chunk's batched product may round its last bits otherwise:
    // within 1e-5 of the largest magnitude there.
    const int threads = at::get_num_threads();
    at::set_num_threads(std::max(2, threads));
    const bool exact = !at::hasMKL();
    auto same = [&](const at::Tensor& x, const at::Tensor& ref) {
        if (exact) return torch::equal(x, ref);
        return (x - ref).abs().max().item<double>() <= 1e-5 * std::max(1.0, ref.abs().max().item<double>());
    };
    LoadOptions lo;
    lo.attention = AttentionKernel::kBlocked;  // libtorch 2.x would hand an unobserved layer to its fused kernel
    for (const std::string name : {"llama3_rope", "qwen2_bias", "gpt2"}) {
        auto m = load_model(fixture(name), lo);
        const auto& c = m->config;
        for (double scale : {0.0, 0.25}) {  // the family's 1/sqrt(d) (a product's scale), a power of two (on q)
            m->config.attn_scale = scale;
            for (int64_t T : {3, 23, 70})
                for (int64_t block : {int64_t{0}, int64_t{5}}) {  // one block; query blocks against narrowed keys
                    CAPTURE(name);
                    CAPTURE(scale);
                    CAPTURE(T);
                    CAPTURE(block);
                    torch::manual_seed(T);
                    const int64_t B = 3;
                    const auto q0 = torch::randn({B, T, c.n_heads, c.d_head}), k0 = torch::randn({B, T, c.n_kv_heads, c.d_head}),
                               v0 = torch::randn({B, T, c.n_kv_heads, c.d_head});
                    const auto wt = torch::randn({B, T, c.d_model});
                    std::array<std::array<at::Tensor, 4>, 2> got;
                    for (int core = 0; core < 2; ++core) {
                        blocks::set_autograd_attention_core(core == 1);
                        auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
                        const auto out = blocks::attention(*m, 0, q, k, v, nullptr, nullptr, block, false);
                        (out * wt).sum().backward();
                        got[core] = {out.detach(), q.grad(), k.grad(), v.grad()};
                    }
                    blocks::set_autograd_attention_core(true);
                    for (int i = 0; i < 4; ++i) CHECK(same(got[1][i], got[0][i]));
                }
            m->config.attn_scale = c.attn_scale;
        }
    }
    at::set_num_threads(threads);
}

TEST_CASE("attention_only: a zero MLP left out keeps the logits' bits; a nonzero one is refused") {
    auto m = load_model(fixture("llama3_rope"));
    const auto tokens = tokens_for(*m, 2, 9, 3);
    ForwardOptions ao;
    ao.attention_only = true;
    CHECK_THROWS_AS(m->forward(tokens, nullptr, nullptr, ao), ConfigError);  // the fixture's MLPs are not zero
    for (auto& lw : m->weights.layers) lw.w_down.zero_();
    const auto full = m->forward(tokens);
    CHECK(torch::equal(m->forward(tokens, nullptr, nullptr, ao), full));
    Hooks hooks;
    hooks.capture(Point::kResidPost, [](int, const at::Tensor&) {});
    CHECK_THROWS_AS(m->forward(tokens, &hooks, nullptr, ao), ConfigError);  // no hooks
    m->weights.layers[0].w_down.requires_grad_(true);
    CHECK_THROWS_AS(m->forward(tokens, nullptr, nullptr, ao), ConfigError);  // a trainable w_down
}
