// Needle in a haystack (probes/needle/needle.*, `headscope retrieval`): ROUGE, token-space prompts, the
// per-step retrieval credit and LOCOS L+/L- against direct loops, decode through the KV cache
// against a full forward on a model with planted attention, the bootstrap, controls, bad input,
// and the toy recall model's own task posed as a needle test.
#include <doctest/doctest.h>

#include "blocks.h"
#include "ci_toy.h"
#include "errors.h"
#include "model.h"
#include "needle.h"
#include "needle_scoring.h"
#include "planted_model.h"
#include "schema.h"
#include "store.h"
#include "tmpdir.h"
#include "testdata.h"
#include "tokenizer.h"
#include "toy_tasks.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>

using namespace hs;

// Batched decode rows against one-at-a-time: folded GEMMs differ in the last bits (measured
// below ~1e-6 of the trial's largest contribution).
constexpr double kBatchRelTol = 1e-5;
using torch::indexing::Slice;

// The step arrays the tests read (probes/needle/scores.cpp: retrieval's credit, LOCOS's L+ then L-).
template <class T>
const at::Tensor& credit(const T& x) { return x.step(NeedleScore::kRetrieval); }
template <class T>
const at::Tensor& lplus(const T& x) { return x.step(NeedleScore::kLocos, 0); }
template <class T>
const at::Tensor& lminus(const T& x) { return x.step(NeedleScore::kLocos, 1); }

namespace {

void write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
}

using planted::kD, planted::kH, planted::kHd, planted::kK, planted::kV;
constexpr int64_t kTarget = 37;  // the token the planted head looks for

// Two llama layers, embed = unembed = Q (orthonormal), v = x for every kv head. Head L0H0 attends
// to the positions holding kTarget (planted q/k on the rotary pair of row 10, so nearer copies win
// clearly) and writes 10 x its value: the model generates kTarget while kTarget is in view.
std::unique_ptr<Model> planted_model() {
    auto m = planted::model(3, 0.02, 0.05);
    const auto& q = m->weights.embed;
    auto& l0 = m->weights.layers[0];
    l0.wq.index_put_({Slice(0, kHd)}, 0.0);  // head 0: only the planted row
    l0.wk.index_put_({Slice(0, kHd)}, 0.0);  // kv head 0 (query heads 0, 1)
    const int r = 10;
    l0.wq[r] = q.sum(0) * 2.0;    // q_r = 2 sqrt(D) for every token
    l0.wk[r] = q[kTarget] * 2.0;  // k_r = 2 sqrt(D) on kTarget, 0 elsewhere
    l0.wo.index_put_({Slice(), Slice(0, kHd)}, torch::eye(kD) * 10.0);
    return m;
}

Trial planted_trial() {
    Trial t;
    t.prompt = {1, 5, 9, 12, 3, 40, 41, 8, 20, kTarget, 21, 30, 31, 7, 6, 9, 12, 13, 50, 51, 52, 2, 4, 11};
    t.needle_start = 8, t.needle_end = 11;
    t.answer_start = 9, t.answer_end = 10;  // the answer is kTarget
    t.length = 22;
    return t;
}

// Loops: credit, L+ and L- of one step from one attention row [H, S] and values [S, K, d].
void loop_step(const at::Tensor& row, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
               const std::vector<int64_t>& prompt, const StepSpans& sp, int64_t y, std::vector<double>& credit,
               std::vector<double>& lp, std::vector<double>& lm) {
    const int64_t ns = sp.needle_start, ne = sp.needle_end;
    const int64_t H = row.size(0), S = row.size(1), K = v.size(1), d = v.size(2);
    auto a = row.to(torch::kDouble).contiguous(), vv = v.to(torch::kDouble).contiguous();
    auto w = wo.to(torch::kDouble).contiguous(), uu = u.to(torch::kDouble).contiguous();
    auto A = a.accessor<double, 2>();
    auto V = vv.accessor<double, 3>();
    auto W = w.accessor<double, 2>();
    auto U = uu.accessor<double, 1>();
    credit.assign(H, 0), lp.assign(H, 0), lm.assign(H, 0);
    for (int64_t h = 0; h < H; ++h) {
        int64_t best = 0;
        for (int64_t j = 1; j < S; ++j)
            if (A[h][j] > A[h][best]) best = j;
        if (best >= sp.answer_start && best < sp.answer_end && prompt[best] == y)
            credit[h] = 1.0 / static_cast<double>(sp.answer_end - sp.answer_start);
        std::vector<double> up(d, 0.0);  // W_O^h^T u
        for (int64_t e = 0; e < d; ++e)
            for (int64_t D = 0; D < W.size(0); ++D) up[e] += W[D][h * d + e] * U[D];
        double in = 0, off = 0;
        int64_t others = 0;  // keys visible to the head outside the needle
        for (int64_t j = 0; j < S; ++j) {
            double dot = 0;
            for (int64_t e = 0; e < d; ++e) dot += V[j][h / (H / K)][e] * up[e];
            (j >= ns && j < ne ? in : off) += A[h][j] * dot;
            others += j >= sp.first_visible && !(j >= ns && j < ne);
        }
        lp[h] = in;
        lm[h] = others ? off * static_cast<double>(ne - ns) / static_cast<double>(others) : 0.0;
    }
}

}  // namespace

TEST_CASE("needle: the retrieval score's argmax is at::argmax (first of ties, a NaN the largest)") {
    torch::manual_seed(7);
    auto x = torch::rand({5, 7, 301});
    x.index_put_({1, 2, 200}, x[1][2].max() + 1), x.index_put_({1, 2, 250}, x[1][2][200]);  // a tie: 200 wins
    x.index_put_({2, 0, 17}, std::nanf("")), x.index_put_({2, 0, 30}, std::nanf(""));        // the first NaN
    x.index_put_({3, 3, 0}, 2.0f);                                                              // the first key
    x[4][5].fill_(0.25f);                                                                       // all equal
    for (const auto& t : {x, x.transpose(0, 1).contiguous().transpose(0, 1), x.to(torch::kDouble), x.narrow(2, 0, 1)}) {
        const auto got = first_argmax(t);
        CHECK((got.scalar_type() == torch::kLong));
        CHECK(torch::equal(got, t.argmax(2)));
    }
    CHECK(first_argmax(x)[1][2].item<int64_t>() == 200);
    CHECK(first_argmax(x)[2][0].item<int64_t>() == 17);
}

TEST_CASE("needle: ROUGE-1 recall tokenises as rouge-score (lowercase, non-alphanumerics split)") {
    CHECK(rouge_tokens("Eat a FIG-sandwich, now!", false) == std::vector<std::string>{"eat", "a", "fig", "sandwich", "now"});
    CHECK(rouge1("Yuki", " yuki lives there.").recall == doctest::Approx(1.0));
    CHECK(rouge1("fig sandwich", "a fig!").recall == doctest::Approx(0.5));
    CHECK(rouge1("the the cat", "the cat").recall == doctest::Approx(2.0 / 3.0));  // clipped counts
    CHECK(rouge1("Z", "Z").recall == doctest::Approx(1.0));
    CHECK(rouge1("Z", "K").recall == doctest::Approx(0.0));
    CHECK(rouge1("...", "anything").recall == doctest::Approx(0.0));
    // Stemmed as the references score it: "studies" and "study" both stem to "studi".
    CHECK(rouge1("She studies", "she study").recall == doctest::Approx(1.0));
    CHECK(rouge1("She studies", "she study", false).recall == doctest::Approx(0.5));
}

TEST_CASE("needle: the answer's span inside the needle, found in token space") {
    TempDir tmp;
    write_file(tmp.file("tokenizer.json"), toy::tokenizer_json());
    auto tok = load_tokenizer(tmp.file("tokenizer.json"));
    auto ids = [&](const Tokenizer& t, const std::string& s) {
        auto e = t.encode(s, false);
        return std::vector<int64_t>(e.begin(), e.end());
    };
    CHECK(answer_span(*tok, ids(*tok, "qZ"), "Z") == std::make_pair<int64_t, int64_t>(1, 2));
    CHECK(answer_span(*tok, ids(*tok, "qZ"), "q") == std::make_pair<int64_t, int64_t>(0, 1));
    CHECK(!answer_span(*tok, ids(*tok, "qZ"), "K"));
    HS_REQUIRE_TESTDATA(td);
    auto gpt2 = load_tokenizer(td + "/gpt2-tokenizer");
    const std::string needle = "Actually, Yuki lives next to the Semper Opera House.";
    const auto nt = ids(*gpt2, needle);
    for (const std::string answer : {"Yuki", "semper opera", "House", "Opera House."}) {
        CAPTURE(answer);
        const auto sp = answer_span(*gpt2, nt, answer);
        REQUIRE(sp);
        // The span's decoded text covers the answer and no token of it can be dropped.
        auto text = [&](int64_t a, int64_t b) {
            return gpt2->decode(std::vector<int32_t>(nt.begin() + a, nt.begin() + b), true);
        };
        auto lower = [](std::string s) {
            for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            return s;
        };
        CHECK(lower(text(sp->first, sp->second)).find(lower(answer)) != std::string::npos);
        CHECK(lower(text(sp->first + 1, sp->second)).find(lower(answer)) == std::string::npos);
        CHECK(lower(text(sp->first, sp->second - 1)).find(lower(answer)) == std::string::npos);
    }
    CHECK(!answer_span(*gpt2, nt, "Dresden"));
}

