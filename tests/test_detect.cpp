// Head detectors (probes/attention_detectors) against independent loop computations of the
// formulas, hand-made patterns with known answers, the HDF5 layout of `headscope detect`, and the
// export round trip.
#include <doctest/doctest.h>

#include "attention_detectors.h"
#include "store.h"
#include "testdata.h"
#include "tmpdir.h"
#include "tokenizer.h"
#include "util.h"

#include <hdf5.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

using namespace hs;
using namespace torch::indexing;

namespace {

constexpr double kTol = 1e-5;  // probe vs independent computation, fp32

std::string hs_binary() {
    if (const char* e = std::getenv("HEADSCOPE_BIN"); e && *e) return e;
    return HS_BINARY;
}

int run_cli(const std::string& args, const std::string& log) {
    return std::system((hs_binary() + " " + args + " >" + log + " 2>&1").c_str());
}

// Every layer's pattern of one forward: L x [B, H, T, T] float32 (fine for a tiny model).
std::vector<at::Tensor> all_patterns(const Model& m, const at::Tensor& tokens) {
    std::vector<at::Tensor> p(m.config.n_layers);
    Hooks hooks;
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& x) { p[l] = x.to(torch::kFloat).clone(); });
    torch::NoGradGuard ng;
    m.forward(tokens, &hooks);
    return p;
}

// Stripe formula by loops: mean over q in [q_lo, q_hi] of A[q, q - back] (back = -1: column 0).
double ref_stripe(const at::Tensor& a, int64_t q_lo, int64_t q_hi, int64_t back) {  // a [T, T]
    auto acc = a.accessor<float, 2>();
    double s = 0;
    for (int64_t q = q_lo; q <= q_hi; ++q) s += acc[q][back < 0 ? 0 : q - back];
    return s / static_cast<double>(q_hi - q_lo + 1);
}

double ref_stripe_kind(const at::Tensor& a, StripeKind k, int64_t n) {
    switch (k) {
        case StripeKind::kInduction: return ref_stripe(a, n + 1, 2 * n, n - 1);
        case StripeKind::kPreviousToken: return ref_stripe(a, 1, 2 * n, 1);
        case StripeKind::kDuplicateToken: return ref_stripe(a, n + 1, 2 * n, n);
        case StripeKind::kAttentionSink: return ref_stripe(a, 1, 2 * n, -1);
    }
    return NAN;
}

// Detection pattern from its definition, entry by entry.
double ref_d(const std::vector<int64_t>& t, StripeKind k, int64_t i, int64_t j) {
    if (j > i) return 0;
    switch (k) {
        case StripeKind::kPreviousToken: return j == i - 1 ? 1 : 0;
        case StripeKind::kDuplicateToken: return j < i && t[i] == t[j] ? 1 : 0;
        case StripeKind::kInduction: return j >= 1 && t[i] == t[j - 1] && j - 1 < i ? 1 : 0;
        case StripeKind::kAttentionSink: break;
    }
    return 0;
}

// TransformerLens compute_head_attention_similarity_score, on a copy, in double.
double ref_detector(const at::Tensor& a_in, const std::vector<int64_t>& t, StripeKind k, const DetectorOptions& o) {
    const int64_t T = a_in.size(0);
    auto acc = a_in.accessor<float, 2>();
    std::vector<double> a(T * T), d(T * T);
    for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) a[i * T + j] = acc[i][j], d[i * T + j] = ref_d(t, k, i, j);
    auto excluded = [&](int64_t i, int64_t j) { return (o.exclude_bos && j == 0) || (o.exclude_current_token && i == j); };
    double num = 0, den = 0, l1 = 0;
    for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) {
            if (excluded(i, j)) continue;
            num += a[i * T + j] * d[i * T + j];
            den += a[i * T + j];
            l1 += std::abs(a[i * T + j] - d[i * T + j]);
        }
    return o.measure == ErrorMeasure::kMul ? num / den : 1.0 - l1 / static_cast<double>(T);
}

const std::vector<StripeKind> kAllKinds = {StripeKind::kInduction, StripeKind::kPreviousToken,
                                           StripeKind::kDuplicateToken, StripeKind::kAttentionSink};

std::unique_ptr<Model> stories(const std::string& td) { return load_model(td + "/stories260K/stories260K.bin"); }

}  // namespace

