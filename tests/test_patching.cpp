// Activation, attribution and path patching (probes/ablation/patching.h). References: a hand-made
// intervene_z forward per pair (exact patching), exact patching itself where the metric is linear
// in the patched activation (attribution), and the CI toy induction model's training_log.json
// "ground_truth" (which heads form the circuit) for what the methods must find.
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "errors.h"
#include "heads.h"
#include "hooks.h"
#include "model.h"
#include "patching.h"
#include "planted_model.h"
#include "report.h"
#include "store.h"
#include "test_util.h"
#include "tmpdir.h"
#include "tokenizer.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

using namespace hs;
using nlohmann::json;

namespace {

std::string toy() { return ci_toy_model("induction"); }
json ground_truth() { return json::parse(read_text_file(path_join(toy(), "training_log.json")))["ground_truth"]; }
std::string data_file(const std::string& name) { return std::string(HS_SOURCE_DIR) + "/datasets/patching/" + name; }

Head head_of(const std::string& name) {
    int l = -1, h = -1;
    REQUIRE(parse_head_name(name, l, h));
    return {l, h};
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// Spearman's rank correlation of two score vectors (no ties expected).
double spearman(const at::Tensor& a, const at::Tensor& b) {
    auto ranks = [](const at::Tensor& x) {
        auto order = std::get<1>(x.to(torch::kDouble).flatten().sort());
        auto r = torch::empty_like(order, torch::kDouble);
        r.index_put_({order}, torch::arange(order.size(0), torch::kDouble));
        return r;
    };
    auto ra = ranks(a), rb = ranks(b);
    ra = ra - ra.mean(), rb = rb - rb.mean();
    return ((ra * rb).sum() / (ra.norm() * rb.norm())).item<double>();
}

// One layer, attention only (the MLP's down projection is 0), and norms that are the identity: with
// eps = 1e12 and weights 1e6, x * 1e6 / sqrt(mean(x^2) + 1e12) = x to fp32 rounding for |x| ~ 1.
// The metric (a logit difference) is then linear in every head's z and head-out.
std::unique_ptr<Model> linear_model() {
    auto m = planted::model(5, 0.2, 0.0);
    m->config.n_layers = 1;
    m->weights.layers.resize(1);
    m->config.norm_eps = 1e12;
    m->weights.final_norm_w = torch::full({planted::kD}, 1e6);
    m->weights.layers[0].attn_norm_w = torch::full({planted::kD}, 1e6);
    m->weights.layers[0].mlp_norm_w = torch::full({planted::kD}, 1e6);
    return m;
}

PatchPairs random_pairs(int64_t N, int64_t T, int64_t V, uint64_t seed) {
    torch::manual_seed(seed);
    PatchPairs p;
    p.clean = torch::randint(V, {N, T}, torch::kLong);
    p.corrupt = p.clean.clone();
    p.corrupt.narrow(1, T / 2, T - T / 2).random_(V);  // the second half differs
    p.lengths.assign(N, T);
    for (int64_t i = 0; i < N; ++i) p.answer.push_back((7 * i + 3) % V), p.wrong.push_back((5 * i + 11) % V);
    return p;
}

}  // namespace

TEST_CASE("exact patching of one head equals a hand-made intervene_z forward per pair") {
    auto m = load_model(toy());
    auto tok = find_tokenizer_for_model(toy(), m->config.vocab_size);
    auto pairs = read_patch_pairs(data_file("toy-induction-fresh-half.jsonl"), *m, tok.get(), MetricKind::kLogitDiff);
    PatchOptions o;
    o.metric = MetricKind::kLogitDiff;
    o.max_rows = 40;  // several forwards per layer
    auto r = exact_patching(*m, pairs, o);
    const int64_t N = pairs.rows(), H = m->config.n_heads;
    CHECK(r.scores.sizes() == at::IntArrayRef({m->config.n_layers, H}));
    torch::NoGradGuard ng;
    std::vector<at::Tensor> z(m->config.n_layers);
    Hooks cap;
    cap.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = x.clone(); });
    m->forward(pairs.clean, &cap);
    auto metric = [&](const at::Tensor& logits) {
        double s = 0;
        for (int64_t i = 0; i < N; ++i) {
            auto row = logits[i][pairs.lengths[i] - 1].to(torch::kDouble);
            s += (row[pairs.answer[i]] - row[pairs.wrong[i]]).item<double>();
        }
        return s / N;
    };
    CHECK(r.metric_clean == doctest::Approx(metric(m->forward(pairs.clean))).epsilon(1e-6));
    CHECK(r.metric_corrupt == doctest::Approx(metric(m->forward(pairs.corrupt))).epsilon(1e-6));
    for (auto [l, h] : std::vector<Head>{{0, 0}, {1, static_cast<int>(H - 1)}, head_of(ground_truth()["induction_heads"][0])}) {
        Hooks hk;
        for (int64_t i = 0; i < N; ++i) hk.intervene_z({l, h, i, HeadOp::kReplace, 0.0, z[l][i].select(1, h).clone()});
        const double want = metric(m->forward(pairs.corrupt, &hk));
        CHECK(r.patched[l][h].item<double>() == doctest::Approx(want).epsilon(1e-5));
        CHECK(r.scores[l][h].item<double>() ==
              doctest::Approx((want - r.metric_corrupt) / (r.metric_clean - r.metric_corrupt)).epsilon(1e-5));
    }
}

