// RazorAttention's head selection (probes/needle/kv/razor.h): with two repeats its echo and induction scores
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

#include <cmath>
#include <memory>
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

// ---- The reference preset (golden-stick@a50ddc93): selection rule, scoring, toy ----

namespace {

// [L, K] bool from a list of (layer, kv head).
at::Tensor bools(int64_t L, int64_t K, std::initializer_list<std::pair<int, int>> on) {
    auto t = torch::zeros({L, K}, torch::kBool);
    for (auto [l, h] : on) t[l][h] = true;
    return t;
}

std::unique_ptr<Model> family(const std::string& name) {
    auto m = load_model(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + name);
    if (m->config.bos_id < 0) m->config.bos_id = 0;  // gpt2's fixture config names none
    return m;
}

// The reference's echo / induction [L, H] recomputed the slow way from the q and k the forward
// hands to attention: float64 S x S per head, the mask loop of attention_wrappers.py:105-110
// written out, mean over S^2. Also checks that the causal softmax of the same q k^T * scale is the
// model's own attn.pattern (so q, k and the scale are the ones the model attends with).
std::pair<at::Tensor, at::Tensor> slow_reference(const Model& m, const at::Tensor& row, int64_t n) {
    const int64_t L = m.config.n_layers, H = m.config.n_heads, g = m.config.kv_group(), S = row.size(0);
    std::vector<at::Tensor> qs(L), ks(L), pats(L);
    Hooks hooks;
    hooks.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { qs[l] = x[0].to(torch::kDouble); });
    hooks.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { ks[l] = x[0].to(torch::kDouble); });
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& x) { pats[l] = x[0].to(torch::kDouble); });
    torch::NoGradGuard ng;
    m.forward(row.unsqueeze(0), &hooks);
    const double scale = m.config.attn_scale > 0 ? m.config.attn_scale : 1.0 / std::sqrt(double(m.config.d_head));
    auto echo = torch::zeros({L, H}, torch::kDouble), ind = torch::zeros({L, H}, torch::kDouble);
    auto future = torch::ones({S, S}, torch::kDouble).triu(1);
    for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h) {
            auto sc = torch::matmul(qs[l].select(1, h), ks[l].select(1, h / g).t()) * scale;  // [S, S]
            auto causal = torch::softmax(sc.masked_fill(future.to(torch::kBool), -INFINITY), -1);
            CHECK((causal - pats[l][h]).abs().max().item<double>() < 1e-4);
            auto p = torch::softmax(sc + future * -1e-5, -1);
            auto pa = p.accessor<double, 2>();
            double e = 0, i_sum = 0;
            for (int64_t i = 1; i < S; ++i) {
                if (i / n == 0) continue;
                for (int64_t j = i % n; j < i; j += n) e += pa[i][j], i_sum += pa[i][j + 1];
            }
            echo[l][h] = e / double(S * S), ind[l][h] = i_sum / double(S * S);
        }
    return {echo, ind};
}

}  // namespace

TEST_CASE("razor reference: round half to even, as Python's round") {
    CHECK(round_half_even(0.5) == 0);
    CHECK(round_half_even(1.5) == 2);
    CHECK(round_half_even(2.5) == 2);
    CHECK(round_half_even(3.5) == 4);
    CHECK(round_half_even(2.6) == 3);
    CHECK(round_half_even(1024 * 0.14) == 143);  // Llama-2-7B's induction k
    CHECK(round_half_even(1024 * 0.01) == 10);
    CHECK(round_half_even(50 * 0.01) == 0);      // no echo head at N = 50
    CHECK(round_half_even(250 * 0.01) == 2);     // 2.5 -> 2
    CHECK(round_half_even(150 * 0.01) == 2);     // 1.5 -> 2
    CHECK(round_half_even(8 * 0.14) == 1);       // the CI toys
}

