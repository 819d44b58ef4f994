// Attention-sink rates (Gu et al., ICLR 2025; probes/detect sink-rate and sink_rates): hand-made
// alpha_0 values with known rates; the library against the reference's computation
// (sail-sg/Attention-Sink eval_sink_open_source.py:41-49, redone here on whole captured patterns, as
// [N, L, H, T, T] tensors) on the planted model and on stories260K; and a ground truth, a planted
// model whose heads attend to token 0 by construction (alpha_0 = 1, rate 1) beside uniform heads
// (alpha_0 = H_T / T, the harmonic number over T, by hand).
#include <doctest/doctest.h>

#include "attention_detectors.h"
#include "errors.h"
#include "planted_model.h"
#include "testdata.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <cmath>

using namespace hs;

namespace {

// The reference's computation (eval_sink_open_source.py:45-48) on patterns [N, L, H, T, T]:
// ratios T, T-1, ..., 1 over the key axis, (A / ratios).sum over queries, > epsilon, means.
struct RefRates {
    at::Tensor alpha;       // [N, L, H]: importance_scores[..., 0]
    at::Tensor head_rate;   // [L, H]
    at::Tensor layer_rate;  // [L]
    double model_rate;      // metric1[0] / 100
};
RefRates reference_rates(const at::Tensor& attention_scores, double epsilon) {
    const auto s = attention_scores.to(torch::kFloat);  // the reference's np.save'd float32 patterns
    const int64_t N = s.size(0), L = s.size(1), H = s.size(2), T1 = s.size(3), T2 = s.size(4);
    REQUIRE(T1 == T2);
    auto ratios = torch::arange(T1, 0, -1).view({1, 1, 1, T1}).unsqueeze(0).expand({N, L, H, T1, T2}).to(s.scalar_type());
    // The reference writes [None, None, None, :] on a 5-D tensor, which broadcasts over the key axis.
    auto importance = (s / ratios).sum(-2);  // [N, L, H, T] float32
    auto above = importance.gt(epsilon).to(torch::kDouble);  // float32 against the scalar, as torch does
    return {importance.select(-1, 0).to(torch::kDouble), above.select(-1, 0).mean(0), above.select(-1, 0).mean(at::IntArrayRef{0, 2}),
            above.mean(at::IntArrayRef{0, 1, 2})[0].item<double>()};
}

// Every layer's whole pattern of one sequence: [L, H, T, T] float32.
at::Tensor patterns_of(const Model& m, const std::vector<int64_t>& seq) {
    std::vector<at::Tensor> p(m.config.n_layers);
    Hooks hooks;
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& x) { p[l] = x[0].to(torch::kFloat).clone(); });
    torch::NoGradGuard ng;
    m.forward(torch::tensor(seq, torch::kLong).unsqueeze(0), &hooks);
    return torch::stack(p);
}

// The planted model with two heads a layer made by hand (residual = the embedding in every layer:
// wo and the MLP's down projection are zero). Token kSink's key in KV group 0 is s along dimension
// 31, RoPE's slowest pair (rotation under 0.01 rad over 64 positions), every other key of the group
// 0; a sink head's query is c along the same dimension for every token, a uniform head's query 0.
// So the sink head's score for key 0 is 8 c s (RMSNorm makes each embedding row 8 long, divided by
// sqrt(64)) and 0 elsewhere: attention to token 0 is 1 - O(T e^-32). Sinks: L0H0 and L1H1; uniform:
// L0H1 and L1H0; heads 2 and 3 (KV group 1) keep the generator's random q and k.
constexpr int64_t kSink = 0;
std::unique_ptr<Model> planted_sinks() {
    auto m = planted::model(21, 0.0, 0.0);
    const auto u = m->weights.embed;  // [V, D], orthonormal rows
    const double c = 2.0, s = 2.0;
    for (int l = 0; l < 2; ++l) {
        auto& lw = m->weights.layers[l];
        lw.wk.narrow(0, 0, planted::kHd).zero_();
        lw.wk[31].copy_(u[kSink] * s);
        const int64_t sink = l == 0 ? 0 : 1, uniform = 1 - sink;
        lw.wq.narrow(0, sink * planted::kHd, planted::kHd).zero_();
        lw.wq[sink * planted::kHd + 31].copy_(u.sum(0) * c);
        lw.wq.narrow(0, uniform * planted::kHd, planted::kHd).zero_();
    }
    return m;
}

std::vector<int64_t> planted_seq(int64_t T, uint64_t seed) {
    torch::manual_seed(seed);
    auto r = torch::randint(1, planted::kV, {T - 1}, torch::kLong);  // never kSink after position 0
    std::vector<int64_t> s{kSink};
    for (int64_t i = 0; i < T - 1; ++i) s.push_back(r[i].item<int64_t>());
    return s;
}