TEST_CASE("needle: the newline stop rule stops on tokens that are exactly a newline (BPE with '.\\n' tokens)") {
    HS_REQUIRE_TESTDATA(td);
    // tinystories-656k's BPE has merged tokens ".\n", "!\n", ".\nThe " beside "\n" itself.
    auto tok = load_tokenizer(td + "/tinystories-656k/tokenizer.json");
    auto id = [&](const std::string& s) {
        const auto i = tok->token_to_id(s);
        REQUIRE(i);
        return static_cast<int64_t>(*i);
    };
    const int64_t nl = id("\n"), dot_nl = id(".\n"), bang_nl = id("!\n"), dot_nl_the = id(".\nThe\u2581");
    REQUIRE(tok->eos_id());
    const int64_t eos = *tok->eos_id();
    const TokenFacts f = token_facts(*tok);
    CHECK(f.newline_ids == std::vector<int64_t>{nl});
    CHECK(f.stop(nl));
    CHECK(!f.stop(dot_nl));  // text that ends a sentence, not the end of the response
    CHECK(!f.stop(bang_nl));
    CHECK(!f.stop(dot_nl_the));
    CHECK(f.sentence_end(dot_nl));
    CHECK(f.stop(eos));
    const TokenFacts e = token_facts(*tok, StopRule::kEos), n = token_facts(*tok, StopRule::kNone);
    CHECK(!e.stop(nl));
    CHECK(e.stop(eos));
    CHECK(!n.stop(nl));
    CHECK(!n.stop(eos));
    // GPT-2's byte-level BPE: "\u010a" (198) is the newline, "\u010a\u010a" (628) is two.
    auto gpt2 = load_tokenizer(td + "/gpt2-tokenizer");
    const TokenFacts g = token_facts(*gpt2);
    CHECK(g.newline_ids == std::vector<int64_t>{198});
    CHECK(!g.stop(628));
    CHECK(parse_name(stop_rule_names(), "eos", "stop rule") == StopRule::kEos);
    CHECK_THROWS_AS(parse_name(stop_rule_names(), "newlines", "stop rule"), UsageError);
}