TEST_CASE("attribution patching equals exact patching where the metric is linear in the site (1 layer, attention only, no norm)") {
    auto m = linear_model();
    auto pairs = random_pairs(5, 12, planted::kV, 3);
    for (Point site : {Point::kAttnZ, Point::kAttnHeadOut})
        for (bool each : {false, true}) {
            CAPTURE(patch_site_name(site));
            CAPTURE(each);
            PatchOptions o;
            o.metric = MetricKind::kLogitDiff, o.site = site, o.each_position = each, o.max_rows = 15;
            auto exact = exact_patching(*m, pairs, o);
            auto attr = attribution_patching(*m, pairs, o);
            // (a head-out subscription sums per-head products: the same metric to fp32 rounding)
            CHECK(std::abs(attr.metric_clean - exact.metric_clean) < 1e-6);
            CHECK(std::abs(attr.metric_corrupt - exact.metric_corrupt) < 1e-6);
            CHECK(max_diff(attr.patched, exact.patched) < 1e-5);
            CHECK(max_diff(attr.scores, exact.scores) < 1e-5);
            // Not vacuous: the heads matter, and positions before the last matter only through attention.
            CHECK(exact.scores.abs().max().item<double>() > 0.05);
        }
    // The metric is not linear in the query (softmax): the two differ there, as they should (with
    // queries scaled up so that attention is far from uniform).
    m->weights.layers[0].wq.mul_(10);
    PatchOptions q;
    q.metric = MetricKind::kLogitDiff, q.site = Point::kAttnQ;
    CHECK(max_diff(attribution_patching(*m, pairs, q).scores, exact_patching(*m, pairs, q).scores) > 1e-3);
}

TEST_CASE("attribution ranks the toy induction model's heads as exact patching does (fresh repeated half)") {
    auto m = load_model(toy());
    auto tok = find_tokenizer_for_model(toy(), m->config.vocab_size);
    auto pairs = read_patch_pairs(data_file("toy-induction-fresh-half.jsonl"), *m, tok.get(), MetricKind::kLoss);
    PatchOptions o;
    o.metric = MetricKind::kLoss;
    auto exact = exact_patching(*m, pairs, o);
    auto attr = attribution_patching(*m, pairs, o);
    CHECK(exact.metric_corrupt > exact.metric_clean + 1.0);  // the corruption breaks induction
    const double rho = spearman(exact.scores, attr.scores);
    MESSAGE("exact  " << exact.scores);
    MESSAGE("attrib " << attr.scores);
    MESSAGE("Spearman " << rho << "; forwards exact " << exact.forwards << ", attribution " << attr.forwards);
    CHECK(rho >= 0.8);
    // The head that restores most is an induction head, by both methods.
    const auto gt = ground_truth();
    auto best = [&](const at::Tensor& s) {
        const auto j = rank_heads(s, true)[0];
        return format_head(static_cast<int>(j / s.size(1)), static_cast<int>(j % s.size(1)));
    };
    bool ex_ind = false, at_ind = false;
    for (const auto& x : gt["induction_heads"]) ex_ind |= best(exact.scores) == x, at_ind |= best(attr.scores) == x;
    CHECK(ex_ind);
    CHECK(at_ind);
    // Per position: the last position carries the induction heads' effect.
    o.each_position = true;
    auto each = exact_patching(*m, pairs, o);
    CHECK(each.scores.sizes() == at::IntArrayRef({m->config.n_layers, m->config.n_heads, pairs.clean.size(1)}));
}