double harmonic(int64_t T) {
    double h = 0;
    for (int64_t k = 1; k <= T; ++k) h += 1.0 / static_cast<double>(k);
    return h;
}

constexpr double kTol = 1e-5;  // fp32 patterns, summed in blocks vs whole

}  // namespace

TEST_CASE("sink rates: hand-made alpha_0, strictly above epsilon, and bad epsilon") {
    // alpha_0 [N = 2, L = 2, H = 2].
    auto alpha = torch::tensor({0.2f, 0.31f, 0.9f, 0.0f, 0.3f, 0.95f, 0.5f, 0.1f}).view({2, 2, 2});
    auto r = sink_rates(alpha, 0.3);
    // Above 0.3: sequence 0: L0 (no, yes), L1 (yes, no); sequence 1: L0 (no: 0.3 is not > 0.3, yes), L1 (yes, no).
    CHECK(torch::equal(r.head_rate, torch::tensor({0.f, 1.f, 1.f, 0.f}).view({2, 2})));
    CHECK(torch::equal(r.layer_rate, torch::tensor({0.5f, 0.5f})));
    CHECK(r.model_rate == doctest::Approx(0.5));
    auto r0 = sink_rates(alpha, 0.0);  // every alpha_0 but the one 0.0
    CHECK(r0.model_rate == doctest::Approx(7.0 / 8));
    CHECK(r0.head_rate[0][1].item<double>() == doctest::Approx(1.0));
    CHECK(r0.head_rate[1][1].item<double>() == doctest::Approx(0.5));
    CHECK_THROWS_AS(sink_rates(alpha, -0.1), UsageError);
    CHECK_THROWS_AS(sink_rates(alpha, 1.5), UsageError);
    CHECK_THROWS_AS(sink_rates(alpha, NAN), UsageError);
    CHECK_THROWS_AS(sink_rates(torch::zeros({2, 2}), 0.3), DataError);
}

TEST_CASE("sink rates: planted sink heads score 1, uniform heads H_T / T, as the reference computes them") {
    auto m = planted_sinks();
    // Ragged on purpose: a uniform head's alpha_0 is H_5 / 5 = 0.457 (above 0.3) on the short
    // sequence and H_16 / 16 = 0.211 (below) on the long ones.
    const std::vector<std::vector<int64_t>> seqs = {planted_seq(16, 1), planted_seq(5, 2), planted_seq(16, 3)};
    auto got = detector_scores(*m, seqs, {StripeKind::kFirstToken}, {}).front();
    REQUIRE(got.probe == "sink-rate");
    auto rates = sink_rates(got.samples, 0.3);
    for (auto lh : {std::pair{0, 0}, std::pair{1, 1}}) {
        const int l = lh.first, h = lh.second;
        CAPTURE(l);
        CAPTURE(h);
        for (int64_t s = 0; s < 3; ++s) CHECK(got.samples[s][l][h].item<double>() == doctest::Approx(1.0).epsilon(1e-6));
        CHECK(rates.head_rate[l][h].item<double>() == 1.0);
    }
    for (auto lh : {std::pair{0, 1}, std::pair{1, 0}}) {
        const int l = lh.first, h = lh.second;
        CAPTURE(l);
        CAPTURE(h);
        for (int64_t s = 0; s < 3; ++s) {
            const int64_t T = static_cast<int64_t>(seqs[s].size());
            CHECK(got.samples[s][l][h].item<double>() == doctest::Approx(harmonic(T) / T).epsilon(1e-6));
        }
        CHECK(rates.head_rate[l][h].item<double>() == doctest::Approx(1.0 / 3));  // the T = 5 sequence only
    }
    // The reference's computation, one sequence at a time (its arrays need one T), indicators pooled.
    double max_dev = 0;
    at::Tensor above_sum = torch::zeros({2, planted::kH}, torch::kDouble);
    for (size_t s = 0; s < seqs.size(); ++s) {
        auto ref = reference_rates(patterns_of(*m, seqs[s]).unsqueeze(0), 0.3);
        max_dev = std::max(max_dev, (ref.alpha[0] - got.samples[s].to(torch::kDouble)).abs().max().item<double>());
        above_sum += ref.head_rate;
    }
    CHECK(max_dev < kTol);
    CHECK(torch::allclose(rates.head_rate.to(torch::kDouble), above_sum / 3.0));
    CHECK(rates.layer_rate[0].item<double>() == doctest::Approx(above_sum[0].mean().item<double>() / 3.0));
    CHECK(rates.model_rate == doctest::Approx(above_sum.mean().item<double>() / 3.0));
    MESSAGE("planted: model sink rate " << rates.model_rate << ", layers " << rates.layer_rate[0].item<double>() << " "
                                        << rates.layer_rate[1].item<double>() << "; max |alpha_0 - reference| " << max_dev);
}

