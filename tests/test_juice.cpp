// JUICE's head selection as a YAML study: the scale-grid sweep (per-configuration factors in one
// forward), the prob metric, the conflicts dataset and the selection rule (probes/decoding/juice.h).
// References: one Ablator per factor (the engine's own scale mode, itself checked against
// hand-made hooks in test_ablation); exp(-loss) at the answer position; the reference code's rule
// (GaotangLi/JUICE src/select_intervention_head.py) worked by hand on small arrays; the CI toy
// induction model's training_log.json "ground_truth".
#include <doctest/doctest.h>

#include "ablation.h"
#include "ci_toy.h"
#include "errors.h"
#include "experiment.h"
#include "heads.h"
#include "juice.h"
#include "model.h"
#include "store.h"
#include "test_util.h"
#include "tmpdir.h"
#include "tokenizer.h"
#include "util.h"
#include "yaml_errors.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

using namespace hs;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-5;  // fp32 forwards, batched vs separate

double max_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

std::string toy() { return ci_toy_model("induction"); }

json ground_truth() { return json::parse(read_text_file(path_join(toy(), "training_log.json")))["ground_truth"]; }

void write_text(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    REQUIRE(f.good());
}

// The toy induction prompts (datasets/experiments/toy-induction-prompts.jsonl) as conflicts lines:
// the induction continuation is the "parametric" answer, the counterfactual the "context" one, and
// each question also follows a distractor context (the first 5 characters of another prompt).
std::string toy_conflicts(const TempDir& dir, int64_t lines) {
    const auto text = read_text_file(std::string(HS_SOURCE_DIR) + "/datasets/experiments/toy-induction-prompts.jsonl");
    std::vector<json> in;
    for (const auto& l : split(text, '\n'))
        if (!trim(l).empty()) in.push_back(json::parse(l));
    REQUIRE(static_cast<int64_t>(in.size()) >= lines);
    const std::string path = dir.file("conflicts.jsonl");
    std::ofstream f(path);
    for (int64_t i = 0; i < lines; ++i) {
        const auto& j = in[i];
        const auto other = in[(i + 1) % lines]["prompt"].get<std::string>().substr(0, 5);
        f << json{{"question", j["prompt"]}, {"parametric_answer", j["answer"]}, {"context_answer", j["counterfactual"]},
                  {"context", other}}.dump()
          << "\n";
    }
    return path;
}

}  // namespace

