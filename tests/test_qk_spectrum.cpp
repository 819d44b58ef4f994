// The weight-only QK spectrum (probes/weights/qk_spectrum.h): planted heads of known rank come out with
// that effective rank; on every real checkpoint the thin-QR route equals a full SVD of the
// d_model x d_model form built from the model's own weights (weight_circuits.h); the command
// writes what the library computes.
#include <doctest/doctest.h>

#include "model.h"
#include "planted_model.h"
#include "qk_spectrum.h"
#include "store.h"
#include "testdata.h"
#include "tmpdir.h"
#include "weight_circuits.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <variant>

using namespace hs;
using namespace torch::indexing;

namespace {

using planted::kD, planted::kH, planted::kHd, planted::kK;

double erank_of(const std::vector<double>& s) {
    return effective_rank(torch::tensor(s, torch::kDouble)).item<double>();
}

// Query head h's rows of wq, or kv head j's rows of wk ([d, D] each).
at::Tensor q_rows(Model& m, int l, int h) { return m.weights.layers[l].wq.index({Slice(h * kHd, (h + 1) * kHd)}); }
at::Tensor k_rows(Model& m, int l, int j) { return m.weights.layers[l].wk.index({Slice(j * kHd, (j + 1) * kHd)}); }

}  // namespace

TEST_CASE("qk-spectrum: effective rank of given singular values (exp of the entropy, Roy & Vetterli)") {
    CHECK(erank_of({3.0, 0.0, 0.0}) == doctest::Approx(1.0).epsilon(1e-12));
    CHECK(erank_of({1.0, 1.0, 1.0, 1.0}) == doctest::Approx(4.0).epsilon(1e-12));
    // p = (2/3, 1/3): exp(-(2/3 ln 2/3 + 1/3 ln 1/3)) = 1.88988...
    CHECK(erank_of({2.0, 1.0}) == doctest::Approx(std::exp(-(2.0 / 3 * std::log(2.0 / 3) + 1.0 / 3 * std::log(1.0 / 3))))
                                      .epsilon(1e-12));
    CHECK(std::isnan(erank_of({0.0, 0.0})));  // a zero form has no rank to speak of: NaN, not 0 or 1
}

TEST_CASE("qk-spectrum: planted heads of rank 1 and of k equal singular values, and a zero head") {
    auto m = planted::model(11, 0.1, 0.3);  // 2 layers, 4 query heads on 2 kv heads, d = D = 64
    torch::NoGradGuard ng;
    // L0H1: W_Q^h = a b^T (rank 1); its kv head (0) keeps random W_K: M_h has rank 1.
    q_rows(*m, 0, 1).copy_(torch::outer(torch::randn({kHd}), torch::randn({kD})));
    // L1H2 and L1H3 read kv head 1. W_K = I, W_Q^{L1H2} = the first 5 rows of I: M = diag(1 x5, 0...).
    k_rows(*m, 1, 1).copy_(torch::eye(kHd, kD));
    auto e5 = torch::zeros({kHd, kD});
    e5.index_put_({Slice(0, 5), Slice(0, 5)}, torch::eye(5));
    q_rows(*m, 1, 2).copy_(e5);
    // L1H0: W_Q = 0.
    q_rows(*m, 1, 0).zero_();
    auto s = qk_spectrum(*m);
    CHECK(s.effective_rank.sizes() == at::IntArrayRef({2, kH}));
    CHECK(s.singular_values.sizes() == at::IntArrayRef({2, kH, kHd}));
    CHECK(s.effective_rank[0][1].item<double>() == doctest::Approx(1.0).epsilon(1e-5));
    CHECK(s.effective_rank[1][2].item<double>() == doctest::Approx(5.0).epsilon(1e-9));
    CHECK(std::isnan(s.effective_rank[1][0].item<double>()));
    // Random heads are nowhere near rank 1 (the planted ones are not an accident of the fixture).
    CHECK(s.effective_rank[0][0].item<double>() > 10.0);
    CHECK(s.effective_rank[1][3].item<double>() > 3.0);  // W_K = I, W_Q random: M = W_Q^T, full rank
    // Singular values come out descending.
    auto sv = s.singular_values[0][0];
    CHECK(torch::all(sv.index({Slice(None, -1)}) >= sv.index({Slice(1, None)})).item<bool>());
}

TEST_CASE("qk-spectrum: q/k norm weights are folded into the form (Qwen3 w, Gemma 3 1 + w, OLMo-2 per head)") {
    auto m = planted::model(12, 0.1, 0.3);
    torch::NoGradGuard ng;
    auto one_hot = torch::zeros({kHd});
    one_hot[3] = 2.0;
    // Per-head q norm weight with a single non-zero entry: every head's query lives in one
    // dimension, so every form has rank 1, although W_Q and W_K are random.
    m->config.qk_norm = true;
    for (auto& lw : m->weights.layers) lw.q_norm_w = one_hot, lw.k_norm_w = torch::ones({kHd});
    auto s = qk_spectrum(*m);
    CHECK(torch::allclose(s.effective_rank, torch::ones_like(s.effective_rank), 0, 1e-5));
    // Gemma's (1 + w): w = -1 everywhere but one entry gives the same one-dimensional query.
    m->config.family = Family::kGemma;
    for (auto& lw : m->weights.layers) lw.q_norm_w = one_hot - 1.0, lw.k_norm_w = torch::zeros({kHd});
    s = qk_spectrum(*m);
    CHECK(torch::allclose(s.effective_rank, torch::ones_like(s.effective_rank), 0, 1e-5));
    // OLMo-2: one weight over the whole projection; only query head 2 keeps a single dimension.
    m->config.family = Family::kOlmo2;
    m->config.qk_norm = false;
    m->config.qk_norm_full = true;
    for (auto& lw : m->weights.layers) {
        lw.q_norm_w = torch::ones({kH * kHd});
        lw.q_norm_w.index_put_({Slice(2 * kHd, 3 * kHd)}, one_hot);
        lw.k_norm_w = torch::ones({kK * kHd});
    }
    s = qk_spectrum(*m);
    for (int l = 0; l < 2; ++l) {
        CHECK(s.effective_rank[l][2].item<double>() == doctest::Approx(1.0).epsilon(1e-5));
        CHECK(s.effective_rank[l][1].item<double>() > 10.0);
    }
}

