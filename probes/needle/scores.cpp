// The needle scan's score registry (see scores.h): one row a score.
#include "scores.h"

#include "errors.h"
#include "needle_scoring.h"
#include "util.h"

#include <fmt/format.h>

namespace hs {

const std::vector<NeedleScoreRow>& needle_scores() {
    static const std::vector<NeedleScoreRow> rows = {
        {NeedleScore::kRetrieval, "retrieval",
         "Wu et al. 2024 copy criterion: per decode step, 1/|answer span| "
         "when the head's argmax key lies in the answer's tokens inside the "
         "needle and holds the generated token; summed over steps (a "
         "perfect copier scores 1 per trial), mean over passing trials",
         {{"retrieval", true}}, {{"credit", true}}, retrieval_step, retrieval_trial, NeedleReduction::kPassedMean,
         /*flags_heads=*/true, /*steps_need_needle=*/false},
        {NeedleScore::kLocos, "locos",
         "mean over answer steps of L+ - L-, phi_{t,j} = alpha_{t,j} u_y^T W_O^h v_j "
         "(raw unembedding row, no final norm); L+ over the needle, L- over "
         "the other keys the head can see times n/(K-n); mean over passing "
         "trials with an answer step",
         {{"locos", true}, {"lplus", false}, {"lminus", false}}, {{"lplus", true}, {"lminus", true}}, locos_step, locos_trial,
         NeedleReduction::kAnswerStepMean, /*flags_heads=*/false, /*steps_need_needle=*/true,
         /*needs_query_rows=*/false, /*step_reads_values=*/true},
        {NeedleScore::kR2, "r2",
         "HeadKV's retrieval-reasoning score (FYYFU/HeadKV "
         "retrieval_head_detection_r2.py lines 218-229): per decode step, "
         "(1/N) x the summed attention weights of the head's top N keys "
         "(N = |answer span|, ties: first indices) that lie in the answer's "
         "span, no copy condition; summed over the first |answer tokens| "
         "steps; mean over passing trials (the reference: qa_f1 > 50)",
         {{"r2", false}}, {{"r2", false}}, r2_step, r2_trial, NeedleReduction::kPassedMean,
         /*flags_heads=*/false, /*steps_need_needle=*/false},
        {NeedleScore::kQrhead, "qrhead",
         "QRHead's query-focused retrieval score (princeton-pli/QRHead "
         "attn_retriever.py lines 197-217, 301-312): the attention rows of the "
         "question's tokens (the template after the context) after the prefill, "
         "averaged over those tokens, minus the same rows with the question "
         "replaced by 'N/A'; over the needle's tokens, those above mean - 2 std "
         "summed; mean over the done trials (passing or not)",
         {{"qrhead", false}}, {}, qrhead_step, qrhead_trial, NeedleReduction::kDoneMean,
         /*flags_heads=*/false, /*steps_need_needle=*/false, /*needs_query_rows=*/true},
    };
    return rows;
}

const NeedleScoreRow& needle_score(NeedleScore s) { return needle_scores().at(static_cast<size_t>(s)); }

const char* needle_score_name(NeedleScore s) { return needle_score(s).name; }

bool needle_scores_read_values(NeedleScoreSet which) {
    for (auto s : which.list())
        if (needle_score(s).step_reads_values) return true;
    return false;
}

std::vector<NeedleScore> NeedleScoreSet::list() const {
    std::vector<NeedleScore> out;
    for (const auto& row : needle_scores())
        if (has(row.id)) out.push_back(row.id);
    return out;
}

std::string needle_score_names() {
    std::string out;
    for (const auto& row : needle_scores()) out += (out.empty() ? "" : ", ") + std::string(row.name);
    return out;
}

NeedleScore parse_needle_score(const std::string& name) {
    for (const auto& row : needle_scores())
        if (name == row.name) return row.id;
    throw UsageError(fmt::format("unknown score '{}' (valid: {})", name, needle_score_names()));
}

NeedleScoreSet parse_needle_scores(const std::string& csv) {
    NeedleScoreSet set;
    for (const auto& part : split(csv, ',')) {
        const auto word = trim(part);
        if (!word.empty()) set.add(parse_needle_score(word));
    }
    if (set.empty()) throw UsageError(fmt::format("no score named (valid: {})", needle_score_names()));
    return set;
}

}  // namespace hs