TEST_CASE("razor reference: the selection rule on hand-made tables") {
    // L = 4, K = 5 (N = 20). echo share 0.1 -> k = 2; induction share 0.2 -> k = 4.
    auto echo = torch::full({4, 5}, 0.01);
    echo[1][2] = 0.9, echo[3][0] = 0.8;  // the echo top 2: layers 1 and 3
    auto ind = torch::full({4, 5}, 0.02);
    ind[0][0] = 0.5, ind[2][4] = 0.4, ind[3][1] = 0.3, ind[0][3] = 0.2;  // the induction top 4
    SUBCASE("early return: all induction heads + the echo heads of the first layer with any") {
        auto p = razor_select(echo, ind, 0.1, 0.2, RazorPreset::kReference);
        CHECK(p.echo_k == 2);
        CHECK(p.induction_k == 4);
        CHECK(torch::equal(p.echo, bools(4, 5, {{1, 2}, {3, 0}})));
        CHECK(torch::equal(p.induction, bools(4, 5, {{0, 0}, {2, 4}, {3, 1}, {0, 3}})));
        CHECK(torch::equal(p.kv, bools(4, 5, {{0, 0}, {2, 4}, {3, 1}, {0, 3}, {1, 2}})));  // (3, 0) dropped
    }
    SUBCASE("paper: the full union") {
        auto p = razor_select(echo, ind, 0.1, 0.2, RazorPreset::kPaper);
        CHECK(torch::equal(p.kv, bools(4, 5, {{0, 0}, {2, 4}, {3, 1}, {0, 3}, {1, 2}, {3, 0}})));
    }
    SUBCASE("the early return merges the first echo layer even when it has induction heads") {
        echo[1][2] = 0.01, echo[0][4] = 0.9;  // echo top 2: (0, 4) and (3, 0)
        auto p = razor_select(echo, ind, 0.1, 0.2, RazorPreset::kReference);
        CHECK(torch::equal(p.kv, bools(4, 5, {{0, 0}, {2, 4}, {3, 1}, {0, 3}, {0, 4}})));
    }
    SUBCASE("membership by value: ties with the k-th value are kept") {
        ind[1][1] = 0.2, ind[2][2] = 0.2;  // three heads tie at the 4th value
        auto p = razor_select(echo, ind, 0.1, 0.2, RazorPreset::kPaper);
        CHECK(p.induction_k == 4);
        CHECK(p.induction.sum().item<int64_t>() == 6);
        CHECK(torch::equal(p.induction, bools(4, 5, {{0, 0}, {2, 4}, {3, 1}, {0, 3}, {1, 1}, {2, 2}})));
        // A tie at the top of a k = 1 list keeps both.
        auto e2 = torch::zeros({4, 5});
        e2[0][1] = 1.0, e2[2][3] = 1.0;
        auto p2 = razor_select(e2, ind, 0.05, 0.2, RazorPreset::kReference);  // k = round(1.0) = 1
        CHECK(p2.echo_k == 1);
        CHECK(torch::equal(p2.echo, bools(4, 5, {{0, 1}, {2, 3}})));
        CHECK(torch::equal(p2.kv, p2.induction | bools(4, 5, {{0, 1}})));  // only layer 0's echo survives
    }
    SUBCASE("banker's rounding of k") {
        // N = 20: share 0.125 -> 2.5 -> 2; 0.175 -> 3.5 -> 4; 0.075 -> 1.5 -> 2.
        auto v = torch::arange(20, torch::kDouble).flip(0).view({4, 5});  // distinct values
        CHECK(razor_select(v, v, 0.125, 0.175, RazorPreset::kPaper).echo_k == 2);
        CHECK(razor_select(v, v, 0.125, 0.175, RazorPreset::kPaper).echo.sum().item<int64_t>() == 2);
        CHECK(razor_select(v, v, 0.125, 0.175, RazorPreset::kPaper).induction.sum().item<int64_t>() == 4);
        CHECK(razor_select(v, v, 0.075, 0.075, RazorPreset::kPaper).echo.sum().item<int64_t>() == 2);
        // headscope's rank rule takes floor(N share) there: 2, 3, 1.
        CHECK(razor_select(v, v, 0.125, 0.175, RazorPreset::kHeadscope).echo.sum().item<int64_t>() == 2);
        CHECK(razor_select(v, v, 0.125, 0.175, RazorPreset::kHeadscope).induction.sum().item<int64_t>() == 3);
        CHECK(razor_select(v, v, 0.075, 0.075, RazorPreset::kHeadscope).echo.sum().item<int64_t>() == 1);
    }
    SUBCASE("no echo head selected: the induction heads only") {
        // L = 10, K = 5 (N = 50): round(50 * 0.01) = round(0.5) = 0 echo heads at the defaults.
        torch::manual_seed(7);
        auto e = torch::rand({10, 5}), i = torch::rand({10, 5});
        auto p = razor_select(e, i, 0.01, 0.14, RazorPreset::kReference);
        CHECK(p.echo_k == 0);
        CHECK(p.induction_k == 7);
        CHECK(!p.echo.any().item<bool>());
        CHECK(torch::equal(p.kv, p.induction));
        CHECK(p.kv.sum().item<int64_t>() == 7);
        auto top7 = rank_heads(i, true);
        for (int k = 0; k < 7; ++k) CHECK(p.kv.flatten()[top7[k]].item<bool>());
    }
}

