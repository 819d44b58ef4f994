// The ablation engine (probes/ablation/ablation.h), `headscope run` / `merge` and the YAML schema
// (src/experiment/experiment.h). References: one unbatched forward per configuration with the heads edited
// by hand through Hooks::intervene_z / intervene_q; finite differences for gradient importance;
// the CI toy model's training_log.json "ground_truth" for what the example must find.
#include <doctest/doctest.h>

#include "ablation.h"
#include "attention_detectors.h"
#include "ci_toy.h"
#include "errors.h"
#include "experiment.h"
#include "yaml_errors.h"
#include "model.h"
#include "store.h"
#include "test_util.h"
#include "tmpdir.h"
#include "util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

using namespace hs;
using nlohmann::json;

namespace {

constexpr double kTol = 1e-5;  // batched vs unbatched, engine vs hand-made hooks (fp32)

double max_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

std::string toy() { return ci_toy_model("induction"); }

json ground_truth() { return json::parse(read_text_file(path_join(toy(), "training_log.json")))["ground_truth"]; }

std::pair<int, int> head_of(const std::string& name) {
    int l = -1, h = -1;
    REQUIRE(parse_head_name(name, l, h));
    return {l, h};
}

// Mean loss per row at the repeated-half positions with `hooks` applied to one plain forward.
at::Tensor direct_rows(const Model& m, const at::Tensor& tokens, int64_t n, const Hooks& hooks) {
    torch::NoGradGuard ng;
    return induction_loss_rows(m.forward(tokens, &hooks), tokens, n);
}

}  // namespace