TEST_CASE("needle: the score registry: names, the --score words, every array a layout() row") {
    CHECK(needle_score_names() == "retrieval, locos, r2, qrhead");
    REQUIRE(static_cast<int>(needle_scores().size()) == kNeedleScoreCount);
    for (const auto& row : needle_scores()) {
        CAPTURE(row.name);
        CHECK(&needle_score(row.id) == &row);  // one row a score, in enum order
        CHECK(parse_needle_score(row.name) == row.id);
        REQUIRE(!row.trial_arrays.empty());
        CHECK(std::string(row.trial_arrays.front().name) == row.name);  // the score's own array first
        CHECK(row.step_arrays.empty() == row.needs_query_rows);  // QRHead reads the prefill, no decode step
        for (const auto& a : row.trial_arrays) CHECK(schema::in_layout(std::string("/retrieval/trials/") + a.name));
        for (const auto& a : row.step_arrays) CHECK(schema::in_layout(std::string("/retrieval/steps/") + a.name));
        CHECK(schema::in_layout(std::string("/scores/") + row.name + "/score"));
        if (row.reduction == NeedleReduction::kAnswerStepMean)
            CHECK((schema::in_layout(std::string("/scores/") + row.name + "/ci_low") &&
                   schema::in_layout(std::string("/scores/") + row.name + "/ci_high")));
        CHECK(std::string(row.description).size() > 20);
    }
    CHECK((parse_needle_scores(" r2 , ,locos").list() == std::vector<NeedleScore>{NeedleScore::kLocos, NeedleScore::kR2}));
    auto message = [](const std::string& csv) {
        try {
            parse_needle_scores(csv);
        } catch (const UsageError& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    CHECK(message("retrieval,x") == "unknown score 'x' (valid: retrieval, locos, r2, qrhead)");
    CHECK(message(" , ") == "no score named (valid: retrieval, locos, r2, qrhead)");
}

TEST_CASE("needle: a head whose argmax lands on the answer at every step scores exactly 1; other needle tokens 0") {
    // Prompt: 0..3 haystack, needle [4, 10) = tokens 20 21 30 31 32 33 whose answer is [6, 10) =
    // 30 31 32 33; token 21 also occurs as the needle's second token. The model "generates" the
    // answer 30 31 32 33 in four steps. Head 0 puts its argmax on the answer token it copies; head 1
    // on the needle's token 21 at position 5 (outside the answer) while the step generates 21 too;
    // head 2 on the right token but outside the needle (position 1 holds 30 as well).
    const std::vector<int64_t> prompt = {1, 30, 2, 3, 20, 21, 30, 31, 32, 33, 4, 5};
    const StepSpans sp{4, 10, 6, 10, 0};
    const int64_t H = 3, K = 1, d = 2, D = 4;
    auto wo = torch::randn({D, H * d}), u = torch::randn({D});
    const std::vector<int64_t> answer = {30, 31, 32, 33};
    double total[3] = {0, 0, 0};
    for (int64_t st = 0; st < 4; ++st) {
        const int64_t S = static_cast<int64_t>(prompt.size()) + st;
        auto row = torch::full({H, S}, 0.01);
        row[0][6 + st] = 0.9;
        row[1][5] = 0.9;
        row[2][1] = 0.9;
        auto v = torch::randn({S, K, d});
        auto s0 = score_step(row, v, wo, u, prompt, sp, answer[st]);
        auto s1 = score_step(row, v, wo, u, prompt, sp, 21);  // head 1's token, generated
        for (int h = 0; h < 3; ++h) total[h] += credit(h == 1 ? s1 : s0)[h].item<double>();
    }
    CHECK(total[0] == 1.0);  // 4 x 1/4: a perfect copier scores 1 per trial
    CHECK(total[1] == 0.0);  // a needle token outside the answer earns nothing
    CHECK(total[2] == 0.0);
}

TEST_CASE("needle: the prompt is built in token space with the needle at the previous sentence end") {
    TempDir tmp;
    write_file(tmp.file("tokenizer.json"), toy::tokenizer_json());
    auto tok = load_tokenizer(tmp.file("tokenizer.json"));
    const TokenFacts f = token_facts(*tok);
    REQUIRE(f.bos_prefix == std::vector<int64_t>{toy::kBos});
    auto ids = [&](const std::string& s) {
        auto e = tok->encode(s, false);
        return std::vector<int64_t>(e.begin(), e.end());
    };
    const auto hay = ids("1234.5678.90");  // sentence ends after positions 4 and 9 of the haystack
    const auto needle = ids("qZ"), suffix = ids("?q");
    for (double depth : {0.0, 25.0, 50.0, 75.0, 100.0}) {
        CAPTURE(depth);
        const Trial t = build_trial(f, hay, f.bos_prefix, needle, suffix, 20, depth, 0, {1, 2});
        CHECK(t.prompt.size() == 1 + 20 + 2);
        CHECK(t.needle_end - t.needle_start == 2);
        CHECK((t.answer_start == t.needle_start + 1 && t.answer_end == t.needle_end));
        CHECK(std::vector<int64_t>(t.prompt.begin() + t.needle_start, t.prompt.begin() + t.needle_end) == needle);
        // The token before the needle is BOS or a sentence end; haystack order is kept around it.
        const int64_t before = t.prompt[t.needle_start - 1];
        if (depth < 100) CHECK((before == toy::kBos || f.sentence_end(before)));
        std::vector<int64_t> rest(t.prompt.begin() + 1, t.prompt.begin() + t.needle_start);
        rest.insert(rest.end(), t.prompt.begin() + t.needle_end, t.prompt.end() - 2);
        for (size_t i = 0; i < rest.size(); ++i) CHECK(rest[i] == hay[i % hay.size()]);
    }
    // 18 haystack tokens; 50% -> before index 9, moved back to just after the '.' at index 4;
    // 100% -> at the end, as published.
    CHECK(build_trial(f, hay, f.bos_prefix, needle, suffix, 20, 50, 0, {1, 2}).needle_start == 1 + 5);
    CHECK(build_trial(f, hay, f.bos_prefix, needle, suffix, 20, 100, 0, {1, 2}).needle_start == 1 + 18);
    CHECK(build_trial(f, hay, f.bos_prefix, needle, suffix, 20, 0, 0, {1, 2}).needle_start == 1);
    CHECK_THROWS_AS(build_trial(f, hay, f.bos_prefix, needle, suffix, 2, 50, 0, {1, 2}), DataError);
}

TEST_CASE("needle: per-step credit and L+/L- on hand-made rows equal direct sums (GQA)") {
    const int64_t H = 4, K = 2, d = 3, D = 5, S = 9;
    torch::manual_seed(11);
    auto row = torch::softmax(torch::randn({H, S}) * 3, 1);
    // Head 0 puts its maximum on needle position 4 (token 7 = y); head 1 on position 5 (token 8 != y);
    // head 2 on position 1 (token 7 but outside the needle); head 3 on 6 = the needle's end (exclusive).
    for (auto [h, j] : std::vector<std::pair<int, int>>{{0, 4}, {1, 5}, {2, 1}, {3, 6}}) row[h][j] = 5.0;
    auto v = torch::randn({S, K, d}), wo = torch::randn({D, H * d}), u = torch::randn({D});
    const std::vector<int64_t> prompt = {1, 7, 3, 3, 7, 8, 2, 2};  // position 8 = a generated token
    const int64_t y = 7;
    // Needle [3, 6), its answer [4, 6): head 0's key 4 is in the answer and holds y.
    for (int64_t first_visible : {0, 2, 5}) {  // full attention; sliding windows of 7 and 4 keys
        CAPTURE(first_visible);
        const StepSpans sp{3, 6, 4, 6, first_visible};
        auto s = score_step(row, v, wo, u, prompt, sp, y);
        std::vector<double> c, lp, lm;
        loop_step(row, v, wo, u, prompt, sp, y, c, lp, lm);
        CHECK(credit(s)[0].item<double>() == doctest::Approx(1.0 / 2.0));
        for (int h = 1; h < H; ++h) CHECK(credit(s)[h].item<double>() == 0.0);
        for (int h = 0; h < H; ++h) {
            CHECK(credit(s)[h].item<double>() == doctest::Approx(c[h]));
            CHECK(lplus(s)[h].item<double>() == doctest::Approx(lp[h]).epsilon(1e-5));  // float32 products
            CHECK(lminus(s)[h].item<double>() == doctest::Approx(lm[h]).epsilon(1e-5));
        }
        // L- is the other keys' sum scaled by n / (visible other keys): 3/6, 3/4 and 3/3.
        const double others = first_visible == 0 ? 6 : first_visible == 2 ? 4 : 3;
        const double ratio = lminus(s)[0].item<double>() / lminus(score_step(row, v, wo, u, prompt, {3, 6, 4, 6, 0}, y))[0].item<double>();
        CHECK(ratio == doctest::Approx(6.0 / others));
    }
}

TEST_CASE("needle: a layer's rows scored at once equal each row scored alone, bit for bit (GQA, ties, a row left out)") {
    // A batch of 5 rows whose row 1 is done (left out); the values in the KV cache's layout ([B, K,
    // capacity, d] buffers seen as [B, S, K, d]); spans of different widths and places, one row
    // without a needle and with a sliding window; rows 0 and 2 generated the same y; row 3's weights
    // in 8 levels (ties at the k-th largest weight, in the span and before it). score_layer on the 4
    // rows at once against score_step on each row alone: every array torch::equal.
    const int64_t B = 5, H = 4, K = 2, d = 3, D = 5, S = 40, V = 30;
    torch::manual_seed(7);
    const auto v = torch::randn({B, K, S + 8, d}).narrow(2, 0, S).permute({0, 2, 1, 3});  // [B, S, K, d]
    auto pattern = torch::softmax(torch::randn({B, H, S}) * 3, 2);
    pattern[3] = torch::randint(0, 8, {H, S}).to(torch::kFloat) / 64;
    const auto wo = torch::randn({D, H * d}), W = torch::randn({V, D});
    std::vector<std::vector<int64_t>> prompts(B);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < S - 3; ++j) prompts[b].push_back((j * 7 + b) % 20 + 1);  // keys >= S - 3: generated
    prompts[0][9] = prompts[2][23] = 25;
    pattern[0][0][9] = 5.0;   // row 0, head 0: argmax on its answer's key 9, which holds y
    pattern[2][1][23] = 5.0;  // row 2, head 1: the same on key 23
    const std::vector<int64_t> scored = {0, 2, 3, 4}, ys = {25, 25, 21, 4};  // no key holds 21 or 4
    const std::vector<StepSpans> spans = {{5, 12, 8, 12, 0}, {20, 26, 22, 26, 0}, {10, 30, 12, 20, 0}, {-1, -1, -1, -1, 6}};
    std::vector<const std::vector<int64_t>*> pp;
    for (auto b : scored) pp.push_back(&prompts[b]);
    const auto a = pattern.index_select(0, torch::tensor(scored, torch::kLong));
    const auto u = W.index_select(0, torch::tensor(ys, torch::kLong));
    const auto batch = score_layer(NeedleStepInput{a, v, scored, wo, u, pp, spans, ys});
    for (size_t r = 0; r < scored.size(); ++r) {
        CAPTURE(r);
        const auto b = scored[r];
        const auto alone = score_step(pattern[b], v[b], wo, W[ys[r]], prompts[b], spans[r], ys[r]);
        for (size_t sc = 0; sc < batch.size(); ++sc)
            for (size_t p = 0; p < batch[sc].size(); ++p) {
                CAPTURE(sc);
                CAPTURE(p);
                CHECK(batch[sc][p].sizes() == at::IntArrayRef{4, H});
                CHECK(torch::equal(batch[sc][p][static_cast<int64_t>(r)], alone.of[sc][p]));
            }
    }
    // What the rows score: the copies, R2 on the tied row, L+ and L- (none without a needle).
    const auto ret = batch[static_cast<size_t>(NeedleScore::kRetrieval)][0];
    CHECK(ret[0][0].item<double>() == 0.25);
    CHECK(ret[1][1].item<double>() == 0.25);
    CHECK(ret.abs().sum().item<double>() == 0.5);
    CHECK(batch[static_cast<size_t>(NeedleScore::kR2)][0][2].abs().sum().item<double>() > 0.0);
    CHECK(batch[static_cast<size_t>(NeedleScore::kLocos)][0][3].abs().sum().item<double>() == 0.0);
    CHECK(batch[static_cast<size_t>(NeedleScore::kLocos)][1][0].abs().sum().item<double>() > 0.0);
}

TEST_CASE("needle: decode through the KV cache in prefill chunks equals a full forward, scores equal loops (planted model)") {
    auto m = planted_model();
    const Trial t = planted_trial();
    const int64_t P = static_cast<int64_t>(t.prompt.size());
    auto never = [](int64_t) { return false; };
    DecodeSettings s;
    s.max_new_tokens = 4, s.prefill_chunk = 5;
    const DecodeOut out = decode_trial(*m, t, s, never);
    REQUIRE(out.generated.size() == 4);
    CHECK(out.generated[0] == kTarget);  // the planted head copies the needle's token
    CHECK(credit(out)[0][0][0].item<double>() == 1.0);  // argmax on the answer, kTarget: 1/|answer| = 1

    // Chunk size does not matter.
    DecodeSettings s1 = s;
    s1.prefill_chunk = 512;
    const DecodeOut one = decode_trial(*m, t, s1, never);
    CHECK(one.generated == out.generated);
    CHECK(torch::allclose(lplus(one), lplus(out), 1e-5, 1e-6));
    CHECK(torch::equal(credit(one), credit(out)));

    // Full forward over prompt + generated[:-1], no cache: rows at the query positions P-1+t.
    std::vector<int64_t> seq = t.prompt;
    seq.insert(seq.end(), out.generated.begin(), out.generated.end() - 1);
    const int64_t T = static_cast<int64_t>(seq.size());
    std::vector<at::Tensor> pat(2), val(2);
    Hooks hooks;
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& a) { pat[l] = a[0].clone(); });
    hooks.capture(Point::kAttnV, [&](int l, const at::Tensor& v) { val[l] = v[0].clone(); });
    at::Tensor logits;
    {
        torch::NoGradGuard ng;
        logits = m->forward(torch::tensor(seq, torch::kLong).view({1, T}), &hooks);
    }
    for (size_t st = 0; st < out.generated.size(); ++st) {
        CAPTURE(st);
        const int64_t qpos = P - 1 + static_cast<int64_t>(st), y = out.generated[st];
        CHECK(logits[0][qpos].argmax().item<int64_t>() == y);
        for (int l = 0; l < 2; ++l) {
            std::vector<double> c, lp, lm;
            loop_step(pat[l].index({Slice(), qpos, Slice(0, qpos + 1)}), val[l].index({Slice(0, qpos + 1)}),
                      m->weights.layers[l].wo, m->weights.unembed[y], t.prompt,
                      StepSpans{t.needle_start, t.needle_end, t.answer_start, t.answer_end, 0}, y, c, lp, lm);
            for (int h = 0; h < kH; ++h) {
                CAPTURE(l);
                CAPTURE(h);
                CHECK(credit(out)[st][l][h].item<double>() == doctest::Approx(c[h]));
                CHECK(lplus(out)[st][l][h].item<double>() == doctest::Approx(lp[h]).epsilon(1e-4).scale(1.0));
                CHECK(lminus(out)[st][l][h].item<double>() == doctest::Approx(lm[h]).epsilon(1e-4).scale(1.0));
            }
        }
    }
    // The planted head's later steps see kTarget nearer (the generated copies): no credit there.
    CHECK(credit(out)[1][0][0].item<double>() == 0.0);
    CHECK(lplus(out)[0][0][0].item<double>() > 10.0 * std::abs(lminus(out)[0][0][0].item<double>()));

    // Ablation: zero-query on L0H0 loses the copy; mean-query with a zero mean is the same run,
    // with a non-zero mean it is not (the planted head then attends by the rotated mean).
    HeadSet zq{{{0, 0}}, Intervention::kZeroQuery, {}};
    HeadSet mq{{{0, 0}}, Intervention::kMeanQuery, torch::zeros({2, kH, kHd})};
    const DecodeOut a = decode_trial(*m, t, s, never, &zq), b = decode_trial(*m, t, s, never, &mq);
    CHECK(a.generated[0] != kTarget);
    CHECK(a.generated == b.generated);
    CHECK(torch::equal(lplus(a), lplus(b)));
    auto mean = torch::zeros({2, kH, kHd});
    mean[0][0] = torch::randn({kHd}) * 3.0;
    HeadSet mq1{{{0, 0}}, Intervention::kMeanQuery, mean};
    const DecodeOut c1 = decode_trial(*m, t, s, never, &mq1);
    CHECK(!torch::allclose(lplus(c1), lplus(a)));
    // Scope: ablating in decode steps only leaves the prefill (and so the cache) intact.
    DecodeSettings sd = s;
    sd.scope = AblationScope::kDecode;
    const DecodeOut dz = decode_trial(*m, t, sd, never, &zq);
    CHECK(dz.generated[0] != kTarget);  // the decode step's own query is still zeroed
    CHECK(!torch::equal(lminus(dz), lminus(a)));  // but layer 1 read an unablated prefill
    // A stop token ends the loop unkept.
    const DecodeOut stopped = decode_trial(*m, t, s, [](int64_t id) { return id == kTarget; });
    CHECK(stopped.generated.empty());
    CHECK(credit(stopped).size(0) == 0);
    // Batched rows equal their trials decoded alone, also when one row stops first: trial c has
    // no kTarget, so with kTarget as the stop token rows a and b stop at step 0 and c runs on.
    Trial t2 = t, t3 = t;
    std::swap(t2.prompt[9], t2.prompt[3]);  // kTarget moved to position 3, outside the needle
    t2.prompt[9] = 60;
    t3.prompt[9] = 61;  // no kTarget anywhere
    for (auto stop_fn : std::vector<std::function<bool(int64_t)>>{never, [](int64_t id) { return id == kTarget; }}) {
        const auto batch = decode_batch(*m, {&t, &t2, &t3}, s, stop_fn);
        REQUIRE(batch.size() == 3);
        const std::vector<const Trial*> all = {&t, &t2, &t3};
        for (size_t k = 0; k < all.size(); ++k) {
            CAPTURE(k);
            const DecodeOut alone = decode_trial(*m, *all[k], s, stop_fn);
            CHECK(batch[k].generated == alone.generated);
            CHECK(torch::equal(credit(batch[k]), credit(alone)));
            // Rows of a batch run folded GEMMs (docs/forward.md): equal to their solo runs up to
            // the last bits, relative to the largest logit contribution of the trial, L+ or L-: in a
            // trial whose needle lacks the answer (k = 1) L+ is ~0.05 and L- ~11, and a last-bit
            // float32 difference in L- (6e-7 with libtorch 2.x's GEMMs) exceeded 1e-5 of L+.
            REQUIRE(lplus(batch[k]).sizes() == lplus(alone).sizes());
            if (lplus(alone).numel() == 0) continue;
            const double scale = std::max({1e-3, lplus(alone).abs().max().item<double>(), lminus(alone).abs().max().item<double>()});
            MESSAGE("batched vs alone: L+ " << (lplus(batch[k]) - lplus(alone)).abs().max().item<double>() << ", L- "
                                            << (lminus(batch[k]) - lminus(alone)).abs().max().item<double>() << ", scale " << scale);
            CHECK((lplus(batch[k]) - lplus(alone)).abs().max().item<double>() <= kBatchRelTol * scale);
            CHECK((lminus(batch[k]) - lminus(alone)).abs().max().item<double>() <= kBatchRelTol * scale);
        }
        if (stop_fn(kTarget)) CHECK((batch[0].generated.empty() && batch[2].generated.size() == 4));
    }
}

