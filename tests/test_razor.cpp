// RazorAttention's head selection (probes/razor.h): with two repeats its echo and induction scores
// are `detect`'s duplicate-token and induction stripes; on the CI induction toy the heads the
// training log proved causal rank first; the combined ordering keeps the paper's selection as a
// prefix; with GQA every query head of a KV group gets the group's score.
#include <doctest/doctest.h>

#include "attention_detectors.h"
#include "ci_toy.h"
#include "errors.h"
#include "heads.h"
#include "model.h"
#include "planted_model.h"
#include "razor.h"
#include "toy_tasks.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <set>

using namespace hs;
using nlohmann::json;

namespace {

RazorSettings toy_settings() {
    RazorSettings s;
    s.n_sequences = 8;
    s.seed = 3;
    s.token_lo = toy::kFirstAlnum;  // the alphanumerics the toy was trained on
    s.token_hi = toy::kVocabSize;
    return s;
}

// Flat indices l * H + h of `names` ("L1H0", ...).
std::set<int64_t> flat_set(const json& names, int64_t H) {
    std::set<int64_t> out;
    for (const auto& n : names) {
        int l = -1, h = -1;
        REQUIRE(parse_head_name(n.get<std::string>(), l, h));
        out.insert(l * H + h);
    }
    return out;
}

}  // namespace

TEST_CASE("razor: with two repeats, echo and induction are detect's duplicate-token and induction stripes") {
    auto m = load_model(ci_toy_model("induction"));
    RazorSettings s = toy_settings();
    s.repeats = 2;
    s.n_tokens = 20;
    s.max_rows = 3;  // rows split over several forwards
    auto r = razor_scores(*m, s);
    StripeInput in;
    in.seq_len = 20, in.batch = 8, in.seed = 3, in.token_lo = s.token_lo, in.token_hi = s.token_hi;
    auto tokens = repeated_random_tokens(*m, in);
    CHECK(torch::equal(r.tokens, tokens));
    auto st = stripe_scores(*m, tokens, 20, {StripeKind::kDuplicateToken, StripeKind::kInduction});
    // Same tokens and pattern, different batch splits (folded GEMMs): 1e-5.
    CHECK((r.echo - st[0].score).abs().max().item<double>() < 1e-5);
    CHECK((r.induction - st[1].score).abs().max().item<double>() < 1e-5);
    CHECK(r.induction.max().item<double>() > 0.3);  // not a comparison of zeros
}

TEST_CASE("razor: on the CI induction toy the causal induction heads rank first") {
    const std::string dir = ci_toy_model("induction");
    auto m = load_model(dir);
    const json gt = json::parse(read_text_file(path_join(dir, "training_log.json")))["ground_truth"];
    const int64_t H = m->config.n_heads;
    auto r = razor_scores(*m, toy_settings());  // |R| = (64 - 1) / 4 = 15, four repeats
    CHECK(r.n_tokens == 15);
    CHECK(r.tokens.sizes() == at::IntArrayRef({8, 61}));
    const auto want = flat_set(gt["induction_heads"], H);
    REQUIRE(!want.empty());
    const auto order = rank_heads(r.score, true);
    MESSAGE("ground truth " << gt["induction_heads"].dump() << "; razor order "
                            << format_heads(top_heads(r.score, 2 * static_cast<int64_t>(H))) << "; echo "
                            << r.echo << "; induction " << r.induction);
    for (size_t i = 0; i < want.size(); ++i) CHECK(want.count(order[i]) == 1);
    // The raw induction score separates them too: the weakest member beats the best other head.
    auto flat = r.induction.flatten();
    double weakest = 1e9, best_other = -1e9;
    for (int64_t j = 0; j < flat.numel(); ++j) {
        const double v = flat[j].item<double>();
        if (want.count(j)) weakest = std::min(weakest, v);
        else best_other = std::max(best_other, v);
    }
    CHECK(weakest > best_other + 0.1);
}

