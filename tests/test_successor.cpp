// Successor heads (probes/weights/successor.h): a head planted to map each task token to its successor
// scores 1.0 and the other heads near chance, under the reference's MLP0(W_E) (no norm, every layer,
// layer 0 included), headscope's former MLP0(norm(W_E)) and copy suppression's W_EE; the reference's
// representation ignores MLP0's norm weights; ties succeed (reference) or fail (--ties fail); a
// wrap-around pair scores against the task's distinct tokens; pairs with a multi-token word are
// dropped alone; the 0.4 threshold is strict; the planted head carries the successor in the forward
// (zero-ablating it takes it away); the default tasks and the task file round-trip; bad task files
// are one line naming the file. Reference: the planted construction itself (X M = Y solved exactly)
// and dense recomputations of test_successor_head.py's lines 77-83.
#include <doctest/doctest.h>

#include "blocks.h"
#include "copy_suppression.h"
#include "errors.h"
#include "intervention.h"
#include "planted_model.h"
#include "successor.h"
#include "tmpdir.h"
#include "weight_circuits.h"

#include <torch/torch.h>

#include <fstream>

using namespace hs;
using namespace torch::indexing;
using planted::kD, planted::kHd;

namespace {

// Two tasks over token ids (words unused by the scorer): 10 and 16 tokens.
std::vector<TokenizedTask> planted_tasks() {
    std::vector<TokenizedTask> t(2);
    t[0].task.name = "a", t[0].form = "bare";
    for (int64_t i = 3; i < 13; ++i) t[0].ids.push_back(i);
    t[1].task.name = "b", t[1].form = "bare";
    for (int64_t i = 40; i > 24; --i) t[1].ids.push_back(i);  // descending ids: order is the task's, not the vocabulary's
    for (auto& k : t) {
        k.task.words.assign(k.ids.size(), "w");
        k.n_single = static_cast<int64_t>(k.ids.size());
    }
    return t;
}

// Sources (every task token but its last) and their successors.
std::pair<at::Tensor, at::Tensor> pairs(const std::vector<TokenizedTask>& tasks) {
    std::vector<int64_t> src, dst;
    for (const auto& k : tasks)
        for (size_t i = 0; i + 1 < k.ids.size(); ++i) src.push_back(k.ids[i]), dst.push_back(k.ids[i + 1]);
    return {torch::tensor(src, torch::kLong), torch::tensor(dst, torch::kLong)};
}

// Head (l, h)'s OV set to M (v = x in the planted model): x -> x M.
void set_ov(Model& m, int l, int h, const at::Tensor& ov) {
    m.weights.layers[l].wo.index_put_({Slice(), Slice(h * kHd, (h + 1) * kHd)}, ov.t());
}

// M with X M = scale * W_U[dst] exactly (X has full row rank: 24 rows in D = 64).
at::Tensor successor_ov(const Model& m, const at::Tensor& x, const at::Tensor& dst, double scale) {
    auto y = m.weights.unembed.index({dst}) * scale;
    return torch::linalg_pinv(x.to(torch::kDouble)).matmul(y.to(torch::kDouble)).to(torch::kFloat);
}

// The reference's source rows: block 0's MLP on the raw embedding, no norm (its lines 56-59).
at::Tensor reference_rows(const Model& m, const at::Tensor& ids) {
    return blocks::mlp(m.config, m.weights.layers[0], embed_rows(m, ids), false);
}

// test_successor_head.py lines 77-83 written out densely for head (l, h) on source rows `x`: per task,
// the pair succeeds when its successor's logit equals the largest over the task's distinct tokens.
double dense_reference_score(const Model& m, const std::vector<TokenizedTask>& tasks, const at::Tensor& x, int l, int h) {
    auto ov = torch::matmul(head_v_in(m, l, h), head_o_out(m, l, h));
    int64_t row = 0, ok = 0, n = 0;
    for (const auto& k : tasks) {
        auto ids = torch::tensor(k.ids, torch::kLong);
        auto logits = x.index({Slice(row, row + ids.size(0) - 1)}).matmul(ov).matmul(m.weights.unembed.index({ids}).t());
        for (int64_t i = 0; i + 1 < ids.size(0); ++i, ++n) ok += (logits[i][i + 1] == logits[i].max()).item<bool>();
        row += ids.size(0) - 1;
    }
    return static_cast<double>(ok) / static_cast<double>(n);
}

}  // namespace