TEST_CASE("razor reference: presets parse by name; a bad name lists the good ones") {
    CHECK(parse_razor_preset("reference") == RazorPreset::kReference);
    CHECK(parse_razor_preset("paper") == RazorPreset::kPaper);
    CHECK(parse_razor_preset("headscope") == RazorPreset::kHeadscope);
    try {
        parse_razor_preset("golden");
        FAIL("no error");
    } catch (const UsageError& e) {
        CHECK(std::string(e.what()).find("want headscope, reference or paper") != std::string::npos);
        CHECK(e.param().empty());  // the tool's with_flag("--razor-preset", ...) puts the flag in front
    }
}

TEST_CASE("razor reference: the scores equal a slow recomputation from the captured q and k") {
    for (std::string name : {"gpt2", "olmo2", "qwen3"}) {
        CAPTURE(name);
        auto m = family(name);
        RazorSettings s;
        s.seed = 11;
        auto r = razor_reference_scores(*m, s);
        const int64_t n = (m->config.max_seq_len - 1) / 4;  // gpt2: 7 (context 32); olmo2, qwen3: 15
        CHECK(r.n_tokens == n);
        REQUIRE(r.tokens.sizes() == at::IntArrayRef({1, 1 + 4 * n}));
        // [BOS, R, R, R, R], R drawn from the whole vocabulary (< 10000 ids)
        auto row = r.tokens[0];
        CHECK(row[0].item<int64_t>() == m->config.bos_id);
        for (int c = 1; c < 4; ++c) CHECK(torch::equal(row.narrow(0, 1 + c * n, n), row.narrow(0, 1, n)));
        CHECK(row.max().item<int64_t>() < m->config.vocab_size);
        auto [echo, ind] = slow_reference(*m, row, n);
        const double de = (r.echo.to(torch::kDouble) - echo).abs().max().item<double>();
        const double di = (r.induction.to(torch::kDouble) - ind).abs().max().item<double>();
        MESSAGE(name << ": max |diff| echo " << de << ", induction " << di << "; echo max "
                     << echo.max().item<double>() << ", induction max " << ind.max().item<double>());
        CHECK(de < 1e-5);
        CHECK(di < 1e-5);
        CHECK(torch::allclose(r.echo.to(torch::kDouble), echo, 1e-4, 1e-7));
        CHECK(torch::allclose(r.induction.to(torch::kDouble), ind, 1e-4, 1e-7));
        CHECK(ind.min().item<double>() > 0);  // not a comparison of zeros
        auto sel = razor_reference_selection(*m, s, RazorPreset::kReference);
        CHECK(torch::equal(sel.scores.echo, r.echo));
        // GQA: per KV head the max over its query heads; every query head of a kept group is kept.
        const int64_t L = m->config.n_layers, K = m->config.n_kv_heads, g = m->config.kv_group();
        CHECK(torch::equal(sel.echo, std::get<0>(r.echo.view({L, K, g}).max(2))));
        CHECK(torch::equal(sel.induction, std::get<0>(r.induction.view({L, K, g}).max(2))));
        CHECK(torch::equal(sel.full, sel.pick.kv.repeat_interleave(g, 1)));
        // The order puts the selection first.
        const int64_t kept = sel.full.sum().item<int64_t>();
        CHECK(kept >= 1);
        auto order = rank_heads(sel.order, true);
        for (int64_t i = 0; i < kept; ++i) CHECK(sel.full.flatten()[order[i]].item<bool>());
    }
}

