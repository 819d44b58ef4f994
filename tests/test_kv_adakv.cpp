// Ada-KV and CriticalAdaKV (probes/needle/kv/kv_adakv.h; docs/methods.md, "KV-cache policies"): the kept
// positions against kvpress's code run step by step (tests/adakv_reference.py's cases in
// tests/fixtures/adakv/reference.json, exact sets), hand-made cases, the safeguard and the equal memory
// (a layer keeps K C entries, what per-head SnapKV's H query heads keep) through the policies'
// configurations, and CriticalKV's value norms on the fixture models against a recomputation in double.
#include <doctest/doctest.h>

#include "kv_adakv.h"
#include "kv_policy.h"
#include "model.h"
#include "weight_circuits.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

using namespace hs;

namespace {

std::string source(const std::string& rel) { return std::string(HS_SOURCE_DIR) + "/" + rel; }

at::Tensor floats(const nlohmann::json& j, std::vector<int64_t> shape) {
    std::vector<float> v;
    for (const auto& x : j) v.push_back(static_cast<float>(x.get<double>()));  // float32 values, written exactly
    return torch::tensor(v, torch::kFloat).view(shape);
}

// The kept positions of each row of a [K, P] bool mask.
std::vector<std::vector<int64_t>> kept(const at::Tensor& keep) {
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(keep.size(0)));
    for (int64_t k = 0; k < keep.size(0); ++k)
        for (int64_t p = 0; p < keep.size(1); ++p)
            if (keep[k][p].item<bool>()) out[static_cast<size_t>(k)].push_back(p);
    return out;
}

double rel_max(const at::Tensor& a, const at::Tensor& b) {
    return ((a.to(torch::kDouble) - b.to(torch::kDouble)).abs() / b.to(torch::kDouble).abs().clamp_min(1.0)).max().item<double>();
}

Trial trial_of(int64_t P) {
    Trial t;
    t.prompt.assign(static_cast<size_t>(P), 1);
    return t;
}

}  // namespace

TEST_CASE("kv adakv: the kept positions equal kvpress's AdaKVPress and CriticalAdaKVPress (adakv_reference.py's cases)") {
    std::ifstream f(source("tests/fixtures/adakv/reference.json"));
    REQUIRE(f.good());
    const auto doc = nlohmann::json::parse(f);
    REQUIRE(doc["cases"].size() >= 16);
    int i = 0;
    for (const auto& c : doc["cases"]) {
        CAPTURE(i++);
        const int64_t H = c["H"], K = c["K"], w = c["window"], P = c["P"], C = c["C"], d = c["d"], D = c["D"];
        const double alpha = c["alpha"], eps = c["epsilon"], first = c["first_stage"];
        CAPTURE(H);
        CAPTURE(K);
        CAPTURE(C);
        CAPTURE(alpha);
        const auto pooled = floats(c["pooled"], {H, P - w});
        const auto kv = adakv_kv_scores(pooled, H / K, P);
        // The group mean and the window's pad: the same float32 operations as the reference.
        CHECK(rel_max(kv, floats(c["kv_scores"], {K, P})) < 1e-6);
        const auto values = floats(c["values"], {K, P, d}).permute({1, 0, 2}).contiguous();  // [P, K, d]
        const auto vo = vo_l1_norms(values, floats(c["o_out"], {H, d, D}));
        CHECK(rel_max(vo, floats(c["vo"], {K, P})) < 1e-5);
        const auto ada = adakv_keep(kv, C, alpha);
        CHECK(kept(ada) == c["keep_adakv"].get<std::vector<std::vector<int64_t>>>());
        const auto crit = critical_adakv_keep(kv, vo, C, alpha, eps, first);
        CHECK(kept(crit) == c["keep_critical"].get<std::vector<std::vector<int64_t>>>());
        // Both keep exactly K C entries of the layer (kvpress prunes K (P - C)).
        CHECK(ada.sum().item<int64_t>() == K * C);
        CHECK(crit.sum().item<int64_t>() == K * C);
    }
}