TEST_CASE("ablation prefix reuse: starting at layer l from its resid_pre equals the full forward (every family fixture)") {
    namespace fs = std::filesystem;
    int checked = 0;
    for (const auto& entry : fs::directory_iterator(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families")) {
        if (!fs::exists(entry.path() / "config.json")) continue;
        CAPTURE(entry.path().filename().string());
        auto m = load_model(entry.path().string());
        torch::NoGradGuard ng;
        auto gen = at::detail::createCPUGenerator(5);
        auto tokens = at::randint(m->config.vocab_size, {3, 11}, gen, torch::TensorOptions().dtype(torch::kLong));
        auto full = m->forward(tokens);
        for (int l = 1; l < m->config.n_layers; ++l) {
            Hooks cap;
            at::Tensor pre;
            cap.capture(Point::kResidPre, [&](int, const at::Tensor& x) { pre = x.clone(); }, l);
            m->forward(tokens, &cap);
            ForwardOptions fo;
            fo.start_layer = l;
            fo.start_resid = pre;
            auto part = m->forward(tokens, nullptr, nullptr, fo);
            CHECK(max_diff(part, full) < kTol);
            // Expanded over configurations, as the engine does: each copy equals the full forward.
            fo.start_resid = pre.repeat({2, 1, 1});
            auto rep = m->forward(tokens.repeat({2, 1}), nullptr, nullptr, fo);
            CHECK(max_diff(rep.narrow(0, 3, 3), full) < kTol);
        }
        ++checked;
    }
    CHECK(checked >= 5);
}

TEST_CASE("ablation prefix reuse: bad start_resid shapes and a KV cache are refused") {
    auto m = load_model(toy());
    auto tokens = torch::ones({2, 5}, torch::kLong);
    ForwardOptions fo;
    fo.start_layer = 1;
    CHECK_THROWS_AS(m->forward(tokens, nullptr, nullptr, fo), ConfigError);
    fo.start_resid = torch::zeros({2, 4, m->config.d_model});
    CHECK_THROWS_AS(m->forward(tokens, nullptr, nullptr, fo), ConfigError);
    fo.start_layer = m->config.n_layers;
    CHECK_THROWS_AS(m->forward(tokens, nullptr, nullptr, fo), ConfigError);
}

TEST_CASE("ablation engine: each configuration's metric equals a forward with the heads edited by hand") {
    auto m = load_model(toy());
    const int L = m->config.n_layers, H = m->config.n_heads;
    const auto gt = ground_truth();
    auto data = repeated_data(*m, 12, 6, 3, 6, 68);
    const int64_t n = data.n;
    auto [pl, ph] = head_of(gt["previous_token_head"].get<std::string>());
    std::vector<std::pair<int, int>> ind;
    for (const auto& x : gt["induction_heads"]) ind.push_back(head_of(x.get<std::string>()));
    // Configurations: baseline, the previous-token head, the induction set, a mixed pair.
    std::vector<std::vector<std::pair<int, int>>> configs = {{}, {{pl, ph}}, ind, {{0, (ph + 1) % H}, {L - 1, 0}}};
    std::vector<at::Tensor> masks;
    for (const auto& c : configs) {
        auto mk = torch::zeros({L, H}, torch::kUInt8);
        for (auto [l, h] : c) mk[l][h] = 1;
        masks.push_back(mk);
    }
    auto M = torch::stack(masks);

    SUBCASE("zero, loss on the repeated half") {
        AblationSetup s;
        s.positions = Positions::kRepeatedHalf;
        auto got = Ablator(*m, data, s).evaluate(M);
        for (size_t c = 0; c < configs.size(); ++c) {
            Hooks hk;
            for (auto [l, h] : configs[c]) hk.intervene_z({l, h, -1, HeadOp::kZero, 0.0, {}});
            CHECK(max_diff(got[c], direct_rows(*m, data.tokens, n, hk)) < kTol);
        }
        // The circuit matters: ablating the previous-token head costs far more than the mixed pair.
        CHECK(got[1].mean().item<double>() > got[0].mean().item<double>() + 1.0);
    }
    SUBCASE("scale and zero-query") {
        AblationSetup s;
        s.positions = Positions::kRepeatedHalf;
        s.mode = Intervention::kScale;
        s.factor = 1.7;
        auto got = Ablator(*m, data, s).evaluate(M);
        s.mode = Intervention::kZeroQuery;
        auto gotq = Ablator(*m, data, s).evaluate(M);
        for (size_t c = 0; c < configs.size(); ++c) {
            Hooks hk, hq;
            for (auto [l, h] : configs[c]) {
                hk.intervene_z({l, h, -1, HeadOp::kScale, 1.7, {}});
                hq.intervene_q({l, h, -1, HeadOp::kZero, 0.0, {}});
            }
            CHECK(max_diff(got[c], direct_rows(*m, data.tokens, n, hk)) < kTol);
            CHECK(max_diff(gotq[c], direct_rows(*m, data.tokens, n, hq)) < kTol);
        }
    }
    SUBCASE("stream: each configuration's heads get the window, as Hooks::window by hand") {
        AblationSetup s;
        s.positions = Positions::kRepeatedHalf;
        s.mode = Intervention::kStream;
        s.window = {1, 2, false};
        auto got = Ablator(*m, data, s).evaluate(M);
        s.window.compensate = true;
        auto gotc = Ablator(*m, data, s).evaluate(M);
        for (size_t c = 0; c < configs.size(); ++c) {
            Hooks hk, hc;
            for (auto [l, h] : configs[c]) {
                hk.window({l, h, -1, 1, 2, false, {}});
                hc.window({l, h, -1, 1, 2, true, {}});
            }
            CHECK(max_diff(got[c], direct_rows(*m, data.tokens, n, hk)) < kTol);
            CHECK(max_diff(gotc[c], direct_rows(*m, data.tokens, n, hc)) < kTol);
        }
        // Streaming is not ablation: the previous-token head needs only the key before its query,
        // the induction heads need the first half of the sequence.
        const double base = got[0].mean().item<double>(), prev = got[1].mean().item<double>(), ind = got[2].mean().item<double>();
        MESSAGE("repeated-half loss: clean " << base << ", previous-token head streaming (sink 1, recent 2) " << prev
                                             << ", induction heads streaming " << ind);
        CHECK(prev < base + 0.05);
        CHECK(ind > base + 1.0);
    }
    SUBCASE("mean per position and resample, from another dataset") {
        auto ref = repeated_data(*m, 12, 10, 9, 6, 68);
        // Reference z by hand: mean over the reference rows per position, and the raw rows.
        std::vector<at::Tensor> z(L);
        Hooks cap;
        cap.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = x.clone(); });
        {
            torch::NoGradGuard ng;
            m->forward(ref.tokens, &cap);
        }
        AblationSetup s;
        s.positions = Positions::kRepeatedHalf;
        s.mode = Intervention::kMean;
        s.reference = &ref;
        auto got = Ablator(*m, data, s).evaluate(M);
        s.mode = Intervention::kResample;
        s.resample_seed = 4;
        Ablator rs(*m, data, s);
        auto gotr = rs.evaluate(M);
        for (size_t c = 0; c < configs.size(); ++c) {
            Hooks hk;
            for (auto [l, h] : configs[c]) hk.intervene_z({l, h, -1, HeadOp::kReplace, 0.0, z[l].mean(0).select(1, h)});
            CHECK(max_diff(got[c], direct_rows(*m, data.tokens, n, hk)) < kTol);
            // Resample: row i reads reference row resample_source(i); one forward per row.
            for (int64_t i = 0; i < data.rows(); ++i) {
                Hooks hr;
                const int64_t src = rs.resample_source(i);
                CHECK(src >= 0);
                for (auto [l, h] : configs[c]) hr.intervene_z({l, h, -1, HeadOp::kReplace, 0.0, z[l][src].select(1, h)});
                auto row = data.tokens.narrow(0, i, 1);
                CHECK(std::abs(gotr[c][i].item<double>() - direct_rows(*m, row, n, hr)[0].item<double>()) < kTol);
            }
        }
    }
    SUBCASE("kl to the clean model, over every position") {
        AblationSetup s;
        s.metric = MetricKind::kKl;
        auto got = Ablator(*m, data, s).evaluate(M);
        torch::NoGradGuard ng;
        auto clean = torch::log_softmax(m->forward(data.tokens), -1).narrow(1, 0, data.tokens.size(1) - 1);
        for (size_t c = 0; c < configs.size(); ++c) {
            Hooks hk;
            for (auto [l, h] : configs[c]) hk.intervene_z({l, h, -1, HeadOp::kZero, 0.0, {}});
            auto abl = torch::log_softmax(m->forward(data.tokens, &hk), -1).narrow(1, 0, data.tokens.size(1) - 1);
            auto kl = (clean.exp() * (clean - abl)).sum(-1).mean(1);  // [N]
            CHECK(max_diff(got[c], kl) < kTol);
        }
        CHECK(got[0].abs().max().item<double>() < 1e-6);
    }
}

