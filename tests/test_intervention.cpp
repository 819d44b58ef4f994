// The intervention vocabulary and its one applier (src/interp/intervention.h): each name means one thing,
// a caller's subset is what it parses, and apply_intervention's two forms (a head list in one row,
// per-row masks) do the same operation as the hooks they stand for. References: hand-made
// Hooks::intervene_* calls on a family fixture.
#include <doctest/doctest.h>

#include "errors.h"
#include "intervention.h"
#include "model.h"

#include <torch/torch.h>

#include <string>

using namespace hs;

namespace {

std::unique_ptr<Model> fixture() { return load_model(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/qwen3"); }

double max_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// The same numbers up to float32 rounding: the mask and head forms (and an untouched row against a
// plain forward) sum the heads' outputs in different orders, which moves logits of ~27 by a few
// ulps (1.4e-5 seen on one CI machine's BLAS). 4e-6 of the largest logit is ~50 ulps; a real
// difference (a head ablated or not) moves them by more than 1e-2.
bool same_numbers(const at::Tensor& a, const at::Tensor& b) {
    return max_diff(a, b) <= 4e-6 * std::max(1.0, b.abs().max().item<double>());
}

}  // namespace

TEST_CASE("intervention names: one meaning each; a caller's subset is what it parses") {
    CHECK(intervention_point(Intervention::kMeanQuery) == Point::kAttnQ);
    CHECK(intervention_point(Intervention::kMeanQueryPreRope) == Point::kAttnQPreRope);
    CHECK(intervention_point(Intervention::kMean) == Point::kAttnZ);
    CHECK(intervention_point(Intervention::kStream) == Point::kCount);
    CHECK(std::string(intervention_name(Intervention::kMeanQueryPreRope)) == "mean-query-pre-rope");
    // Studies (YAML mode:, ablate --mode) list every intervention but LOCOS's pre-RoPE mean, as before.
    CHECK(names_in(study_intervention_names()) ==
          std::vector<std::string>{"zero", "mean", "resample", "scale", "zero-query", "mean-query", "stream"});
    try {
        parse_intervention("mean-query-pre-rope", "mode", study_interventions());
        FAIL("accepted");
    } catch (const UsageError& e) {
        CHECK(std::string(e.what()) == "mode 'mean-query-pre-rope': expected zero, mean, resample, scale, zero-query, "
                                       "mean-query or stream");
    }
    CHECK(parse_intervention("mean-query-pre-rope") == Intervention::kMeanQueryPreRope);
}

TEST_CASE("apply_intervention on heads equals the hooks it stands for; a mode the caller does not allow is a bug") {
    auto m = fixture();
    const auto& c = m->config;
    torch::NoGradGuard ng;
    auto seq = torch::randint(1, c.vocab_size, {2, 9}, torch::kLong);
    const std::vector<Head> heads = {{0, 1}, {1, 0}};
    auto value = torch::randn({c.n_layers, c.n_heads, c.d_head});
    auto by_hand = [&](auto&& add) {
        Hooks h;
        for (auto [l, hd] : heads) add(h, l, hd);
        return m->forward(seq, &h);
    };
    auto applied = [&](InterventionSpec spec, int64_t row) {
        Hooks h;
        apply_intervention(h, spec, heads, row, {spec.mode});
        return m->forward(seq, &h);
    };
    CHECK(torch::equal(applied({Intervention::kZero}, 1), by_hand([](Hooks& h, int l, int hd) {
                           h.intervene_z({l, hd, 1, HeadOp::kZero, 0.0, {}});
                       })));
    CHECK(torch::equal(applied({Intervention::kScale, 2.5}, -1), by_hand([](Hooks& h, int l, int hd) {
                           h.intervene_z({l, hd, -1, HeadOp::kScale, 2.5, {}});
                       })));
    CHECK(torch::equal(applied({Intervention::kZeroQuery}, 0), by_hand([](Hooks& h, int l, int hd) {
                           h.intervene_q({l, hd, 0, HeadOp::kZero, 0.0, {}});
                       })));
    CHECK(torch::equal(applied({Intervention::kMeanQueryPreRope, 1.0, value}, -1), by_hand([&](Hooks& h, int l, int hd) {
                           h.intervene_q_pre_rope({l, hd, -1, HeadOp::kReplace, 0.0, value[l][hd]});
                       })));
    const StreamWindow w{1, 2, false};
    CHECK(torch::equal(applied({Intervention::kStream, 1.0, {}, w}, -1), by_hand([&](Hooks& h, int l, int hd) {
                           h.window({l, hd, -1, w, {}});
                       })));
    // Each changes the output (the check above could not pass by doing nothing).
    CHECK(max_diff(applied({Intervention::kZero}, -1), m->forward(seq)) > 1e-2);
    CHECK(max_diff(applied({Intervention::kStream, 1.0, {}, w}, -1), m->forward(seq)) > 1e-2);
    Hooks h;
    CHECK_THROWS_AS(apply_intervention(h, {Intervention::kMeanQueryPreRope}, heads, -1, study_interventions()), std::logic_error);
    CHECK_THROWS_AS(apply_intervention(h, {Intervention::kResample}, heads, -1, {}), std::logic_error);
    apply_intervention(h, {Intervention::kNone}, heads, -1, {Intervention::kZero});  // none: nothing, whatever is allowed
    CHECK(torch::equal(m->forward(seq, &h), m->forward(seq)));
}

TEST_CASE("apply_intervention per row: the mask form equals the head form row by row") {
    auto m = fixture();
    const auto& c = m->config;
    torch::NoGradGuard ng;
    auto seq = torch::randint(1, c.vocab_size, {1, 9}, torch::kLong).repeat({3, 1});
    // Row 0 untouched, row 1 head (1, 0), row 2 heads (1, 0) and (1, 1).
    auto mask = torch::zeros({3, c.n_heads});
    mask[1][0] = 1, mask[2][0] = 1, mask[2][1] = 1;
    auto rows_form = [&](InterventionSpec spec) {
        Hooks h;
        apply_intervention(h, spec, LayerRows{1, mask, {}, false}, {spec.mode});
        return m->forward(seq, &h);
    };
    auto heads_form = [&](InterventionSpec spec) {
        Hooks h;
        apply_intervention(h, spec, {{1, 0}}, 1, {spec.mode});
        apply_intervention(h, spec, {{1, 0}, {1, 1}}, 2, {spec.mode});
        return m->forward(seq, &h);
    };
    for (const InterventionSpec& spec : {InterventionSpec{Intervention::kZero}, InterventionSpec{Intervention::kScale, 0.5},
                                         InterventionSpec{Intervention::kZeroQuery},
                                         InterventionSpec{Intervention::kStream, 1.0, {}, StreamWindow{1, 2, false}}}) {
        CAPTURE(intervention_name(spec.mode));
        auto a = rows_form(spec), b = heads_form(spec);
        CHECK(same_numbers(a, b));
        CHECK(same_numbers(a[0], m->forward(seq)[0]));
        CHECK(max_diff(a[2], a[0]) > 1e-2);
    }
    // Per-row factors: row r scaled by its own factor.
    Hooks h;
    apply_intervention(h, {Intervention::kScale}, LayerRows{1, mask, torch::tensor({1.0, 3.0, 0.0}, torch::kDouble), false},
                       {Intervention::kScale});
    Hooks g;
    apply_intervention(g, {Intervention::kScale, 3.0}, {{1, 0}}, 1, {Intervention::kScale});
    apply_intervention(g, {Intervention::kScale, 0.0}, {{1, 0}, {1, 1}}, 2, {Intervention::kScale});
    CHECK(same_numbers(m->forward(seq, &h), m->forward(seq, &g)));
}
