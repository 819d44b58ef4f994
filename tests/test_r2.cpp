// HeadKV's R2 (retrieval-reasoning) head score in the needle scan (probes/needle/needle_scoring.cpp
// score_step, NeedleTest::scored, summarize): the per-step credit against an independent recomputation on
// hand-built rows (ties, spans at the row's edges), the decode's per-step R2 against rows of a full
// forward (planted model), and on the CI toy recall model the score's ranking of the proven
// retrieval heads, the trial sum over the first |answer tokens| steps and the mean over passing trials.
// Reference: FYYFU/HeadKV Important_Head/retrieval_head_detection_r2.py (commit 0862a09) lines
// 218-229 (the credit), 245 and 255 (the steps), 314-317 and 238-241 (the passing trials).
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "model.h"
#include "needle.h"
#include "planted_model.h"
#include "store.h"
#include "tmpdir.h"
#include "util.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace hs;
using torch::indexing::Slice;

namespace {

// R2 of one head's row as the reference computes it, with the first indices winning ties: the k = N
// keys of largest weight (a stable sort: among equal weights the earlier position comes first), the
// weights of those inside [start, end) summed by position, divided by N. 0 without a span.
double r2_ref(const std::vector<double>& row, int64_t start, int64_t end) {
    if (start < 0 || end <= start) return 0.0;
    const int64_t S = static_cast<int64_t>(row.size()), n = end - start, k = std::min(n, S);
    std::vector<int64_t> idx(static_cast<size_t>(S));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    std::vector<int64_t> top(idx.begin(), idx.begin() + k);
    std::sort(top.begin(), top.end());
    double sum = 0;
    for (auto i : top)
        if (i >= start && i < end) sum += row[static_cast<size_t>(i)];
    return sum / static_cast<double>(n);
}

std::vector<double> row_of(const at::Tensor& rows, int64_t h) {
    auto r = rows[h].to(torch::kDouble).contiguous();
    return {r.data_ptr<double>(), r.data_ptr<double>() + r.numel()};
}

// score_step's R2 on `rows` [H, S] (v, wo, u and the copy condition do not enter it).
at::Tensor r2_of(const at::Tensor& rows, int64_t start, int64_t end) {
    const int64_t H = rows.size(0), S = rows.size(1), d = 2;
    const std::vector<int64_t> prompt(static_cast<size_t>(S), 7);
    return score_step(rows, torch::randn({S, 1, d}), torch::randn({3, H * d}), torch::randn({3}), prompt,
                      StepSpans{start, end, start, end, 0}, 7)
        .step(NeedleScore::kR2);
}

}  // namespace

