// Ground-truth toy models: train a small Llama-architecture model on a synthetic task
// (datasets/toy_tasks.h), evaluate it, find causally which heads carry the circuit by ablating
// each head in turn, and save a Hugging Face folder that load_model reads like any other.
#pragma once

#include "model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace hs {

enum class ToyTask { kInduction, kRecall, kIcl };
ToyTask parse_toy_task(const std::string& name);  // ConfigError listing the tasks
std::string toy_task_name(ToyTask t);

struct TrainOptions {
    ToyTask task = ToyTask::kInduction;
    uint64_t seed = 1;
    int steps = 0;        // 0: the task's default
    int threads = 0;      // libtorch intra-op threads; <= 0: every core
    int batch = 0;        // 0: the task's default
    double lr = 0.0;      // peak AdamW learning rate; 0: the task's default
    int log_every = 50;   // loss curve resolution (steps)
    bool with_mlp = false; // train the MLPs too; by default they stay exactly zero (attention-only)
    bool progress = true; // progress bar on stderr (when it is a terminal)
};

// Defaults per task (steps, batch, lr) and the model shape.
int default_steps(ToyTask t);
ModelConfig toy_config(ToyTask t);
// Random initialisation from `seed`: N(0, 0.02) matrices, unit norm weights. attention_only: the
// MLP matrices are zero (the block's MLP then adds exactly 0, so the saved folder is a plain Llama
// checkpoint that computes an attention-only transformer).
std::unique_ptr<Model> init_toy_model(const ModelConfig& cfg, uint64_t seed, bool attention_only = true);

// Task metrics on a held-out evaluation set drawn from eval_seed (independent of training data).
// induction: repeated-half and first-occurrence loss (nats/token) on [BOS, R, R] for |R| in
// {10, 15, 25}; recall: exact accuracy at several context lengths up to max_seq_len.
// "passed" says whether the targets hold (induction: every repeated-half loss < 0.5; recall:
// every accuracy >= 0.95).
nlohmann::json evaluate_toy(const Model& m, ToyTask task, uint64_t eval_seed);

// Per-head zero ablation of z and attention statistics on the evaluation set; names the heads
// that carry the circuit under the thresholds recorded in the result (see train.cpp).
nlohmann::json toy_ground_truth(const Model& m, ToyTask task, uint64_t eval_seed);

struct ToyTrainResult {
    std::unique_ptr<Model> model;
    nlohmann::json log;  // everything training_log.json holds
};
// Trains (deterministic for a given seed and thread count), then evaluates and ablates.
ToyTrainResult train_toy(const TrainOptions& o);

// The eval seed a training seed uses (recorded in the log).
uint64_t toy_eval_seed(uint64_t train_seed);

// Hugging Face tensors (model.embed_tokens.weight, ...) and config.json of a Llama-family model.
std::map<std::string, at::Tensor> hf_llama_tensors(const Model& m);
nlohmann::json hf_llama_config(const ModelConfig& c);

// A staging folder next to `out`: the constructor checks `out` (an existing non-empty folder
// needs force; a file is refused) and creates "<out>.tmp-<pid>" at once, so an unwritable place
// fails before any training. commit() replaces `out`; the destructor removes an uncommitted stage.
class StagedFolder {
public:
    StagedFolder(const std::string& out, bool force);
    ~StagedFolder();
    StagedFolder(const StagedFolder&) = delete;
    StagedFolder& operator=(const StagedFolder&) = delete;
    const std::string& path() const { return tmp_; }
    void commit();

private:
    std::string out_, tmp_;
    bool committed_ = false;
};

// Writes config.json, model.safetensors, tokenizer.json and training_log.json into dir.
void save_toy_model(const Model& m, const nlohmann::json& log, const std::string& dir);

}  // namespace hs
