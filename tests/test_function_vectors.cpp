// Function-vector heads (probes/ablation/function_vectors.h). References: the reference's prompt
// template written out by hand, a hand-made forward per prompt with one head's z replaced at the
// last token (the fixed-source patching sweep), and the CI toy trained on in-context functions
// whose function-carrying heads its training log names by ablation (train.cpp, toy_ground_truth),
// which the AIE must rank first. tests/fv_check.py recomputes whole files.
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "errors.h"
#include "function_vectors.h"
#include "heads.h"
#include "hooks.h"
#include "model.h"
#include "patching.h"
#include "tmpdir.h"
#include "tokenizer.h"
#include "toy_tasks.h"
#include "train.h"
#include "util.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

using namespace hs;
using nlohmann::json;

namespace {

std::string task_file(const std::string& name) { return std::string(HS_SOURCE_DIR) + "/datasets/fv/" + name; }

// The toy template: "x1Y1x2Y2...a" (no prefixes, separators or spaces).
FvOptions toy_options() {
    FvOptions o;
    o.n_shots = 6;
    o.n_trials = 32;
    o.tmpl.input_prefix = o.tmpl.output_prefix = o.tmpl.input_sep = o.tmpl.output_sep = "";
    o.tmpl.prepend_space = false;
    return o;
}

// The CI icl toy (tests/ci_toy.sh: 600 steps, seed 1, one thread; shipped in tests/fixtures/ci-toy).
struct IclToy {
    std::unique_ptr<Model> model;
    json log;
    std::string dir;
};
IclToy& icl_toy() {
    static IclToy t = [] {
        IclToy out;
        out.dir = ci_toy_model("icl");
        out.model = load_model(out.dir);
        out.log = json::parse(read_text_file(path_join(out.dir, "training_log.json")));
        return out;
    }();
    return t;
}

}  // namespace

TEST_CASE("fv: the prompt is the reference's template") {
    // create_prompt with word_pairs_to_prompt_data's defaults: prefixes Q:/A:, separators \n / \n\n, spaces.
    const std::vector<WordPair> demos = {{"hot", "cold"}, {"up", "down"}};
    CHECK(fv_prompt_text(demos, "big", FvTemplate{}) == "Q: hot\nA: cold\n\nQ: up\nA: down\n\nQ: big\nA:");
    FvTemplate bare;
    bare.input_prefix = bare.output_prefix = bare.input_sep = bare.output_sep = "";
    bare.prepend_space = false;
    CHECK(fv_prompt_text({{"b", "C"}, {"c", "D"}}, "a", bare) == "bCcDa");
}

TEST_CASE("fv: task files, their split and bad ones") {
    const auto t = read_fv_task(task_file("antonyms.json"));
    CHECK(!t.split_given());
    CHECK(t.pairs.size() >= 30);
    const auto toy = read_fv_task(task_file("toy-icl-shift2.json"));
    REQUIRE(toy.split_given());
    REQUIRE(toy.valid.size() == 1);
    CHECK(toy.valid[0].input == "a");
    CHECK(toy.valid[0].output == toy::token_text(toy::icl_output(2, 0)));
    for (size_t i = 0; i < toy.train.size(); ++i)  // the files hold the generator's pairs
        CHECK(toy.train[i].output == toy::token_text(toy::icl_output(2, static_cast<int64_t>(i) + 1)));
    TempDir d;
    const std::string bad = path_join(d.path, "bad.json");
    std::ofstream(bad) << "[{\"input\": \"a\"}]";
    CHECK_THROWS_AS(read_fv_task(bad), DataError);
    std::ofstream(bad) << "{\"demonstrations\": []}";
    CHECK_THROWS_AS(read_fv_task(bad), DataError);
}