// The reference: M_h = W_Q^h (W_K^{h/g})^T formed whole [D, D] from weight_circuits.h's per-head
// factors (its own slicing and GQA mapping), and torch's full SVD of it, in float64.
// Tolerances: singular values within 1e-10 of the largest one of the head (the extra D - d values
// of the full SVD within 1e-10 of 0), effective rank within 1e-9 (absolute).
TEST_CASE("qk-spectrum: the thin-QR route equals a full d_model x d_model SVD on every real checkpoint") {
    HS_REQUIRE_TESTDATA(td);
    for (const std::string path : {td + "/stories260K/stories260K.bin", td + "/tinystories-656k",
                                   td + "/aidreams260K/aidreams260K.bin"}) {
        CAPTURE(path);
        auto m = load_model(path);
        const auto& c = m->config;
        REQUIRE(!c.qk_norm);
        REQUIRE(!c.qk_norm_full);
        auto s = qk_spectrum(*m);
        const int64_t r = s.singular_values.size(2);
        REQUIRE(r == std::min(c.d_head, c.d_model));
        double worst_sv = 0, worst_rank = 0;
        for (int l = 0; l < c.n_layers; ++l)
            for (int h = 0; h < c.n_heads; ++h) {
                auto full = torch::matmul(head_q_in(*m, l, h).to(torch::kDouble),
                                          head_k_in(*m, l, h).to(torch::kDouble).t());  // [D, D]
                auto ref = torch::linalg_svdvals(full);                                   // [D]
                const double top = ref[0].item<double>();
                REQUIRE(top > 0);
                auto ours = s.singular_values[l][h];
                worst_sv = std::max(worst_sv, ((ours - ref.index({Slice(0, r)})).abs().max().item<double>()) / top);
                if (ref.size(0) > r) worst_sv = std::max(worst_sv, ref.index({Slice(r, None)}).abs().max().item<double>() / top);
                worst_rank = std::max(worst_rank, std::abs(effective_rank(ref).item<double>() -
                                                           s.effective_rank[l][h].item<double>()));
            }
        MESSAGE(path << ": worst singular value gap " << worst_sv << " (of the head's largest), worst effective-rank gap "
                     << worst_rank);
        CHECK(worst_sv < 1e-10);
        CHECK(worst_rank < 1e-9);
        // A real head's form is far from rank 1 and at most d.
        CHECK(s.effective_rank.min().item<double>() > 1.5);
        CHECK(s.effective_rank.max().item<double>() <= static_cast<double>(r) + 1e-9);
    }
}

// Golden layout of `headscope qk-spectrum` (docs/hdf5-schema.md, "/scores/qk_rank/"): names,
// shapes and attributes, and the file holds what the library computes (as float32, exactly).
TEST_CASE("qk-spectrum: golden HDF5 layout of `headscope qk-spectrum`") {
    HS_REQUIRE_TESTDATA(td);
    TempDir tmp;
    const std::string model = td + "/stories260K/stories260K.bin", h5 = tmp.file("q.h5");
    const std::string cmd = std::string("'") + HS_BINARY + "' -q qk-spectrum '" + model + "' --out '" + h5 +
                            "' --top 0 >'" + tmp.file("log") + "' 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    auto m = load_model(model);
    const int64_t L = m->config.n_layers, H = m->config.n_heads, r = m->config.d_head;
    ResultReader rd(h5);
    CHECK(rd.children("/") == std::vector<std::string>{"meta", "scores"});
    CHECK(rd.children("/scores") == std::vector<std::string>{"qk_rank"});
    CHECK(rd.children("/scores/qk_rank") == std::vector<std::string>{"score", "singular_values"});
    auto score = rd.read_numbers("/scores/qk_rank/score");
    auto sv = rd.read_numbers("/scores/qk_rank/singular_values");
    CHECK(score.shape == std::vector<int64_t>{L, H});
    CHECK(sv.shape == std::vector<int64_t>{L, H, r});
    auto a = rd.attrs("/scores/qk_rank");
    for (const char* k : {"probe", "description", "method", "weight_processing", "qk_norm", "biases", "rope"}) {
        INFO("attribute " << k);
        CHECK(a.count(k) == 1);
    }
    CHECK(std::get<std::string>(a.at("probe")) == "qk_rank");
    CHECK(rd.attrs("/meta").count("weights_sha256") == 1);
    auto lib = qk_spectrum(*m);
    auto f = [](const at::Tensor& t) { return t.to(torch::kFloat).to(torch::kDouble).flatten(); };
    CHECK(torch::equal(torch::tensor(score.values, torch::kDouble), f(lib.effective_rank)));
    CHECK(torch::equal(torch::tensor(sv.values, torch::kDouble), f(lib.singular_values)));
}