TEST_CASE("successor: a planted head scores 1.0 under the reference's MLP0(W_E); the others near chance") {
    auto m = planted::model(11, 0.2, 0.3);  // every head a random OV
    const auto tasks = planted_tasks();
    auto [src, dst] = pairs(tasks);
    torch::NoGradGuard ng;
    const auto x = reference_rows(*m, src);
    set_ov(*m, 1, 2, successor_ov(*m, x, dst, 4.0));
    set_ov(*m, 0, 3, successor_ov(*m, x, dst, 4.0));  // layer 0 reads MLP0(W_E) too in the reference
    const auto s = successor_scores(*m, tasks, SuccessorEmbedding::kReference);
    CHECK(s.score.sizes() == at::IntArrayRef{2, planted::kH});
    CHECK(s.task_score.sizes() == at::IntArrayRef{2, 2, planted::kH});
    CHECK(s.source.size() == 24);
    CHECK(s.score[1][2].item<float>() == 1.0f);
    CHECK(s.score[0][3].item<float>() == 1.0f);
    CHECK(s.task_score[0][1][2].item<float>() == 1.0f);
    CHECK(s.task_score[1][1][2].item<float>() == 1.0f);
    CHECK(torch::equal(s.predicted[1][2], dst));
    CHECK(s.rank[1][2].max().item<int64_t>() == 0);
    // The others: random OVs, near chance (1/10 and 1/16 a token); mean well below, none at 1.
    auto others = s.score.clone();
    others[1][2] = 0, others[0][3] = 0;
    MESSAGE("other heads: max " << others.max().item<float>() << ", mean " << others.sum().item<float>() / (others.numel() - 2));
    CHECK(others.max().item<float>() < 0.5f);
    CHECK(others.sum().item<float>() / (others.numel() - 2) < 0.25f);
    // The 0.4 threshold: the two planted heads and no other.
    CHECK(successor_heads(s.score, kSuccessorThreshold) == std::vector<std::pair<int, int>>{{0, 3}, {1, 2}});
    // The score is the per-token success fraction: recomputed from the ranks.
    CHECK(s.score[0][0].item<float>() == doctest::Approx((s.rank[0][0] == 0).to(torch::kFloat).mean().item<float>()));
    // Dense reference (lines 77-83) for every random head.
    for (int l = 0; l < 2; ++l)
        for (int h = 0; h < planted::kH; ++h)
            CHECK(s.score[l][h].item<float>() == doctest::Approx(dense_reference_score(*m, tasks, x, l, h)).epsilon(1e-6));
}

TEST_CASE("successor: the reference's MLP0(W_E) ignores MLP0's norm; headscope's reads it and gives layer 0 the raw W_E") {
    auto m = planted::model(13, 0.2, 0.3);
    const auto tasks = planted_tasks();
    auto [src, dst] = pairs(tasks);
    torch::NoGradGuard ng;
    const auto before = successor_scores(*m, tasks, SuccessorEmbedding::kReference);
    const auto old_before = successor_scores(*m, tasks, SuccessorEmbedding::kHeadscope);
    m->weights.layers[0].mlp_norm_w = torch::rand({kD}) * 3 + 0.1;
    const auto after = successor_scores(*m, tasks, SuccessorEmbedding::kReference);
    const auto old_after = successor_scores(*m, tasks, SuccessorEmbedding::kHeadscope);
    CHECK(torch::equal(before.rank, after.rank));
    CHECK(!torch::equal(old_before.rank.index({1}), old_after.rank.index({1})));  // layer 1 reads MLP0(norm(W_E))
    CHECK(torch::equal(old_before.rank.index({0}), old_after.rank.index({0})));    // layer 0 reads raw W_E
    // headscope's option, planted on its own rows, scores 1.0 and matches the dense rule with strict ties.
    const auto xo = mlp_output(*m, 0, embed_rows(*m, src));
    set_ov(*m, 1, 0, successor_ov(*m, xo, dst, 4.0));
    const auto o = successor_scores(*m, tasks, SuccessorEmbedding::kHeadscope, SuccessorTies::kFail);
    CHECK(o.score[1][0].item<float>() == 1.0f);
    CHECK(o.score[1][1].item<float>() == doctest::Approx(dense_reference_score(*m, tasks, xo, 1, 1)).epsilon(1e-6));
}