TEST_CASE("ablation engine: batched equals unbatched, and prefix reuse equals full recomputation") {
    auto m = load_model(toy());
    const int L = m->config.n_layers, H = m->config.n_heads;
    auto data = repeated_data(*m, 10, 5, 11, 6, 68);
    // Every single head, every layer and two random sets: configurations starting at each layer.
    std::vector<at::Tensor> masks = {torch::zeros({L, H}, torch::kUInt8)};
    for (int j = 0; j < L * H; ++j) {
        auto mk = torch::zeros({L, H}, torch::kUInt8);
        mk[j / H][j % H] = 1;
        masks.push_back(mk);
    }
    for (int l = 0; l < L; ++l) masks.push_back(torch::zeros({L, H}, torch::kUInt8).index_fill_(0, torch::tensor({l}), 1));
    auto gen = at::detail::createCPUGenerator(3);
    for (int r = 0; r < 2; ++r) masks.push_back(at::randint(2, {L, H}, gen, torch::TensorOptions().dtype(torch::kLong)).to(torch::kUInt8));
    auto M = torch::stack(masks);
    for (auto mode : {Intervention::kZero, Intervention::kMeanQuery}) {
        CAPTURE(static_cast<int>(mode));
        AblationSetup s;
        s.positions = Positions::kRepeatedHalf;
        s.mode = mode;
        s.max_rows = 1000;  // every configuration in one forward
        Ablator batched(*m, data, s);
        auto a = batched.evaluate(M);
        s.max_rows = data.rows();  // one configuration a forward
        s.prefix_reuse = false;
        auto b = Ablator(*m, data, s).evaluate(M);
        s.prefix_reuse = true;
        auto c = Ablator(*m, data, s).evaluate(M);
        s.max_rows = 3;  // the 5 rows in chunks of 3 and 2
        auto d = Ablator(*m, data, s).evaluate(M);
        CHECK(max_diff(a, b) < kTol);
        CHECK(max_diff(b, c) < kTol);
        CHECK(max_diff(b, d) < kTol);
        CHECK(!torch::isnan(a).any().item<bool>());
        CHECK(batched.forwards() < M.size(0));
    }
}