TEST_CASE("sink rates: the stripe convention ([BOS, R, R] rows) equals the reference's computation on the batch") {
    auto m = planted_sinks();
    const int64_t n = 7, B = 3;
    std::vector<std::vector<int64_t>> seqs;
    at::Tensor tokens = torch::empty({B, 2 * n + 1}, torch::kLong);
    for (int64_t b = 0; b < B; ++b) {
        auto r = planted_seq(n + 1, 10 + b);  // kSink, then n tokens
        for (int64_t i = 0; i <= n; ++i) tokens[b][i] = r[i];
        for (int64_t i = 1; i <= n; ++i) tokens[b][n + i] = r[i];
    }
    auto got = stripe_scores(*m, tokens, n, {StripeKind::kFirstToken}, 2).front();  // two rows a forward
    std::vector<at::Tensor> pats;
    for (int64_t b = 0; b < B; ++b) {
        auto row = tokens[b].contiguous();
        pats.push_back(patterns_of(*m, std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel())));
    }
    auto ref = reference_rates(torch::stack(pats), 0.3);  // [N, L, H, T, T] as the reference stacks samples
    CHECK((ref.alpha - got.samples.to(torch::kDouble)).abs().max().item<double>() < kTol);
    auto rates = sink_rates(got.samples, 0.3);
    CHECK(torch::allclose(rates.head_rate.to(torch::kDouble), ref.head_rate));
    CHECK(torch::allclose(rates.layer_rate.to(torch::kDouble), ref.layer_rate));
    CHECK(rates.model_rate == doctest::Approx(ref.model_rate));
    CHECK(got.score[0][0].item<double>() == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(got.score[0][1].item<double>() == doctest::Approx(harmonic(2 * n + 1) / (2 * n + 1)).epsilon(1e-6));
}

TEST_CASE("sink rates: stories260K on its own texts equals the reference's computation, at several epsilons") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/stories260K/stories260K.bin");
    auto tok = find_tokenizer_for_model(td + "/stories260K/stories260K.bin", m->config.vocab_size);
    REQUIRE(tok);
    // As the reference: every text cut to the same number of tokens (its token_length), BOS as the tokenizer adds it.
    const int64_t T = 24;
    std::vector<std::vector<int64_t>> seqs;
    for (const char* text : {"Once upon a time, there was a little girl named Lily. She liked to play in the park with her ball.",
                             "Tom had a big red dog. The dog liked to run and jump in the sun all day long with Tom.",
                             "One day, a small bird sat on a tree. It sang a happy song and the children came to listen."}) {
        std::vector<int64_t> s;
        for (auto id : tok->encode(text, true)) s.push_back(id);
        REQUIRE(static_cast<int64_t>(s.size()) >= T);
        s.resize(T);
        seqs.push_back(s);
    }
    auto got = detector_scores(*m, seqs, {StripeKind::kFirstToken}, {}).front();
    std::vector<at::Tensor> pats;
    for (const auto& s : seqs) pats.push_back(patterns_of(*m, s));
    const auto all = torch::stack(pats);
    for (double eps : {0.05, 0.1, 0.2, 0.3}) {
        CAPTURE(eps);
        auto ref = reference_rates(all, eps);
        auto rates = sink_rates(got.samples, eps);
        CHECK((ref.alpha - got.samples.to(torch::kDouble)).abs().max().item<double>() < kTol);
        CHECK(torch::allclose(rates.head_rate.to(torch::kDouble), ref.head_rate));
        CHECK(rates.model_rate == doctest::Approx(ref.model_rate));
        MESSAGE("stories260K, T = " << T << ", epsilon " << eps << ": model sink rate " << rates.model_rate);
    }
}

TEST_CASE("sink rates: run_head_probes carries the rates with its epsilon") {
    auto m = planted_sinks();
    ProbeInput in;
    in.seqs = {planted_seq(16, 1), planted_seq(16, 3)};
    in.sink_epsilon = 0.25;
    auto out = run_head_probes(*m, {"attention-sink", "sink-rate"}, in);
    REQUIRE(out.size() == 2);
    CHECK_FALSE(out[0].sink.has_value());
    REQUIRE(out[1].sink.has_value());
    CHECK(out[1].sink->epsilon == 0.25);
    // The two probes differ by row 0 only: alpha_0 = (1 + (T - 1) * attention-sink) / T.
    CHECK(torch::allclose(out[1].score, (1.0 + 15.0 * out[0].score) / 16.0, 1e-5, 1e-6));
    in.sink_epsilon = 2;
    CHECK_THROWS_AS(run_head_probes(*m, {"sink-rate"}, in), UsageError);
}