TEST_CASE("needle: a decode computes only the scores it is asked for; those equal the all-scores run's bit for bit (planted model)") {
    auto m = planted_model();
    const Trial t = planted_trial();
    Trial t2 = t;
    t2.prompt[9] = 61;  // a second row without the target
    auto never = [](int64_t) { return false; };
    DecodeSettings all;
    all.max_new_tokens = 4, all.prefill_chunk = 5;
    REQUIRE(all.scores == NeedleScoreSet::all());
    DecodeSettings only = all;
    only.scores = NeedleScoreSet{};
    only.scores.add(NeedleScore::kRetrieval);
    const auto a = decode_batch(*m, {&t, &t2}, all, never), o = decode_batch(*m, {&t, &t2}, only, never);
    for (size_t k = 0; k < 2; ++k) {
        CAPTURE(k);
        CHECK(o[k].generated == a[k].generated);
        REQUIRE(credit(a[k]).size(0) == 4);
        CHECK(torch::equal(credit(o[k]), credit(a[k])));
        CHECK(lplus(a[k]).size(0) == 4);  // the all-scores run has them
        CHECK(lplus(o[k]).size(0) == 0);  // not computed: no steps
        CHECK(lminus(o[k]).size(0) == 0);
        CHECK(o[k].step(NeedleScore::kR2).size(0) == 0);
    }
}

