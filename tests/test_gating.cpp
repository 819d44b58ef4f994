// Causal head gating (probes/ablation/gating.h) and its YAML sweep. References: central finite differences
// for the gates' gradient; evaluate_gates one gate set at a time for the batched gate sets; the CI
// toy recall model's training_log.json "ground_truth" (its retrieval heads) with a planted
// interfering head for what the fits must label.
#include <doctest/doctest.h>

#include "ablation.h"
#include "ci_toy.h"
#include "errors.h"
#include "gating.h"
#include "heads.h"
#include "model.h"
#include "store.h"
#include "test_util.h"
#include "toy_recall_data.h"
#include "tmpdir.h"
#include "toy_tasks.h"
#include "util.h"
#include "yaml_errors.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>

using namespace hs;
using nlohmann::json;

namespace {

Head head_of(const std::string& name) {
    int l = -1, h = -1;
    REQUIRE(parse_head_name(name, l, h));
    return {l, h};
}


}  // namespace

TEST_CASE("gating: batched gate sets equal one at a time, and autograd equals central differences") {
    auto m = load_model(ci_toy_model("induction"));
    const int L = m->config.n_layers, H = m->config.n_heads;
    auto data = repeated_data(*m, 10, 6, 5, 6, 68);
    AblationSetup s;
    s.positions = Positions::kRepeatedHalf;
    Ablator ab(*m, data, s);
    torch::manual_seed(2);
    auto logits = torch::randn({3, L, H});
    {
        torch::NoGradGuard ng;
        auto batched = ab.gated_metric(torch::sigmoid(logits)).to(torch::kCPU);
        for (int64_t g = 0; g < 3; ++g)
            CHECK(batched[g].item<double>() == doctest::Approx(ab.evaluate_gates(torch::sigmoid(logits[g])).mean().item<double>()).epsilon(1e-5));
    }
    torch::AutoGradMode grad(true);
    auto leaf = logits.clone().requires_grad_(true);
    ab.gated_metric(torch::sigmoid(leaf)).sum().backward();
    auto gr = leaf.grad();
    torch::NoGradGuard ng;
    const double eps = 1e-2;
    for (auto [g, l, h] : std::vector<std::array<int64_t, 3>>{{0, 0, 1}, {1, L - 1, 0}, {2, L - 1, H - 1}, {2, 0, 0}}) {
        auto up = logits.clone(), dn = logits.clone();
        up[g][l][h] += eps;
        dn[g][l][h] -= eps;
        const double fd = (ab.gated_metric(torch::sigmoid(up))[g].item<double>() - ab.gated_metric(torch::sigmoid(dn))[g].item<double>()) /
                          (2 * eps);
        const double an = gr[g][l][h].item<double>();
        CAPTURE(g);
        CAPTURE(l);
        CAPTURE(h);
        CHECK(std::abs(an - fd) <= 1e-3 * std::max(1.0, std::abs(fd)) + 2e-4);
    }
}

TEST_CASE("gating: the roles rule") {
    auto gp = torch::tensor({0.9f, 0.9f, 0.1f, 0.1f}).view({1, 2, 2});
    auto gm = torch::tensor({0.9f, 0.1f, 0.1f, 0.9f}).view({1, 2, 2});
    auto r = head_roles(gp, gm);
    CHECK(r[0][0][0].item<int>() == static_cast<int>(HeadRole::kFacilitating));
    CHECK(r[0][0][1].item<int>() == static_cast<int>(HeadRole::kIrrelevant));
    CHECK(r[0][1][0].item<int>() == static_cast<int>(HeadRole::kInterfering));
    CHECK(r[0][1][1].item<int>() == static_cast<int>(HeadRole::kUnstable));
    CHECK(std::string(head_role_name(HeadRole::kInterfering)) == "interfering");
}

