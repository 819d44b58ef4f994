// The needle scan's static file parts (docs/hdf5-schema.md, "Needle in a haystack"): the trials'
// prompts and spans, the run's parameters, the score groups' and the ablation's attributes, the
// decoding pass (/retrieval/decoding) and the stream sweep's attributes, each with its description
// text beside its path. The per-trial results are schema::NeedleRecord (schema.h); the needle study
// (probes/needle/needle_study.h) fills these records from its trials and spec.
#pragma once

#include "store.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hs::schema {

// A grid's trials: prompts (-1 padded), needle and answer spans (-1 where a search found none),
// length, depth and needle index.
struct NeedleTrialsRecord {
    std::vector<std::vector<int64_t>> prompts;
    std::vector<int64_t> needle_start, needle_end, answer_start, answer_end, length, needle;
    std::vector<double> depth;
};
// Into `group` (/retrieval/trials, /retrieval/ablation/trials).
void write_trial_arrays(ResultWriter& w, const std::string& group, const NeedleTrialsRecord& t);

// The scan's parameters as /retrieval records them (and --resume compares).
struct NeedleParamsRecord {
    std::string haystack_file, needles_file, haystack_sha256, needles_sha256, tmpl;
    std::vector<int64_t> lengths;
    std::vector<double> depths;
    int64_t max_new_tokens = 0, prefill_chunk = 0, batch = 0, bootstrap = 0, seed = 0, n_trials = 0;
    double pass_threshold = 0, flag_threshold = 0;
    std::string stop, ablation_scope, scores;
    bool prefix_reuse = true;
    // The protocol and every choice it resolved to (recorded when named or not headscope).
    bool with_protocol = false;
    std::string protocol, assembly, ablation_assembly, ablation_template, insertion, answer_span, stop_order,
        haystack_format, haystack_repeat, rng;
    int64_t buffer = 0, ablation_max_new_tokens = 0;
    std::vector<int64_t> stop_ids;  // empty: "none"
};
Attrs needle_params(const NeedleParamsRecord& p);

// One needle score's /scores/<name> group: its name and description.
struct NeedleScoreAttrs {
    std::string name, description;
    bool with_ci = false;  // LOCOS: the bootstrap's resamples, seed and interval rule
};
// The parts of the file that do not depend on the trials' results: the score groups' attributes
// (with the run's parameters), the trials' prompts and spans, the parameters, /retrieval/trials'
// attributes.
void write_needle_static(ResultWriter& w, const std::vector<NeedleScoreAttrs>& groups, const NeedleTrialsRecord& trials,
                         const Attrs& params, int64_t bootstrap, int64_t seed);
// /retrieval's job attributes: a run's shard (jobs::shard_attrs: "I/N", index, count, whether every
// owned item is done) or a merge's (jobs::merged_attrs).
void write_needle_job(ResultWriter& w, const Attrs& job);

// /retrieval/ablation's attributes (and its trials, query_mean where the ablation has them).
struct NeedleAblationRecord {
    std::string ablation, source, scope;
    std::vector<std::string> heads;  // per set
    int64_t random_controls = 0, distinct_controls_possible = 0, control_seed = 0;
    bool separate_trials = false;  // the ablation passes decode prompts of their own
    int64_t baseline_set = 0;
    NeedleTrialsRecord trials;
    bool stream = false;
    std::vector<int64_t> window;  // sink, recent, compensate
    bool mean_query = false;
    int64_t calibration_trials = 0, calibration_seed = 0;
    std::vector<int64_t> calibration_trial_indices;
    bool reference_rng = false;
    std::vector<float> query_mean;  // [L, H, d_head]
    int64_t L = 0, H = 0, d_head = 0;
};
void write_needle_ablation(ResultWriter& w, const NeedleAblationRecord& a);

// /retrieval/decoding: per set (0 = the named heads, 1.. random controls) and trial, the combined
// output's ROUGE, the pass flag and the answer's first-token margins.
struct NeedleDecodingRecord {
    int64_t S = 0, N = 0;
    std::vector<double> rouge1_recall, rougeL_f, answer_margin, base_margin;  // [S, N]
    std::vector<int64_t> passed;                                             // [S, N]
    std::string rule;
    std::vector<std::string> sets;
    int64_t control_seed = 0;
    bool decore = false;
    std::string alpha;  // decore: "entropy" or the number
    double alpha_max = 0;
    std::string enhance, suppress;  // juice
    double alpha_enhance = 0, alpha_suppress = 0;
};
void write_decoding(ResultWriter& w, const NeedleDecodingRecord& d);

// The stream sweep's attributes (/retrieval/streaming, StreamingRecord::attrs).
struct StreamSweepParams {
    int64_t sink = 0, recent = 0, random_orders = 0, sweep_rows = 0, seed = 0;
    bool compensate = false;
    std::string order_source, scope;
    double baseline_accuracy = 0, baseline_rougeL_f = 0;
};
Attrs stream_sweep_attrs(const StreamSweepParams& p);

}  // namespace hs::schema
