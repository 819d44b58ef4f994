// The per-trial results of `headscope retrieval` as its file stores them, and what is computed from
// them: shared by retrieval (written after every checkpoint, read back by --resume) and merge (the
// shards of one needle scan joined). The head scores, LOCOS intervals and ablation accuracies are
// always computed from the stored per-trial values, so a merged file equals the unsharded run's bit
// for bit. Names: docs/hdf5-schema.md ("/retrieval").
#pragma once

#include "needle.h"
#include "store.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hs::cli {

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
    std::vector<float> retrieval, locos;     // [N, L, H]
    std::vector<float> lplus, lminus;        // [N, L, H] means over the answer steps
    std::vector<float> step_credit, step_lplus, step_lminus;  // [N, steps, L, H] (with_steps), NaN past the end
    int64_t S = 0;                           // ablation sets (0: none yet)
    std::vector<int32_t> masks;              // [S, L, H]
    std::vector<uint8_t> abl_done;           // [S, N]
    std::vector<float> abl_rouge1, abl_rougeL;  // [S, N]
    std::vector<int32_t> abl_passed;         // [S, N]
    std::vector<int64_t> abl_generated;      // [S, N, abl_steps], -1 past the end

    void init(int64_t n, int64_t l, int64_t h, int64_t steps, int64_t abl_steps, bool with_steps);  // nothing done
    void init_sets(const std::vector<std::vector<std::pair<int, int>>>& sets);
    void set_trial(int64_t i, const TrialResult& r);
    void set_ablated(int64_t s, int64_t i, const TrialResult& r);
    void copy_trial(const NeedleResults& from, int64_t i);
    void copy_ablated(const NeedleResults& from, int64_t from_set, int64_t s, int64_t i);
    bool same_set(const NeedleResults& other, int64_t other_set, int64_t s) const;  // equal masks
};

// Computed from the done trials only (a shard's or an unfinished run's file: its own trials).
struct NeedleSummary {
    at::Tensor ret, locos, ci_low, ci_high;  // [L, H] double
    int64_t n_done = 0, n_pass = 0, n_locos = 0;
    double accuracy = 0, rougeL = 0;         // over the done trials (NaN when none)
    bool with_ci = false;                    // >= 10 scored trials (the reference's rule)
    std::vector<float> abl_acc, abl_rougeL;  // [S] over each set's done trials
    std::vector<std::string> flagged;        // retrieval score > flag_threshold
};
// LOCOS computes bootstrap intervals only over at least this many scored trials (logit_contrib.py).
constexpr int64_t kBootstrapMinTrials = 10;
// rng: which bootstrap (RngKind::kReference: numpy's, as logit_contrib.py draws it).
NeedleSummary summarize(const NeedleResults& r, int64_t bootstrap, uint64_t seed, double flag_threshold,
                        RngKind rng = RngKind::kHeadscope);

// Writes (replacing) every dataset and attribute that depends on the results: /retrieval/trials/
// results and done, /retrieval/ablation/ results, done and accuracies (when S > 0), /scores/retrieval
// and /scores/locos datasets (when the group exists or want_*), n_passed, accuracy, n_trials_done,
// n_trials_scored, flagged. The static parts (prompts, spans, parameters, masks) are the caller's.
void write_needle_results(ResultWriter& w, const NeedleResults& r, const NeedleSummary& s, bool want_ret,
                          bool want_locos);

// Reads a retrieval file's results (StorageError naming the file when something is missing or has
// another shape than [N, ...] with the file's own N, L, H).
NeedleResults read_needle_results(const ResultReader& f);

// The parameters two files of one needle scan must share (the /retrieval and /retrieval/ablation
// attributes that define the work, the haystack's and needles' sha256, the model's weights and
// dtype); "" when they agree, else "NAME: A vs B" for the first that differs.
std::string needle_config_difference(const ResultReader& a, const ResultReader& b);

// Where a merge writes: a copy of the first shard next to `out` ("<out>.tmp-<pid>-merge"), removed
// by the destructor unless the caller renamed it into place. StorageError naming `out` when the
// copy cannot be made.
class MergeStage {
public:
    MergeStage(const std::string& first, const std::string& out);
    ~MergeStage();
    MergeStage(const MergeStage&) = delete;
    MergeStage& operator=(const MergeStage&) = delete;
    const std::string& path() const { return tmp_; }

private:
    std::string tmp_;
};

// The attributes a merged file's root group gets (/experiment for sweeps, /retrieval for needle
// scans): shard "merged", the inputs, index 0 of 1, and whether every piece of work was found.
Attrs merged_attrs(const std::vector<std::string>& inputs, bool complete);

struct MergeArgs {
    std::vector<std::string> inputs;
    std::string out;
    bool force = false, partial = false;
};
// headscope merge for retrieval shards.
void merge_retrieval(const MergeArgs& o, const std::vector<std::unique_ptr<ResultReader>>& rs);

// Attribute values as text with a one-element list read as its element (a list of one is read back
// as a scalar by some HDF5 readers): for comparing parameters.
std::string attr_text(const AttrValue& v);

}  // namespace hs::cli
