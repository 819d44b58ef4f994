// Successor heads (probes/weights/successor.h): a head planted to map each task token to its successor
// scores 1.0 and the other heads near chance, under the paper's MLP0 embedding and copy
// suppression's W_EE; the planted head carries the successor prediction in the forward (zero-
// ablating it takes it away); the default tasks and the task file round-trip; bad task files are one
// line naming the file. Reference: the planted construction itself (X M = Y solved exactly).
#include <doctest/doctest.h>

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

}  // namespace

TEST_CASE("successor: a planted head scores 1.0 under the paper's MLP0 embedding; the others near chance") {
    auto m = planted::model(11, 0.2, 0.3);  // every head a random OV
    const auto tasks = planted_tasks();
    auto [src, dst] = pairs(tasks);
    torch::NoGradGuard ng;
    set_ov(*m, 1, 2, successor_ov(*m, mlp_output(*m, 0, embed_rows(*m, src)), dst, 4.0));
    const auto s = successor_scores(*m, tasks, SuccessorEmbedding::kMlp0);
    CHECK(s.score.sizes() == at::IntArrayRef{2, planted::kH});
    CHECK(s.task_score.sizes() == at::IntArrayRef{2, 2, planted::kH});
    CHECK(s.source.size() == 24);
    CHECK(s.score[1][2].item<float>() == 1.0f);
    CHECK(s.task_score[0][1][2].item<float>() == 1.0f);
    CHECK(s.task_score[1][1][2].item<float>() == 1.0f);
    CHECK(torch::equal(s.predicted[1][2], dst));
    CHECK(s.rank[1][2].max().item<int64_t>() == 0);
    // The others: random OVs, near chance (1/10 and 1/16 a token); mean well below, none at 1.
    auto others = s.score.clone();
    others[1][2] = 0;
    MESSAGE("other heads: max " << others.max().item<float>() << ", mean " << others.sum().item<float>() / (others.numel() - 1));
    CHECK(others.max().item<float>() < 0.5f);
    CHECK(others.sum().item<float>() / (others.numel() - 1) < 0.25f);
    // The score is the per-token success fraction: recomputed from the ranks.
    CHECK(s.score[0][0].item<float>() == doctest::Approx((s.rank[0][0] == 0).to(torch::kFloat).mean().item<float>()));
    // Dense reference for one random head: the restricted logits formed whole, task by task.
    auto p = torch::matmul(torch::matmul(mlp_output(*m, 0, embed_rows(*m, src)), head_v_in(*m, 1, 0)), head_o_out(*m, 1, 0));
    int64_t row = 0, ok = 0;
    for (const auto& k : tasks) {
        auto ids = torch::tensor(k.ids, torch::kLong);
        auto logits = p.index({Slice(row, row + ids.size(0) - 1)}).matmul(m->weights.unembed.index({ids}).t());
        for (int64_t i = 0; i + 1 < ids.size(0); ++i) ok += logits[i].argmax().item<int64_t>() == i + 1 &&
                                                            (logits[i] >= logits[i][i + 1]).sum().item<int64_t>() == 1;
        row += ids.size(0) - 1;
    }
    CHECK(s.score[1][0].item<float>() == doctest::Approx(static_cast<double>(ok) / 24.0).epsilon(1e-6));
}

TEST_CASE("successor: planted under W_EE, the head carries the successor in the forward; zero-ablated it does not") {
    auto m = planted::model(12, 0.0, 0.05);  // every OV 0: the residual is the token, MLPs and the planted head
    const auto tasks = planted_tasks();
    auto [src, dst] = pairs(tasks);
    torch::NoGradGuard ng;
    auto x = attn_input(*m, 1, effective_embedding_rows(*m, src));
    set_ov(*m, 1, 1, successor_ov(*m, x, dst, 8.0));
    const auto s = successor_scores(*m, tasks, SuccessorEmbedding::kEffective);
    CHECK(s.score[1][1].item<float>() == 1.0f);
    CHECK(s.score.sum().item<float>() == 1.0f);  // every other head's OV is 0: all ties, no success
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

TEST_CASE("successor tasks: the paper's eight, a file round-trips, bad files are one line naming the file") {
    const auto d = default_successor_tasks();
    REQUIRE(d.size() == 8);
    CHECK(d[0].name == "numbers");
    CHECK(d[0].words.size() == 200);
    CHECK(d[3].words.front() == "Monday");
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
    bad("{\"a\": [\"x\", \"y\", \"x\"]}", "twice");
    bad("[\"x\", \"y\"]", "expected an object");
    bad("{\"a\": [\"x\",\n \"y\"", ":2: not valid JSON");
}