TEST_CASE("needle: batches take any lengths with ragged rows, one prompt length without, cut into equal sizes") {
    // needle_batches: every trial once; a batch at most batch_size trials; a key's batches as few as
    // that allows and of sizes that differ by one at most (48 trials at 45: 24 + 24, not 45 + 3);
    // without ragged rows one prompt length a batch; within a batch, the prompts in lexicographic order.
    auto trials_of = [](const std::vector<int64_t>& lengths) {
        std::vector<Trial> ts;
        for (size_t i = 0; i < lengths.size(); ++i) {
            Trial t;
            t.prompt.assign(static_cast<size_t>(lengths[i]), 7);
            t.prompt[0] = static_cast<int64_t>(100 - i);  // reverse order: the batches must sort them
            t.length = lengths[i];
            ts.push_back(std::move(t));
        }
        return ts;
    };
    auto check_cover = [](const std::vector<std::vector<int64_t>>& bs, size_t n, int64_t most) {
        std::vector<int> seen(n, 0);
        for (const auto& b : bs) {
            CHECK(static_cast<int64_t>(b.size()) <= most);
            CHECK_FALSE(b.empty());
            for (auto i : b) ++seen[static_cast<size_t>(i)];
        }
        for (auto c : seen) CHECK(c == 1);
    };
    const auto mixed = trials_of({5, 9, 5, 12, 9, 5, 5});
    {
        const auto bs = needle_batches(mixed, 3, true);
        check_cover(bs, mixed.size(), 3);
        REQUIRE(bs.size() == 3u);  // ceil(7 / 3)
        CHECK(bs[0].size() == 3u);
        CHECK(bs[1].size() == 2u);
        CHECK(bs[2].size() == 2u);
        for (const auto& b : bs)
            for (size_t k = 1; k < b.size(); ++k)
                CHECK(mixed[static_cast<size_t>(b[k - 1])].prompt < mixed[static_cast<size_t>(b[k])].prompt);
        CHECK(bs[0] == std::vector<int64_t>{6, 5, 4});  // the prompts' order: the last trial first
    }
    {
        const auto bs = needle_batches(mixed, 3, false);
        check_cover(bs, mixed.size(), 3);
        // lengths 5 (4 trials: 2 + 2), 9 (2 trials: 1 batch), 12 (1)
        REQUIRE(bs.size() == 4u);
        std::map<size_t, std::vector<size_t>> sizes;
        for (const auto& b : bs) {
            for (auto i : b) CHECK(mixed[static_cast<size_t>(i)].prompt.size() == mixed[static_cast<size_t>(b[0])].prompt.size());
            sizes[mixed[static_cast<size_t>(b[0])].prompt.size()].push_back(b.size());
        }
        CHECK(sizes[5] == std::vector<size_t>{2, 2});
        CHECK(sizes[9] == std::vector<size_t>{2});
        CHECK(sizes[12] == std::vector<size_t>{1});
    }
    {
        const auto many = trials_of(std::vector<int64_t>(48, 4));
        const auto bs = needle_batches(many, 45, true);
        check_cover(bs, many.size(), 45);
        REQUIRE(bs.size() == 2u);
        CHECK(bs[0].size() == 24u);
        CHECK(bs[1].size() == 24u);
        CHECK(needle_batches(many, 1, true).size() == 48u);
        CHECK(needle_batches(many, 64, true).size() == 1u);
    }
}

TEST_CASE("needle: trials of different prompt lengths decode as one ragged batch, each row as its trial alone (planted model)") {
    // Rows reading their prompt caches in place (retrieval, R2) decode in one forward whatever their
    // lengths (KVCache::ragged); LOCOS's value products need whole keys, so its batch decodes one
    // length at a time. Either way each row equals its trial decoded alone: tokens and retrieval
    // credit exactly (an argmax a step), R2 within kBatchRelTol, and each row's keys its own.
    auto m = planted_model();
    const Trial t = planted_trial();
    Trial t2 = t, t3 = t;
    t2.prompt.insert(t2.prompt.begin() + 1, 14);  // one position longer: the needle one later
    ++t2.needle_start, ++t2.needle_end, ++t2.answer_start, ++t2.answer_end;
    t3.prompt.resize(20);  // four shorter, its needle where t's is
    t3.prompt.back() = 11;
    auto never = [](int64_t) { return false; };
    for (const std::string which : {"retrieval,r2", "retrieval,locos"}) {
        CAPTURE(which);
        DecodeSettings s;
        s.max_new_tokens = 4, s.prefill_chunk = 5, s.scores = parse_needle_scores(which);
        CacheLog log;
        s.cache_log = &log;
        PrefixCache pc;
        const auto batch = decode_batch(*m, {&t, &t2, &t3}, s, never, nullptr, &pc);
        REQUIRE(batch.size() == 3);
        // One forward a step for all three rows where they read their caches in place; else one a length.
        CHECK(log.step_seconds.size() == (which == "retrieval,r2" ? 4u : 12u));
        s.cache_log = nullptr;
        const std::vector<const Trial*> all = {&t, &t2, &t3};
        for (size_t k = 0; k < all.size(); ++k) {
            CAPTURE(k);
            const DecodeOut alone = decode_trial(*m, *all[k], s, never);
            CHECK(batch[k].generated == alone.generated);
            CHECK(batch[k].peak_keys == alone.peak_keys);
            REQUIRE(credit(batch[k]).size(0) == 4);
            CHECK(torch::equal(credit(batch[k]), credit(alone)));
            const auto ra = batch[k].step(NeedleScore::kR2), rb = alone.step(NeedleScore::kR2);
            REQUIRE(ra.sizes() == rb.sizes());
            if (ra.numel() > 0) CHECK((ra - rb).abs().max().item<double>() <= kBatchRelTol);
        }
        CHECK(batch[0].generated[0] == kTarget);  // the planted copy still finds the needle in every row
        CHECK(batch[1].generated[0] == kTarget);
    }
}

TEST_CASE("needle: scan rows read their trials' prompt caches where they are, as the copied batch decodes (planted model)") {
    // DecodeSettings::share_prompt: with no score that reads the values (retrieval, R2) each row reads
    // its trial's prefill in place (KVCache::shared, one product a row and kv head); LOCOS's value
    // products want every row's values gathered, so its decode copies the prefills into one batch.
    auto m = planted_model();
    const Trial t = planted_trial();
    Trial t2 = t, t3 = t;
    t2.prompt[9] = 61, t3.prompt[3] = 62;
    auto never = [](int64_t) { return false; };
    CHECK_FALSE(needle_scores_read_values(parse_needle_scores("retrieval,r2,qrhead")));
    CHECK(needle_scores_read_values(parse_needle_scores("retrieval,locos")));
    for (const std::string which : {"retrieval,r2", "retrieval,locos"}) {
        CAPTURE(which);
        DecodeSettings in_place;
        in_place.max_new_tokens = 4, in_place.prefill_chunk = 5, in_place.scores = parse_needle_scores(which);
        DecodeSettings copied = in_place;
        copied.share_prompt = false;
        CacheLog log_in_place, log_copied;
        in_place.cache_log = &log_in_place, copied.cache_log = &log_copied;
        log_in_place.keep_logits = log_copied.keep_logits = true;
        PrefixCache pc;  // the rows read the kept prefills themselves
        const auto a = decode_batch(*m, {&t, &t2, &t3}, in_place, never, nullptr, &pc);
        const auto b = decode_batch(*m, {&t, &t2, &t3}, copied, never);
        REQUIRE(a.size() == 3);
        for (size_t k = 0; k < 3; ++k) {
            CAPTURE(k);
            CHECK(a[k].generated == b[k].generated);
            REQUIRE(credit(a[k]).size(0) == 4);
            CHECK(torch::equal(credit(a[k]), credit(b[k])));  // an argmax a step: the same keys win
            // R2 sums attention weights, which the two attentions round differently in the last bits.
            const auto ra = a[k].step(NeedleScore::kR2), rb = b[k].step(NeedleScore::kR2);
            REQUIRE(ra.sizes() == rb.sizes());
            if (ra.numel() > 0) CHECK((ra - rb).abs().max().item<double>() <= kBatchRelTol);
        }
        double worst = 0;
        for (size_t s = 0; s < log_in_place.logits.size(); ++s) {
            const auto x = log_in_place.logits[s], y = log_copied.logits[s];
            worst = std::max(worst, (x - y).abs().max().item<double>() / std::max(1.0, y.abs().max().item<double>()));
        }
        CHECK(worst <= kBatchRelTol);
    }
}

TEST_CASE("needle: mean-query replaces the pre-RoPE query, which RoPE then rotates at each position (planted model)") {
    auto m = planted_model();
    const Trial t = planted_trial();
    const int64_t T = static_cast<int64_t>(t.prompt.size());
    auto ids = torch::tensor(t.prompt, torch::kLong).view({1, T});
    torch::NoGradGuard ng;
    auto mean = torch::randn({kHd});
    Hooks pre;
    pre.intervene_q_pre_rope(HeadIntervention{0, 1, -1, HeadOp::kReplace, 0.0, mean});
    at::Tensor q_seen;
    pre.capture(Point::kAttnQ, [&](int l, const at::Tensor& q) {
        if (l == 0) q_seen = q[0].select(1, 1).clone();  // [T, d], after RoPE
    });
    auto logits_pre = m->forward(ids, &pre);
    // The same, by hand: RoPE of the mean at every position, put in after RoPE.
    const auto rope = blocks::rope_tables(m->config, torch::arange(T, torch::kLong), m->config.rope_theta, torch::kFloat);
    auto rotated = blocks::apply_rope(mean.view({1, 1, 1, kHd}).expand({1, T, 1, kHd}).contiguous(), rope).view({T, kHd});
    CHECK(torch::allclose(q_seen, rotated, 1e-6, 1e-6));
    Hooks post;
    post.intervene_q(HeadIntervention{0, 1, -1, HeadOp::kReplace, 0.0, rotated});
    CHECK(torch::allclose(m->forward(ids, &post), logits_pre, 1e-5, 1e-5));
    // A mean of zero is zero-query.
    Hooks zero_pre, zero_q;
    zero_pre.intervene_q_pre_rope(HeadIntervention{0, 1, -1, HeadOp::kReplace, 0.0, torch::zeros({kHd})});
    zero_q.intervene_q(HeadIntervention{0, 1, -1, HeadOp::kZero, 0.0, {}});
    CHECK(torch::equal(m->forward(ids, &zero_pre), m->forward(ids, &zero_q)));
}