TEST_CASE("detect: stripe scores equal the formulas computed by loops on captured patterns (stories260K)") {
    HS_REQUIRE_TESTDATA(td);
    auto m = stories(td);
    const int64_t n = 12, L = m->config.n_layers, H = m->config.n_heads;
    StripeInput in;
    in.seq_len = n, in.batch = 3, in.seed = 7, in.token_lo = 100, in.token_hi = 400;
    auto tokens = repeated_random_tokens(*m, in);  // [3, 25]
    REQUIRE(tokens.sizes() == at::IntArrayRef({3, 2 * n + 1}));
    CHECK(torch::equal(tokens.index({Slice(), Slice(1, n + 1)}), tokens.index({Slice(), Slice(n + 1, None)})));
    CHECK(tokens.index({Slice(), 0}).eq(1).all().item<bool>());
    CHECK(tokens.index({Slice(), Slice(1, None)}).ge(100).all().item<bool>());
    CHECK(tokens.index({Slice(), Slice(1, None)}).lt(400).all().item<bool>());
    CHECK(torch::equal(tokens, repeated_random_tokens(*m, in)));  // seeded: reproducible

    auto pats = all_patterns(*m, tokens);
    auto got = stripe_scores(*m, tokens, n, kAllKinds, /*max_rows=*/2);  // two chunks: 2 + 1 rows
    double max_dev = 0;
    for (size_t k = 0; k < kAllKinds.size(); ++k) {
        REQUIRE(got[k].samples.sizes() == at::IntArrayRef({3, L, H}));
        for (int64_t l = 0; l < L; ++l)
            for (int64_t h = 0; h < H; ++h) {
                double mean = 0;
                for (int64_t b = 0; b < 3; ++b) {
                    const double want = ref_stripe_kind(pats[l][b][h], kAllKinds[k], n);
                    mean += want / 3;
                    max_dev = std::max(max_dev, std::abs(got[k].samples[b][l][h].item<double>() - want));
                }
                max_dev = std::max(max_dev, std::abs(got[k].score[l][h].item<double>() - mean));
            }
    }
    MESSAGE("stripe: max |probe - loops| = " << max_dev);
    CHECK(max_dev < kTol);
    auto prev = got[1].score.flatten();
    auto order = prev.argsort(0, true);
    for (int i = 0; i < 3; ++i)
        MESSAGE("stories260K previous-token #" << i + 1 << ": L" << order[i].item<int64_t>() / H << "H"
                                               << order[i].item<int64_t>() % H << " " << prev[order[i]].item<double>());
}

TEST_CASE("detect: detector scores equal TransformerLens formulas by loops, mul/abs, all exclude flags") {
    HS_REQUIRE_TESTDATA(td);
    auto m = stories(td);
    auto tok = find_tokenizer_for_model(td + "/stories260K/stories260K.bin", m->config.vocab_size);
    REQUIRE(tok);
    std::vector<std::vector<int64_t>> seqs;
    for (const char* text : {"The cat sat on the mat. The cat sat on the mat.", "Tom had a dog. Tom had a dog too",
                             "Lily"}) {
        std::vector<int64_t> s;
        for (auto id : tok->encode(text, true)) s.push_back(id);
        seqs.push_back(s);
    }
    REQUIRE(seqs[0].size() != seqs[1].size());  // ragged on purpose
    const int64_t L = m->config.n_layers, H = m->config.n_heads, N = static_cast<int64_t>(seqs.size());
    std::vector<std::vector<at::Tensor>> pats;
    for (const auto& s : seqs) pats.push_back(all_patterns(*m, torch::tensor(s, torch::kLong).unsqueeze(0)));
    double max_dev = 0;
    int combos = 0;
    for (auto measure : {ErrorMeasure::kMul, ErrorMeasure::kAbs})
        for (int flags = 0; flags < 4; ++flags) {
            DetectorOptions o{measure, (flags & 1) != 0, (flags & 2) != 0};
            auto got = detector_scores(*m, seqs, kAllKinds, o);
            for (size_t k = 0; k < kAllKinds.size(); ++k)
                for (int64_t l = 0; l < L; ++l)
                    for (int64_t h = 0; h < H; ++h) {
                        double mean = 0;
                        for (int64_t s = 0; s < N; ++s) {
                            const auto& a = pats[s][l][0][h];
                            const int64_t T = a.size(0);
                            double want = kAllKinds[k] == StripeKind::kAttentionSink
                                              ? ref_stripe(a, 1, T - 1, -1)
                                              : ref_detector(a, seqs[s], kAllKinds[k], o);
                            mean += want / N;
                            max_dev = std::max(max_dev, std::abs(got[k].samples[s][l][h].item<double>() - want));
                        }
                        max_dev = std::max(max_dev, std::abs(got[k].score[l][h].item<double>() - mean));
                    }
            ++combos;
        }
    MESSAGE("detector (" << combos << " measure/flag combinations): max |probe - loops| = " << max_dev);
    CHECK(max_dev < kTol);
}

