// Decoding under head interventions (probes/decoding/decoding.h): rows in lockstep equal the rows decoded
// alone and full recomputation; DeCoRe at alpha 0 is greedy decoding; JUICE on one head is a scale.
#include "decoding.h"
#include "errors.h"
#include "heads.h"
#include "hooks.h"
#include "model.h"
#include "testdata.h"

#include <doctest/doctest.h>
#include <torch/torch.h>

using namespace hs;

namespace {

// Plain greedy decoding with a KV cache, batch 1, the whole prompt prefilled in one forward.
std::vector<int64_t> plain_greedy(const Model& m, const std::vector<int64_t>& prompt, int64_t steps) {
    torch::NoGradGuard ng;
    KVCache cache;
    auto in = torch::tensor(prompt, torch::kLong).unsqueeze(0);
    std::vector<int64_t> out;
    for (int64_t t = 0; t < steps; ++t) {
        auto logits = m.forward(in, nullptr, &cache);
        out.push_back(logits[0][-1].argmax().item<int64_t>());
        in = torch::tensor({out.back()}, torch::kLong).unsqueeze(0);
    }
    return out;
}

// Last-position logits of `seq` recomputed whole (no cache) with `hooks`, rows of the batch = R copies.
at::Tensor recompute_last(const Model& m, const std::vector<int64_t>& seq, int64_t R, const Hooks& hooks) {
    torch::NoGradGuard ng;
    auto ids = torch::tensor(seq, torch::kLong).unsqueeze(0).expand({R, -1}).contiguous();
    return m.forward(ids, &hooks).select(1, -1).to(torch::kFloat);
}

// max |a - b| / max |a|: the KV-cached step and the whole recomputation run GEMMs of other shapes
// (one query row against T), so fp32 rounding differs in the last bits (here up to 2e-5 on logits
// of size 10-17, i.e. ~2e-6 of their scale); the tolerance is 1e-5 of the logits' scale.
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a - b).abs().max().item<double>() / a.abs().max().item<double>();
}

const std::vector<int64_t> kPrompt = {1, 403, 407, 261, 378, 429, 271, 126, 285, 307, 262, 122};

}  // namespace

TEST_CASE("decoding: DeCoRe with alpha 0 is plain greedy decoding, token for token") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    const auto plain = plain_greedy(*m, kPrompt, 24);
    auto spec = decore_spec({{1, 0}, {2, 3}, {4, 5}}, false, 0.0, 1e9);
    spec.max_new_tokens = 24;
    const auto out = decode_rows(*m, kPrompt, spec, {}, 5);
    CHECK(out.tokens == plain);
    CHECK(out.row_tokens[0] == plain);  // the base row is the plain model
    // With the entropy rule the masked row matters: the contrast is a different decode somewhere,
    // and every alpha is an entropy in [0, log V].
    auto spec_e = decore_spec({{1, 0}, {2, 3}, {4, 5}}, true, 0.0, 1e9);
    spec_e.max_new_tokens = 24;
    const auto e = decode_rows(*m, kPrompt, spec_e, {}, 5);
    REQUIRE(e.alphas.size() == e.tokens.size());
    for (double a : e.alphas) CHECK((a >= 0 && a <= std::log(static_cast<double>(m->config.vocab_size)) + 1e-9));
    // alpha_max caps it.
    auto spec_c = decore_spec({{1, 0}}, true, 0.0, 0.25);
    spec_c.max_new_tokens = 8;
    for (double a : decode_rows(*m, kPrompt, spec_c).alphas) CHECK(a <= 0.25);
}

TEST_CASE("decoding: two rows in one batched KV-cached decode equal each row alone and full recomputation") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    const int L = m->config.n_layers, H = m->config.n_heads;
    DecodingSpec two;
    two.rows = {DecodingRow{}, parse_decoding_row("zero-query:L1H0,L3H2", L, H)};
    two.max_new_tokens = 16, two.keep_logits = true, two.exact_rows = true;
    const auto both = decode_rows(*m, kPrompt, two, {}, 4);

    DecodingSpec base = two, masked = two;
    base.rows = {two.rows[0]};
    masked.rows = {two.rows[1]};
    const auto b = decode_rows(*m, kPrompt, base, {}, 4), k = decode_rows(*m, kPrompt, masked, {}, 4);
    CHECK(both.row_tokens[0] == b.row_tokens[0]);
    CHECK(both.row_tokens[1] == k.row_tokens[0]);
    CHECK(both.row_tokens[0] == plain_greedy(*m, kPrompt, 16));
    CHECK(both.row_tokens[0] != both.row_tokens[1]);  // the intervention changed the text (else the test says nothing)
    // One folded GEMM for both rows (the default, faster): the same text, logits equal up to rounding.
    DecodingSpec folded = two;
    folded.exact_rows = false;
    const auto f = decode_rows(*m, kPrompt, folded, {}, 4);
    CHECK(f.row_tokens == both.row_tokens);
    for (size_t t = 0; t < f.logits.size(); ++t) CHECK(rel_diff(both.logits[t], f.logits[t]) <= 1e-5);
    for (size_t t = 0; t < both.logits.size(); ++t) {
        CHECK(torch::allclose(both.logits[t][0], b.logits[t][0], 1e-5, 1e-5));
        CHECK(torch::allclose(both.logits[t][1], k.logits[t][0], 1e-5, 1e-5));
    }
    // Full recomputation of row 1's own text at every step, with its interventions on every position.
    Hooks hooks;
    for (auto [l, h] : two.rows[1].heads) hooks.intervene_q(HeadIntervention{l, h, 0, HeadOp::kZero, 0.0, {}});
    std::vector<int64_t> seq = kPrompt;
    for (size_t t = 0; t < both.logits.size(); ++t) {
        const auto full = recompute_last(*m, seq, 1, hooks)[0];
        CHECK(rel_diff(full, both.logits[t][1]) <= 1e-5);
        seq.push_back(both.row_tokens[1][t]);
    }
}