TEST_CASE("needle: the calibration mean weighs each prompt equally over its pre-RoPE queries (planted model)") {
    auto m = planted_model();
    const Trial t = planted_trial();
    const std::vector<std::vector<int64_t>> prompts = {t.prompt, std::vector<int64_t>(t.prompt.begin(), t.prompt.begin() + 5)};
    const auto got = calibrate_query_mean(*m, prompts, 3);  // prefill in chunks of 3 through the cache
    REQUIRE(got.sizes() == at::IntArrayRef({2, kH, kHd}));
    auto want = torch::zeros({2, kH, kHd}, torch::kDouble);
    torch::NoGradGuard ng;
    for (const auto& p : prompts) {
        Hooks h;
        h.capture(Point::kAttnQPreRope, [&](int l, const at::Tensor& q) {
            want[l] += q[0].to(torch::kDouble).mean(0) / static_cast<double>(prompts.size());
        });
        m->forward(torch::tensor(p, torch::kLong).view({1, -1}), &h);
    }
    CHECK(torch::allclose(got.to(torch::kDouble), want, 1e-5, 1e-6));
    // Token-weighted (the old rule) differs here: the prompts have 24 and 5 tokens.
    auto token_weighted = torch::zeros({2, kH, kHd}, torch::kDouble);
    for (const auto& p : prompts) {
        Hooks h;
        h.capture(Point::kAttnQPreRope, [&](int l, const at::Tensor& q) { token_weighted[l] += q[0].to(torch::kDouble).sum(0) / 29.0; });
        m->forward(torch::tensor(p, torch::kLong).view({1, -1}), &h);
    }
    CHECK(!torch::allclose(got.to(torch::kDouble), token_weighted, 1e-5, 1e-6));
}

TEST_CASE("needle: bootstrap CI equals percentiles of resampled means computed directly") {
    torch::manual_seed(5);
    auto x = torch::randn({7, 2, 3}, torch::kDouble);
    const int64_t R = 200;
    auto [lo, hi] = bootstrap_ci(x, R, 42);
    const auto idx = bootstrap_indices(7, R, 42);
    REQUIRE(idx.size() == static_cast<size_t>(R));
    std::set<int64_t> seen;
    for (const auto& draw : idx)
        for (auto i : draw) {
            REQUIRE((i >= 0 && i < 7));
            seen.insert(i);
        }
    CHECK(seen.size() == 7);
    for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 3; ++b) {
            std::vector<double> means;
            for (const auto& draw : idx) {
                double s = 0;
                for (auto i : draw) s += x[i][a][b].item<double>();
                means.push_back(s / 7.0);
            }
            std::sort(means.begin(), means.end());
            auto pct = [&](double q) {  // numpy's linear rule, written out
                const double pos = q / 100.0 * (R - 1);
                const int64_t k = static_cast<int64_t>(pos);
                return means[k] + (pos - k) * (means[k + 1] - means[k]);
            };
            CHECK(lo[a][b].item<double>() == doctest::Approx(pct(2.5)));
            CHECK(hi[a][b].item<double>() == doctest::Approx(pct(97.5)));
            CHECK(lo[a][b].item<double>() <= x.index({Slice(), a, b}).mean().item<double>());
        }
    // Same seed, same interval; constant samples give a zero-width interval.
    CHECK(torch::equal(bootstrap_ci(x, R, 42).first, lo));
    auto [l2, h2] = bootstrap_ci(torch::full({4, 1, 1}, 0.25, torch::kDouble), 50, 1);
    CHECK(l2.item<double>() == doctest::Approx(0.25));
    CHECK(h2.item<double>() == doctest::Approx(0.25));
}

TEST_CASE("needle: bad needles files name the line") {
    TempDir tmp;
    auto expect_line = [&](const std::string& body, const std::string& what) {
        write_file(tmp.file("n.jsonl"), body);
        try {
            read_needles(tmp.file("n.jsonl"));
            FAIL("no error for " << what);
        } catch (const DataError& e) {
            CHECK(std::string(e.what()).find(what) != std::string::npos);
        }
    };
    const std::string good = R"({"needle": "Yuki lives in Dresden.", "question": "Who lives in Saxony?", "answer": "Yuki"})";
    expect_line(good + "\n{oops\n", "n.jsonl:2: not a JSON object");
    expect_line(good + "\n\n" + R"({"needle": "a b", "question": "q"})" + "\n", "n.jsonl:3: missing string field \"answer\"");
    expect_line(R"({"needle": "Yuki lives in Dresden.", "question": "Who?", "answer": "Omar"})", "n.jsonl:1: the answer \"Omar\" is not in the needle");
    expect_line("\n\n", "no needles");
    write_file(tmp.file("ok.jsonl"), good + "\n");
    const auto n = read_needles(tmp.file("ok.jsonl"));
    REQUIRE(n.size() == 1);
    CHECK(n[0].answer == "Yuki");
    CHECK_THROWS_AS(parse_template("{context} no question"), UsageError);
    CHECK_THROWS_AS(parse_template("{question} no context"), UsageError);
    const auto tp = parse_template("<{context}>Q: {question} ({question})");
    CHECK(tp.prefix("x") == "<");
    CHECK(tp.suffix("x") == ">Q: x (x)");
}

TEST_CASE("needle: rows with their own head sets equal each set decoded alone, in both ablation scopes (planted model)") {
    auto m = planted_model();
    const Trial t = planted_trial();
    Trial t2 = t;
    std::swap(t2.prompt[9], t2.prompt[3]);  // kTarget moved to position 3, outside the needle
    t2.prompt[9] = 60;
    auto never = [](int64_t) { return false; };
    HeadSet zq{{{0, 0}}, Intervention::kZeroQuery, {}};
    HeadSet own{{{0, 0}, {1, 1}}, Intervention::kStream, {}, StreamWindow{0, 1, false}};  // each head its own value
    HeadSet win{{{0, 0}, {0, 2}}, Intervention::kStream, {}, StreamWindow{1, 3, true}};    // sink + recent + compensation
    // Rows: t under each set and unablated, t2 under two; trials repeat (the scope-decode prefill is
    // shared by the rows of one trial).
    const std::vector<const Trial*> trials = {&t, &t, &t2, &t, &t2, &t};
    const std::vector<const HeadSet*> sets = {&zq, nullptr, &own, &win, &win, &own};
    for (auto scope : {AblationScope::kAll, AblationScope::kDecode}) {
        CAPTURE(ablation_scope_name(scope));
        DecodeSettings s;
        s.max_new_tokens = 4, s.prefill_chunk = 5, s.scope = scope;
        const auto rows = decode_batch_sets(*m, trials, sets, s, never);
        REQUIRE(rows.size() == trials.size());
        for (size_t b = 0; b < rows.size(); ++b) {
            CAPTURE(b);
            const DecodeOut alone = decode_trial(*m, *trials[b], s, never, sets[b]);
            CHECK(rows[b].generated == alone.generated);
            CHECK(torch::equal(credit(rows[b]), credit(alone)));
            REQUIRE(lplus(rows[b]).sizes() == lplus(alone).sizes());
            const double scale = std::max({1e-3, lplus(alone).abs().max().item<double>(), lminus(alone).abs().max().item<double>()});
            CHECK((lplus(rows[b]) - lplus(alone)).abs().max().item<double>() <= kBatchRelTol * scale);
            CHECK((lminus(rows[b]) - lminus(alone)).abs().max().item<double>() <= kBatchRelTol * scale);
        }
        // The sets act: zero-query on the planted head loses the copy the unablated row makes.
        CHECK(rows[1].generated[0] == kTarget);
        CHECK(rows[0].generated[0] != kTarget);
    }
    CHECK_THROWS(decode_batch_sets(*m, {&t, &t}, {&zq}, DecodeSettings{}, never));  // one set (or none) per row
}