TEST_CASE("detect: hand-made patterns give the known scores") {
    const int64_t n = 6, T = 2 * n + 1;
    // Perfect previous-token head: row q attends to q - 1 (row 0 to itself).
    auto prev = torch::zeros({T, T});
    prev[0][0] = 1;
    for (int64_t q = 1; q < T; ++q) prev[q][q - 1] = 1;
    auto p4 = prev.view({1, 1, T, T});
    CHECK(stripe_scores_layer(p4, StripeKind::kPreviousToken, n).item<double>() == doctest::Approx(1.0).epsilon(1e-7));
    CHECK(stripe_scores_layer(p4, StripeKind::kInduction, n).item<double>() == 0.0);
    CHECK(stripe_scores_layer(p4, StripeKind::kAttentionSink, n).item<double>() ==
          doctest::Approx(1.0 / (2 * n)).epsilon(1e-7));  // only q = 1 attends to 0
    auto tokens = torch::arange(T, torch::kLong);
    auto d_prev = detection_pattern(tokens, StripeKind::kPreviousToken);
    auto before = p4.clone();
    // mul: every row but the first puts its unit mass on D; sum(A) = T.
    CHECK(detector_scores_layer(p4, d_prev, {ErrorMeasure::kMul, false, false}).item<double>() ==
          doctest::Approx(1.0 - 1.0 / T).epsilon(1e-6));
    // Zeroing column 0 removes row 0's mass and row 1's (which was on D): (T - 2) / (T - 2).
    CHECK(detector_scores_layer(p4, d_prev, {ErrorMeasure::kMul, true, false}).item<double>() ==
          doctest::Approx(1.0).epsilon(1e-6));
    // abs: only row 0 differs from D, by 1.
    CHECK(detector_scores_layer(p4, d_prev, {ErrorMeasure::kAbs, false, false}).item<double>() ==
          doctest::Approx(1.0 - 1.0 / T).epsilon(1e-6));
    CHECK(detector_scores_layer(p4, d_prev, {ErrorMeasure::kAbs, false, true}).item<double>() ==
          doctest::Approx(1.0).epsilon(1e-6));
    CHECK(torch::equal(p4, before));  // the exclusions never write to the pattern

    // Perfect induction stripe on [BOS, R, R]: the first half attends to BOS.
    auto ind = torch::zeros({T, T});
    for (int64_t q = 0; q <= n; ++q) ind[q][0] = 1;
    for (int64_t q = n + 1; q <= 2 * n; ++q) ind[q][q - n + 1] = 1;
    auto i4 = ind.view({1, 1, T, T});
    CHECK(stripe_scores_layer(i4, StripeKind::kInduction, n).item<double>() == doctest::Approx(1.0).epsilon(1e-7));
    CHECK(stripe_scores_layer(i4, StripeKind::kDuplicateToken, n).item<double>() == 0.0);
    CHECK(stripe_scores_layer(i4, StripeKind::kAttentionSink, n).item<double>() == doctest::Approx(0.5).epsilon(1e-7));
    // As a detector on tokens [BOS, R, R] with distinct R: n of the T rows lie on D (the mul ceiling
    // near 0.5 the reference notes mention), and exclude_bos lifts it to 1.
    auto rr = torch::cat({torch::tensor({1}, torch::kLong), torch::arange(10, 10 + n), torch::arange(10, 10 + n)});
    auto d_ind = detection_pattern(rr, StripeKind::kInduction);
    CHECK(d_ind.sum().item<double>() == n);  // one target per query of the second copy
    CHECK(detector_scores_layer(i4, d_ind, {ErrorMeasure::kMul, false, false}).item<double>() ==
          doctest::Approx(static_cast<double>(n) / T).epsilon(1e-6));
    CHECK(detector_scores_layer(i4, d_ind, {ErrorMeasure::kMul, true, false}).item<double>() ==
          doctest::Approx(1.0).epsilon(1e-6));
    // Small pattern checked entry by entry: tokens [1, 5, 7, 5, 7].
    auto t5 = torch::tensor({1, 5, 7, 5, 7}, torch::kLong);
    auto dup = detection_pattern(t5, StripeKind::kDuplicateToken);
    auto want_dup = torch::zeros({5, 5});
    want_dup[3][1] = 1, want_dup[4][2] = 1;
    CHECK(torch::equal(dup, want_dup));
    auto want_ind = torch::zeros({5, 5});
    want_ind[3][2] = 1, want_ind[4][3] = 1;
    CHECK(torch::equal(detection_pattern(t5, StripeKind::kInduction), want_ind));
}

