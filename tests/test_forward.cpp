// The forward pass against independent references (shared/testdata), and the capture and
// intervention points against the identities they must satisfy.
#include <doctest/doctest.h>

#include "model.h"
#include "safetensors.h"
#include "testdata.h"

#include <torch/torch.h>

using namespace hs;
using namespace torch::indexing;

namespace {

// Reference logits within 1e-4 absolute (fp32), as the testdata README asks.
constexpr double kLogitTol = 1e-4;

void check_reference(const Model& m, const std::string& ref_path) {
    SafetensorsFile ref(ref_path);
    auto tokens = ref.get("tokens").to(torch::kLong);      // [T]
    auto want = ref.get("logits").to(torch::kFloat);       // [T, V]
    torch::NoGradGuard ng;
    auto got = m.forward(tokens.unsqueeze(0))[0];          // [T, V]
    REQUIRE(got.sizes() == want.sizes());
    const double err = (got - want).abs().max().item<double>();
    MESSAGE(ref_path << ": max |logit - reference| = " << err);
    CHECK(err < kLogitTol);
    // Greedy choices agree wherever the reference continued greedily (positions after the prompt).
    auto argmax = got.argmax(-1);
    CHECK(torch::equal(argmax.index({Slice(None, -1)}).index({Slice(-20, None)}),
                       tokens.index({Slice(1, None)}).index({Slice(-20, None)})));
}

}  // namespace

TEST_CASE("stories260K (llama2.c .bin) logits match the reference implementation") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    CHECK(m->config.n_layers == 5);
    CHECK(m->config.n_kv_heads == 4);
    check_reference(*m, td + "/stories260K/reference_park.safetensors");
    check_reference(*m, td + "/stories260K/reference_cat.safetensors");
}

TEST_CASE("tinystories-656k (HF Llama, lm_head-only tied storage) logits match the reference") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/tinystories-656k");
    CHECK(m->config.tie_embeddings);
    CHECK(m->weights.embed.is_same(m->weights.unembed));
    check_reference(*m, td + "/tinystories-656k/reference_bos.safetensors");
}

TEST_CASE("aidreams260K loads and gives finite logits") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/aidreams260K/aidreams260K.bin");
    CHECK(m->config.n_heads == 4);
    torch::NoGradGuard ng;
    auto logits = m->forward(torch::arange(1, 40, torch::kLong).unsqueeze(0));
    CHECK(torch::isfinite(logits).all().item<bool>());
}

TEST_CASE("KV-cached decoding equals the full forward") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    torch::NoGradGuard ng;
    auto tokens = torch::randint(3, 512, {2, 24}, torch::kLong);
    auto full = m->forward(tokens);
    KVCache cache;
    auto a = m->forward(tokens.index({Slice(), Slice(0, 10)}), nullptr, &cache);
    std::vector<at::Tensor> parts = {a};
    for (int t = 10; t < 24; ++t) parts.push_back(m->forward(tokens.index({Slice(), Slice(t, t + 1)}), nullptr, &cache));
    auto inc = torch::cat(parts, 1);
    CHECK((inc - full).abs().max().item<double>() < 1e-4);
    CHECK(cache.length() == 24);
}

TEST_CASE("KV cache: appends in place, copies never share buffers, replaced or cut tensors are respected") {
    torch::manual_seed(3);
    auto kv = [](int64_t T) { return torch::randn({2, T, 3, 4}); };  // [B, T, K, d]
    const auto a = kv(3), b = kv(2), c = kv(1), e = kv(2), a0 = a.clone();
    KVCache cache;  // no reserve: the buffer grows (doubles) on the second append
    cache.append(0, a, a * 2);
    auto [k, v] = cache.append(0, b, b * 2);
    CHECK(torch::equal(k, torch::cat({a, b}, 1)));
    CHECK(torch::equal(v, torch::cat({a, b}, 1) * 2));
    CHECK(cache.length() == 5);
    // A copy appends into its own buffer: neither sees the other's positions.
    KVCache copy = cache;
    copy.append(0, c, c);
    cache.append(0, e, e * 2);
    CHECK(torch::equal(copy.k[0], torch::cat({a, b, c}, 1)));
    CHECK(torch::equal(cache.k[0], torch::cat({a, b, e}, 1)));
    // A tensor put in by hand (a kept prefix) is copied into a fresh buffer by the next append.
    cache.k[0] = a.narrow(1, 0, 2), cache.v[0] = a.narrow(1, 0, 2) * 2;
    cache.append(0, c, c * 2);
    CHECK(torch::equal(cache.k[0], torch::cat({a.narrow(1, 0, 2), c}, 1)));
    CHECK(torch::equal(a, a0));  // the hand-made tensor itself is untouched
    // truncate keeps the first positions; the next append writes after them.
    cache.truncate(1);
    cache.append(0, e, e * 2);
    CHECK(torch::equal(cache.k[0], torch::cat({a.narrow(1, 0, 1), e}, 1)));
    CHECK(torch::equal(cache.v[0], torch::cat({a.narrow(1, 0, 1), e}, 1) * 2));
    // A row expanded to a batch (stride 0) becomes real rows on the next append.
    KVCache one;
    one.reserve(8);
    one.append(0, a.narrow(0, 0, 1), a.narrow(0, 0, 1));
    one.k[0] = one.k[0].expand({2, -1, -1, -1}), one.v[0] = one.v[0].expand({2, -1, -1, -1});
    one.append(0, b, b);
    CHECK(torch::equal(one.k[0], torch::cat({a.narrow(0, 0, 1).expand({2, -1, -1, -1}), b}, 1)));
}