TEST_CASE("razor: the combined order keeps the paper's selection (top 1 % echo + top 14 % induction) as a prefix") {
    torch::manual_seed(5);
    // 10 layers x 10 heads, no GQA: N = 100 groups, so the paper keeps exactly the top 1 echo head
    // and the top 14 induction heads.
    auto echo = torch::rand({10, 10}), ind = torch::rand({10, 10});
    auto score = razor_combine(echo, ind, 10, 0.01, 0.14);
    std::set<int64_t> paper;
    for (auto i : rank_heads(echo, true)) { paper.insert(i); break; }
    auto ri = rank_heads(ind, true);
    for (int k = 0; k < 14; ++k) paper.insert(ri[k]);
    std::set<int64_t> kept;
    auto flat = score.flatten();
    for (int64_t j = 0; j < 100; ++j)
        if (flat[j].item<double>() >= 1.0) kept.insert(j);
    CHECK(kept == paper);
    CHECK(kept.size() >= 14);
    // ... and they are the first |kept| of the ordering.
    auto order = rank_heads(score, true);
    for (size_t i = 0; i < kept.size(); ++i) CHECK(kept.count(order[i]) == 1);
    // The best echo head alone scores N * 0.01 / 1 = 1; the best induction head 14.
    CHECK(flat[rank_heads(ind, true)[0]].item<double>() == doctest::Approx(14.0));
    // Hand example with GQA: L = 1, H = 4, K = 2 (N = 2), shares 0.5 / 0.5.
    auto e = torch::tensor({{0.1, 0.9, 0.2, 0.3}}), i = torch::tensor({{0.0, 0.1, 0.7, 0.2}});
    // Group maxima: echo (0.9, 0.3) -> ranks (0, 1); induction (0.1, 0.7) -> ranks (1, 0).
    // Group 0: max(2*0.5/1, 2*0.5/2) = 1; group 1: max(2*0.5/2, 2*0.5/1) = 1.
    auto sc = razor_combine(e, i, 2, 0.5, 0.5);
    CHECK(torch::allclose(sc, torch::ones({1, 4})));
    sc = razor_combine(e, i, 2, 0.5, 0.25);  // group 0: max(1, 0.25) = 1; group 1: max(0.5, 0.5) = 0.5
    CHECK(torch::allclose(sc, torch::tensor({{1.0f, 1.0f, 0.5f, 0.5f}})));
}

TEST_CASE("razor: with GQA the query heads of a KV group share the group's score") {
    auto m = planted::model(21, 0.1, 0.3);  // 4 query heads on 2 kv heads, context 64
    m->config.bos_id = 0;
    RazorSettings s;
    s.n_sequences = 2;
    auto r = razor_scores(*m, s);
    CHECK(r.n_tokens == 15);
    const int g = m->config.kv_group();
    REQUIRE(g == 2);
    for (int l = 0; l < m->config.n_layers; ++l)
        for (int j = 0; j < m->config.n_kv_heads; ++j) {
            CHECK(r.score[l][j * g].item<float>() == r.score[l][j * g + 1].item<float>());
            // The raw scores differ within the group (the max is what the group gets).
            CHECK(r.echo[l][j * g].item<float>() != r.echo[l][j * g + 1].item<float>());
        }
    CHECK(torch::equal(r.score, razor_combine(r.echo, r.induction, 2, 0.01, 0.14)));
}

TEST_CASE("razor: bad settings name their parameter") {
    auto m = planted::model(21, 0.1, 0.3);
    m->config.bos_id = 0;
    auto param_of = [&](const RazorSettings& s) {
        try {
            razor_scores(*m, s);
        } catch (const Error& e) {
            return e.param();
        }
        return std::string("no error");
    };
    RazorSettings s;
    s.repeats = 1;
    CHECK(param_of(s) == "repeats");
    s = {};
    s.n_tokens = 16;  // 1 + 4 * 16 = 65 > 64
    CHECK(param_of(s) == "n_tokens");
    s = {};
    s.n_tokens = 15;
    CHECK(param_of(s) == "no error");
    s.n_sequences = 0;
    CHECK(param_of(s) == "n_sequences");
    s = {};
    s.echo_share = 1.5;
    CHECK(param_of(s) == "echo_share");
    s = {};
    s.token_lo = 10, s.token_hi = 5;
    CHECK(param_of(s) == "token_range");
}
