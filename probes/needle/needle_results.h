// The needle scan's results as they accumulate (per trial, per ablation set), what is computed from
// them (head scores, LOCOS intervals, accuracies), and the plan of its work items (which batches a
// shard owns, which are done). Shared by `retrieval` (a checkpoint after every batch, --resume) and
// `merge` (a scan's shards joined): the scores are always computed from the stored per-trial values,
// so a merged file equals the unsharded run's bit for bit. The file keeps them as schema::NeedleRecord
// and schema::NeedleScoresRecord (src/store/schema.h; docs/hdf5-schema.md, "/retrieval"): the
// conversions (to_record, from_record, stored) and the write and read functions here name the score
// arrays from the registry (scores.h).
#pragma once

#include "needle.h"
#include "schema.h"
#include "scores.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hs {

struct NeedleResults {
    int64_t N = 0, L = 0, H = 0, steps = 0;  // trials, layers, heads, max_new_tokens
    int64_t abl_steps = 0;                   // the ablation passes' max_new_tokens
    bool with_steps = false;                 // per-step scores kept (--dump-steps)
    std::vector<uint8_t> done;               // [N] the unablated decode ran
    std::vector<int64_t> generated;          // [N, steps], -1 past the end
    std::vector<std::string> response;       // [N]
    std::vector<float> rouge1, rougeL;       // [N]
    std::vector<int32_t> passed;             // [N]
    std::vector<int64_t> answer_steps;       // [N]
    // Every score's trial arrays [score][part] [N, L, H] (NaN where not done; an array a file
    // written before it lacks reads as NaN) and step arrays [score][part] [N, steps, L, H]
    // (with_steps), NaN past a trial's end.
    PerNeedleScore<std::vector<float>> arrays, step_arrays;
    int64_t S = 0;                           // ablation sets (0: none yet)
    std::vector<int32_t> masks;              // [S, L, H]
    std::vector<uint8_t> abl_done;           // [S, N]
    std::vector<float> abl_rouge1, abl_rougeL;  // [S, N]
    std::vector<int32_t> abl_passed;         // [S, N]
    std::vector<int64_t> abl_generated;      // [S, N, abl_steps], -1 past the end

    // Every array at its shape, nothing done (NaN scores, -1 tokens), no ablation sets.
    void init(int64_t n, int64_t l, int64_t h, int64_t steps, int64_t abl_steps, bool with_steps);
    void init_sets(int64_t s, std::vector<int32_t> masks);  // S sets of these [S, L, H] masks, nothing of them done
    void init_sets(const std::vector<std::vector<std::pair<int, int>>>& sets);  // nothing of them done
    void set_trial(int64_t i, const TrialResult& r);
    void set_ablated(int64_t s, int64_t i, const TrialResult& r);
    void copy_trial(const NeedleResults& from, int64_t i);
    void copy_ablated(const NeedleResults& from, int64_t from_set, int64_t s, int64_t i);
    bool same_set(const NeedleResults& other, int64_t other_set, int64_t s) const;  // equal masks
    const std::vector<float>& array(NeedleScore s, size_t part = 0) const { return arrays[static_cast<size_t>(s)][part]; }

    // As the file keeps them, and back (the score arrays by the registry's dataset names).
    schema::NeedleRecord to_record() const;
    static NeedleResults from_record(schema::NeedleRecord r);
};

// Computed from the done trials only (a shard's or an unfinished run's file: its own trials).
struct NeedleSummary {
    std::vector<at::Tensor> scores;          // [score] [L, H] double, every score of the registry
    at::Tensor ci_low, ci_high;              // [L, H] double: the bootstrapped score's (LOCOS) intervals
    int64_t n_done = 0, n_pass = 0, n_locos = 0;  // n_locos: passing trials with an answer step
    int64_t n_query = 0;                     // done trials with a QRHead array (NeedleReduction::kDoneMean)
    double accuracy = 0, rougeL = 0;         // over the done trials (NaN when none)
    bool with_ci = false;                    // >= 10 scored trials (the reference's rule)
    std::vector<float> abl_acc, abl_rougeL;  // [S] over each set's done trials
    std::vector<std::string> flagged;        // the flagging score (retrieval) > flag_threshold

    const at::Tensor& score(NeedleScore s) const { return scores.at(static_cast<size_t>(s)); }  // [L, H]
    int64_t n_scored(NeedleScore s) const;  // the trials score s averages (n_trials_scored)
    schema::NeedleScoresRecord stored(NeedleScoreSet set) const;  // as the file keeps it, set's groups
};
// LOCOS computes bootstrap intervals only over at least this many scored trials (logit_contrib.py).
constexpr int64_t kBootstrapMinTrials = 10;
// rng: which bootstrap (RngKind::kReference: numpy's, as logit_contrib.py draws it).
NeedleSummary summarize(const NeedleResults& r, int64_t bootstrap, uint64_t seed, double flag_threshold,
                        RngKind rng = RngKind::kHeadscope);

// The file: every per-trial result and the summary's groups of the scores in `set` (/scores/<name>),
// replacing what a checkpoint wrote before; read back for --resume and merge; the scores a file
// holds (a /scores/<name> group each).
void write_needle_results(ResultWriter& w, const NeedleResults& r, const NeedleSummary& s, NeedleScoreSet set);
NeedleResults read_needle_results(const ResultReader& f);
NeedleScoreSet needle_scores_in(const ResultReader& f);

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