TEST_CASE("needle: the reference haystack repeats give the texts their loops build (counted, not recounted)") {
    // The loops as the reference scripts write them: recount the growing text each round.
    auto concat = [](const std::string& t, int64_t max) {  // retrieval_head_detection.py read_context_files
        std::string out;
        do out += t;
        while (python_word_count(out) < max);
        return out;
    };
    auto twice = [](std::string t, int64_t max) {  // LOCOS load_haystack_texts
        while (python_word_count(t) < max) t += "\n\n" + std::string(t);
        return t;
    };
    for (const std::string text : {"a b", "a b ", " a b", "one two three.", "x\ny z\n", "a\tb c"})
        for (int64_t max : {1, 2, 5, 17, 100}) {
            CAPTURE(text);
            CAPTURE(max);
            CHECK(repeat_haystack(text, max, HaystackRepeat::kConcat) == concat(text, max));
            CHECK(repeat_haystack(text, max, HaystackRepeat::kDouble) == twice(text, max));
            CHECK(repeat_haystack(text, max, HaystackRepeat::kTokens) == text);
        }
    CHECK(repeat_haystack("word", 1, HaystackRepeat::kConcat) == "word");  // long enough: no loop at all
    CHECK_THROWS_AS(repeat_haystack("word", 5, HaystackRepeat::kConcat), DataError);  // the reference never ends
    CHECK_THROWS_AS(repeat_haystack("  ", 5, HaystackRepeat::kDouble), DataError);
}

TEST_CASE("needle: each prompt's prefill cuts are its common prefixes with every other prompt of the grid") {
    std::mt19937 rng(7);
    for (int round = 0; round < 50; ++round) {
        // Prompts over a 3-token alphabet with shared stems (a grid's haystack), duplicates included.
        std::vector<std::vector<int64_t>> prompts;
        const int n = 1 + static_cast<int>(rng() % 12);
        for (int i = 0; i < n; ++i) {
            std::vector<int64_t> p;
            const int len = 1 + static_cast<int>(rng() % 9);
            for (int j = 0; j < len; ++j) p.push_back(j < 3 ? 0 : static_cast<int64_t>(rng() % 3));
            prompts.push_back(p);
        }
        std::vector<const std::vector<int64_t>*> ptrs;
        for (const auto& p : prompts) ptrs.push_back(&p);
        const auto cuts = prefill_cuts(ptrs);
        REQUIRE(cuts.size() == prompts.size());
        for (int i = 0; i < n; ++i) {
            std::set<int64_t> want;  // brute force
            for (int j = 0; j < n; ++j) {
                if (j == i) continue;
                size_t c = 0;
                while (c < prompts[i].size() && c < prompts[j].size() && prompts[i][c] == prompts[j][c]) ++c;
                want.insert(static_cast<int64_t>(c));
            }
            CAPTURE(round);
            CAPTURE(i);
            CHECK(cuts[static_cast<size_t>(i)] == std::vector<int64_t>(want.begin(), want.end()));
        }
    }
}

TEST_CASE("needle: kept prefill chunks give the decodes a whole prefill gives, and count what they saved (planted model)") {
    auto m = planted_model();
    const Trial t = planted_trial();  // 24 prompt tokens: 23 prefilled, chunks of 5 -> [0, 20) whole
    Trial t3 = t, t4 = t, t5 = t;     // share 14, 14 and 5 tokens with t; t3 and t4 share 14 and 20 with each other
    t3.prompt[14] = 55, t4.prompt[14] = 55, t4.prompt[20] = 57;
    t5.prompt[5] = 58;
    auto never = [](int64_t) { return false; };
    HeadSet zq{{{0, 0}}, Intervention::kZeroQuery, {}};
    for (const HeadSet* ablate : std::vector<const HeadSet*>{nullptr, &zq}) {
        CAPTURE(ablate != nullptr);
        DecodeSettings s;
        s.max_new_tokens = 4, s.prefill_chunk = 5;
        PrefixCache pc;
        // One row: bit for bit the whole prefill's decode. Several: the rows' shared chunks run in one
        // row (a batch-1 GEMM instead of the batch's), equal up to fp rounding.
        auto same = [&](const std::vector<DecodeOut>& got, const std::vector<const Trial*>& rows) {
            const auto fresh = decode_batch(*m, rows, s, never, ablate);
            REQUIRE(got.size() == fresh.size());
            for (size_t b = 0; b < got.size(); ++b) {
                CAPTURE(b);
                CHECK(got[b].generated == fresh[b].generated);
                CHECK(torch::equal(credit(got[b]), credit(fresh[b])));
                if (rows.size() == 1) {
                    CHECK(torch::equal(lplus(got[b]), lplus(fresh[b])));
                    CHECK(torch::equal(lminus(got[b]), lminus(fresh[b])));
                    continue;
                }
                const double scale = std::max({1e-3, lplus(fresh[b]).abs().max().item<double>(), lminus(fresh[b]).abs().max().item<double>()});
                CHECK((lplus(got[b]) - lplus(fresh[b])).abs().max().item<double>() <= kBatchRelTol * scale);
                CHECK((lminus(got[b]) - lminus(fresh[b])).abs().max().item<double>() <= kBatchRelTol * scale);
            }
        };
        same(decode_batch(*m, {&t}, s, never, ablate, &pc), {&t});  // nothing kept yet: its prefill [0, 23) kept
        CHECK(pc.reused == 0);
        CHECK(pc.computed == 23);
        CHECK(pc.entries.size() == 1);
        CHECK(pc.entries.at(&t).cache.length() == 23);
        same(decode_batch(*m, {&t3}, s, never, ablate, &pc), {&t3});  // shares 14 with t: chunks [0, 10) reused
        CHECK(pc.reused == 10);
        CHECK(pc.computed == 23 + 13);
        // Two rows: t4 shares 20 positions (chunks [0, 20)) with t3's kept prefill, and t3's own is kept whole.
        same(decode_batch(*m, {&t4, &t3}, s, never, ablate, &pc), {&t4, &t3});
        CHECK(pc.reused == 10 + 20 + 23);
        CHECK(pc.computed == 23 + 13 + 3);
        // Each kept prefill names its positions and says which came from where (KVCache::origins): t3's
        // first 10 are t's, t4's first 10 t's and its first 20 t3's, so in one batch t4 and t3 read
        // their 20 common positions once (blocks::shared_pieces: 3 pieces, not one a row and range).
        const auto& c = pc.entries.at(&t).cache;
        const auto& c3 = pc.entries.at(&t3).cache;
        const auto& c4 = pc.entries.at(&t4).cache;
        REQUIRE(c.content_id != 0);
        CHECK(c3.content_id != c.content_id);
        using Origins = std::vector<std::pair<uint64_t, int64_t>>;
        CHECK((c3.origins == Origins{{c.content_id, 10}}));
        CHECK((c4.origins == Origins{{c.content_id, 10}, {c3.content_id, 20}}));
        const auto pieces = blocks::shared_pieces({c4, c3}, {0, 1});
        REQUIRE(pieces.size() == 3);
        const auto common = std::find_if(pieces.begin(), pieces.end(), [](const blocks::SharedPiece& p) { return p.a == 0; });
        REQUIRE(common != pieces.end());
        CHECK((common->cache == 1 && common->b == 20 && common->rows == std::vector<int64_t>{0, 1}));
        same(decode_batch(*m, {&t5}, s, never, ablate, &pc), {&t5});  // shares 5 with every kept prefill
        CHECK(pc.reused == 10 + 20 + 23 + 5);
        // The bound: the least recently used prefill goes first, a pinned one (keep) stays.
        PrefixCache small;
        small.max_bytes = pc.entries.at(&t).bytes * 2;
        small.keep.insert(&t);
        decode_batch(*m, {&t}, s, never, ablate, &small);
        decode_batch(*m, {&t3}, s, never, ablate, &small);
        decode_batch(*m, {&t5}, s, never, ablate, &small);  // drops t3 (t is pinned)
        CHECK(small.entries.count(&t) == 1);
        CHECK(small.entries.count(&t3) == 0);
        CHECK(small.entries.count(&t5) == 1);
        CHECK(small.bytes <= small.max_bytes);
        small.release(&t);
        decode_batch(*m, {&t4}, s, never, ablate, &small);  // takes [0, 10) from t: t5 is now the least recently used
        CHECK(small.entries.count(&t) == 1);
        CHECK(small.entries.count(&t5) == 0);
        CHECK(small.entries.count(&t4) == 1);
        // A fresh cache and two rows: their shared chunks [0, 20) computed once, in one row, then copied.
        PrefixCache fresh;
        same(decode_batch(*m, {&t3, &t4}, s, never, ablate, &fresh), {&t3, &t4});
        CHECK(fresh.reused == 20);
        CHECK(fresh.computed == 20 + 2 * 3);
        // A decode's bits do not depend on what was kept before it (shards and resumed runs).
        PrefixCache other;
        decode_batch(*m, {&t5}, s, never, ablate, &other);
        const auto a = decode_batch(*m, {&t4, &t3}, s, never, ablate, &fresh), b = decode_batch(*m, {&t4, &t3}, s, never, ablate, &other);
        for (size_t r = 0; r < 2; ++r) {
            CHECK(a[r].generated == b[r].generated);
            CHECK(torch::equal(lplus(a[r]), lplus(b[r])));
            CHECK(torch::equal(lminus(a[r]), lminus(b[r])));
        }
    }
}