TEST_CASE("JUICE selection: the reference's rule, worked by hand") {
    // L = 1, H = 2; factors 2 (alpha 1), 0 (alpha -1), -1 (alpha -2); rows: variants 0, 0, 1, 1.
    const std::vector<double> factors = {1, 2, 0, -1, 2, 0, -1};
    auto masks = torch::zeros({7, 1, 2}, torch::kUInt8);
    for (int c = 1; c <= 3; ++c) masks[c][0][0] = 1;
    for (int c = 4; c <= 6; ++c) masks[c][0][1] = 1;
    // metric per configuration and row (p of the parametric answer)
    auto rows = torch::tensor({{0.5, 0.5, 0.2, 0.2},      // baseline
                               {0.7, 0.9, 0.3, 0.3},      // L0H0 x2: +0.3 (v0), +0.1 (v1)
                               {0.1, 0.1, 0.1, 0.1},      // L0H0 x0: -0.4, -0.1
                               {0.2, 0.2, 0.15, 0.15},    // L0H0 x-1: -0.3, -0.05
                               {0.6, 0.6, 0.05, 0.05},    // L0H1 x2: +0.1, -0.15  (not positive on v1)
                               {0.8, 0.8, 0.4, 0.4},      // L0H1 x0: +0.3, +0.2
                               {0.6, 0.6, 0.3, 0.3}},     // L0H1 x-1: +0.1, +0.1
                              torch::kDouble);
    auto sel = juice_selection(rows, masks, factors, {0, 0, 1, 1});
    CHECK(sel.variants == std::vector<int64_t>{0, 1});
    CHECK(sel.factors == std::vector<double>{2, 0, -1});
    CHECK(sel.delta.sizes() == at::IntArrayRef({2, 1, 2, 3}));
    CHECK(sel.delta[0][0][0][0].item<double>() == doctest::Approx(0.3).epsilon(1e-12));
    CHECK(sel.delta[1][0][1][1].item<double>() == doctest::Approx(0.2).epsilon(1e-12));
    // up: the one positive factor; down: the mean of the two negative-alpha factors.
    CHECK(sel.up[1][0][0].item<double>() == doctest::Approx(0.1).epsilon(1e-12));
    CHECK(sel.down[0][0][1].item<double>() == doctest::Approx(0.2).epsilon(1e-12));   // (0.3 + 0.1) / 2
    CHECK(sel.down[1][0][1].item<double>() == doctest::Approx(0.15).epsilon(1e-12));  // (0.2 + 0.1) / 2
    // enhance: L0H0 positive on both variants (0.3 + 0.1); L0H1 is not (v1: -0.1) -> NaN.
    CHECK(sel.enhance[0][0].item<double>() == doctest::Approx(0.4).epsilon(1e-12));
    CHECK(std::isnan(sel.enhance[0][1].item<double>()));
    // suppress: L0H1 (scaling it down raises the answer on both variants: 0.2 + 0.15); L0H0 lowers it -> NaN.
    CHECK(sel.suppress[0][1].item<double>() == doctest::Approx(0.35).epsilon(1e-12));
    CHECK(std::isnan(sel.suppress[0][0].item<double>()));
    // One variant (no ids): the rows pool.
    auto one = juice_selection(rows, masks, factors, {});
    CHECK(one.variants == std::vector<int64_t>{0});
    CHECK(std::isnan(one.enhance[0][1].item<double>()));  // pooled: (0.6+0.6+0.05+0.05)/4 - 0.35 < 0
    CHECK(one.enhance[0][0].item<double>() == doctest::Approx(0.2).epsilon(1e-12));  // 0.55 - 0.35
    // A configuration with two heads is not a scale grid.
    auto bad = masks.clone();
    bad[2][0][1] = 1;
    CHECK_THROWS_AS(juice_selection(rows, bad, factors, {0, 0, 1, 1}), ConfigError);
}

TEST_CASE("scale-grid engine: many factors in one batched forward equal one Ablator per factor") {
    auto m = load_model(toy());
    const int L = m->config.n_layers, H = m->config.n_heads;
    auto data = repeated_data(*m, 10, 5, 7, 6, 68);
    const std::vector<double> grid = {2, 0, -1, 31};
    std::vector<at::Tensor> masks = {torch::zeros({L, H}, torch::kUInt8)};
    std::vector<double> factors = {1};
    for (auto [l, h] : std::vector<Head>{{0, 1}, {L - 1, H - 1}})
        for (double f : grid) {
            auto mk = torch::zeros({L, H}, torch::kUInt8);
            mk[l][h] = 1;
            masks.push_back(mk), factors.push_back(f);
        }
    auto M = torch::stack(masks);
    AblationSetup s;
    s.mode = Intervention::kScale;
    s.positions = Positions::kRepeatedHalf;
    s.max_rows = 64;  // every configuration in one forward
    Ablator ab(*m, data, s);
    REQUIRE(ab.plan(M).size() == 1);
    auto got = ab.evaluate(M, {}, factors);
    for (double f : grid) {
        AblationSetup one = s;
        one.factor = f;
        auto want = Ablator(*m, data, one).evaluate(M);
        for (size_t c = 0; c < factors.size(); ++c)
            if (factors[c] == f) CHECK(max_diff(got[c], want[c]) < kTol);
    }
    // Factor 0 is zero ablation.
    AblationSetup z = s;
    z.mode = Intervention::kZero;
    auto zero = Ablator(*m, data, z).evaluate(M);
    CHECK(max_diff(got[2], zero[2]) < kTol);
    // Factors need scale mode and one per configuration.
    CHECK_THROWS_AS(Ablator(*m, data, z).evaluate(M, {}, factors), ConfigError);
    CHECK_THROWS_AS(ab.evaluate(M, {}, {1.0, 2.0}), ConfigError);
}