TEST_CASE("path patching: the previous-token head reaches the induction heads through their keys only") {
    auto m = load_model(toy());
    auto tok = find_tokenizer_for_model(toy(), m->config.vocab_size);
    auto pairs = read_patch_pairs(data_file("toy-induction-pairs.jsonl"), *m, tok.get(), MetricKind::kLoss);
    const auto gt = ground_truth();
    const std::string prev = gt["previous_token_head"].get<std::string>();
    std::vector<std::string> ind;
    for (const auto& x : gt["induction_heads"]) ind.push_back(x.get<std::string>());
    const int L = m->config.n_layers, H = m->config.n_heads;
    double score[3];
    const char* inputs[3] = {"k", "q", "v"};
    for (int i = 0; i < 3; ++i) {
        auto spec = parse_path_spec(fmt::format("{}->{}:{}", prev, fmt::join(ind, ","), inputs[i]), L, H);
        auto r = path_patching(*m, pairs, spec, MetricKind::kLoss);
        score[i] = r.score;
        MESSAGE(spec.label() << ": " << r.score << " (loss clean " << r.metric_clean << ", corrupted " << r.metric_corrupt
                             << ", patched " << r.metric_patched << ")");
        CHECK(r.metric_corrupt > r.metric_clean + 1.0);
    }
    CHECK(score[0] >= 0.5);
    CHECK(std::abs(score[1]) <= 0.1);
    CHECK(std::abs(score[2]) <= 0.1);
    // Exact activation patching of the previous-token head's own output restores through every path:
    // at least what the key path does.
    PatchOptions o;
    o.metric = MetricKind::kLoss;
    auto exact = exact_patching(*m, pairs, o);
    auto [pl, ph] = head_of(prev);
    CHECK(exact.scores[pl][ph].item<double>() >= score[0] - 0.1);
}