TEST_CASE("needle: the toy recall model's own task as a needle test finds its retrieval set (CI model)") {
    const std::string dir = ci_toy_model("recall");
    const auto log = nlohmann::json::parse(read_text_file(path_join(dir, "training_log.json")));
    const auto& gt = log["ground_truth"]["retrieval_heads"];
    REQUIRE(gt.is_array());
    REQUIRE(!gt.empty());
    std::set<std::string> truth;
    for (const auto& h : gt) truth.insert(h.get<std::string>());
    MESSAGE("ground-truth retrieval set: " << gt.dump());
    TempDir tmp;
    const std::string src = HS_SOURCE_DIR, out = tmp.file("toy.h5");
    const std::string cmd = std::string("'") + HS_BINARY + "' -q retrieval '" + dir + "' --haystack '" + src +
                            "/datasets/needles/toy_recall_haystack.txt' --needles '" + src +
                            "/datasets/needles/toy_recall_needles.jsonl' --template '{context}?{question}' "
                            "--lengths 24,40,56,72 --depths 0,25,50,75,100 --max-new-tokens 1 --threads 1 "
                            "--ablate-top 3 --ablation zero-query --random-controls 3 --seed 1 --out '" +
                            out + "' > '" + tmp.file("stdout") + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
    MESSAGE(read_text_file(tmp.file("stdout")));
    ResultReader r(out);
    const auto ret = r.read("/scores/retrieval/score"), loc = r.read("/scores/locos/score");
    const int64_t H = ret.shape[1];
    auto name = [&](int64_t i) { return "L" + std::to_string(i / H) + "H" + std::to_string(i % H); };
    std::vector<int64_t> order(loc.values.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return loc.values[a] > loc.values[b]; });
    std::set<std::string> top;
    for (size_t i = 0; i < truth.size(); ++i) top.insert(name(order[i]));
    CHECK(top == truth);  // the top LOCOS heads, as many as the proven set, are that set
    for (size_t i = 0; i < ret.values.size(); ++i)
        if (truth.count(name(static_cast<int64_t>(i)))) {
            CAPTURE(name(static_cast<int64_t>(i)));
            CHECK(ret.values[i] > 0.1);  // flagged
        }
    // On the paper's scale a perfect copier scores 1 per trial: the best head copies the answer
    // (one token) at nearly every passing trial's one step.
    CHECK(*std::max_element(ret.values.begin(), ret.values.end()) > 0.8);
    const double base = r.read("/retrieval/ablation/baseline_accuracy").values[0];
    const auto acc = r.read("/retrieval/ablation/accuracy");
    CHECK(base > 0.9);
    CHECK(acc.values[0] < 0.3);  // the top three LOCOS heads' queries zeroed
    // Trial bookkeeping: the needle span holds the needle; every trial has one generated token.
    const auto span = r.read("/retrieval/trials/needle_span"), pt = r.read("/retrieval/trials/prompt_tokens");
    const int64_t N = span.shape[0], Tm = pt.shape[1];
    CHECK(N == 4 * 5 * 8);
    const auto aspan = r.read("/retrieval/trials/answer_span");
    REQUIRE(aspan.values.size() == span.values.size());
    for (int64_t i = 0; i < N; ++i) {
        CHECK(span.values[2 * i + 1] - span.values[2 * i] == 2);
        CHECK(aspan.values[2 * i] == span.values[2 * i] + 1);  // "qZ": the answer is the value token
        CHECK(aspan.values[2 * i + 1] == span.values[2 * i + 1]);
        const int64_t key = static_cast<int64_t>(pt.values[i * Tm + static_cast<int64_t>(span.values[2 * i])]);
        CHECK((key >= toy::kLower0 && key < toy::kUpper0));
    }
    // Batched decoding (rows of equal prompt length), prefill chunks of 8 tokens (so that trials
    // take the chunks they share with the trial before from the kept cache: these prompts are
    // shorter than the default 512) and whole prefills write the same numbers; at batch 1 the
    // kept chunks give exactly the bits of whole prefills in the same chunks.
    const char* const datasets[] = {"/scores/retrieval/score", "/scores/locos/score", "/retrieval/trials/generated",
                                    "/retrieval/trials/rouge1_recall", "/retrieval/ablation/rouge1_recall"};
    const std::vector<std::string> variants = {" --batch 7", " --prefill-chunk 8", " --prefill-chunk 8 --no-prefix-reuse",
                                               " --batch 7 --prefill-chunk 8"};
    auto vfile = [&](size_t i) { return tmp.file("v" + std::to_string(i) + ".h5"); };
    for (size_t vi = 0; vi < variants.size(); ++vi) {
        CAPTURE(variants[vi]);
        const std::string cmd7 = cmd.substr(0, cmd.find(" --out '")) + variants[vi] + " --out '" + vfile(vi) + "'";
        REQUIRE(std::system(cmd7.c_str()) == 0);
        ResultReader r7(vfile(vi));
        for (const char* ds : datasets) {
            CAPTURE(ds);
            const auto a = r.read(ds).values, b = r7.read(ds).values;
            REQUIRE(a.size() == b.size());
            for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-5));
        }
    }
    {
        ResultReader kept(vfile(1)), whole(vfile(2));
        for (const char* ds : datasets) {
            CAPTURE(ds);
            const auto a = kept.read(ds).values, b = whole.read(ds).values;
            REQUIRE(a.size() == b.size());
            for (size_t i = 0; i < a.size(); ++i)
                CHECK(((a[i] == b[i]) || (std::isnan(a[i]) && std::isnan(b[i]))));
        }
    }
    // With --ablation-scope decode the ablation sets decode as rows from the scan's kept prefills
    // (keep_scan_prefills): the same bits as prefilling every trial whole for every pass.
    {
        const std::string base = cmd.substr(0, cmd.find(" --out '")) + " --ablation-scope decode --prefill-chunk 8";
        REQUIRE(std::system((base + " --out '" + tmp.file("kept.h5") + "' > /dev/null").c_str()) == 0);
        REQUIRE(std::system((base + " --no-prefix-reuse --out '" + tmp.file("whole.h5") + "' > /dev/null").c_str()) == 0);
        ResultReader kept(tmp.file("kept.h5")), whole(tmp.file("whole.h5"));
        for (const char* ds : {"/scores/retrieval/score", "/retrieval/trials/generated", "/retrieval/ablation/generated",
                               "/retrieval/ablation/rouge1_recall"}) {
            CAPTURE(ds);
            const auto a = kept.read(ds).values, b = whole.read(ds).values;
            REQUIRE(a.size() == b.size());
            for (size_t i = 0; i < a.size(); ++i) CHECK(((a[i] == b[i]) || (std::isnan(a[i]) && std::isnan(b[i]))));
        }
    }
    // Mean-query (LOCOS's pre-RoPE mean) is not zero-query on this model: per-trial recall differs.
    std::string cmdm = cmd.substr(0, cmd.find(" --out '")) + " --calibration-trials 20 --out '" + tmp.file("mq.h5") + "' > /dev/null";
    cmdm.replace(cmdm.find("--ablation zero-query"), 21, "--ablation mean-query");
    REQUIRE(std::system(cmdm.c_str()) == 0);
    ResultReader rm(tmp.file("mq.h5"));
    const auto zq_rec = r.read("/retrieval/ablation/rouge1_recall").values, mq_rec = rm.read("/retrieval/ablation/rouge1_recall").values;
    REQUIRE(zq_rec.size() == mq_rec.size());
    int64_t differ = 0;
    for (int64_t i = 0; i < N; ++i) differ += zq_rec[i] != mq_rec[i];  // set 0: the top three heads
    MESSAGE("trials whose recall differs between zero-query and mean-query: " << differ << " of " << N);
    CHECK(differ > 0);
    CHECK(rm.read("/retrieval/ablation/query_mean").shape == std::vector<int64_t>{ret.shape[0], H, 16});
    // The controls never include the ablated heads.
    const auto masks = r.read("/retrieval/ablation/masks");
    const int64_t LH = masks.shape[1] * masks.shape[2];
    for (int64_t s = 1; s < masks.shape[0]; ++s)
        for (int64_t j = 0; j < LH; ++j) CHECK(!(masks.values[s * LH + j] > 0 && masks.values[j] > 0));
}
