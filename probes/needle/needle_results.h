// The needle scan's results as they accumulate (per trial, per ablation set), what is computed from
// them (head scores, LOCOS intervals, accuracies), and the plan of its work items (which batches a
// shard owns, which are done). Shared by `retrieval` (a checkpoint after every batch, --resume) and
// `merge` (a scan's shards joined): the scores are always computed from the stored per-trial values,
// so a merged file equals the unsharded run's bit for bit. Stored as schema::NeedleRecord
// (src/store/schema.h; docs/hdf5-schema.md, "/retrieval").
#pragma once

#include "needle.h"
#include "schema.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hs {

struct NeedleResults : schema::NeedleRecord {
    NeedleResults() = default;
    explicit NeedleResults(schema::NeedleRecord r) : schema::NeedleRecord(std::move(r)) {}

    using schema::NeedleRecord::init_sets;  // (S, masks [S, L, H])
    void init_sets(const std::vector<std::vector<std::pair<int, int>>>& sets);  // nothing of them done
    void set_trial(int64_t i, const TrialResult& r);
    void set_ablated(int64_t s, int64_t i, const TrialResult& r);
    void copy_trial(const NeedleResults& from, int64_t i);
    void copy_ablated(const NeedleResults& from, int64_t from_set, int64_t s, int64_t i);
    bool same_set(const NeedleResults& other, int64_t other_set, int64_t s) const;  // equal masks
};

// Computed from the done trials only (a shard's or an unfinished run's file: its own trials).
struct NeedleSummary {
    at::Tensor ret, locos, ci_low, ci_high;  // [L, H] double
    at::Tensor r2;                           // [L, H] double: HeadKV's R2, mean over the passing trials
    int64_t n_done = 0, n_pass = 0, n_locos = 0;
    double accuracy = 0, rougeL = 0;         // over the done trials (NaN when none)
    bool with_ci = false;                    // >= 10 scored trials (the reference's rule)
    std::vector<float> abl_acc, abl_rougeL;  // [S] over each set's done trials
    std::vector<std::string> flagged;        // retrieval score > flag_threshold

    schema::NeedleScoresRecord stored() const;  // as the file keeps it
};
// LOCOS computes bootstrap intervals only over at least this many scored trials (logit_contrib.py).
constexpr int64_t kBootstrapMinTrials = 10;
// rng: which bootstrap (RngKind::kReference: numpy's, as logit_contrib.py draws it).
NeedleSummary summarize(const NeedleResults& r, int64_t bootstrap, uint64_t seed, double flag_threshold,
                        RngKind rng = RngKind::kHeadscope);

// The work items of a scan, the unit a shard owns and a checkpoint completes: the baseline's batches
// g (item g), then each ablation set s's batches of the ablation trials (item G + s * Ga + g). With
// `rows` (the sets decode as rows of shared forwards: an unablated prefill, --sweep-rows > 1) an
// ablation batch is one item for every set, so that a row's forward holds the same rows in a shard, a
// resumed run and the whole run (rows share GEMMs: their last bits depend on the rows beside them).
class NeedleWork {
public:
    NeedleWork(const NeedleTest& test, bool rows) : test_(test), rows_(rows) {}
    bool rows() const { return rows_; }
    int64_t item(int64_t set, int64_t g) const;  // set -1: the scored baseline
    const std::vector<std::vector<int64_t>>& batches_of(int64_t set) const {
        return set < 0 ? test_.batches() : test_.ablation_batches();
    }
    bool batch_done(const NeedleResults& r, int64_t set, int64_t g) const;
    // Every item an owner (shard index of count) holds is done, sets -1 .. n_sets - 1.
    bool complete(const NeedleResults& r, int64_t n_sets, int64_t shard_index, int64_t shard_count) const;
    // The trial decodes of the items that owner holds, sets -1 .. n_sets - 1 (a progress bar's total).
    int64_t owned_decodes(int64_t n_sets, int64_t shard_index, int64_t shard_count) const;

private:
    const NeedleTest& test_;
    bool rows_;
};

}  // namespace hs