TEST_CASE("r2: per-step credit on hand-built rows equals the top-N recomputation (ties: first indices; spans at the edges)") {
    // Weights in 1/64ths: every sum is exact, so the comparison is ==. S = 12, span [4, 8) (N = 4)
    // unless a case says otherwise.
    auto rows = torch::full({6, 12}, 1.0 / 64, torch::kFloat);
    // Head 0: the span holds the 4 largest weights: R2 = (8+8+6+6)/64 / 4.
    for (int j : {4, 5}) rows[0][j] = 8.0 / 64;
    for (int j : {6, 7}) rows[0][j] = 6.0 / 64;
    // Head 1: BOS (the sink) is the largest, then 2 span keys at 4/64 and, for the 4th place, a tie at
    // 2/64 between key 2 (before the span) and key 7 (in it): the first index (2) wins, key 7 is out.
    rows[1][0] = 32.0 / 64;
    for (int j : {4, 5}) rows[1][j] = 4.0 / 64;
    rows[1][2] = 2.0 / 64, rows[1][7] = 2.0 / 64;
    // Head 2: the same tie with the span's key first (key 5 vs key 10 after the span): key 5 is taken.
    rows[2][0] = 32.0 / 64;
    for (int j : {4, 6}) rows[2][j] = 4.0 / 64;
    rows[2][5] = 2.0 / 64, rows[2][10] = 2.0 / 64;
    // Head 3: a uniform row: the first 4 keys are the top 4, none in [4, 8): 0.
    // Head 4: the largest weights on generated tokens past the span (keys 9-11) and one in the span.
    for (int j : {9, 10, 11}) rows[4][j] = 10.0 / 64;
    rows[4][4] = 9.0 / 64;
    // Head 5: every weight distinct, rising with the position.
    for (int j = 0; j < 12; ++j) rows[5][j] = static_cast<float>(j + 1) / 64;

    auto r = r2_of(rows, 4, 8);
    REQUIRE(r.sizes() == at::IntArrayRef{6});
    CHECK(r[0].item<double>() == 28.0 / 64 / 4);
    CHECK(r[1].item<double>() == 8.0 / 64 / 4);
    CHECK(r[2].item<double>() == 10.0 / 64 / 4);
    CHECK(r[3].item<double>() == 0.0);
    CHECK(r[4].item<double>() == 9.0 / 64 / 4);
    CHECK(r[5].item<double>() == 0.0);  // its top 4 are keys 8-11, after the span
    for (int64_t h = 0; h < 6; ++h) {
        CAPTURE(h);
        CHECK(r[h].item<double>() == r2_ref(row_of(rows, h), 4, 8));
    }
    // Spans at the edges: [0, 3) with BOS in it (head 1's top 3: BOS, keys 4 and 5);
    // [9, 12) ending at the row's end (the generated tokens of head 4); a span ending past the row
    // (Wu's overlap search may give one): N = 5 > the 3 keys [9, 12) it covers; a span longer than
    // the row (k = S); no span (-1, -1) and an empty one.
    for (auto [s, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {9, 12}, {9, 14}, {0, 12}, {0, 20}, {-1, -1}, {5, 5}}) {
        CAPTURE(s);
        CAPTURE(e);
        auto rs = r2_of(rows, s, e);
        for (int64_t h = 0; h < 6; ++h) {
            CAPTURE(h);
            CHECK(rs[h].item<double>() == r2_ref(row_of(rows, h), s, e));
        }
    }
    CHECK(r2_of(rows, 0, 3)[1].item<double>() == 32.0 / 64 / 3);
    CHECK(r2_of(rows, 9, 12)[4].item<double>() == 30.0 / 64 / 3);
    CHECK(r2_of(rows, 9, 14)[4].item<double>() == 30.0 / 64 / 5);  // top 5: keys 9-11, 4 and (a tie) 0
    CHECK(r2_of(rows, -1, -1).abs().sum().item<double>() == 0.0);
    CHECK(r2_of(rows, 5, 5).abs().sum().item<double>() == 0.0);

    // Rows with many ties (weights in 8 levels), random spans: the recomputation exactly.
    std::mt19937 rng(5);
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t H = 3, S = 1 + static_cast<int64_t>(rng() % 30);
        auto t = torch::empty({H, S}, torch::kFloat);
        for (int64_t h = 0; h < H; ++h)
            for (int64_t j = 0; j < S; ++j) t[h][j] = static_cast<float>(rng() % 8) / 64;
        const int64_t s = static_cast<int64_t>(rng() % S), e = s + 1 + static_cast<int64_t>(rng() % (S + 2 - s));
        auto rs = r2_of(t, s, e);
        for (int64_t h = 0; h < H; ++h) {
            CAPTURE(trial);
            CHECK(rs[h].item<double>() == r2_ref(row_of(t, h), s, e));
        }
    }
}

TEST_CASE("r2: the decode's per-step R2 is the recomputation on the rows of a full forward (planted model)") {
    auto m = planted::model(3, 0.02, 0.05);
    Trial t;
    t.prompt = {1, 5, 9, 12, 3, 40, 41, 8, 20, 37, 21, 30, 31, 7, 6, 9, 12, 13, 50, 51, 52, 2, 4, 11};
    t.needle_start = 8, t.needle_end = 13;
    t.answer_start = 9, t.answer_end = 12;
    DecodeSettings s;
    s.max_new_tokens = 4, s.prefill_chunk = 5;
    const DecodeOut out = decode_trial(*m, t, s, [](int64_t) { return false; });
    REQUIRE(out.generated.size() == 4);
    REQUIRE(out.step(NeedleScore::kR2).sizes() == at::IntArrayRef{4, 2, planted::kH});
    const int64_t P = static_cast<int64_t>(t.prompt.size());
    std::vector<int64_t> seq = t.prompt;
    seq.insert(seq.end(), out.generated.begin(), out.generated.end() - 1);
    std::vector<at::Tensor> pat(2);
    Hooks hooks;
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& a) { pat[l] = a[0].clone(); });
    {
        torch::NoGradGuard ng;
        m->forward(torch::tensor(seq, torch::kLong).view({1, static_cast<int64_t>(seq.size())}), &hooks);
    }
    double total = 0;
    for (int64_t st = 0; st < 4; ++st)
        for (int l = 0; l < 2; ++l) {
            const int64_t q = P - 1 + st;
            const auto rows = pat[l].index({Slice(), q, Slice(0, q + 1)});  // every key the step sees
            for (int64_t h = 0; h < planted::kH; ++h) {
                CAPTURE(st);
                CAPTURE(l);
                CAPTURE(h);
                const double want = r2_ref(row_of(rows, h), t.answer_start, t.answer_end);
                CHECK(out.step(NeedleScore::kR2)[st][l][h].item<double>() == doctest::Approx(want).epsilon(1e-5));
                total += want;
            }
        }
    CHECK(total > 0);  // some head puts some of its top-3 keys on the answer
}

