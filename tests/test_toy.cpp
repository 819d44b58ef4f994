// Toy models: the synthetic tokenizer round-trips through the project's loader, training is
// deterministic, the CI models (tests/fixtures/ci-toy, the CI recipes' output) reach the task targets
// with the known circuit found by ablation, and a saved folder reloads (load_model) to the same
// metrics; the long suite trains the CI recipes themselves.
#include <doctest/doctest.h>

#include "attention_detectors.h"
#include "ci_toy.h"
#include "errors.h"
#include "model.h"
#include "tmpdir.h"
#include "tokenizer.h"
#include "toy_tasks.h"
#include "train.h"
#include "util.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>

using namespace hs;
using nlohmann::json;

namespace {

// Reloaded weights are bit-identical; the tolerance covers nothing but float printing paths.
constexpr double kReloadTol = 1e-4;
// CI variants: induction runs fewer steps than its default; recall needs its default 3000 (phase change ~1700) (see README "Toy models" / training_log.json).
constexpr int kCiInductionSteps = 1500;
constexpr int kCiRecallSteps = 3000;  // = the default: at 2500 the 128-token accuracy was 0.900

ToyTrainResult train_and_save(ToyTask task, int steps, uint64_t seed, const std::string& dir) {
    TrainOptions o;
    o.task = task;
    o.steps = steps;
    o.seed = seed;
    o.threads = 1;
    o.progress = false;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = train_toy(o);
    MESSAGE(toy_task_name(task) << ": " << steps << " steps, "
                                << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                                << " s incl. evaluation and ablations; metrics " << r.log["final_metrics"].dump());
    StagedFolder stage(dir, false);
    save_toy_model(*r.model, r.log, stage.path());
    stage.commit();
    return r;
}

// Every number of `want` found again in `got` within kReloadTol.
void check_same_metrics(const json& want, const json& got) {
    for (auto& [k, v] : want.items()) {
        CAPTURE(k);
        REQUIRE(got.contains(k));
        if (v.is_number_float()) CHECK(std::abs(v.get<double>() - got[k].get<double>()) < kReloadTol);
        else if (v.is_object()) check_same_metrics(v, got[k]);
        else CHECK(v == got[k]);
    }
}

// Loads dir like any other checkpoint and re-evaluates it.
void check_reload(const std::string& dir, const json& train_log, ToyTask task) {
    auto m = load_model(dir);
    CHECK(m->config.architecture == "LlamaForCausalLM");
    CHECK(m->config.n_layers == train_log["sizes"]["n_layers"].get<int>());
    CHECK(m->config.vocab_size == toy::kVocabSize);
    auto tok = find_tokenizer_for_model(dir, m->config.vocab_size);
    REQUIRE(tok);
    CHECK(tok->bos_id() == std::optional<int32_t>(1));
    const uint64_t seed = train_log["eval_seed"].get<uint64_t>();
    check_same_metrics(train_log["final_metrics"], evaluate_toy(*m, task, seed));
    auto gt = toy_ground_truth(*m, task, seed);
    CHECK(std::abs(gt["baseline"].get<double>() - train_log["ground_truth"]["baseline"].get<double>()) < kReloadTol);
    auto log = json::parse(read_text_file(path_join(dir, "training_log.json")));
    CHECK(log["seed"] == train_log["seed"]);
    CHECK(log["loss_curve"].size() == train_log["loss_curve"].size());
}

// "L1H2" -> layer * H + head
int64_t flat_head(const std::string& name, int64_t H) {
    int l = -1, h = -1;
    REQUIRE(std::sscanf(name.c_str(), "L%dH%d", &l, &h) == 2);
    return l * H + h;
}

// headscope detect's stripe scores on the saved folder single out the heads that training-time
// ablation proved causal: the top |S| induction (previous-token) heads are exactly the set S in
// training_log.json, and the weakest of S beats the best head outside S by a clear margin.
void check_detect_finds_ground_truth(const std::string& dir) {
    auto log = json::parse(read_text_file(path_join(dir, "training_log.json")));
    const json& g = log["ground_truth"];
    auto m = load_model(dir);
    StripeInput in;
    in.seq_len = 25;  // 2 * 25 + 1 tokens fit the toy model's 64
    in.batch = 32;
    in.token_lo = toy::kFirstAlnum;  // the alphanumerics it was trained on
    in.token_hi = toy::kVocabSize;
    auto sc = stripe_scores(*m, repeated_random_tokens(*m, in), in.seq_len,
                            {StripeKind::kInduction, StripeKind::kPreviousToken});
    const int64_t H = m->config.n_heads;
    auto check_set = [&](const at::Tensor& score, const json& names, const std::string& what) {
        CAPTURE(what);
        REQUIRE(names.is_array());
        REQUIRE(!names.empty());
        std::set<int64_t> want;
        for (const auto& n : names) want.insert(flat_head(n.get<std::string>(), H));
        auto flat = score.flatten().to(torch::kDouble);
        auto order = flat.argsort(0, true);
        const int64_t k = static_cast<int64_t>(want.size());
        for (int64_t i = 0; i < k; ++i) CHECK(want.count(order[i].item<int64_t>()) == 1);
        const double margin = (flat[order[k - 1]] - flat[order[k]]).item<double>();
        MESSAGE(what << ": ground truth " << names.dump() << "; detect's top " << k << " weakest "
                     << flat[order[k - 1]].item<double>() << ", best other " << flat[order[k]].item<double>());
        CHECK(margin > 0.2);
    };
    check_set(sc[0].score, g["induction_heads"], "induction");
    check_set(sc[1].score, g["previous_token_heads"], "previous-token");
}

// The CI induction model (training_log.json and the weights): the task targets, a circuit that
// ablation found (a previous-token head in layer 0, induction heads in layer 1), reloads, detect finds it.
void check_ci_induction(const std::string& dir) {
    const json log = json::parse(read_text_file(path_join(dir, "training_log.json")));
    REQUIRE(log["steps"].get<int>() == kCiInductionSteps);
    const json& f = log["final_metrics"];
    for (auto& [n, v] : f["repeated_half_loss"].items()) {
        CAPTURE(n);
        CHECK(v.get<double>() < 0.5);
    }
    CHECK(f["first_occurrence_loss_mean"].get<double>() > 3.5);  // random tokens stay unpredictable
    const json& g = log["ground_truth"];
    MESSAGE("ground truth: " << g.dump());
    REQUIRE(g["induction_head"].is_string());
    for (const auto& n : g["induction_heads"]) CHECK(n.get<std::string>().rfind("L1H", 0) == 0);
    REQUIRE(g["previous_token_head"].is_string());
    CHECK(g["previous_token_head"].get<std::string>().rfind("L0H", 0) == 0);
    // Ablating the circuit destroys the metric (>= 1 nat; measured 3.8-4.8 over seeds 1-3); no
    // head outside it comes close: at most half that harm (measured 0.76-1.04, from partial
    // previous-token heads in layer 0).
    const double joint_harm = g["induction_heads_joint_ablation"].get<double>() - g["baseline"].get<double>();
    CHECK(joint_harm >= 1.0);
    CHECK(g["max_harm_outside_circuit"].get<double>() < 0.5 * joint_harm);
    check_reload(dir, log, ToyTask::kInduction);
    check_detect_finds_ground_truth(dir);
}

// The CI recall model: exact recall at every context length, a retrieval head, reloads.
void check_ci_recall(const std::string& dir) {
    const json log = json::parse(read_text_file(path_join(dir, "training_log.json")));
    REQUIRE(log["steps"].get<int>() == kCiRecallSteps);
    const json& f = log["final_metrics"];
    for (auto& [n, v] : f["accuracy"].items()) {
        CAPTURE(n);
        CHECK(v.get<double>() >= 0.9);  // CI target, looser than the full run's 0.95
    }
    const json& g = log["ground_truth"];
    MESSAGE("ground truth: " << g.dump());
    CHECK(g["retrieval_head"].is_string());
    check_reload(dir, log, ToyTask::kRecall);
}

}  // namespace