TEST_CASE("successor: ties succeed as the reference counts them (a head with no output scores 1.0), fail with kFail") {
    auto m = planted::model(12, 0.0, 0.05);  // every OV 0: every logit ties
    const auto tasks = planted_tasks();
    auto [src, dst] = pairs(tasks);
    torch::NoGradGuard ng;
    set_ov(*m, 1, 1, successor_ov(*m, reference_rows(*m, src), dst, 8.0));
    const auto ref = successor_scores(*m, tasks, SuccessorEmbedding::kReference);
    const auto strict = successor_scores(*m, tasks, SuccessorEmbedding::kReference, SuccessorTies::kFail);
    CHECK(ref.score.min().item<float>() == 1.0f);  // line 83: target == max, and every logit is 0
    CHECK(ref.rank.max().item<int64_t>() == 0);
    CHECK(strict.score[1][1].item<float>() == 1.0f);
    CHECK(strict.score.sum().item<float>() == 1.0f);  // the others tie everywhere: no success
    CHECK(strict.rank[0][0][0].item<int64_t>() == 9);  // all 9 other tokens of task a tie with the successor
}

TEST_CASE("successor: a wrap-around pair scores against the distinct tokens; pairs with a multi-token word drop alone") {
    auto m = planted::model(14, 0.2, 0.3);
    std::vector<TokenizedTask> tasks(2);
    tasks[0].task = {"cycle", {"a", "b", "c", "d", "a"}};
    tasks[0].ids = {5, 6, 7, 8, 5};  // d -> a closes the cycle
    tasks[0].form = "bare";
    tasks[1].task = {"gappy", {"p", "q", "r", "s", "t", "u"}};
    tasks[1].ids = {20, 21, -1, 23, 24, -1};  // r and u are not one token
    tasks[1].form = "bare";
    CHECK(tasks[0].pairs() == 4);
    CHECK(tasks[0].scored_pairs() == 4);
    CHECK(tasks[1].pairs() == 5);
    CHECK(tasks[1].scored_pairs() == 2);  // p -> q, s -> t
    torch::NoGradGuard ng;
    auto src = torch::tensor(std::vector<int64_t>{5, 6, 7, 8, 20, 23}, torch::kLong);
    auto dst = torch::tensor(std::vector<int64_t>{6, 7, 8, 5, 21, 24}, torch::kLong);
    set_ov(*m, 1, 3, successor_ov(*m, reference_rows(*m, src), dst, 4.0));
    for (auto ties : {SuccessorTies::kSuccess, SuccessorTies::kFail}) {
        const auto s = successor_scores(*m, tasks, SuccessorEmbedding::kReference, ties);
        CHECK(s.source == std::vector<int64_t>{5, 6, 7, 8, 20, 23});
        CHECK(s.target == std::vector<int64_t>{6, 7, 8, 5, 21, 24});
        CHECK(s.task == std::vector<int64_t>{0, 0, 0, 0, 1, 1});
        CHECK(s.score[1][3].item<float>() == 1.0f);  // d -> a succeeds: a is one candidate, not two tied columns
        CHECK(s.predicted[1][3][3].item<int64_t>() == 5);
        CHECK(s.task_score.sizes() == at::IntArrayRef{2, 2, planted::kH});
    }
    // A task with no pair of single-token words is skipped; the others are scored.
    tasks[1].ids = {20, -1, 22, -1, 24, -1};
    CHECK(tasks[1].scored_pairs() == 0);
    tasks[1].ids.clear();
    const auto s = successor_scores(*m, tasks, SuccessorEmbedding::kReference);
    CHECK(s.task_score.size(0) == 1);
    CHECK(s.source.size() == 4);
}

TEST_CASE("successor: the 0.4 threshold is strict, in float32 as torch compares (line 90: accuracy > thresh)") {
    // 2/5 in float32 is 0.4f, a hair above the double 0.4: the reference's float32 comparison keeps it out.
    auto sc = torch::tensor(std::vector<float>{2.0f / 5.0f, 0.41f, 0.0f, 1.0f}).view({2, 2});
    CHECK(successor_heads(sc, 0.4) == std::vector<std::pair<int, int>>{{0, 1}, {1, 1}});
    CHECK(successor_heads(sc, 1.0).empty());
}

