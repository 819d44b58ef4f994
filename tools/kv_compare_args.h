// `retrieval --kv-compare`: the flags into the comparison's spec before the scan (every file read, every
// value checked, a resumed comparison's state read, before anything is written; the policies and their
// needs from the registry, probes/needle/kv/kv_policy.h), and after it the comparison run as a
// resumable job, written through the schema to /retrieval/kv_compare (docs/hdf5-schema.md) and printed.
#pragma once

#include "kv_policy.h"
#include "needle_results.h"
#include "scores.h"

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace hs::cli {

inline constexpr const char* kDefaultBudgets = "0.1,0.25,0.5,0.75,1";

struct KvCompareArgs {
    std::string policies;  // --kv-compare: empty = off
    std::string budgets;     // --kv-budgets; empty: kDefaultBudgets unless --kv-capacity is given
    std::string capacities;  // --kv-capacity: tokens per query head
    std::string score = "r2";      // --kv-score: HeadKV's importance
    std::string duo_gates;         // --duo-gates FILE.h5:DATASET
    std::string duo_window = "64,256";
    std::string duo_select = "sparsity";  // --duo-select: the reference's sparsity quantile, or budget
    std::string razor_window;  // empty: golden-stick's, 4,251 with the mean token, 4,252 without (256 in all)
    bool razor_no_compensate = false;
    int64_t snap_window = 8, snap_kernel = 7;
    double beta = 1.5, temp = 1.0;
    std::string compress_at = "prompt";  // or "question", "tail", "tail:N"
    bool on() const { return !policies.empty(); }
};

void add_kv_compare_args(CLI::App* sub, KvCompareArgs& a);

// The comparison's spec before the scan: files read, flags parsed; scores of this run left undefined
// (filled by run_kv_compare_args). UsageError (exit 2) naming the flag for a bad value, an unknown
// policy, a score this run does not compute (`run`: the scores this run's scan computes), a budget
// outside (0, 1], a capacity not a whole number >= 1 (or not above SnapKV's window when snapkv or headkv
// is listed); the file errors of read_head_score (a missing file or dataset, a score of another
// shape: another model).
struct KvComparePlan {
    KvCompareSpec spec;
    std::vector<std::optional<NeedleScore>> run_scores;  // per policy: the scan's score it takes, if any
    KvCompareJob job;  // checkpoints and a resumed state (prepare_kv_compare)
};
// razor_preset (--razor-preset): how razor's order is found (probes/needle/kv/razor.h).
KvComparePlan plan_kv_compare(const KvCompareArgs& a, const Model& m, const NeedleScoreSet& run, int64_t random_orders,
                              int64_t sweep_rows, uint64_t seed, const std::string& razor_preset);

// Before the scan, the test built: the question's tokens (--kv-compress-at question), the checkpoints
// (job: the scan's --checkpoint-seconds), and with `resume` what a killed run of this comparison left
// in job.out, read now (the scan rewrites /retrieval); its StorageError for another comparison carries
// param "resume" (the command adds how to start over).
void prepare_kv_compare(KvComparePlan* plan, const NeedleTest& test, const Model& m, const Tokenizer& tok, const KvCompareArgs& a,
                        KvCompareJob job, bool resume);

// After the scan: fills the run's scores from `sum`, runs the comparison (checkpoints of its partial
// state in `out`), replaces /retrieval/kv_compare in `out` with its table and prints it.
void run_kv_compare_args(KvComparePlan plan, const NeedleTest& test, const Model& m, const NeedleSummary& sum,
                         const std::string& out);

}  // namespace hs::cli
