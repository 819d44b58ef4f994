// The head atlas (`headscope atlas MODEL`): every cheap per-head score the model allows, side by
// side, computed by the probes that own them (nothing recomputed here): the attention-pattern
// detectors on [BOS, R, R] rows (induction, previous-token, duplicate-token, Gu et al.'s sink rate:
// probes/detect), and from the weights successor heads (with a tokenizer whose words make at least
// one task), copy suppression's OV rank-0 share, the effective QK rank, and MAPS on relation files
// when asked (probes/weights). Each score is a column [L, H]; a column with a threshold gives heads a
// role (the score above it: the method's own threshold, or one the caller sets); the atlas keeps the
// columns' Spearman correlations over heads and each head's roles.
#pragma once

#include "atlas_records.h"
#include "attention_detectors.h"
#include "copy_suppression.h"
#include "model.h"
#include "needle_study.h"

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

struct AtlasSpec {
    StripeInput stripe;              // the detectors' [BOS, R, R] rows
    double sink_epsilon = 0.3;       // sink-rate's epsilon, also the sink role's threshold
    int64_t max_rows = 64;
    CopySuppressionOptions copy_suppression{2048, 2048, 0};  // n_tokens: source tokens scored (0: all)
    std::string maps_relations;      // "": no MAPS; else read_relations' spec
    std::map<std::string, double> thresholds;  // a column's role threshold, set or replaced by the caller
    // On request (`atlas --needle`): the needle scan's scores on a short grid, the retrieval score
    // (Wu et al.; role above the spec's flag_threshold, Wu's 0.1) and QRHead's, from one scored pass
    // of the spec's trials (no ablation, nothing written but the atlas's columns).
    std::optional<NeedleStudySpec> needle;
};

// One score of the atlas: its values [L, H], where it comes from, and its role.
struct AtlasColumn {
    std::string name;         // "induction", "sink-rate", "successor", "copy-suppression", "qk-rank", "maps/<relation>"
    std::string source;       // the method and its reference, in words
    at::Tensor score;         // [L, H] float32
    std::string role;         // the role a head above the threshold takes ("" with no threshold)
    double threshold = NAN;   // NaN: no role
    std::string threshold_source;  // where the threshold comes from
};

struct AtlasResult {
    std::vector<AtlasColumn> columns;
    at::Tensor correlation;            // [S, S] float32: Spearman's rho over the L*H heads (NaN: a constant column)
    at::Tensor roles;                  // [S, L, H] uint8: 1 where the head's score > the column's threshold
    at::Tensor n_roles;                // [L, H] int64
    std::vector<std::string> skipped;  // "successor: ..." a method the model does not allow, and why
    std::vector<ProbeScores> probes;   // the detectors' full results (samples, sink rates)
    double model_sink_rate = NAN;      // Gu et al.'s model rate (sink-rate's rates)
    int64_t seq_len = 0;               // |R| of the detectors' rows (cut to the context)
    int64_t cs_tokens = 0;             // copy suppression's scored source tokens
    int64_t needle_trials = 0, needle_passed = 0;  // the needle columns' trials (0: none asked)
};

// The methods' own thresholds (docs/methods.md, "The head atlas"): induction, previous-token and
// duplicate-token 0.4 (ARENA's detectors), sink-rate epsilon, successor 0.4 (kSuccessorThreshold).
// UsageError naming the column for a threshold of a column the atlas does not have.
AtlasResult run_atlas(const Model& m, const Tokenizer* tok, const AtlasSpec& spec);

// The file's record (src/store/atlas_records.h): the columns, their roles and correlations.
schema::AtlasRecord atlas_record(const AtlasResult& r, const AtlasSpec& spec);

// Spearman's rho of two equally long vectors (average ranks for ties; NaN when either is constant
// or holds a NaN).
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace hs
