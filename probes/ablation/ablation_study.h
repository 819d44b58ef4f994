// The ablation study behind `headscope run` (docs/experiments.md; its file: docs/hdf5-schema.md,
// "Ablation experiments"): an experiment's datasets and probe scores, then each study's Ablator and
// configurations (causal head gating and DuoAttention's gates fitted first for those sweeps), its
// results as batches of configurations finish, what a resumed file already holds, and the whole file
// as schema records. The command turns flags into the experiment, checks a resumed file's identity,
// calls this with the job runner (src/jobs/jobs.h: the shard, the checkpoint after every batch),
// writes the records and prints.
#pragma once

#include "ablation.h"
#include "ablation_records.h"
#include "duo_gates.h"
#include "gating.h"
#include "jobs.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

// One score of the experiment's `probes:` list ([L, H]), with its group's attributes.
struct ExperimentProbe {
    std::string probe, data;
    at::Tensor score;  // [L, H]
    Attrs attrs;
};

// One study: its Ablator, its configurations (and the fit or plan they came from), its results so far.
struct StudyState {
    const StudySpec* spec = nullptr;
    const AblationData* data = nullptr;
    StudyConfigs cfg;
    PrunePlan prune;      // prune sweeps
    GatingResult gating;  // gating sweeps
    DuoGateResult duo;    // duo-gates sweeps
    DuoDeployment duo_deploy;
    schema::DuoFitFacts duo_facts;
    AblationSetup setup;
    std::unique_ptr<Ablator> ab;
    at::Tensor rows;            // [S, N] float32, NaN where not done
    std::vector<uint8_t> done;  // [S]
    // The batches one unsharded run evaluates (Ablator::plan): batch k is the job's item k, so it
    // belongs to shard k % N and a resumed run skips it when all its configurations are done.
    std::vector<std::vector<int64_t>> batches;
};

class AblationStudy {
public:
    // Everything before the first configuration runs, in this order: torch's seed (the experiment's),
    // the head names and score files against the model's shape, the datasets, the probe scores, then
    // each study's Ablator and configurations (gating and duo-gates fit their gates here, with
    // progress bars). ConfigError at the file's marks. The experiment and model must outlive it.
    // prefix_reuse = false recomputes the layers below the first ablated layer (checks, benchmarks).
    AblationStudy(const Experiment& e, const Model& m, const Tokenizer* tok, bool prefix_reuse);
    AblationStudy(const AblationStudy&) = delete;
    AblationStudy& operator=(const AblationStudy&) = delete;

    // --resume: the configurations `r` records as done where they are the same heads (a prune order
    // could differ across builds). The caller has checked that `r` is this job's file (jobs::compare);
    // StorageError naming the file when a study's datasets have another shape.
    void resume(const ResultReader& r);
    // Runs every batch `shard` owns that is not done, study by study, with a progress bar each;
    // the checkpoint follows every batch. Returns the configurations run.
    int64_t run(const jobs::Shard& shard, jobs::Checkpoint& checkpoint);
    // 1 when every configuration of the shard's batches is done (a killed run's file says 0, and its
    // /ablation/<study>/done says which are missing).
    int64_t complete(const jobs::Shard& shard) const;
    // The file less /meta, as it stands.
    schema::AblationRunFile records(const jobs::Shard& shard) const;
    const std::vector<StudyState>& studies() const { return studies_; }

private:
    const Experiment& e_;
    const Model& m_;
    std::vector<AblationData> data_;
    std::vector<ExperimentProbe> probes_;
    std::vector<StudyState> studies_;
};

// A scale-grid study's JUICE selection (probes/decoding/juice.h) as its file record: `run` after each
// batch, `merge` from the merged rows (rows [S, N], masks [S, L, H], factors [S], variants [N] or empty).
schema::JuiceRecord juice_record(const at::Tensor& rows, const at::Tensor& masks, const std::vector<double>& factors,
                                 const std::vector<int64_t>& variants);

}  // namespace hs
