// The needle scan's head scores: one registry. A score is a value of NeedleScore and one row of
// needle_scores() (probes/needle/scores.cpp): its name (the --score word, /scores/<name>, the
// per-trial dataset /retrieval/trials/<name>), its description (the attribute the file keeps), how a
// decode step scores a head (the step function, probes/needle/needle_scoring.cpp), how a trial's
// steps reduce (the trial function) and how the done trials reduce (NeedleReduction). Everything that
// handles "the scores this run computes" (the decode, the per-trial results, the summary, the file,
// the KV policies' orders, --order, --ablate-top, merge, the report) iterates over a NeedleScoreSet
// and reads the rows; nothing names a score by a bool or a string comparison. Adding a score:
// docs/architecture.md, "A needle score".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hs {

enum class NeedleScore : int {
    kRetrieval = 0,  // Wu et al. 2024's copy-paste criterion
    kLocos = 1,      // LOCOS's logit contribution L+ - L-
    kR2 = 2,         // HeadKV's retrieval-reasoning score
    kQrhead = 3,     // QRHead's query-focused retrieval score (the question's calibrated attention to the needle)
};
constexpr int kNeedleScoreCount = 4;

// A set of scores, in registry order when listed.
struct NeedleScoreSet {
    uint32_t bits = 0;
    bool has(NeedleScore s) const { return (bits >> static_cast<int>(s)) & 1u; }
    void add(NeedleScore s) { bits |= 1u << static_cast<int>(s); }
    bool empty() const { return bits == 0; }
    std::vector<NeedleScore> list() const;
    bool operator==(const NeedleScoreSet& o) const { return bits == o.bits; }
    static NeedleScoreSet all() { return NeedleScoreSet{(1u << kNeedleScoreCount) - 1}; }
};

// One array a score keeps per trial (/retrieval/trials/<name>) or per trial and step
// (/retrieval/steps/<name>). in_every_file false: the array came after files were written (a file
// without it reads back as NaN, and --resume and merge still take it).
struct NeedleArrayName {
    const char* name;
    bool in_every_file;
};

// How the summary reduces the done trials' score array (the score's first trial array) to [L, H].
enum class NeedleReduction {
    kPassedMean,      // mean over the passing trials (n_trials_scored: the passing trials)
    kAnswerStepMean,  // mean over the passing trials with an answer step, with bootstrap intervals
                      // (/scores/<name>/ci_low, ci_high; n_trials_scored: those trials)
    kDoneMean,        // mean over the done trials whose array is a number (QRHead: passing or not; NaN where
                      // the needle's span was not found or the score was not asked for)
};

// What one layer's decode step hands a step function: the batch rows it scores (needle_scoring.h).
struct NeedleStepInput;
// What a trial's decode hands a trial function (needle_scoring.h).
struct NeedleTrialSteps;
// One decode step on one layer, for the R scored rows of a batch at once -> their step arrays,
// [R, H] double on the CPU each.
using NeedleStepFn = std::vector<at::Tensor> (*)(const NeedleStepInput&);
// A trial's steps -> the row's trial arrays, [L, H] double each.
using NeedleTrialFn = std::vector<at::Tensor> (*)(const NeedleTrialSteps&);

struct NeedleScoreRow {
    NeedleScore id;
    const char* name;         // "retrieval", "locos", "r2", "qrhead"
    const char* description;  // /scores/<name> description attribute
    // Per trial, [N, L, H]: the score's own array first (named as the score), then its parts
    // (LOCOS: lplus, lminus). Every score's arrays are kept; a score --score does not name is not
    // computed (its step function never runs) and its arrays are NaN.
    std::vector<NeedleArrayName> trial_arrays;
    // Per trial and step, [N, steps, L, H] (--dump-steps), NaN past a trial's end.
    std::vector<NeedleArrayName> step_arrays;
    NeedleStepFn step;
    NeedleTrialFn trial;
    NeedleReduction reduction;
    bool flags_heads;        // its summary names the heads above --flag-threshold (the flagged attribute)
    bool steps_need_needle;  // its kept steps are NaN where the needle's span was not found
    // The trial function reads the question's calibrated attention rows after the prefill
    // (NeedleTrialSteps::query_cal: QRHead), which the scan computes only when --score asks for it.
    bool needs_query_rows = false;
    // Its step function reads the values (NeedleStepInput::v, the attn.v capture: LOCOS's value
    // products). A decode whose scores read none captures no values, and its rows then read their
    // trials' prompt caches where they are (needle_decode.h, DecodeSettings::share_prompt).
    bool step_reads_values = false;
};
// Whether any score of `which` reads the values a step (NeedleScoreRow::step_reads_values).
bool needle_scores_read_values(NeedleScoreSet which);
const std::vector<NeedleScoreRow>& needle_scores();  // every score, in enum order
const NeedleScoreRow& needle_score(NeedleScore s);
const char* needle_score_name(NeedleScore s);
// "retrieval", "locos", "r2" -> the score; UsageError "unknown score 'x' (valid: retrieval, locos, r2, qrhead)".
NeedleScore parse_needle_score(const std::string& name);
// "retrieval,locos" -> the set (words trimmed, empty words skipped); UsageError for an unknown word
// or an empty list ("no score named (valid: retrieval, locos, r2, qrhead)").
NeedleScoreSet parse_needle_scores(const std::string& csv);
std::string needle_score_names();  // "retrieval, locos, r2, qrhead" (messages and help)

// Per-score arrays indexed [score][part], the parts in the row's trial_arrays or step_arrays order:
// what a decode step, a trial and the scan's results hold for every score of the registry.
template <class T>
using PerNeedleScore = std::vector<std::vector<T>>;
template <class T>
PerNeedleScore<T> per_needle_score_trials() {  // sized as the rows' trial arrays
    PerNeedleScore<T> v;
    for (const auto& row : needle_scores()) v.emplace_back(row.trial_arrays.size());
    return v;
}
template <class T>
PerNeedleScore<T> per_needle_score_steps() {  // sized as the rows' step arrays
    PerNeedleScore<T> v;
    for (const auto& row : needle_scores()) v.emplace_back(row.step_arrays.size());
    return v;
}

}  // namespace hs