TEST_CASE("metric prob: p(answer) = exp(-loss at the answer position); target counterfactual reads the other token") {
    auto m = load_model(toy());
    auto data = repeated_data(*m, 8, 4, 11, 6, 68);
    data.lengths.assign(4, 12);  // the answer is read at position 11 (predicting token 12)
    auto acc = data.tokens.accessor<int64_t, 2>();
    for (int64_t i = 0; i < 4; ++i) data.answers.push_back(acc[i][12]), data.counterfactuals.push_back(acc[(i + 1) % 4][12]);
    auto masks = torch::zeros({2, m->config.n_layers, m->config.n_heads}, torch::kUInt8);
    masks[1][1][0] = 1;
    AblationSetup s;
    s.metric = MetricKind::kLoss;
    s.positions = Positions::kAnswer;
    auto loss = Ablator(*m, data, s).evaluate(masks);
    s.metric = MetricKind::kProb;
    s.positions = Positions::kAll;
    auto prob = Ablator(*m, data, s).evaluate(masks);
    CHECK(max_diff(prob, (-loss).exp()) < kTol);
    // The counterfactual: swap the two token lists and read the answer.
    s.counterfactual = true;
    auto pcf = Ablator(*m, data, s).evaluate(masks);
    auto swapped = data;
    std::swap(swapped.answers, swapped.counterfactuals);
    s.counterfactual = false;
    CHECK(max_diff(pcf, Ablator(*m, swapped, s).evaluate(masks)) < kTol);
    CHECK(max_diff(pcf, prob) > 1e-3);
}

TEST_CASE("conflicts data: rows per variant, the continuation token, and bad lines named") {
    auto m = load_model(toy());
    auto tok = find_tokenizer_for_model(toy(), m->config.vocab_size);
    REQUIRE(tok);
    TempDir dir;
    Experiment e;
    e.file = "exp.yaml";
    DataSpec d;
    d.name = "c";
    d.kind = DataKind::kConflicts;
    d.separator = "";
    d.answer_prefix = "";
    d.file = dir.file("c.jsonl");
    write_text(d.file, "{\"question\": \"abcab\", \"parametric_answer\": \"c\", \"context_answer\": \"x\", "
                       "\"contexts\": [\"zz\", \"yyy\"]}\n\n"
                       "{\"question\": \"pq\", \"parametric_answer\": \"rs\", \"context_answer\": \"t\"}\n");
    auto data = make_data(e, d, *m, tok.get());
    REQUIRE(data.rows() == 4);  // 1 + 2 contexts, then the second line's question alone
    CHECK(data.variants == std::vector<int64_t>{0, 1, 2, 0});
    auto enc = [&](const std::string& s) {
        auto v = tok->encode(s, true);
        return std::vector<int64_t>(v.begin(), v.end());
    };
    CHECK(data.lengths == std::vector<int64_t>{static_cast<int64_t>(enc("abcab").size()), static_cast<int64_t>(enc("zzabcab").size()),
                                               static_cast<int64_t>(enc("yyyabcab").size()), static_cast<int64_t>(enc("pq").size())});
    CHECK(data.answers[0] == enc("abcabc").back());
    CHECK(data.counterfactuals[2] == enc("yyyabcabx").back());
    CHECK(data.answers[3] == enc("pqr").back());  // the first token of "rs"
    // clean: false drops the question-alone rows; a line with no context then has no row.
    d.clean = false;
    CHECK_THROWS_WITH_AS(make_data(e, d, *m, tok.get()), doctest::Contains("c.jsonl:3: no rows"), DataError);
    // Bad lines name the file and line.
    d.clean = true;
    write_text(d.file, "{\"question\": \"ab\", \"parametric_answer\": \"c\", \"context_answer\": \"x\"}\n{\"question\": \"ab\"}\n");
    CHECK_THROWS_WITH_AS(make_data(e, d, *m, tok.get()), doctest::Contains("c.jsonl:2: expected {\"question\""), DataError);
    write_text(d.file, "{\"question\": \"ab\", \"parametric_answer\": \"c\", \"context_answer\": \"x\", \"context\": \"q\", "
                       "\"contexts\": [\"r\"]}\n");
    CHECK_THROWS_WITH_AS(make_data(e, d, *m, tok.get()), doctest::Contains("c.jsonl:1: give \"context\" or \"contexts\""), DataError);
    write_text(d.file, "not json\n");
    CHECK_THROWS_WITH_AS(make_data(e, d, *m, tok.get()), doctest::Contains("c.jsonl:1: not a JSON object"), DataError);
    // count limits lines, not rows.
    write_text(d.file, "{\"question\": \"ab\", \"parametric_answer\": \"c\", \"context_answer\": \"x\", \"context\": \"q\"}\n"
                       "{\"question\": \"cd\", \"parametric_answer\": \"c\", \"context_answer\": \"x\"}\n");
    d.count = 1;
    CHECK(make_data(e, d, *m, tok.get()).rows() == 2);
}