TEST_CASE("ablation prune: gradient importance equals central finite differences on the gates") {
    auto m = load_model(toy());
    const int L = m->config.n_layers, H = m->config.n_heads;
    auto data = repeated_data(*m, 8, 4, 21, 6, 68);
    for (Positions pos : {Positions::kRepeatedHalf, Positions::kAll}) {
        CAPTURE(name_of(pos));
        AblationSetup s;
        s.positions = pos;
        Ablator ab(*m, data, s);
        auto pruned = torch::zeros({L, H}, torch::kUInt8);
        pruned[0][0] = 1;  // importance at a partly pruned model, as after a prune step
        auto grad = ab.gate_gradient_importance(pruned);
        const double eps = 1e-2;
        auto xi = (1 - pruned.to(torch::kDouble));
        double worst = 0;
        for (int l = 0; l < L; ++l)
            for (int h = 0; h < H; ++h) {
                auto up = xi.clone(), dn = xi.clone();
                up[l][h] += eps;
                dn[l][h] -= eps;
                auto d = (ab.evaluate_gates(up).to(torch::kDouble) - ab.evaluate_gates(dn).to(torch::kDouble)) / (2 * eps);
                const double fd = d.abs().mean().item<double>(), g = grad[l][h].item<double>();
                const double rel = std::abs(g - fd) / std::max(std::abs(fd), 1e-3);
                worst = std::max(worst, rel);
                CHECK_MESSAGE(rel < 1e-3, format_head(l, h) << ": autograd " << g << " vs finite differences " << fd);
            }
        MESSAGE(name_of(pos) << ": worst relative difference " << worst);
    }
    auto n = normalise_per_layer(torch::tensor({{3.0, 4.0}, {0.0, 2.0}}, torch::kDouble));
    CHECK(max_diff(n, torch::tensor({{0.6, 0.8}, {0.0, 1.0}}, torch::kDouble)) < 1e-12);
}

TEST_CASE("ablation run: the issue's toy-induction example finds the previous-token head and the induction set") {
    TempDir dir;
    const std::string out = dir.file("x.h5");
    const std::string exp = std::string(HS_SOURCE_DIR) + "/datasets/experiments/toy-induction.yaml";
    REQUIRE(run_cli(fmt::format("run '{}' --model '{}' --out '{}'", exp, toy(), out)) == 0);
    const auto gt = ground_truth();
    ResultReader r(out);
    auto masks = r.read("/ablation/single/masks"), metric = r.read("/ablation/single/metric");
    auto kind = r.read("/ablation/single/kind");
    const int64_t S = masks.shape[0], L = masks.shape[1], H = masks.shape[2];
    CHECK(kind.strings[0] == "baseline");
    CHECK(S == 1 + L * H);
    // The single study ranks the previous-token head first.
    int64_t best = 1;
    for (int64_t i = 1; i < S; ++i)
        if (metric.values[i] > metric.values[best]) best = i;
    auto [pl, ph] = head_of(gt["previous_token_head"].get<std::string>());
    CHECK(masks.values[best * L * H + pl * H + ph] == 1);
    // Cumulative at k = |induction set|: that set, and a joint harm of several nats.
    auto cm = r.read("/ablation/cumulative/masks"), cmet = r.read("/ablation/cumulative/metric");
    auto ck = r.read("/ablation/cumulative/k"), ckind = r.read("/ablation/cumulative/kind");
    auto cseed = r.read("/ablation/cumulative/control_seed");
    const int64_t k = static_cast<int64_t>(gt["induction_heads"].size());
    const double base = cmet.values[0];
    bool found = false;
    std::vector<uint8_t> top4(L * H, 0);  // every head the cumulative sweep tests
    for (int64_t i = 0; i < cm.shape[0]; ++i)
        if (ckind.strings[i] == "cumulative")
            for (int64_t j = 0; j < L * H; ++j) top4[j] |= cm.values[i * L * H + j] != 0;
    for (int64_t i = 0; i < cm.shape[0]; ++i) {
        if (ckind.strings[i] == "control") {
            CHECK(cseed.values[i] >= 0);
            for (int64_t j = 0; j < L * H; ++j) CHECK(!(top4[j] && cm.values[i * L * H + j] != 0));
            continue;
        }
        CHECK(cseed.values[i] == -1);
        if (ckind.strings[i] != "cumulative" || ck.values[i] != k) continue;
        found = true;
        for (const auto& name : gt["induction_heads"]) {
            auto [l, h] = head_of(name.get<std::string>());
            CHECK(cm.values[i * L * H + l * H + h] == 1);
        }
        const double harm = cmet.values[i] - base;
        const double gt_harm = gt["induction_heads_joint_ablation"].get<double>() - gt["baseline"].get<double>();
        MESSAGE("cumulative k=" << k << ": +" << harm << " nats (training log's joint ablation: +" << gt_harm << ")");
        CHECK(harm > 2.0);
        CHECK(harm > 0.5 * gt_harm);
    }
    CHECK(found);
    // Three controls per non-baseline configuration; every row and the data are in the file.
    CHECK(cm.shape[0] == 1 + 4 * 4);
    CHECK(r.read("/ablation/cumulative/metric_rows").shape == std::vector<int64_t>{cm.shape[0], 32});
    CHECK(r.read("/data/repeats/tokens").shape == std::vector<int64_t>{32, 41});
    CHECK(r.exists("/scores/induction/score"));
    auto a = r.attrs("/ablation/cumulative");
    CHECK(attr_to_string(a.at("mode")) == "zero");
    CHECK(attr_to_string(a.at("positions")) == "repeated-half");
}