TEST_CASE("r2: on the CI toy recall model the proven retrieval heads score highest; trial sums and means as specified (CI model)") {
    const std::string dir = ci_toy_model("recall");
    TempDir tmp;
    const std::string src = HS_SOURCE_DIR;
    auto run = [&](const std::string& extra, const std::string& out) {
        const std::string cmd = std::string("'") + HS_BINARY + "' -q retrieval '" + dir + "' --haystack '" + src +
                                "/datasets/needles/toy_recall_haystack.txt' --needles '" + src +
                                "/datasets/needles/toy_recall_needles.jsonl' --template '{context}?{question}' "
                                "--lengths 24,40,56,72 --depths 0,25,50,75,100 --threads 1 " + extra + " --out '" +
                                tmp.file(out) + "' > '" + tmp.file("stdout") + "'";
        REQUIRE(std::system(cmd.c_str()) == 0);
        MESSAGE(read_text_file(tmp.file("stdout")));
        return ResultReader(tmp.file(out));
    };
    ResultReader r = run("--max-new-tokens 1 --score retrieval,locos,r2", "one.h5");
    const auto score = r.read("/scores/r2/score");
    REQUIRE(score.shape == std::vector<int64_t>{2, 4});
    const int64_t H = score.shape[1];
    auto name = [&](int64_t i) { return "L" + std::to_string(i / H) + "H" + std::to_string(i % H); };
    std::string all;
    for (size_t i = 0; i < score.values.size(); ++i) all += name(static_cast<int64_t>(i)) + " " + std::to_string(score.values[i]) + "  ";
    MESSAGE("r2 scores: " << all);
    // Measured (the 3000-step CI model, 160 trials, all passing): L1H0 0.9367, L1H1 0.9292,
    // L1H2 0.2830, L1H3 0.2112, L0H3 0.0034, the other layer-0 heads 0 (retrieval: 1, 1, 0.58,
    // 0.51; LOCOS: 0.53, 0.50, 0.061, 0.015). One answer token, so one step per trial: R2 is then the
    // weight of the head's top key when that key is the answer's.
    std::set<std::string> top3, truth = {"L1H0", "L1H1", "L1H2"};
    std::vector<int64_t> order(score.values.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score.values[a] > score.values[b]; });
    for (int i = 0; i < 3; ++i) top3.insert(name(order[static_cast<size_t>(i)]));
    CHECK(top3 == truth);
    CHECK(score.values[static_cast<size_t>(order[1])] > 0.8);
    CHECK(score.values[static_cast<size_t>(order[2])] > score.values[static_cast<size_t>(order[3])] + 0.05);

    // The score is the mean of the trials' R2 over the passing trials.
    const auto tr = r.read("/retrieval/trials/r2"), passed = r.read("/retrieval/trials/passed");
    const int64_t N = tr.shape[0], LH = tr.shape[1] * tr.shape[2];
    REQUIRE(N == 4 * 5 * 8);
    std::vector<double> mean(static_cast<size_t>(LH), 0.0);
    int64_t n_pass = 0;
    for (int64_t i = 0; i < N; ++i) {
        if (!(passed.values[i] > 0)) continue;
        ++n_pass;
        for (int64_t j = 0; j < LH; ++j) mean[j] += tr.values[i * LH + j];
    }
    REQUIRE(n_pass > 0);
    for (int64_t j = 0; j < LH; ++j) CHECK(score.values[j] == doctest::Approx(mean[j] / n_pass).epsilon(1e-6));

    // Two steps (--stop none): a trial's R2 sums only the first |answer tokens| = 1 step ("Z" of
    // "qZ"; the reference stops after len(answer_tokens) steps), so it is the one-step run's, while
    // the second step has credit of its own. (No trial passes: the response "ZP" is one word.)
    ResultReader r2 = run("--max-new-tokens 2 --stop none --score r2 --dump-steps", "two.h5");
    CHECK(!r2.exists("/scores/retrieval"));
    const auto tr2 = r2.read("/retrieval/trials/r2"), st = r2.read("/retrieval/steps/r2");
    REQUIRE(st.shape == std::vector<int64_t>{N, 2, 2, 4});
    double second = 0;
    for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < LH; ++j) {
            CHECK(tr2.values[i * LH + j] == st.values[(i * 2) * LH + j]);
            // The one-step run also computes LOCOS, whose value products make its decode copy the
            // prefills into one batch cache; this r2-only run reads them in place (needle_decode.h,
            // DecodeSettings::share_prompt): the attention weights agree within float rounding.
            CHECK(tr2.values[i * LH + j] == doctest::Approx(tr.values[i * LH + j]).epsilon(1e-6));
            second += st.values[(i * 2 + 1) * LH + j];
        }
    MESSAGE("the second steps' R2, summed over trials and heads: " << second);
    CHECK(second > 0);
}
