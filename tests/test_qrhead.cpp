// QRHead (probes/needle/qrhead.h, rerank.h; the needle score `qrhead`): the span and document scores
// against a recomputation of the reference lines on hand-built rows, the query passes against the
// rows of a full forward (planted model), and on the CI toy recall model the score's ranking of the
// proven retrieval heads (L1H0, L1H1, L1H2), its mean over the trials, and the re-ranker's recall.
// Reference: princeton-pli/QRHead (commit 7a668e7) src/qrretriever/attn_retriever.py lines 197-217
// (calibration), 229-247 (re-ranking), 301-312 (per-head scores), 323-353 (the query's rows).
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "model.h"
#include "planted_model.h"
#include "qrhead.h"
#include "store.h"
#include "tmpdir.h"
#include "util.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <set>
#include <string>
#include <vector>

using namespace hs;
using torch::indexing::None;
using torch::indexing::Slice;

namespace {

// x.mean() - 2 x.std() (unbiased), the values above it summed: the reference's lines 244-247 in
// plain loops.
double kept_sum_ref(const std::vector<double>& x) {
    const double n = static_cast<double>(x.size());
    double mean = 0;
    for (double v : x) mean += v / n;
    double ss = 0;
    for (double v : x) ss += (v - mean) * (v - mean);
    const double sd = x.size() > 1 ? std::sqrt(ss / (n - 1)) : std::nan("");
    double sum = 0;
    for (double v : x)
        if (v > mean - 2 * sd) sum += v;
    return sum;
}

}  // namespace

TEST_CASE("qrhead: span and document scores equal the reference lines recomputed (threshold, one token, heads summed first)") {
    torch::manual_seed(3);
    const int64_t L = 2, H = 3, S = 20;
    auto cal = torch::randn({L, H, S}, torch::kDouble) * 0.1;
    cal[1][2][7] = -5.0;  // an outlier below mean - 2 std inside the span [4, 12): dropped
    const auto sc = qrhead_span_scores(cal, 4, 12);
    REQUIRE(sc.sizes() == at::IntArrayRef{L, H});
    for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h) {
            std::vector<double> x;
            for (int64_t j = 4; j < 12; ++j) x.push_back(cal[l][h][j].item<double>());
            CHECK(sc[l][h].item<double>() == doctest::Approx(kept_sum_ref(x)).epsilon(1e-12));
        }
    double with_outlier = 0;
    for (int64_t j = 4; j < 12; ++j) with_outlier += cal[1][2][j].item<double>();
    CHECK(sc[1][2].item<double>() == doctest::Approx(with_outlier + 5.0).epsilon(1e-12));  // the -5 left out
    // One token: torch.std is NaN, `x > NaN` keeps nothing: 0 (the reference's behaviour).
    CHECK(qrhead_span_scores(cal, 3, 4).abs().sum().item<double>() == 0.0);
    // No span, or one outside the rows: NaN.
    CHECK(std::isnan(qrhead_span_scores(cal, -1, -1)[0][0].item<double>()));
    CHECK(std::isnan(qrhead_span_scores(cal, 15, 25)[0][0].item<double>()));
    // The re-ranker sums the heads per token first, then thresholds each document.
    const std::vector<Head> heads = {{0, 1}, {1, 2}};
    const std::vector<std::pair<int64_t, int64_t>> spans = {{1, 5}, {5, 12}, {12, 20}};
    const auto docs = qrhead_doc_scores(cal, heads, spans);
    REQUIRE(docs.size() == 3);
    for (size_t d = 0; d < spans.size(); ++d) {
        std::vector<double> x;
        for (int64_t j = spans[d].first; j < spans[d].second; ++j) x.push_back(cal[0][1][j].item<double>() + cal[1][2][j].item<double>());
        CHECK(docs[d] == doctest::Approx(kept_sum_ref(x)).epsilon(1e-12));
    }
}