TEST_CASE("detect: induction loss and per-head ablated loss equal unbatched runs with cross-entropy by loops") {
    HS_REQUIRE_TESTDATA(td);
    auto m = stories(td);
    const int64_t n = 10, H = m->config.n_heads;
    StripeInput in;
    in.seq_len = n, in.batch = 2, in.seed = 1;
    auto tokens = repeated_random_tokens(*m, in);  // [2, 21]
    // Mean over rows and positions p in [n+1, 2n-1] of logsumexp(logits[p]) - logits[p][tok[p+1]].
    auto ref_loss = [&](const at::Tensor& logits) {
        double s = 0;
        int count = 0;
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t p = n + 1; p <= 2 * n - 1; ++p) {
                auto row = logits[b][p].to(torch::kDouble);
                s += row.logsumexp(0).item<double>() - row[tokens[b][p + 1].item<int64_t>()].item<double>();
                ++count;
            }
        return s / count;
    };
    torch::NoGradGuard ng;
    auto il = induction_loss(*m, tokens, n, /*max_rows=*/6);  // 3 heads a forward: chunks straddle layers
    const double base = ref_loss(m->forward(tokens));
    CHECK(il.baseline == doctest::Approx(base).epsilon(kTol));
    double max_dev = 0;
    for (auto [l, h] : std::vector<std::pair<int, int>>{{0, 0}, {1, 7}, {2, 3}, {4, 6}}) {
        Hooks hooks;
        hooks.intervene_z({l, h, -1, HeadOp::kZero, 0.0, {}});
        max_dev = std::max(max_dev, std::abs(il.ablated[l][h].item<double>() - ref_loss(m->forward(tokens, &hooks))));
    }
    MESSAGE("induction loss: baseline " << il.baseline << ", max |batched ablation - unbatched| = " << max_dev);
    CHECK(max_dev < kTol);
    CHECK(il.samples.sizes() == at::IntArrayRef({2, m->config.n_layers, H}));
    CHECK((il.ablated - il.samples.mean(0)).abs().max().item<double>() < 1e-6);
}

TEST_CASE("detect: scores are reduced layer by layer (no earlier layer's pattern stays alive)") {
    HS_REQUIRE_TESTDATA(td);
    auto m = stories(td);
    const int64_t n = 8, L = m->config.n_layers, H = m->config.n_heads;
    StripeInput in;
    in.seq_len = n, in.batch = 2;
    auto tokens = repeated_random_tokens(*m, in);
    std::vector<at::Tensor> samples;
    for (size_t k = 0; k < kAllKinds.size(); ++k) samples.push_back(torch::zeros({2, L, H}));
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> seen;
    size_t uses_before = 0;
    int alive_earlier = 0, kept = 0, calls = 0;
    Hooks hooks;
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& p) {
        for (const auto& w : seen) alive_earlier += w.expired() ? 0 : 1;  // earlier layers' patterns
        seen.push_back(p.storage().getWeakStorageImpl());
        uses_before = p.storage().use_count();
    });
    hooks.capture_rows(Point::kAttnPattern, stripe_capture(kAllKinds, n, samples, 0));
    hooks.capture(Point::kAttnPattern, [&](int, const at::Tensor& p) {
        kept += p.storage().use_count() != uses_before ? 1 : 0;  // the reducer holds no view of it
        ++calls;
    });
    torch::NoGradGuard ng;
    ForwardOptions fo;
    fo.compute_logits = false;
    m->forward(tokens, &hooks, nullptr, fo);
    CHECK(calls == L);
    CHECK(alive_earlier == 0);
    CHECK(kept == 0);
    // The same capture is what stripe_scores uses: identical numbers.
    auto ref = stripe_scores(*m, tokens, n, kAllKinds);
    for (size_t k = 0; k < kAllKinds.size(); ++k) CHECK(torch::equal(samples[k], ref[k].samples));
}