TEST_CASE("successor: planted under W_EE, the head carries the successor in the forward; zero-ablated it does not") {
    auto m = planted::model(12, 0.0, 0.05);  // every OV 0: the residual is the token, MLPs and the planted head
    const auto tasks = planted_tasks();
    auto [src, dst] = pairs(tasks);
    torch::NoGradGuard ng;
    auto x = attn_input(*m, 1, effective_embedding_rows(*m, src));
    set_ov(*m, 1, 1, successor_ov(*m, x, dst, 8.0));
    const auto s = successor_scores(*m, tasks, SuccessorEmbedding::kEffective, SuccessorTies::kFail);
    CHECK(s.score[1][1].item<float>() == 1.0f);
    CHECK(s.score.sum().item<float>() == 1.0f);  // every other head's OV is 0: all ties, no success under kFail
    // The forward on each source token alone (position 0 attends to itself: the head reads W_EE).
    auto hits = [&](bool ablate) {
        Hooks h;
        if (ablate) apply_intervention(h, {Intervention::kZero}, {{1, 1}}, -1, {Intervention::kZero});
        auto logits = m->forward(src.view({-1, 1}), &h).select(1, 0);  // [N, V]
        int64_t n = 0, row = 0;
        for (const auto& k : tasks) {
            auto ids = torch::tensor(k.ids, torch::kLong);
            for (int64_t i = 0; i + 1 < ids.size(0); ++i, ++row)
                n += ids[logits[row].index({ids}).argmax()].item<int64_t>() == dst[row].item<int64_t>();
        }
        return static_cast<double>(n) / static_cast<double>(row);
    };
    const double with = hits(false), without = hits(true);
    MESSAGE("forward: successor first among the task's tokens " << with << " with the head, " << without << " zero-ablated");
    CHECK(with == 1.0);
    CHECK(without < 0.2);
}

TEST_CASE("successor tasks: the reference's eight with days and months wrapping; a file round-trips; bad files are one line") {
    const auto d = default_successor_tasks();
    REQUIRE(d.size() == 8);
    std::vector<std::string> names;
    for (const auto& t : d) names.push_back(t.name);
    // test_successor_head.py lines 11-19, in its order.
    CHECK(names == std::vector<std::string>{"numbers", "number_words", "cardinal_words", "days", "months", "day_prefixes",
                                            "month_prefixes", "letters"});
    CHECK(d[0].words.size() == 200);
    CHECK(d[3].words.size() == 8);
    CHECK(d[3].words.front() == "Monday");
    CHECK(d[3].words.back() == "Monday");
    CHECK(d[4].words.size() == 13);
    CHECK(d[4].words.back() == "January");
    CHECK(d[5].words.size() == 7);   // the prefixes do not wrap
    CHECK(d[6].words.size() == 12);
    CHECK(d[7].words.back() == "Z");
    TempDir tmp;
    const std::string f = tmp.file("tasks.json");
    std::ofstream(f) << successor_tasks_json(d);
    const auto back = read_successor_tasks(f);
    REQUIRE(back.size() == d.size());
    for (size_t i = 0; i < d.size(); ++i) CHECK((back[i].name == d[i].name && back[i].words == d[i].words));
    auto bad = [&](const std::string& text, const std::string& what) {
        std::ofstream(f) << text;
        try {
            read_successor_tasks(f);
            FAIL("accepted: " << text);
        } catch (const DataError& e) {
            CHECK(std::string(e.what()).rfind(f, 0) == 0);
            CHECK(std::string(e.what()).find(what) != std::string::npos);
        }
    };
    bad("{}", "no tasks");
    bad("{\"a\": [\"x\"]}", "at least two words");
    bad("{\"a\": [\"x\", 3]}", "word 1 is not a non-empty string");
    bad("{\"a\": [\"x\", \"y\", \"x\", \"z\"]}", "twice");  // a repeat that is not the closing word
    bad("{\"a\": [\"x\", \"y\", \"y\"]}", "twice");          // the last word repeats another than the first
    bad("{\"a\": [\"x\", \"x\"]}", "twice");                  // a cycle needs two distinct words
    bad("[\"x\", \"y\"]", "expected an object");
    bad("{\"a\": [\"x\",\n \"y\"", ":2: not valid JSON");
    std::ofstream(f) << "{\"cycle\": [\"x\", \"y\", \"x\"]}";
    CHECK(read_successor_tasks(f)[0].words == std::vector<std::string>{"x", "y", "x"});
}