TEST_CASE("fv: the sweep equals one forward per prompt with one head's z replaced at the last token") {
    auto& t = icl_toy();
    const Model& m = *t.model;
    auto tok = load_tokenizer(t.dir);
    FvOptions o = toy_options();
    o.n_trials = 5;
    o.max_rows = 7;  // heads split across forwards
    const auto p = fv_prompts(read_fv_task(task_file("toy-icl-shift1.json")), "toy", *tok, m.config, o);
    const auto r = function_vector_heads(m, p, o);
    const int L = m.config.n_layers, H = m.config.n_heads;
    // The mean z at the last token, by hand.
    std::vector<at::Tensor> mean(L);
    for (size_t i = 0; i < p.clean_lengths.size(); ++i) {
        Hooks h;
        h.capture(Point::kAttnZ, [&](int l, const at::Tensor& z) {
            auto v = z[0][-1].to(torch::kDouble);
            mean[l] = mean[l].defined() ? mean[l] + v : v;
        });
        m.forward(p.clean[i].narrow(0, 0, p.clean_lengths[i]).unsqueeze(0), &h);
    }
    auto prob = [&](const at::Tensor& ids, int64_t ans, Hooks* h) {
        return torch::softmax(m.forward(ids, h)[0][-1].to(torch::kDouble), -1)[ans].item<double>();
    };
    double max_err = 0;
    for (int l = 0; l < L; ++l)
        for (int hh = 0; hh < H; ++hh) {
            double ie = 0;
            for (size_t i = 0; i < p.corrupt_lengths.size(); ++i) {
                auto ids = p.corrupt[i].narrow(0, 0, p.corrupt_lengths[i]).unsqueeze(0);
                Hooks h;
                const auto src = (mean[l][hh] / static_cast<double>(p.clean_lengths.size())).to(torch::kFloat);
                h.edit(Point::kAttnZ, [&](int, const at::Tensor& z) -> std::optional<at::Tensor> {
                    auto y = z.clone();
                    y[0][-1][hh] = src;
                    return y;
                }, l);
                ie += prob(ids, p.corrupt_answer[i], &h) - prob(ids, p.corrupt_answer[i], nullptr);
            }
            ie /= static_cast<double>(p.corrupt_lengths.size());
            max_err = std::max(max_err, std::abs(ie - r.aie[l][hh].item<double>()));
        }
    CHECK(max_err < 1e-5);
}

TEST_CASE("fv: the toy's function-carrying heads rank first by AIE") {
    auto& t = icl_toy();
    const Model& m = *t.model;
    const json& f = t.log["final_metrics"];
    REQUIRE(f["passed"].get<bool>());
    const json& gt = t.log["ground_truth"]["function_heads"];
    REQUIRE(gt.size() >= 1);
    auto tok = load_tokenizer(t.dir);
    const FvOptions o = toy_options();
    // Todd et al. rank heads by the AIE averaged over tasks.
    at::Tensor mean_aie;
    for (int k = 0; k < toy::kIclTasks; ++k) {
        const auto p = fv_prompts(read_fv_task(task_file(fmt::format("toy-icl-shift{}.json", k))), "toy", *tok, m.config, o);
        const auto r = function_vector_heads(m, p, o);
        mean_aie = mean_aie.defined() ? mean_aie + r.aie : r.aie.clone();
    }
    mean_aie = mean_aie / static_cast<double>(toy::kIclTasks);
    const int H = m.config.n_heads;
    auto order = std::get<1>(mean_aie.flatten().sort(/*stable=*/true, 0, /*descending=*/true));
    std::vector<std::string> top;
    for (size_t i = 0; i < gt.size(); ++i) {
        const int64_t j = order[static_cast<int64_t>(i)].item<int64_t>();
        top.push_back(format_head(static_cast<int>(j / H), static_cast<int>(j % H)));
    }
    INFO("AIE averaged over the tasks: " << mean_aie << "; ground truth " << gt.dump());
    for (const auto& g : gt) CHECK(std::find(top.begin(), top.end(), g.get<std::string>()) != top.end());
    // Each member's AIE is positive: its mean activation moves the corrupted prompts towards the answer.
    for (const auto& g : gt) {
        int l = -1, h = -1;
        REQUIRE(parse_head_name(g.get<std::string>(), l, h));
        CHECK(mean_aie[l][h].item<double>() > 0.01);
    }
}