TEST_CASE("capture points: causal patterns, rows sum to one, head outputs sum to attn_out") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/tinystories-656k");
    const int L = m->config.n_layers, H = m->config.n_heads;
    Hooks hooks;
    std::vector<at::Tensor> pattern(L), head_out(L), attn_out(L), q(L), k(L);
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& x) { pattern[l] = x.clone(); });
    hooks.capture(Point::kAttnHeadOut, [&](int l, const at::Tensor& x) { head_out[l] = x.clone(); });
    hooks.capture(Point::kAttnOut, [&](int l, const at::Tensor& x) { attn_out[l] = x.clone(); });
    hooks.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { q[l] = x.clone(); });
    hooks.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { k[l] = x.clone(); });
    torch::NoGradGuard ng;
    auto tokens = torch::randint(3, 2048, {2, 17}, torch::kLong);
    m->forward(tokens, &hooks);
    for (int l = 0; l < L; ++l) {
        REQUIRE(pattern[l].sizes() == std::vector<int64_t>{2, H, 17, 17});
        CHECK(q[l].sizes() == std::vector<int64_t>{2, 17, H, m->config.d_head});
        CHECK(k[l].sizes() == std::vector<int64_t>{2, 17, m->config.n_kv_heads, m->config.d_head});
        auto upper = pattern[l].triu(1);
        CHECK(upper.abs().max().item<double>() == 0.0);
        CHECK((pattern[l].sum(-1) - 1).abs().max().item<double>() < 1e-5);
        CHECK((head_out[l].sum(2) - attn_out[l]).abs().max().item<double>() < 1e-5);
    }
}

TEST_CASE("points nobody asked for are not materialised") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/tinystories-656k");
    Hooks hooks;
    int z_calls = 0;
    hooks.capture(Point::kAttnZ, [&](int, const at::Tensor&) { ++z_calls; }, 1);
    CHECK(!hooks.wants(Point::kAttnPattern, 0));
    CHECK(!hooks.wants(Point::kAttnZ, 0));
    CHECK(hooks.wants(Point::kAttnZ, 1));
    torch::NoGradGuard ng;
    m->forward(torch::randint(3, 2048, {1, 8}, torch::kLong), &hooks);
    CHECK(z_calls == 1);
}

TEST_CASE("zero-query intervention gives uniform attention over the causal prefix") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    Hooks hooks;
    hooks.intervene_q({2, 5, -1, HeadOp::kZero, 0.0, {}});
    at::Tensor p;
    hooks.capture(Point::kAttnPattern, [&](int, const at::Tensor& x) { p = x.clone(); }, 2);
    torch::NoGradGuard ng;
    const int64_t T = 12;
    m->forward(torch::randint(3, 512, {1, T}, torch::kLong), &hooks);
    auto want = torch::tril(torch::ones({T, T})) / torch::arange(1, T + 1, torch::kFloat).unsqueeze(1);
    CHECK((p[0][5] - want).abs().max().item<double>() < 1e-6);
    CHECK((p[0][4] - want).abs().max().item<double>() > 1e-2);  // other heads untouched
}

TEST_CASE("an intervention on batch row 1 leaves row 0 bit-identical to an unbatched run") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    torch::NoGradGuard ng;
    auto seq = torch::randint(3, 512, {1, 20}, torch::kLong);
    auto alone = m->forward(seq)[0];
    Hooks hooks;
    hooks.intervene_z({1, 3, 1, HeadOp::kZero, 0.0, {}});
    hooks.intervene_q({3, 0, 1, HeadOp::kZero, 0.0, {}});
    auto both = m->forward(torch::cat({seq, seq}, 0), &hooks);
    CHECK(torch::equal(both[0], alone));
    CHECK((both[1] - alone).abs().max().item<double>() > 1e-3);  // row 1 really changed
    // Scaling z by 1 is the identity; by 0 equals zeroing.
    Hooks s1, s0, zero;
    s1.intervene_z({1, 3, -1, HeadOp::kScale, 1.0, {}});
    s0.intervene_z({1, 3, -1, HeadOp::kScale, 0.0, {}});
    zero.intervene_z({1, 3, -1, HeadOp::kZero, 0.0, {}});
    CHECK(torch::equal(m->forward(seq, &s1)[0], alone));
    CHECK(torch::equal(m->forward(seq, &s0), m->forward(seq, &zero)));
}

TEST_CASE("replace-z with the head's own z is the identity; mean-query replaces the query") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    torch::NoGradGuard ng;
    auto seq = torch::randint(3, 512, {1, 16}, torch::kLong);
    Hooks cap;
    at::Tensor z;
    cap.capture(Point::kAttnZ, [&](int, const at::Tensor& x) { z = x.clone(); }, 2);
    auto base = m->forward(seq, &cap);
    Hooks rep;
    rep.intervene_z({2, 1, -1, HeadOp::kReplace, 0.0, z[0].index({Slice(), 1})});  // [T, d]
    CHECK((m->forward(seq, &rep) - base).abs().max().item<double>() < 1e-6);
    Hooks mq;
    auto qv = torch::randn({m->config.d_head});
    mq.intervene_q({2, 1, -1, HeadOp::kReplace, 0.0, qv});
    at::Tensor q;
    mq.capture(Point::kAttnQ, [&](int, const at::Tensor& x) { q = x.clone(); }, 2);
    m->forward(seq, &mq);
    CHECK((q[0].index({Slice(), 1}) - qv.unsqueeze(0)).abs().max().item<double>() == 0.0);
}