TEST_CASE("decoding: JUICE on one head in one layer equals scaling that head by 1 + A; in two layers it does not") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    const double A = 1.5;
    auto juice = juice_spec({{2, 1}}, A, {}, 0.0);
    juice.max_new_tokens = 12, juice.keep_logits = true;
    const auto j = decode_rows(*m, kPrompt, juice);
    DecodingSpec scaled;
    scaled.rows = {DecodingRow{{{2, 1}}, Intervention::kScale, 1 + A}};
    scaled.max_new_tokens = 12, scaled.keep_logits = true;
    const auto s = decode_rows(*m, kPrompt, scaled);
    CHECK(j.tokens == s.tokens);
    double worst = 0;
    for (size_t t = 0; t < j.logits.size(); ++t)
        worst = std::max(worst, (j.logits[t][1] - s.logits[t][0]).abs().max().item<double>());
    CHECK(worst < 1e-4);  // z + A z against (1 + A) z: equal up to rounding
    // Suppression is the same operation with the opposite sign.
    auto sup = juice_spec({}, 0.0, {{2, 1}}, 0.5);
    sup.max_new_tokens = 12, sup.keep_logits = true;
    DecodingSpec half = scaled;
    half.rows = {DecodingRow{{{2, 1}}, Intervention::kScale, 0.5}};
    const auto js = decode_rows(*m, kPrompt, sup), hs_ = decode_rows(*m, kPrompt, half);
    for (size_t t = 0; t < js.logits.size(); ++t) CHECK(torch::allclose(js.logits[t][1], hs_.logits[t][0], 1e-4, 1e-4));

    // Two layers: the later head sees the earlier change in row 1 but adds row 0's unchanged output,
    // so the result is not the two heads scaled by 1 + A.
    auto juice2 = juice_spec({{1, 0}, {3, 2}}, A, {}, 0.0);
    juice2.max_new_tokens = 12, juice2.keep_logits = true;
    const auto j2 = decode_rows(*m, kPrompt, juice2);
    DecodingSpec scaled2;
    scaled2.rows = {DecodingRow{{{1, 0}, {3, 2}}, Intervention::kScale, 1 + A}};
    scaled2.max_new_tokens = 12, scaled2.keep_logits = true;
    const auto s2 = decode_rows(*m, kPrompt, scaled2);
    const double diff = (j2.logits[0][1] - s2.logits[0][0]).abs().max().item<double>();
    MESSAGE("JUICE on L1H0 + L3H2 vs scaling both: first-step logits differ by " << diff);
    CHECK(diff > 1e-3);
    // And the JUICE row is still a full recomputation of its text: the peer row's outputs at every position.
    Hooks hooks;
    for (auto [l, h] : juice2.enhance) {
        HeadIntervention iv{l, h, 1, HeadOp::kAddPeer, A, {}};
        iv.peer = 0;
        hooks.intervene_z(iv);
    }
    std::vector<int64_t> seq = kPrompt;
    for (size_t t = 0; t < j2.logits.size(); ++t) {
        CHECK(rel_diff(recompute_last(*m, seq, 2, hooks)[1], j2.logits[t][1]) <= 1e-5);
        seq.push_back(j2.tokens[t]);
    }
}

TEST_CASE("decoding: row specs parse through the intervention vocabulary and refuse the rest") {
    const auto r = parse_decoding_row("scale=2:L0H1,L1H3", 2, 4);
    CHECK(r.mode == Intervention::kScale);
    CHECK(r.factor == 2.0);
    CHECK(format_decoding_row(r) == "scale=2:L0H1,L1H3");
    CHECK(format_decoding_row(parse_decoding_row("zero-query:L1H0", 2, 4)) == "zero-query:L1H0");
    CHECK(parse_decoding_row("none", 2, 4).mode == Intervention::kNone);
    CHECK_THROWS_WITH_AS(parse_decoding_row("mean:L0H1", 2, 4), doctest::Contains("expected zero, zero-query or scale"), UsageError);
    CHECK_THROWS_AS(parse_decoding_row("scale:L0H1", 2, 4), UsageError);
    CHECK_THROWS_AS(parse_decoding_row("zero=2:L0H1", 2, 4), UsageError);
    CHECK_THROWS_AS(parse_decoding_row("zero:L5H1", 2, 4), UsageError);
    CHECK_THROWS_AS(parse_decoding_row("L0H1", 2, 4), UsageError);
}
