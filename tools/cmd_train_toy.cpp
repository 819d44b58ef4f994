// headscope train-toy: train a small Llama-architecture model on a synthetic task whose circuit
// is known (induction, associative recall), find its heads causally, save a Hugging Face folder.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "heads.h"
#include "guard.h"
#include "progress.h"
#include "train.h"

#include <fmt/format.h>

namespace hs::cli {

struct TrainToyOptions {
    std::string task;
    std::string out;
    uint64_t seed = 1;
    int steps = 0;
    int threads = 0;
    int batch = 0;
    double lr = 0.0;
    int log_every = 50;
    bool force = false;
    bool with_mlp = false;
};

namespace {

using nlohmann::json;

// "L1H2" -> (1, 2), as the training log writes it.
std::pair<int, int> parse_head(const std::string& s) {
    int l = 0, h = 0;
    if (!parse_head_name(s, l, h)) throw DataError(fmt::format("training log: '{}' is not a head name like L1H2", s));
    return {l, h};
}

// The largest harm among the heads of `layer` other than `skip`.
double other_max(const json& harm, int layer, int skip) {
    double m = -1e9;
    for (int h = 0; h < static_cast<int>(harm[layer].size()); ++h)
        if (h != skip) m = std::max(m, harm[layer][h].get<double>());
    return m;
}

void print_metrics(const json& log) {
    const json& f = log["final_metrics"];
    if (log["task"] == "induction") {
        std::string per;
        for (auto& [n, v] : f["repeated_half_loss"].items()) per += fmt::format(" {:.3f} (|R|={})", v.get<double>(), n);
        fmt::print("  repeated-half loss:{}; first occurrence {:.2f} nats (chance log 62 = {:.2f})\n", per,
                   f["first_occurrence_loss_mean"].get<double>(), f["log_vocab"].get<double>());
    } else if (log["task"] == "icl") {
        std::string per, sh;
        for (auto& [n, v] : f["accuracy_by_task"].items()) per += fmt::format(" {:.3f} (task {})", v.get<double>(), n);
        for (auto& [n, v] : f["shuffled_label_accuracy_by_task"].items()) sh += fmt::format(" {:.3f}", v.get<double>());
        fmt::print("  exact answer accuracy:{}; with the labels shuffled:{}\n", per, sh);
    } else {
        std::string per;
        for (auto& [n, v] : f["accuracy"].items()) per += fmt::format(" {:.3f} (T={})", v.get<double>(), n);
        fmt::print("  exact recall accuracy:{} (chance {:.3f})\n", per, f["chance"].get<double>());
    }
    fmt::print("  target ({}): {}\n", f["target"].get<std::string>(), f["passed"].get<bool>() ? "met" : "NOT met");
}

void print_ground_truth(const json& log) {
    const json& g = log["ground_truth"];
    const bool ind = log["task"] == "induction", icl = log["task"] == "icl";
    const std::string key = ind ? "induction_head" : icl ? "function_head" : "retrieval_head";
    const char* what = ind ? "repeated-half loss" : icl ? "answer accuracy" : "recall accuracy";
    const double base = g["baseline"].get<double>();
    const json& set = g[key + "s"];
    const json& attn = g[ind ? "induction_attention" : icl ? "output_attention" : "retrieval_attention"];
    if (g[key].is_null()) {
        fmt::print("  no head or set of heads in layers >= 1 is causal ({} harm >= {})\n", what,
                   g["thresholds"]["causal_harm"].get<double>());
    } else if (set.size() == 1) {
        const auto [l, h] = parse_head(g[key].get<std::string>());
        fmt::print("  {} is the {} head: {} attention {:.2f}; ablating it changes {} from {:.3f} to {:.3f} "
                   "(other layer-{} heads: harm at most {:.3f})\n",
                   g[key].get<std::string>(), ind ? "induction" : icl ? "function" : "retrieval",
                   ind ? "induction" : icl ? "query-to-outputs" : "query-to-value",
                   attn[l][h].get<double>(), what, base, g["per_head_ablation"][l][h].get<double>(), l,
                   other_max(g["per_head_harm"], l, h));
    } else {
        std::string each;
        for (const auto& n : set) {
            const auto [l, h] = parse_head(n.get<std::string>());
            each += fmt::format("{}{} (attention {:.2f}, alone {:.3f})", each.empty() ? "" : ", ", n.get<std::string>(),
                                attn[l][h].get<double>(), g["per_head_ablation"][l][h].get<double>());
        }
        fmt::print("  {} heads share the {} circuit: {}; ablating them together changes {} from {:.3f} to {:.3f} "
                   "(the other layer >= 1 heads together: {:.3f})\n",
                   set.size(), ind ? "induction" : icl ? "function" : "retrieval", each, what, base,
                   g[key + "s_joint_ablation"].get<double>(), g["other_late_heads_joint_ablation"].get<double>());
    }
    fmt::print("  the largest harm from ablating one head outside the circuit: {:.3f}\n",
               g["max_harm_outside_circuit"].get<double>());
    if (!g["previous_token_head"].is_null()) {
        const auto [l, h] = parse_head(g["previous_token_head"].get<std::string>());
        fmt::print("  {} is the previous-token head: previous-token attention {:.2f}; ablating it changes {} "
                   "from {:.3f} to {:.3f}\n",
                   g["previous_token_head"].get<std::string>(), g["previous_token_attention"][l][h].get<double>(), what,
                   base, g["per_head_ablation"][l][h].get<double>());
    }
    for (const auto& n : g["notes"])
        if (n.get<std::string>().rfind("the ", 0) != 0) fmt::print("  note: {}\n", n.get<std::string>());  // the set is printed above
}

}  // namespace

void run_train_toy(const TrainToyOptions& o) {
    TrainOptions t;
    t.task = parse_toy_task(o.task);
    t.seed = o.seed;
    t.steps = o.steps;
    t.threads = o.threads;
    t.batch = o.batch;
    t.lr = o.lr;
    t.log_every = o.log_every;
    t.with_mlp = o.with_mlp;
    // A training batch holds at least 16 tokens a row with their int64 ids and float logits over
    // the toy vocabulary (68 ids), forward and backward: refuse what no machine here could hold.
    check_fits_in_memory(size_product({static_cast<double>(o.batch), 16.0, 2 * (8.0 + 4.0 * 68)}),
                         fmt::format("--batch {}", o.batch));
    StagedFolder stage = with_flag({{"--out", "out"}}, [&] { return with_overwrite_flags(false, [&] { return StagedFolder(o.out, o.force); }); });  // fails now, not after training, when --out is unusable
    log_info("training toy-{} (seed {}) into {}", o.task, o.seed, o.out);
    ToyTrainResult r = train_toy(t);
    save_toy_model(*r.model, r.log, stage.path());
    stage.commit();
    const json& log = r.log;
    fmt::print("trained toy-{}: {} steps in {:.1f} s ({:.1f} s CPU, {} threads, {} parameters), saved to {}\n", o.task,
               log["steps"].get<int>(), log["train_seconds"].get<double>(), log["train_cpu_seconds"].get<double>(),
               log["threads"].get<int>(),
               log["sizes"]["n_params"].get<int64_t>(), o.out);
    fmt::print("  final training loss {:.3f}\n", log["loss_curve"].back()["loss"].get<double>());
    print_metrics(log);
    print_ground_truth(log);
}

void setup_train_toy(CLI::App& app) {
    auto o = std::make_shared<TrainToyOptions>();
    auto* sub = app.add_subcommand("train-toy",
                                   "train a small model whose circuit is known (ground truth for the probes)\n"
                                   "Example: headscope train-toy --task induction --out models/toy-induction --seed 1\n"
                                   "Example: headscope train-toy --task icl --out models/toy-icl --seed 1");
    sub->add_option("--task", o->task, "induction | recall | icl (in-context functions: function-vector heads)")->required();
    sub->add_option("--out", o->out, "output folder (Hugging Face layout)")->required();
    sub->add_option("--seed", o->seed, "training seed (weights, data and evaluation set follow from it)")
        ->capture_default_str();
    sub->add_option("--steps", o->steps, "AdamW steps (0: the task's default)")->check(at_least(0))->capture_default_str();
    sub->add_option("--threads", o->threads, "libtorch threads (0: every core); results depend on it")
        ->capture_default_str();
    sub->add_option("--batch", o->batch, "rows per step (0: the task's default)")->check(at_least(0))->capture_default_str();
    sub->add_option("--lr", o->lr, "peak learning rate (0: the task's default)")->check(at_least(0))->capture_default_str();
    sub->add_option("--log-every", o->log_every, "loss curve resolution in steps")->check(at_least(1))->capture_default_str();
    sub->add_flag("--force", o->force, "replace an existing non-empty output folder");
    sub->add_flag("--with-mlp", o->with_mlp,
                  "train the MLP blocks too (default: attention-only; the MLP weights are saved as zeros)");
    sub->callback([o] { run_train_toy(*o); });
}

}  // namespace hs::cli
