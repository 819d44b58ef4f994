// `retrieval --kv-compare`: the flags, their checks before the scan (every file read, every value
// checked, before anything is written) and the comparison after it (probes/needle/kv/kv_policy.h), written to
// /retrieval/kv_compare (docs/hdf5-schema.md) and printed.
#pragma once

#include "kv_policy.h"
#include "needle_results.h"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace hs::cli {

struct KvCompareArgs {
    std::string policies;  // --kv-compare: empty = off
    std::string budgets = "0.1,0.25,0.5,0.75,1";
    std::string score = "r2";      // --kv-score: HeadKV's importance
    std::string duo_gates;         // --duo-gates FILE.h5:DATASET
    std::string duo_window = "64,256";
    std::string razor_window = "4,251";
    bool razor_no_compensate = false;
    int64_t snap_window = 8, snap_kernel = 7;
    double beta = 1.5, temp = 1.0;
    std::string compress_at = "prompt";  // or "question"
    bool on() const { return !policies.empty(); }
};

void add_kv_compare_args(CLI::App* sub, KvCompareArgs& a);

// What this run's scan computes, for scores named after it (locos, retrieval, r2).
struct RunScores {
    bool ret = false, locos = false, r2 = false;
};

// The comparison's spec before the scan: files read, flags parsed; scores of this run left undefined
// (filled by run_kv_compare_args). UsageError (exit 2) naming the flag for a bad value, an unknown
// policy, a score this run does not compute, a budget outside (0, 1]; the file errors of
// read_head_score (a missing file or dataset, a score of another shape: another model).
struct KvComparePlan {
    KvCompareSpec spec;
    std::vector<std::string> run_scores;  // per policy: "locos" / "retrieval" / "r2" to take from the scan, or ""
};
// razor_preset (--razor-preset): how razor's order is found (probes/needle/kv/razor.h).
KvComparePlan plan_kv_compare(const KvCompareArgs& a, const Model& m, const RunScores& run, int64_t random_orders,
                              int64_t sweep_rows, uint64_t seed, const std::string& razor_preset);

// After the scan: fills the run's scores from `sum`, runs the comparison, appends /retrieval/kv_compare
// to `out` and prints the table.
void run_kv_compare_args(KvComparePlan plan, const NeedleTest& test, const Model& m, const Tokenizer& tok,
                         const NeedleSummary& sum, const std::string& out, const KvCompareArgs& a);

}  // namespace hs::cli
