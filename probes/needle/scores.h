// The needle scan's head scores: one registry. A score is a value of NeedleScore and one row of
// needle_scores() (probes/needle/scores.cpp): its name (the --score word, /scores/<name>, the
// per-trial dataset /retrieval/trials/<name>), its description (the attribute the file keeps), how a
// decode step scores a head and how the steps and trials reduce. Everything that handles "the scores
// this run computes" (the decode, the per-trial results, the summary, the file, the KV policies'
// orders, --order, --ablate-top, merge, the report) iterates over a NeedleScoreSet and reads the
// rows; nothing names a score by a bool or a string comparison. Adding a score: docs/architecture.md,
// "A needle score".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

enum class NeedleScore : int {
    kRetrieval = 0,  // Wu et al. 2024's copy-paste criterion
    kLocos = 1,      // LOCOS's logit contribution L+ - L-
    kR2 = 2,         // HeadKV's retrieval-reasoning score
};
constexpr int kNeedleScoreCount = 3;

// A set of scores, in registry order when listed.
struct NeedleScoreSet {
    uint32_t bits = 0;
    bool has(NeedleScore s) const { return (bits >> static_cast<int>(s)) & 1u; }
    void add(NeedleScore s) { bits |= 1u << static_cast<int>(s); }
    bool empty() const { return bits == 0; }
    std::vector<NeedleScore> list() const;
    bool operator==(const NeedleScoreSet& o) const { return bits == o.bits; }
};

struct NeedleScoreRow {
    NeedleScore id;
    const char* name;         // "retrieval", "locos", "r2"
    const char* description;  // /scores/<name> description attribute
    // (the per-step function, the reductions and the layout rows are added by scores.cpp's table)
};
const std::vector<NeedleScoreRow>& needle_scores();  // every score, in enum order
const NeedleScoreRow& needle_score(NeedleScore s);
const char* needle_score_name(NeedleScore s);
// "retrieval", "locos", "r2" -> the score; UsageError "unknown score 'x' (valid: retrieval, locos, r2)".
NeedleScore parse_needle_score(const std::string& name);
// "retrieval,locos" -> the set; UsageError for an unknown word or an empty list ("no score named ...").
NeedleScoreSet parse_needle_scores(const std::string& csv);
std::string needle_score_names();  // "retrieval, locos, r2" (messages and help)

}  // namespace hs