TEST_CASE("JUICE YAML: scale-grid, prob and conflicts are checked before anything runs") {
    const std::string head = "model: m\ndata:\n  c: {kind: conflicts, file: c.jsonl}\n  r: {kind: repeated, length: 5, count: 2}\n";
    auto study = [](const std::string& body) { return "studies:\n  - name: s\n" + body; };
    CHECK(cfg_error(head + study("    sweep: scale-grid\n    metric: {kind: prob, data: c, target: parametric}\n")) == "(no error)");
    CHECK(cfg_error(head + study("    sweep: scale-grid\n    factors: [2, 0.5]\n    metric: {kind: prob, data: c}\n")) == "(no error)");
    CHECK(cfg_error(head + study("    sweep: scale-grid\n    mode: zero\n    metric: {kind: prob, data: c}\n"))
              .find("exp.yaml:8:11: study 's': sweep scale-grid scales z by each of 'factors'; it takes no mode") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: scale-grid\n    factors: [2, 1]\n    metric: {kind: prob, data: c}\n"))
              .find("exp.yaml:8:18: factors: expected finite numbers other than 1") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: scale-grid\n    factors: [2, 2]\n    metric: {kind: prob, data: c}\n"))
              .find("exp.yaml:8:18: factors: 2 listed twice") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: scale-grid\n    factors: []\n    metric: {kind: prob, data: c}\n"))
              .find("exp.yaml:8:14: factors: expected a list of numbers") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: single\n    factors: [2]\n    metric: {kind: prob, data: c}\n"))
              .find("exp.yaml:8:14: 'factors' belongs to sweep: scale-grid") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: scale-grid\n    controls: {random: 2}\n    metric: {kind: prob, data: c}\n"))
              .find("exp.yaml:8:15: controls: not defined for a scale-grid sweep") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: single\n    metric: {kind: prob, data: r}\n"))
              .find("exp.yaml:8:13: metric prob needs a prompts or conflicts dataset") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: single\n    metric: {kind: loss, data: c, target: context}\n"))
              .find("exp.yaml:8:43: metric: 'target' applies to metric prob only") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: single\n    metric: {kind: prob, data: c, target: both}\n"))
              .find("exp.yaml:8:43: 'target': unknown value 'both'") != std::string::npos);
    CHECK(cfg_error("model: m\ndata:\n  c: {kind: conflicts, file: c.jsonl, sep: x}\n" +
                    study("    sweep: single\n    metric: {kind: prob, data: c}\n"))
              .find("exp.yaml:3:39: unknown key 'sep' in data 'c' (conflicts)") != std::string::npos);
}