TEST_CASE("toy: the synthetic tokenizer.json loads and round-trips") {
    TempDir tmp;
    {
        AtomicFile f(tmp.file("tokenizer.json"));
        f.write(toy::tokenizer_json());
        f.commit();
    }
    auto tok = load_tokenizer(tmp.file("tokenizer.json"));
    CHECK(tok->vocab_size() == toy::kVocabSize);
    CHECK(tok->bos_id() == std::optional<int32_t>(static_cast<int32_t>(toy::kBos)));
    const std::string text = "ab3Q?k.;=Z9";
    auto ids = tok->encode(text);
    REQUIRE(ids.size() == text.size() + 1);
    CHECK(ids[0] == toy::kBos);
    for (size_t i = 0; i < text.size(); ++i) CHECK(toy::token_text(ids[i + 1]) == std::string(1, text[i]));
    CHECK(tok->decode(ids) == text);
    for (int64_t id = 2; id < toy::kVocabSize; ++id) CHECK(tok->encode(toy::token_text(id), false) == std::vector<int32_t>{static_cast<int32_t>(id)});
}

TEST_CASE("toy: generators vary the layout (no fixed-position shortcut)") {
    toy::Rng rng(5);
    auto r = toy::recall_batch(rng, 64, 48, true);
    std::set<int64_t> value_positions(r.value_pos.begin(), r.value_pos.end());
    CHECK(value_positions.size() > 10);
    auto t = r.batch.tokens;
    for (int64_t b = 0; b < 64; ++b) {  // the query key is the key of the recorded value, and the target its value
        CHECK(t[b][r.query_pos[b]].item<int64_t>() == t[b][r.value_pos[b] - 1].item<int64_t>());
        CHECK(r.batch.targets[b][47].item<int64_t>() == t[b][r.value_pos[b]].item<int64_t>());
    }
    auto e = toy::induction_eval_batch(rng, 4, 10);
    CHECK(e.batch.tokens.size(1) == 21);
    CHECK(torch::equal(e.batch.tokens.narrow(1, 1, 10), e.batch.tokens.narrow(1, 11, 10)));
    CHECK(e.batch.mask.sum().item<double>() == 4 * 9);
}