TEST_CASE("ablation run: SIGKILL then --resume equals an uninterrupted run; two shards merged equal it too") {
    TempDir dir;
    const std::string exp = std::string(HS_SOURCE_DIR) + "/datasets/experiments/toy-induction.yaml";
    const std::string base = fmt::format("run '{}' --model '{}' --batch-rows 32", exp, toy());
    REQUIRE(run_cli(base + " --out '" + dir.file("full.h5") + "'") == 0);
    // Killed mid-run: one configuration per batch, a pause after each flush, SIGKILL after ~1 s.
    const std::string killed = dir.file("killed.h5");
    const std::string script = fmt::format(
        "'{}' -q {} --out '{}' --pause-after-batch 150 >/dev/null 2>&1 & pid=$!; "
        "for i in $(seq 100); do [ -f '{}' ] && break; sleep 0.05; done; sleep 1; {{ kill -9 $pid; wait $pid; }} 2>/dev/null; exit 0",
        HS_BINARY, base, killed, killed);
    std::ofstream(dir.file("kill.sh")) << script << "\n";
    REQUIRE(std::system(("bash '" + dir.file("kill.sh") + "'").c_str()) == 0);
    {
        ResultReader r(killed);  // readable, and part-way
        double d = 0, total = 0;
        for (const char* study : {"single", "cumulative"})
            for (double v : r.read(std::string("/ablation/") + study + "/done").values) d += v, total += 1;
        MESSAGE("configurations done when killed: " << d << " of " << total);
        CHECK(d >= 1);
        CHECK(d < total);
    }
    CHECK(run_cli(base + " --out '" + killed + "'") != 0);  // no clobbering without --resume
    REQUIRE(run_cli(base + " --out '" + killed + "' --resume") == 0);
    // Shards.
    REQUIRE(run_cli(base + " --shard 0/2 --out '" + dir.file("s0.h5") + "'") == 0);
    REQUIRE(run_cli(base + " --shard 1/2 --out '" + dir.file("s1.h5") + "'") == 0);
    REQUIRE(run_cli(fmt::format("merge '{}' '{}' --out '{}'", dir.file("s0.h5"), dir.file("s1.h5"), dir.file("merged.h5"))) == 0);
    CHECK(run_cli(fmt::format("merge '{}' '{}' --out '{}'", dir.file("s0.h5"), dir.file("s0.h5"), dir.file("bad.h5"))) == 6);
    ResultReader full(dir.file("full.h5")), res(killed), merged(dir.file("merged.h5")), s0(dir.file("s0.h5"));
    for (const char* study : {"single", "cumulative"}) {
        const std::string g = std::string("/ablation/") + study;
        auto want = full.read(g + "/metric_rows");
        for (const auto* r : {&res, &merged}) {
            CAPTURE(r->path());
            auto got = r->read(g + "/metric_rows");
            REQUIRE(got.shape == want.shape);
            double worst = 0;
            for (size_t i = 0; i < want.values.size(); ++i) worst = std::max(worst, std::abs(got.values[i] - want.values[i]));
            CHECK(worst < kTol);
            CHECK(r->read(g + "/masks").values == full.read(g + "/masks").values);
            for (double d : r->read(g + "/done").values) CHECK(d == 1);
        }
        // Shard 0 of 2 ran exactly the even batches of the unsharded run's plan.
        auto d0 = s0.read(g + "/done"), batch = full.read(g + "/batch");
        CHECK(s0.read(g + "/batch").values == batch.values);
        for (size_t i = 0; i < d0.values.size(); ++i) CHECK(d0.values[i] == (static_cast<int64_t>(batch.values[i]) % 2 == 0 ? 1 : 0));
    }
    // A shard of another experiment is refused.
    std::ofstream(dir.file("other.yaml")) << read_text_file(exp) << "\n# edited\n";
    REQUIRE(run_cli(fmt::format("run '{}' --model '{}' --shard 1/2 --out '{}'", dir.file("other.yaml"), toy(), dir.file("o1.h5"))) == 0);
    CHECK(run_cli(fmt::format("merge '{}' '{}' --out '{}'", dir.file("s0.h5"), dir.file("o1.h5"), dir.file("bad.h5"))) == 6);
    CHECK(!file_exists(dir.file("bad.h5")));
}