TEST_CASE("qrhead: the query passes equal the pattern rows of a full forward, averaged over the query (planted model)") {
    auto m = planted::model(7, 0.02, 0.05);
    const std::vector<int64_t> prompt = {1, 5, 9, 12, 3, 40, 41, 8, 20, 37, 21, 30, 31, 7, 6, 9, 12, 13};
    const std::vector<int64_t> null_q = {50, 51, 52};
    const int64_t qs = 14, P = static_cast<int64_t>(prompt.size());
    const KVCache prefix = qrhead_prefill(*m, prompt, qs, 5);
    const std::vector<int64_t> query(prompt.begin() + qs, prompt.end());
    const auto rows = qrhead_query_rows(*m, prefix, query);
    REQUIRE(rows.sizes() == at::IntArrayRef{2, planted::kH, P});
    CHECK(prefix.length() == qs);  // the prefix is not changed by the query passes
    auto full_rows = [&](const std::vector<int64_t>& seq) {
        std::vector<at::Tensor> pat(2);
        Hooks hooks;
        hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& a) { pat[l] = a[0].to(torch::kDouble).clone(); });
        torch::NoGradGuard ng;
        m->forward(torch::tensor(seq, torch::kLong).view({1, static_cast<int64_t>(seq.size())}), &hooks);
        return torch::stack({pat[0].index({Slice(), Slice(qs, None)}).mean(1), pat[1].index({Slice(), Slice(qs, None)}).mean(1)});
    };
    const auto want = full_rows(prompt);
    CHECK(torch::allclose(rows, want, 1e-6, 1e-7));
    std::vector<int64_t> null_prompt(prompt.begin(), prompt.begin() + qs);
    null_prompt.insert(null_prompt.end(), null_q.begin(), null_q.end());
    const auto cal = qrhead_calibrated(*m, prefix, query, null_q);
    const int64_t n = std::min<int64_t>(P, qs + 3);
    REQUIRE(cal.size(2) == n);
    CHECK(torch::allclose(cal, want.narrow(2, 0, n) - full_rows(null_prompt).narrow(2, 0, n), 1e-6, 1e-7));
}

TEST_CASE("qrhead: on the CI toy recall model the proven retrieval heads lead the needle score; the re-ranker finds the gold pair (CI model)") {
    const std::string dir = ci_toy_model("recall");
    TempDir tmp;
    const std::string src = HS_SOURCE_DIR;
    const std::string cmd = std::string("'") + HS_BINARY + "' -q retrieval '" + dir + "' --haystack '" + src +
                            "/datasets/needles/toy_recall_haystack.txt' --needles '" + src +
                            "/datasets/needles/toy_recall_needles.jsonl' --template '{context}?{question}' "
                            "--lengths 24,40,56,72 --depths 0,25,50,75,100 --threads 1 --max-new-tokens 1 "
                            "--score retrieval,qrhead --out '" + tmp.file("q.h5") + "' > '" + tmp.file("stdout") + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string printed = read_text_file(tmp.file("stdout"));
    MESSAGE(printed);
    CHECK(printed.find("Spearman's rho (retrieval, qrhead) over 8 heads:") != std::string::npos);
    ResultReader r(tmp.file("q.h5"));
    const auto score = r.read("/scores/qrhead/score");
    REQUIRE(score.shape == std::vector<int64_t>{2, 4});
    const int64_t H = 4;
    auto name = [&](int64_t i) { return "L" + std::to_string(i / H) + "H" + std::to_string(i % H); };
    std::vector<int64_t> order(score.values.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score.values[a] > score.values[b]; });
    std::string all;
    for (auto i : order) all += name(i) + " " + std::to_string(score.values[static_cast<size_t>(i)]) + "  ";
    MESSAGE("qrhead scores: " << all);
    std::set<std::string> top3;
    for (int i = 0; i < 3; ++i) top3.insert(name(order[static_cast<size_t>(i)]));
    const std::set<std::string> truth = {"L1H0", "L1H1", "L1H2"};
    CHECK(top3 == truth);
    // The score is the mean of the trials' arrays over every done trial.
    const auto tr = r.read("/retrieval/trials/qrhead");
    const int64_t N = tr.shape[0], LH = 8;
    REQUIRE(N == 160);
    for (int64_t j = 0; j < LH; ++j) {
        double mean = 0;
        for (int64_t i = 0; i < N; ++i) mean += tr.values[static_cast<size_t>(i * LH + j)] / static_cast<double>(N);
        CHECK(score.values[static_cast<size_t>(j)] == doctest::Approx(mean).epsilon(1e-5));
    }
    // The re-ranker with the top 3 heads of that score: documents "kV", the query "?k".
    const std::string rr = std::string("'") + HS_BINARY + "' -q rerank '" + dir + "' --heads '" + tmp.file("q.h5") +
                           ":scores/qrhead/score' --top 3 --docs '" + src + "/datasets/rerank/toy_recall.jsonl' "
                           "--instruction '' --separator '' --doc-format '{doc}' --query-format '?{query}' --threads 1 > '" +
                           tmp.file("rr") + "'";
    REQUIRE(std::system(rr.c_str()) == 0);
    const std::string out = read_text_file(tmp.file("rr"));
    MESSAGE(out);
    CHECK(out.find("16 examples: recall@1 1.0000, MRR 1.0000") != std::string::npos);
}