namespace {

// HDF5 class and byte size of a dataset's element type.
std::pair<H5T_class_t, size_t> h5_type(const std::string& file, const std::string& ds) {
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
    hid_t t = H5Dget_type(d);
    std::pair<H5T_class_t, size_t> out{H5Tget_class(t), H5Tget_size(t)};
    H5Tclose(t), H5Dclose(d), H5Fclose(f);
    return out;
}

void check_dataset(const ResultReader& r, const std::string& ds, H5T_class_t cls, const std::vector<int64_t>& shape) {
    INFO(ds);
    REQUIRE(r.exists(ds));
    CHECK(r.read(ds).shape == shape);
    auto [c, size] = h5_type(r.path(), ds);
    CHECK(c == cls);
    CHECK(size == 4);  // float32 / int32
}

void check_attrs(const Attrs& a, const std::vector<std::string>& names, const std::string& where) {
    for (const auto& k : names) {
        INFO(where << " attribute " << k);
        CHECK(a.count(k) == 1);
    }
}

// RFC 4180 fields of one CSV line (quoted fields may hold commas and doubled quotes).
std::vector<std::string> csv_fields(const std::string& line) {
    std::vector<std::string> out(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
        else if (c == '"') quoted = !quoted;
        else if (c == ',' && !quoted) out.emplace_back();
        else out.back() += c;
    }
    return out;
}

const std::vector<std::string> kProbes = {"attention-sink", "duplicate-token", "induction", "induction-loss",
                                          "previous-token"};

}  // namespace

TEST_CASE("detect: golden HDF5 layout of `headscope detect` (both conventions)") {
    HS_REQUIRE_TESTDATA(td);
    TempDir tmp;
    const std::string model = td + "/stories260K/stories260K.bin";
    const std::string h5 = tmp.file("s.h5");
    REQUIRE(run_cli("detect " + model + " --probe induction,previous-token,duplicate-token,attention-sink,"
                    "induction-loss --seq-len 8 --batch 3 --seed 5 --token-range 50,300 --samples --out " + h5,
                    tmp.file("log")) == 0);
    auto m = stories(td);
    const int64_t L = m->config.n_layers, H = m->config.n_heads, T = 17;
    ResultReader r(h5);
    CHECK(r.children("/") == std::vector<std::string>{"inputs", "meta", "scores"});
    CHECK(r.children("/scores") == kProbes);
    CHECK(r.children("/inputs") == kProbes);
    check_attrs(r.attrs("/meta"), {"tool", "tool_version", "git_commit", "command_line", "utc_time", "model_path",
                                   "weights_sha256", "architecture", "family", "n_layers", "n_heads", "n_kv_heads",
                                   "d_model", "d_head", "vocab_size", "dtype", "device", "threads", "seed"}, "/meta");
    for (const auto& p : kProbes) {
        const std::string g = "/scores/" + p;
        check_dataset(r, g + "/score", H5T_FLOAT, {L, H});
        check_dataset(r, g + "/samples", H5T_FLOAT, {3, L, H});
        check_dataset(r, "/inputs/" + p + "/tokens", H5T_INTEGER, {3, T});
        auto a = r.attrs(g);
        check_attrs(a, {"probe", "convention", "description", "seq_len", "batch", "seed", "token_lo", "token_hi"}, g);
        CHECK(std::get<std::string>(a.at("probe")) == p);
        CHECK(std::get<std::string>(a.at("convention")) == "stripe");
        CHECK(std::get<int64_t>(a.at("seq_len")) == 8);
        CHECK(std::get<int64_t>(a.at("token_lo")) == 50);
        CHECK(std::get<int64_t>(a.at("token_hi")) == 300);
        check_attrs(r.attrs("/inputs/" + p), {"padding", "pad_value"}, "/inputs/" + p);
    }
    check_dataset(r, "/scores/induction-loss/baseline", H5T_FLOAT, {1});
    const double base = std::get<double>(r.attrs("/scores/induction-loss").at("baseline_loss"));
    CHECK(r.read("/scores/induction-loss/baseline").values[0] == doctest::Approx(base).epsilon(1e-6));
    // The file holds what the library computes for the same inputs.
    StripeInput in;
    in.seq_len = 8, in.batch = 3, in.seed = 5, in.token_lo = 50, in.token_hi = 300;
    auto tokens = repeated_random_tokens(*m, in);
    auto file_tokens = r.read("/inputs/induction/tokens").values;
    CHECK(torch::equal(torch::tensor(file_tokens).to(torch::kLong).view({3, T}), tokens));
    auto lib = stripe_scores(*m, tokens, 8, {StripeKind::kInduction});
    auto file_ind = torch::tensor(r.read("/scores/induction/score").values).to(torch::kFloat).view({L, H});
    CHECK((file_ind - lib[0].score).abs().max().item<double>() < 1e-6);
    CHECK(base == doctest::Approx(induction_loss(*m, tokens, 8).baseline).epsilon(1e-5));

    // Detector convention, ragged sequences: -1 padding, the detector attributes.
    const std::string seqs = tmp.file("seqs.txt"), h5d = tmp.file("d.h5");
    std::ofstream(seqs) << "1,20,30,40,20,30,40\n\n1,7,8,7,8\n";
    REQUIRE(run_cli("detect " + model + " --probe induction,attention-sink --tokens-file " + seqs +
                    " --error-measure abs --exclude-bos --out " + h5d, tmp.file("log")) == 0);
    ResultReader rd(h5d);
    CHECK(rd.children("/scores") == std::vector<std::string>{"attention-sink", "induction"});
    CHECK(!rd.exists("/scores/induction/samples"));
    check_dataset(rd, "/inputs/induction/tokens", H5T_INTEGER, {2, 7});
    auto tv = rd.read("/inputs/induction/tokens").values;
    CHECK(tv[7 + 4] == 8);
    CHECK(tv[7 + 5] == -1);
    CHECK(tv[7 + 6] == -1);
    auto a = rd.attrs("/scores/induction");
    check_attrs(a, {"probe", "convention", "description", "n_sequences", "error_measure", "exclude_bos",
                    "exclude_current_token"}, "/scores/induction");
    CHECK(std::get<std::string>(a.at("convention")) == "detector");
    CHECK(std::get<std::string>(a.at("error_measure")) == "abs");
    CHECK(std::get<int64_t>(a.at("exclude_bos")) == 1);
    CHECK(std::get<int64_t>(a.at("exclude_current_token")) == 0);
}