TEST_CASE("JUICE on the toy induction model: the grid finds the circuit, and shards merged equal one run") {
    TempDir dir;
    const auto conflicts = toy_conflicts(dir, 12);
    const std::string exp = dir.file("juice.yaml");
    write_text(exp, fmt::format("model: {}\nseed: 1\nthreads: 2\nbatch_rows: 48\ndata:\n"
                                "  c: {{kind: conflicts, file: {}, separator: '', answer_prefix: ''}}\n"
                                "studies:\n  - name: juice\n    sweep: scale-grid\n    factors: [2, 4, 0, -1]\n"
                                "    metric: {{kind: prob, data: c, target: parametric}}\n",
                                toy(), conflicts));
    const std::string out = dir.file("x.h5");
    REQUIRE(run_cli(fmt::format("run '{}' --out '{}'", exp, out)) == 0);
    ResultReader r(out);
    auto down = r.read("/ablation/juice/juice/down"), delta = r.read("/ablation/juice/juice/delta");
    const int64_t V = down.shape[0], L = down.shape[1], H = down.shape[2];
    CHECK(V == 2);  // the question alone, and after the distractor context
    CHECK(r.read("/data/c/variant").shape == std::vector<int64_t>{24});
    CHECK(r.read("/ablation/juice/factor").shape == std::vector<int64_t>{1 + L * H * 4});
    // Ground truth: scaling down the previous-token head or an induction head lowers p(the induction
    // continuation) on every variant, and the previous-token head lowers it most.
    const auto gt = ground_truth();
    std::vector<std::string> circuit = {gt["previous_token_head"].get<std::string>()};
    for (const auto& x : gt["induction_heads"]) circuit.push_back(x.get<std::string>());
    auto score = torch::tensor(down.values, torch::kDouble).view({V, L, H}).mean(0);  // mean over variants
    auto ranked = rank_heads(score, false);  // most negative first
    MESSAGE("down (mean over variants), most negative: " << format_head(int(ranked[0] / H), int(ranked[0] % H)) << " "
            << score.view(-1)[ranked[0]].item<double>() << ", " << format_head(int(ranked[1] / H), int(ranked[1] % H)) << " "
            << score.view(-1)[ranked[1]].item<double>());
    CHECK(format_head(int(ranked[0] / H), int(ranked[0] % H)) == circuit[0]);
    for (const auto& name : circuit) {
        int l = -1, h = -1;
        REQUIRE(parse_head_name(name, l, h));
        for (int64_t v = 0; v < V; ++v) CHECK(down.values[(v * L + l) * H + h] < 0);
    }
    // Two shards merged: the same per-configuration rows and the same selection.
    const std::string s0 = dir.file("s0.h5"), s1 = dir.file("s1.h5"), merged = dir.file("m.h5");
    REQUIRE(run_cli(fmt::format("run '{}' --shard 0/2 --out '{}'", exp, s0)) == 0);
    REQUIRE(run_cli(fmt::format("run '{}' --shard 1/2 --out '{}'", exp, s1)) == 0);
    REQUIRE(run_cli(fmt::format("merge '{}' '{}' --out '{}'", s0, s1, merged)) == 0);
    ResultReader rm(merged);
    for (const char* ds : {"/ablation/juice/metric_rows", "/ablation/juice/juice/delta", "/ablation/juice/juice/enhance",
                           "/ablation/juice/juice/suppress", "/ablation/juice/juice/up", "/ablation/juice/juice/down"}) {
        auto a = r.read(ds), b = rm.read(ds);
        REQUIRE(a.shape == b.shape);
        bool same = true;
        for (size_t i = 0; i < a.values.size(); ++i)
            same &= (std::isnan(a.values[i]) && std::isnan(b.values[i])) || a.values[i] == b.values[i];
        CHECK_MESSAGE(same, ds);
    }
    // A shard alone has NaN where it did not run, and selects nothing from a missing baseline.
    ResultReader r0(s0);
    bool any_nan = false;
    for (double x : r0.read("/ablation/juice/juice/delta").values) any_nan |= std::isnan(x);
    CHECK(any_nan);
}