TEST_CASE("path specs, pairs files and degenerate pairs are refused with one clear line") {
    CHECK_THROWS_WITH_AS(parse_path_spec("L0H2-L1H0:k", 2, 4), doctest::Contains("expected SENDERS->RECEIVERS:q|k|v"), UsageError);
    CHECK_THROWS_WITH_AS(parse_path_spec("L0H2->L1H0:z", 2, 4), doctest::Contains("must be q, k or v"), UsageError);
    CHECK_THROWS_WITH_AS(parse_path_spec("L1H2->L1H0:k", 2, 4), doctest::Contains("later layer than every sender"), UsageError);
    CHECK_THROWS_AS(parse_path_spec("L0H9->L1H0:k", 2, 4), UsageError);
    CHECK(parse_path_spec("L0H2,L0H1->L1H0:v", 2, 4).label() == "L0H2,L0H1->L1H0:v");
    auto m = load_model(toy());
    auto tok = find_tokenizer_for_model(toy(), m->config.vocab_size);
    TempDir dir;
    auto bad = [&](const std::string& text, MetricKind metric, const std::string& what) {
        const std::string f = dir.file("p.jsonl");
        std::ofstream(f) << text;
        CHECK_THROWS_WITH_AS(read_patch_pairs(f, *m, tok.get(), metric), doctest::Contains(what.c_str()), DataError);
    };
    bad("{\"clean\": \"abc\", \"corrupt\": \"abcd\", \"answer\": \"x\", \"wrong\": \"y\"}\n", MetricKind::kLogitDiff,
        "p.jsonl:1: clean is 4 tokens, corrupt 5; patching needs equal lengths");
    bad("\n{\"clean\": \"abc\", \"corrupt\": \"abd\", \"answer\": \"x\"}\n", MetricKind::kLogitDiff, "p.jsonl:2: expected {\"clean\"");
    bad("{\"clean\": \"abc\", \"corrupt\": \"abd\", \"answer\": \"xy\"}\n", MetricKind::kLoss,
        "p.jsonl:1: \"answer\" \"xy\" encodes to 2 tokens");
    bad("{\"clean\": [1, 2], \"corrupt\": [1, 99999], \"answer\": 3}\n", MetricKind::kProb, "token id 99999 out of range");
    bad("", MetricKind::kLoss, "no pairs");
    // Identical clean and corrupted runs: no gap to normalise by.
    const std::string f = dir.file("same.jsonl");
    std::ofstream(f) << "{\"clean\": \"abcab\", \"corrupt\": \"abcab\", \"answer\": \"c\"}\n";
    auto same = read_patch_pairs(f, *m, tok.get(), MetricKind::kLoss);
    PatchOptions o;
    o.metric = MetricKind::kLoss;
    CHECK_THROWS_WITH_AS(exact_patching(*m, same, o), doctest::Contains("the clean and corrupted runs give the same metric"), DataError);
    // --positions each needs one length.
    const std::string g = dir.file("two.jsonl");
    std::ofstream(g) << "{\"clean\": \"abcab\", \"corrupt\": \"abdab\", \"answer\": \"c\"}\n"
                        "{\"clean\": \"abcdab\", \"corrupt\": \"abcdaz\", \"answer\": \"c\"}\n";
    auto two = read_patch_pairs(g, *m, tok.get(), MetricKind::kLoss);
    o.each_position = true;
    CHECK_THROWS_AS(exact_patching(*m, two, o), UsageError);
}

TEST_CASE("headscope patch writes /patching/<name> and refuses bad input before writing") {
    TempDir dir;
    const std::string out = dir.file("p.h5");
    const std::string pairs = data_file("toy-induction-fresh-half.jsonl");
    REQUIRE(run_cli(fmt::format("patch '{}' --pairs '{}' --metric loss --out '{}'", toy(), pairs, out)) == 0);
    REQUIRE(run_cli(fmt::format("patch '{}' --pairs '{}' --metric loss --method attribution --positions each --out '{}' "
                                "--append", toy(), pairs, out)) == 0);
    {
        ResultReader r(out);
        auto a = r.read("/patching/z-exact/scores"), b = r.read("/patching/z-attribution-each/scores");
        REQUIRE(a.shape.size() == 2);
        CHECK(b.shape == std::vector<int64_t>{a.shape[0], a.shape[1], 20});  // BOS + 19 characters
        CHECK(attr_to_string(r.attrs("/patching/z-exact").at("method")) == "exact");
        CHECK(r.read("/patching/z-exact/metric_clean").values[0] < r.read("/patching/z-exact/metric_corrupt").values[0]);
    }
    // A path group in the same file, and the report draws all three.
    REQUIRE(run_cli(fmt::format("patch '{}' --pairs '{}' --metric loss --path 'L0H2->L1H0:k' --out '{}' --append", toy(),
                                data_file("toy-induction-pairs.jsonl"), out)) == 0);
    const std::string html = render_report({out});
    for (const char* part : {"Patching: z-exact", "Patching: z-attribution-each", "Patching: path", "L0H2-&gt;L1H0:k"}) {
        CAPTURE(part);
        CHECK(html.find(part) != std::string::npos);
    }
    CHECK(run_cli(fmt::format("patch '{}' --pairs '{}' --metric nope --out '{}' --append", toy(), pairs, out)) == 2);
    CHECK(run_cli(fmt::format("patch '{}' --pairs '{}' --path 'L1H0->L0H0:k' --out '{}' --append", toy(), pairs, out)) == 2);
    CHECK(!std::filesystem::exists(dir.file("never.h5")));
    CHECK(run_cli(fmt::format("patch '{}' --pairs '{}/none.jsonl' --out '{}'", toy(), dir.path, dir.file("never.h5"))) != 0);
    CHECK(!std::filesystem::exists(dir.file("never.h5")));
}