TEST_CASE("gating fit (small): three fits, gates in [0, 1], roles by the rule, lambda's direction") {
    auto m = load_model(ci_toy_model("induction"));
    const int L = m->config.n_layers, H = m->config.n_heads;
    auto data = repeated_data(*m, 10, 6, 5, 6, 68);
    AblationSetup s;
    s.positions = Positions::kRepeatedHalf;
    Ablator ab(*m, data, s);
    GatingOptions o;
    o.starts = 2, o.steps = 20, o.seed = 1;
    auto r = fit_head_gates(ab, L, H, o);
    for (const auto* g : {&r.g0, &r.g_plus, &r.g_minus}) {
        REQUIRE(g->sizes() == at::IntArrayRef({2, L, H}));
        CHECK(g->min().item<double>() >= 0.0);
        CHECK(g->max().item<double>() <= 1.0);
    }
    CHECK(torch::equal(r.roles, head_roles(r.g_plus, r.g_minus)));
    CHECK(torch::equal(r.role_counts.sum(0), torch::full({L, H}, 2, r.role_counts.options())));
    CHECK(r.objective.sizes() == at::IntArrayRef({3, 2}));
    CHECK(torch::isfinite(r.objective).all().item<bool>());
    // Lambda's sign: the G+ fit rewards open gates, the G- fit closed ones.
    CHECK(r.g_plus.ge(0.5).sum().item<int64_t>() > r.g_minus.ge(0.5).sum().item<int64_t>());
}

// The ground truth on the toy recall model with a planted interfering head (three fits of 60 steps
// from 10 starts on 48 prompts, about a minute on 2 cores): ctest long_gating, scripts/test.sh --long.
TEST_CASE("gating on the toy recall model: a planted interfering head is found, the retrieval heads facilitate" *
          doctest::test_suite("long")) {
    const std::string dir = ci_toy_model("recall");
    auto m = load_model(dir);
    const auto gt = json::parse(read_text_file(path_join(dir, "training_log.json")))["ground_truth"];
    const int L = m->config.n_layers, H = m->config.n_heads, d = m->config.d_head, D = m->config.d_model;
    std::vector<Head> causal;
    for (const auto& x : gt["retrieval_heads"]) causal.push_back(head_of(x.get<std::string>()));
    REQUIRE(!causal.empty());
    // The planted head: another head of the retrieval layer gets a copy of the first retrieval head's
    // q/k/v and writes its output negated and scaled by 0.8 (so it cancels most of that head).
    const auto [rl, rh] = causal.front();
    int ph = -1;
    for (int h = 0; h < H && ph < 0; ++h)
        if (std::find(causal.begin(), causal.end(), Head{rl, h}) == causal.end()) ph = h;
    REQUIRE(ph >= 0);
    REQUIRE(m->config.n_kv_heads == H);  // the toy is MHA: the kv head is the head
    auto& lw = m->weights.layers[rl];
    {
        torch::NoGradGuard ng;
        lw.wq.narrow(0, ph * d, d).copy_(lw.wq.narrow(0, rh * d, d));
        lw.wk.narrow(0, ph * d, d).copy_(lw.wk.narrow(0, rh * d, d));
        lw.wv.narrow(0, ph * d, d).copy_(lw.wv.narrow(0, rh * d, d));
        lw.wo.narrow(1, ph * d, d).copy_(-0.8 * lw.wo.narrow(1, rh * d, d));
    }
    (void)D;
    auto data = toy_recall_prompts(48, 48, 11);
    AblationSetup s;
    s.metric = MetricKind::kLoss;
    s.positions = Positions::kAnswer;
    s.max_rows = 512;
    Ablator ab(*m, data, s);
    GatingOptions o;
    o.starts = 10, o.steps = 60, o.seed = 3;
    auto r = fit_head_gates(ab, L, H, o);
    const int interfering = r.role_counts[static_cast<int>(HeadRole::kInterfering)][rl][ph].item<int>();
    MESSAGE("planted L" << rl << "H" << ph << ": interfering in " << interfering << " of 10 starts; G+ "
                        << r.g_plus.select(1, rl).select(1, ph) << " G- " << r.g_minus.select(1, rl).select(1, ph));
    CHECK(interfering >= 9);
    // The toy's retrieval circuit is redundant (training log: each of L1H0 and L1H1 kept alone
    // recalls > 0.95; no one head's ablation costs 0.05), so G- keeps a sparse sufficient subset that
    // depends on the start: every start keeps at least one retrieval head, each retrieval head is kept
    // by some start, and in the retrieval layer nothing else facilitates. (Layer 0 feeds the
    // circuit: besides the previous-token head, ablating L0H0 or L0H3 alone costs 0.1 of recall in
    // the training log, so layer-0 heads may be kept as well.)
    std::vector<Head> circuit = causal;
    for (int h = 0; h < H; ++h) circuit.push_back({0, h});
    const auto fac = r.roles.eq(static_cast<int>(HeadRole::kFacilitating));  // [S, L, H]
    for (auto [l, h] : causal) {
        const int n = fac.select(1, l).select(1, h).sum().item<int>();
        MESSAGE(format_head(l, h) << ": facilitating in " << n << " of 10 starts");
        CHECK(n >= 1);
    }
    for (int64_t st = 0; st < o.starts; ++st) {
        int kept = 0;
        for (auto [l, h] : causal) kept += fac[st][l][h].item<bool>();
        CHECK(kept >= 1);
        for (int l = 0; l < L; ++l)
            for (int h = 0; h < H; ++h)
                if (fac[st][l][h].item<bool>()) {
                    CAPTURE(format_head(l, h));
                    CHECK(std::find(circuit.begin(), circuit.end(), Head{l, h}) != circuit.end());
                }
    }
    // The fits did what their lambda asks: G+ keeps more heads open than G-.
    CHECK(r.g_plus.ge(0.5).sum().item<int64_t>() > r.g_minus.ge(0.5).sum().item<int64_t>());
    // Causal check: zeroing the heads G- closes keeps recall near the baseline; zeroing the planted head helps.
    auto cfg = gating_configs(r);
    auto rows = ab.evaluate(torch::stack(cfg.masks)).mean(1);
    CHECK(cfg.kinds[1] == "circuit");
    CHECK(rows[2].item<double>() < rows[0].item<double>());  // G+ < 0.5 zeroed (the interfering head): lower loss
}