TEST_CASE("toy: training is deterministic for a seed and thread count") {
    TempDir tmp;
    auto a = train_and_save(ToyTask::kInduction, 30, 3, tmp.file("a"));
    auto b = train_and_save(ToyTask::kInduction, 30, 3, tmp.file("b"));
    auto c = train_and_save(ToyTask::kInduction, 30, 4, tmp.file("c"));
    const auto sa = sha256_file(tmp.file("a/model.safetensors"));
    CHECK(sa == sha256_file(tmp.file("b/model.safetensors")));
    CHECK(sa != sha256_file(tmp.file("c/model.safetensors")));
    CHECK(a.log["loss_curve"] == b.log["loss_curve"]);
}

TEST_CASE("toy: a saved folder reloads with load_model and re-evaluates to the training-time metrics") {
    TempDir tmp;
    auto ind = train_and_save(ToyTask::kInduction, 30, 2, tmp.file("ind"));
    check_reload(tmp.file("ind"), ind.log, ToyTask::kInduction);
    auto rec = train_and_save(ToyTask::kRecall, 30, 2, tmp.file("rec"));
    check_reload(tmp.file("rec"), rec.log, ToyTask::kRecall);
}

TEST_CASE("toy: the CI induction model has a previous-token head and induction heads that detect finds, and reloads") {
    check_ci_induction(ci_toy_model("induction"));  // 1500 steps, seed 1, one thread (tests/fixtures/ci-toy)
}

TEST_CASE("toy: a trained induction model named by HEADSCOPE_TOY_INDUCTION passes the detect check") {
    const char* dir = std::getenv("HEADSCOPE_TOY_INDUCTION");  // e.g. models/toy-induction (quickstart)
    if (!dir || !*dir) {
        MESSAGE("skipped: set HEADSCOPE_TOY_INDUCTION to a `headscope train-toy --task induction` folder");
        return;
    }
    check_detect_finds_ground_truth(dir);
}

TEST_CASE("toy: the CI recall model retrieves values at every context length, and reloads") {
    check_ci_recall(ci_toy_model("recall"));  // 3000 steps, seed 1, one thread (tests/fixtures/ci-toy)
}

// The CI recipes themselves, trained here (~4 + 8 minutes on one core each): the models meet the same
// targets. On the machine tests/fixtures/ci-toy was trained on (Debian 12's libtorch and OpenBLAS)
// they are those files bit for bit; another BLAS may round differently, so that is reported, not
// required. ctest long_toy, scripts/test.sh --long.
TEST_CASE("toy: the CI recipes train models that meet the targets" * doctest::test_suite("long")) {
    TempDir tmp;
    for (auto [task, steps] : {std::pair{ToyTask::kInduction, kCiInductionSteps}, std::pair{ToyTask::kRecall, kCiRecallSteps}}) {
        const std::string dir = tmp.file(toy_task_name(task));
        train_and_save(task, steps, 1, dir);
        if (task == ToyTask::kInduction) check_ci_induction(dir);
        else check_ci_recall(dir);
        const std::string shipped = std::string(HS_SOURCE_DIR) + "/tests/fixtures/ci-toy/" + toy_task_name(task);
        const bool same = sha256_file(path_join(dir, "model.safetensors")) == sha256_file(path_join(shipped, "model.safetensors"));
        MESSAGE(toy_task_name(task) << ": " << (same ? "bit-identical to" : "differs in its bits from") << " " << shipped);
        WARN(same);
    }
}

TEST_CASE("toy: output folder checks fail before training") {
    TempDir tmp;
    CHECK_THROWS_AS(parse_toy_task("copying"), ConfigError);
    std::string cmd = "mkdir -p '" + tmp.file("full") + "' && touch '" + tmp.file("full/x") + "' '" + tmp.file("afile") + "'";
    REQUIRE(std::system(cmd.c_str()) == 0);
    CHECK_THROWS_AS(StagedFolder(tmp.file("full"), false), StorageError);
    CHECK_THROWS_AS(StagedFolder(tmp.file("afile/sub"), false), StorageError);
    {
        StagedFolder s(tmp.file("full"), true);
        CHECK(is_directory(s.path()));
    }  // not committed: the stage is removed, the old folder kept
    CHECK(file_exists(tmp.file("full/x")));
    CHECK(!file_exists(temp_path_for(tmp.file("full"))));
}