TEST_CASE("kv adakv: hand-made layers: the budget moves to the head with the best scores, the safeguard holds a floor") {
    // Two KV heads (g = 1), prefix scores, window 1 (padded at max + 1 = 1.9): P = 5.
    const auto pooled = torch::tensor({0.9, 0.8, 0.7, 0.6, 0.1, 0.05, 0.02, 0.01}, torch::kFloat).view({2, 4});
    const auto kv = adakv_kv_scores(pooled, 1, 5);
    CHECK(kv[0][4].item<float>() == doctest::Approx(1.9f));
    CHECK(kv[1][4].item<float>() == kv[0][4].item<float>());
    // C = 3, alpha 0.2: n_safe = int(0.6) = 0; the 6 best: both windows and head 0's four positions.
    CHECK(kept(adakv_keep(kv, 3, 0.2)) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3, 4}, {4}});
    // alpha 0.7: n_safe = int(2.1) = 2: head 1 keeps its window and its best position; head 0 the next two.
    CHECK(kept(adakv_keep(kv, 3, 0.7)) == std::vector<std::vector<int64_t>>{{0, 1, 2, 4}, {0, 4}});
    // alpha 1: every head its own C best, per-head SnapKV.
    CHECK(kept(adakv_keep(kv, 3, 1.0)) == std::vector<std::vector<int64_t>>{{0, 1, 4}, {0, 1, 4}});
    // Critical, alpha 0.7: budgets (4, 2); stage 1 keeps int(4 x 0.5) = 2 and 1 best (all safeguarded); head 0
    // fills its other two by (score + 1e-4) x norm: position 3 (0.6 x 10) before 1 (0.8) and 2 (0.7).
    const auto vo = torch::tensor({1.0, 1.0, 1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, torch::kFloat).view({2, 5});
    CHECK(kept(critical_adakv_keep(kv, vo, 3, 0.7, 1e-4, 0.5)) == std::vector<std::vector<int64_t>>{{0, 1, 3, 4}, {0, 4}});
    // Norms alike: the same as Ada-KV.
    CHECK(kept(critical_adakv_keep(kv, torch::ones({2, 5}), 3, 0.7, 1e-4, 0.5)) == kept(adakv_keep(kv, 3, 0.7)));
    // A KV head's budget: g max(B, w), at most P; P <= B whole.
    const KvShape gqa{2, 8, 2, 4, 4};
    CHECK(adakv_capacity(10, 100, gqa, 4) == 40);
    CHECK(adakv_capacity(2, 100, gqa, 4) == 16);
    CHECK(adakv_capacity(30, 100, gqa, 4) == 100);
    CHECK(adakv_capacity(100, 100, gqa, 4) == 100);
}

TEST_CASE("kv adakv: every layer keeps K C entries, each head at least its safeguard and as many as its window") {
    torch::manual_seed(11);
    for (const auto& [H, K] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {6, 3}})
        for (const int64_t C : {6, 11, 25})
            for (const double alpha : {0.0, 0.2, 0.5}) {
                CAPTURE(H);
                CAPTURE(K);
                CAPTURE(C);
                CAPTURE(alpha);
                const int64_t P = 40, w = 5, n_safe = static_cast<int64_t>(static_cast<double>(C) * alpha);
                // Heads of very different scales: Ada-KV's budgets move, the floor binds.
                const auto pooled = torch::rand({H, P - w}).pow(3) * torch::exp(2 * torch::randn({H, 1}));
                const auto kv = adakv_kv_scores(pooled, H / K, P);
                const auto vo = torch::rand({K, P}) + 0.1;
                const auto ada = adakv_keep(kv, C, alpha);
                for (const auto& keep : {ada, critical_adakv_keep(kv, vo, C, alpha, 1e-4, 0.5)}) {
                    CHECK(keep.sum().item<int64_t>() == K * C);
                    CHECK(keep.sum(1).min().item<int64_t>() >= std::max(n_safe, w));
                    if (std::max(n_safe, w) == n_safe) {  // the floor past the window: each head's n_safe best kept
                        const auto best = std::get<1>(kv.sort(true, 1, true)).narrow(1, 0, n_safe);
                        CHECK(keep.gather(1, best).all().item<bool>());
                    }
                }
                // Ada-KV keeps every window (its max + 1 sorts first); CriticalAdaKV keeps the window only where
                // stage 1 promotes it, as kvpress.
                CHECK(ada.narrow(1, P - w, w).all().item<bool>());
            }
}