TEST_CASE("gating YAML: a run writes gates and roles; schema errors name the line") {
    const std::string head = "model: m\ndata:\n  r: {kind: repeated, length: 5, count: 2}\n";
    auto study = [](const std::string& body) { return "studies:\n  - name: s\n" + body; };
    CHECK(cfg_error(head + study("    sweep: gating\n    starts: 3\n    fit_steps: 5\n    metric: {kind: loss, data: r}\n")) ==
          "(no error)");
    CHECK(cfg_error(head + study("    sweep: gating\n    mode: zero-query\n    metric: {kind: loss, data: r}\n"))
              .find("exp.yaml:7:11: gating: the gates multiply z") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: gating\n    heads: all\n    metric: {kind: loss, data: r}\n"))
              .find("exp.yaml:7:12: gating fits a gate on every head") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: gating\n    lambda: -0.1\n    metric: {kind: loss, data: r}\n"))
              .find("exp.yaml:7:13: lambda: expected a number > 0") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: single\n    starts: 2\n    metric: {kind: loss, data: r}\n"))
              .find("exp.yaml:7:13: 'starts' belongs to sweep: gating") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: gating\n    controls: {random: 1}\n    metric: {kind: loss, data: r}\n"))
              .find("controls: not defined for a gating sweep") != std::string::npos);
    TempDir dir;
    const std::string exp = dir.file("g.yaml"), out = dir.file("g.h5");
    std::ofstream(exp) << fmt::format("model: {}\nseed: 2\ndata:\n  r: {{kind: repeated, length: 8, count: 6, token_range: [6, 68]}}\n"
                                      "studies:\n  - name: gates\n    sweep: gating\n    starts: 2\n    fit_steps: 4\n"
                                      "    metric: {{kind: loss, data: r, positions: repeated-half}}\n",
                                      ci_toy_model("induction"));
    REQUIRE(run_cli(fmt::format("run '{}' --out '{}'", exp, out)) == 0);
    ResultReader rd(out);
    auto gp = rd.read("/ablation/gates/gates/g_plus");
    CHECK(gp.shape.size() == 3);
    CHECK(gp.shape[0] == 2);
    CHECK(rd.read("/ablation/gates/gates/role").shape == std::vector<int64_t>{gp.shape[1], gp.shape[2]});
    CHECK(rd.read("/ablation/gates/metric").shape == std::vector<int64_t>{5});  // baseline + 2 x (circuit, interfering)
}