TEST_CASE("razor reference: blocks of query rows change nothing") {
    auto m = family("olmo2");
    at::Tensor q, k;
    Hooks hooks;
    hooks.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { if (l == 1) q = x[0]; });
    hooks.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { if (l == 1) k = x[0]; });
    RazorSettings s;
    auto r = razor_reference_scores(*m, s);
    torch::NoGradGuard ng;
    m->forward(r.tokens, &hooks);
    const double scale = 1.0 / std::sqrt(double(m->config.d_head));
    auto [e1, i1] = razor_reference_layer(q, k, 15, scale);
    auto [e2, i2] = razor_reference_layer(q, k, 15, scale, 1);  // one row per block
    auto [e3, i3] = razor_reference_layer(q, k, 15, scale, 4 * 61 * 7);  // 7 rows per block, a ragged last one
    // Float32 GEMMs of other shapes: rounding only.
    CHECK(torch::allclose(e1, e2, 1e-5, 1e-12));
    CHECK(torch::allclose(i1, i2, 1e-5, 1e-12));
    CHECK(torch::allclose(e1, e3, 1e-5, 1e-12));
    CHECK(torch::allclose(i1, i3, 1e-5, 1e-12));
    CHECK(torch::allclose(r.echo[1].to(torch::kDouble), e1, 1e-5, 1e-9));
}

TEST_CASE("razor reference: at the reference's size (S = 10001) the -1e-5 mask matches the closed form") {
    // q = 0: every score is 0, future keys -1e-5, so row i has weight 1 on its i + 1 past keys and
    // e^-1e-5 on its S - 1 - i future ones. Every mask entry is a past key, i // n of each kind a row.
    const int64_t n = 2500, S = 1 + 4 * n, H = 2;
    auto q = torch::zeros({S, H, 4}), k = torch::randn({S, 1, 4});
    auto [e, i] = razor_reference_layer(q, k, n, 0.5);
    double want = 0;
    const double w = std::exp(-1e-5);
    for (int64_t r = n; r < S; ++r) want += double(r / n) / (double(r + 1) + double(S - 1 - r) * w);
    want /= double(S) * double(S);
    MESSAGE("closed form " << want << ", computed " << e[0].item<double>() << " / " << i[1].item<double>()
                           << "; a causal softmax would give " << [&] {
                                  double c = 0;
                                  for (int64_t r = n; r < S; ++r) c += double(r / n) / double(r + 1);
                                  return c / (double(S) * double(S));
                              }());
    for (int h = 0; h < H; ++h) {
        CHECK(e[h].item<double>() == doctest::Approx(want).epsilon(1e-5));
        CHECK(i[h].item<double>() == doctest::Approx(want).epsilon(1e-5));
    }
}

TEST_CASE("razor reference: on the CI induction toy the selection is a causal induction head") {
    const std::string dir = ci_toy_model("induction");
    auto m = load_model(dir);
    const json gt = json::parse(read_text_file(path_join(dir, "training_log.json")))["ground_truth"];
    const int64_t H = m->config.n_heads;
    const auto want = flat_set(gt["induction_heads"], H);
    REQUIRE(want.size() == 3);
    RazorSettings s = toy_settings();  // the toy's alphanumerics, 8 sequences of |R| = 15
    auto sel = razor_reference_selection(*m, s, RazorPreset::kReference);
    MESSAGE("reference preset on the toy: echo " << sel.echo << "; induction " << sel.induction << "; order "
                                                 << format_heads(top_heads(sel.order, 2 * H)));
    // N = 8 heads: round(0.08) = 0 echo heads, round(1.12) = 1 induction head.
    CHECK(sel.pick.echo_k == 0);
    CHECK(sel.pick.induction_k == 1);
    REQUIRE(sel.full.sum().item<int64_t>() == 1);
    CHECK(want.count(rank_heads(sel.order, true)[0]) == 1);
    CHECK(torch::equal(razor_reference_selection(*m, s, RazorPreset::kPaper).full, sel.full));  // no echo: same
    // The reference's induction score ranks the three causal heads first.
    const auto order = rank_heads(sel.induction, true);
    for (size_t i = 0; i < want.size(); ++i) CHECK(want.count(order[i]) == 1);
    // A budget of three induction heads (k = round(8 * 0.375) = 3) selects exactly them.
    s.induction_share = 0.375;
    auto three = razor_reference_selection(*m, s, RazorPreset::kReference);
    std::set<int64_t> got;
    for (int64_t j = 0; j < three.full.numel(); ++j)
        if (three.full.flatten()[j].item<bool>()) got.insert(j);
    CHECK(got == want);
}
