// The head atlas (probes/atlas/atlas.h): Spearman's rho by hand, the columns equal the probes that
// own them (the atlas recomputes nothing), roles are the scores above the thresholds, a planted
// model's sink heads take the sink role, the file round-trips.
#include <doctest/doctest.h>

#include "atlas.h"
#include "atlas_records.h"
#include "errors.h"
#include "planted_model.h"
#include "qk_spectrum.h"
#include "store.h"
#include "tmpdir.h"

#include <torch/torch.h>

#include <cmath>

using namespace hs;

TEST_CASE("atlas: Spearman's rho by hand") {
    CHECK(spearman({1, 2, 3, 4}, {10, 20, 30, 40}) == doctest::Approx(1.0));
    CHECK(spearman({1, 2, 3, 4}, {4, 3, 2, 1}) == doctest::Approx(-1.0));
    // Ranks (1, 2, 3) and (1, 3, 2): 1 - 6 * (0 + 1 + 1) / (3 * 8) = 0.5.
    CHECK(spearman({0.1, 0.5, 0.9}, {1, 9, 5}) == doctest::Approx(0.5));
    // Ties share their mean rank: (1.5, 1.5, 3) against (1, 2, 3): Pearson of the ranks = sqrt(3) / 2.
    CHECK(spearman({7, 7, 8}, {1, 2, 3}) == doctest::Approx(std::sqrt(3.0) / 2));
    CHECK(std::isnan(spearman({1, 1, 1}, {1, 2, 3})));
    CHECK(std::isnan(spearman({1, NAN, 2}, {1, 2, 3})));
}

TEST_CASE("atlas: the columns are the probes' scores, roles the scores above the thresholds, and the file round-trips") {
    // The planted model of test_sink_rate's ground truth: sink heads by construction.
    auto m = planted::model(21, 0.0, 0.0);
    const auto u = m->weights.embed;
    for (int l = 0; l < 2; ++l) {
        auto& lw = m->weights.layers[l];
        lw.wk.narrow(0, 0, planted::kHd).zero_();
        lw.wk[31].copy_(u[0] * 2.0);
        lw.wq.narrow(0, 0, 2 * planted::kHd).zero_();
        lw.wq[31].copy_(u.sum(0) * 2.0);  // head 0 of each layer sinks on token 0
    }
    m->config.bos_id = 0;
    AtlasSpec spec;
    spec.stripe.seq_len = 8, spec.stripe.batch = 3;
    spec.copy_suppression.n_tokens = 0;
    spec.thresholds["qk-rank"] = 10;
    auto r = run_atlas(*m, nullptr, spec);
    std::vector<std::string> names;
    for (const auto& c : r.columns) names.push_back(c.name);
    CHECK(names == std::vector<std::string>{"induction", "previous-token", "duplicate-token", "sink-rate", "copy-suppression", "qk-rank"});
    REQUIRE(r.skipped.size() == 1);
    CHECK(r.skipped[0].find("successor: no tokenizer") == 0);
    // The detectors' columns are run_head_probes' scores on the same rows.
    ProbeInput in;
    in.stripe_tokens = repeated_random_tokens(*m, spec.stripe), in.n = 8;
    auto probes = run_head_probes(*m, {"induction", "sink-rate"}, in);
    CHECK(torch::equal(r.columns[0].score, probes[0].score));
    CHECK(torch::equal(r.columns[3].score, probes[1].score));
    CHECK(torch::allclose(r.columns[5].score, qk_spectrum(*m).effective_rank.to(torch::kFloat), 0, 0, /*equal_nan=*/true));
    // Sink heads: alpha_0 = 1 > 0.3; the role is exactly score > threshold, and a column without one gives none.
    CHECK(r.roles[3][0][0].item<int>() == 1);
    CHECK(r.roles[3][1][0].item<int>() == 1);
    for (size_t k = 0; k < r.columns.size(); ++k) {
        const auto& c = r.columns[k];
        auto want = std::isnan(c.threshold) ? torch::zeros_like(r.roles[k]) : c.score.gt(c.threshold).to(torch::kUInt8);
        CHECK(torch::equal(r.roles[k], want));
    }
    CHECK(std::isnan(r.columns[4].threshold));
    CHECK(r.columns[5].threshold == 10);
    CHECK(torch::equal(r.n_roles, r.roles.to(torch::kLong).sum(0)));
    for (int64_t i = 0; i < 6; ++i)
        if (!std::isnan(r.correlation[i][i].item<double>())) CHECK(r.correlation[i][i].item<double>() == doctest::Approx(1.0));
    CHECK(torch::allclose(r.correlation.nan_to_num(7), r.correlation.t().nan_to_num(7)));
    spec.thresholds["bogus"] = 1;
    CHECK_THROWS_AS(run_atlas(*m, nullptr, spec), UsageError);
    spec.thresholds.erase("bogus");
    // Write and read back.
    TempDir dir;
    const auto rec = atlas_record(r, spec);
    {
        ResultWriter w(dir.file("a.h5"), WriteMode::kCreate);
        schema::write_atlas(w, rec);
        w.commit();
    }
    ResultReader rd(dir.file("a.h5"));
    auto back = schema::read_atlas(rd);
    CHECK(back.columns == rec.columns);
    CHECK(torch::allclose(torch::tensor(back.scores), torch::tensor(rec.scores), 0, 0, /*equal_nan=*/true));  // NaN: a zero QK form
    CHECK(back.role == rec.role);
    CHECK(back.n_roles == rec.n_roles);
    CHECK(back.skipped == rec.skipped);
    CHECK(back.model_sink_rate == rec.model_sink_rate);
    CHECK(back.L == 2);
    CHECK(back.H == planted::kH);
}