TEST_CASE("kv adakv: at a budget the policies keep what per-head SnapKV keeps (K C = H B a layer), GQA's mask per KV head") {
    for (const auto& [H, K] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}}) {
        CAPTURE(H);
        const int64_t L = 2, w = 3;
        KvCompareSpec spec;
        spec.snap = SnapKVSettings{w, 1};
        const std::vector<Trial> trials = {trial_of(30), trial_of(64)};
        const KvShape sh{L, H, K, H / K, L * K};
        auto pooled = std::make_shared<std::map<const Trial*, at::Tensor>>();
        auto vo = std::make_shared<std::map<const Trial*, at::Tensor>>();
        torch::manual_seed(5);
        for (const auto& t : trials) {
            const int64_t P = static_cast<int64_t>(t.prompt.size());
            (*pooled)[&t] = torch::rand({L, H, P - w});
            (*vo)[&t] = torch::rand({L, K, P}) + 0.1;
        }
        KvContext ctx{spec, sh, trials, pooled, vo};
        const KvPolicy* snap = find_kv_policy("snapkv");
        for (const char* name : {"adakv", "critical-adakv"}) {
            CAPTURE(name);
            const KvPolicy* p = find_kv_policy(name);
            REQUIRE(p != nullptr);
            CHECK(p->needs_snapkv());
            CHECK(p->needs_vo_norms() == (std::string(name) == "critical-adakv"));
            const KvPolicySpec ps{p, name, {}, ""};
            const KvPolicySpec ss{snap, "snapkv", {}, ""};
            for (const double budget : {0.1, 0.25, 0.5}) {
                CAPTURE(budget);
                const auto c = p->config(ps, budget, ctx);
                const auto sc = snap->config(ss, budget, ctx);
                CHECK(c.frac == sc.frac);  // the same measured memory as SnapKV
                for (size_t i = 0; i < trials.size(); ++i) {
                    const auto& t = trials[i];
                    const int64_t P = static_cast<int64_t>(t.prompt.size());
                    const auto keep = c.set.keep(t), skeep = sc.set.keep(t);  // [L, H, P]
                    for (int64_t l = 0; l < L; ++l) {
                        const auto per_kv = keep[l].view({K, H / K, P});
                        CHECK(torch::equal(per_kv, per_kv.narrow(1, 0, 1).expand({K, H / K, P})));  // one mask a group
                        // K C entries a layer = what SnapKV's H query heads keep (H B).
                        CHECK(per_kv.select(1, 0).sum().item<int64_t>() == skeep[l].sum().item<int64_t>());
                        CHECK(static_cast<double>(per_kv.select(1, 0).sum().item<int64_t>()) ==
                              doctest::Approx(c.frac[i] * static_cast<double>(K * P)));
                    }
                }
            }
            // A fixed capacity column: the key names it, the memory is SnapKV's at that capacity.
            KvContext cc = ctx;
            cc.capacity = 6;
            CHECK(p->config(ps, 0.3, cc).frac == snap->config(ss, 0.3, cc).frac);
            CHECK(p->config(ps, 0.3, cc).key != p->config(ps, 0.3, ctx).key);
        }
    }
}

TEST_CASE("kv adakv: CriticalKV's value norms equal a recomputation from the captured values and W_O") {
    for (const std::string name : {"gpt2", "qwen3", "olmo2"}) {
        CAPTURE(name);
        auto m = load_model(source("tests/fixtures/families/" + name));
        const auto& cfg = m->config;
        const int64_t P = 23, g = cfg.n_heads / cfg.n_kv_heads;
        torch::manual_seed(2);
        auto tokens = torch::randint(cfg.vocab_size, {1, P}, torch::kLong);
        std::vector<int64_t> prompt(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + P);
        const auto got = critical_vo_norms(*m, prompt, 6);  // [L, K, P], the prefill in chunks of 6
        REQUIRE(got.sizes() == at::IntArrayRef({cfg.n_layers, cfg.n_kv_heads, P}));
        std::vector<at::Tensor> v(static_cast<size_t>(cfg.n_layers));
        Hooks h;
        h.capture(Point::kAttnV, [&](int l, const at::Tensor& x) { v[static_cast<size_t>(l)] = x[0].to(torch::kDouble); });
        torch::NoGradGuard ng;
        m->forward(tokens, &h);
        double worst = 0;
        for (int l = 0; l < cfg.n_layers; ++l)
            for (int64_t k = 0; k < cfg.n_kv_heads; ++k) {
                auto ref = torch::zeros({P}, torch::kDouble);
                for (int64_t j = 0; j < g; ++j)
                    ref += torch::mm(v[static_cast<size_t>(l)].select(1, k), head_o_out(*m, l, static_cast<int>(k * g + j)).to(torch::kDouble))
                               .abs()
                               .sum(1);
                ref /= static_cast<double>(g);
                worst = std::max(worst, rel_max(got[l][k], ref));
            }
        CHECK(worst < 1e-5);
    }
}