TEST_CASE("detect: export round trip, CSV and JSON values equal the HDF5 datasets") {
    HS_REQUIRE_TESTDATA(td);
    TempDir tmp;
    const std::string h5 = tmp.file("s.h5");
    REQUIRE(run_cli("detect " + td + "/stories260K/stories260K.bin --probe induction,previous-token --seq-len 6 "
                    "--batch 2 --out " + h5, tmp.file("log")) == 0);
    REQUIRE(run_cli("export " + h5 + " --format csv --out " + tmp.file("all.csv"), tmp.file("log")) == 0);
    ResultReader r(h5);
    std::ifstream csv(tmp.file("all.csv"));
    std::string line;
    std::getline(csv, line);
    auto header = csv_fields(line);
    REQUIRE(header.size() > 4);
    CHECK(std::vector<std::string>(header.begin(), header.begin() + 4) ==
          std::vector<std::string>{"probe", "layer", "head", "value"});
    CHECK(std::find(header.begin(), header.end(), "seq_len") != header.end());
    const auto seq_col = std::find(header.begin(), header.end(), "seq_len") - header.begin();
    int rows = 0, mismatches = 0;
    while (std::getline(csv, line)) {
        auto f = csv_fields(line);
        REQUIRE(f.size() == header.size());
        auto d = r.read("/scores/" + f[0] + "/score");
        const double want = d.values[std::stoi(f[1]) * d.shape[1] + std::stoi(f[2])];
        mismatches += std::strtof(f[3].c_str(), nullptr) == static_cast<float>(want) ? 0 : 1;
        mismatches += f[seq_col] == "6" ? 0 : 1;
        ++rows;
    }
    CHECK(rows == 2 * 5 * 8);
    CHECK(mismatches == 0);
    REQUIRE(run_cli("export " + h5 + " --table scores/induction --format json --out " + tmp.file("i.json"),
                    tmp.file("log")) == 0);
    auto j = nlohmann::json::parse(read_text_file(tmp.file("i.json")));
    REQUIRE(j.size() == 40);
    auto d = r.read("/scores/induction/score");
    for (const auto& row : j) {
        CHECK(row["probe"] == "induction");
        CHECK(row["value"].get<float>() == static_cast<float>(d.values[row["layer"].get<int>() * 8 + row["head"].get<int>()]));
    }
}

// The toy-model test (top induction heads = the heads training ablation proved causal) lives in
// tests/test_toy.cpp, next to the training run it needs.