TEST_CASE("ablation YAML: schema errors name the file, line and column") {
    const std::string head = "model: m\ndata:\n  r: {kind: repeated, length: 5, count: 2}\n";
    const std::string study = "studies:\n  - name: s\n    sweep: single\n    metric: {kind: loss, data: r}\n";
    CHECK(cfg_error(head + study) == "(no error)");
    CHECK(cfg_error("model: m\nmodle: x\n").find("exp.yaml:2:1: unknown key 'modle'") != std::string::npos);
    CHECK(cfg_error("model: m\nattention: fused\ndtype: auto\n" + head.substr(9) + study) == "(no error)");
    CHECK(cfg_error("model: m\nattention: sdpa\n" + head.substr(9) + study).find("exp.yaml:2:12: 'attention': unknown value 'sdpa'") != std::string::npos);
    CHECK(cfg_error(head + "studies:\n  - name: s\n    sweep: singel\n    metric: {kind: loss, data: r}\n")
              .find("exp.yaml:6:12: 'sweep': unknown value 'singel'") != std::string::npos);
    CHECK(cfg_error("model: m\ndata:\n  r: {kind: repeated, length: five, count: 2}\n" + study)
              .find("exp.yaml:3:31: 'length': expected an integer, got 'five'") != std::string::npos);
    CHECK(cfg_error(head + study + "    heads: [L1H0, L1X3]\n").find("exp.yaml:8:19: heads: expected a head name") !=
          std::string::npos);
    CHECK(cfg_error(head + "studies:\n  - name: s\n    sweep: single\n    metric: {kind: loss, data: q}\n")
              .find("exp.yaml:7:32: no dataset named 'q'") != std::string::npos);
    CHECK(cfg_error(head + "studies:\n  - name: s\n    sweep: single\n    metric: {kind: accuracy, data: r}\n")
              .find("exp.yaml:7:13: metric accuracy needs a prompts or conflicts dataset") != std::string::npos);
    CHECK(cfg_error(head + "studies:\n  - name: s\n    sweep: cumulative\n    heads: {top: [1, 2], by: scores/induction/score}\n"
                           "    metric: {kind: loss, data: r}\n")
              .find("exp.yaml:7:30: by: 'scores/induction/score': this experiment computes no probe 'induction'") !=
          std::string::npos);
    CHECK(cfg_error(head + "studies:\n  - name: s\n    sweep: single\n    mode: mean\n    metric: {kind: loss, data: r}\n")
              .find("exp.yaml:7:11: mode mean: needs 'data'") != std::string::npos);
    CHECK(cfg_error("model: m\n  bad: [\n").find("exp.yaml:2:") != std::string::npos);
}
