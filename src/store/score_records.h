// The records of the commands that write one result in one pass, and their write functions: /meta
// (every command), the head probes' scores (`detect`), the weight probes' scores (`copy-suppression`,
// `dla`, `maps`, `qk-spectrum`, `successor`) and a patching table (`patch`). Each write function puts
// every dataset name and every attribute, description texts included, beside the path it writes
// (schema.h's builders), so a command fills a record of plain values and writes it; what a file
// holds is read here and in docs/hdf5-schema.md, never in tools/. Probe-specific texts that depend on
// a probe's parameters (a head probe's formula, the successor embedding's source representation)
// come from probes/ as values.
#pragma once

#include "schema.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hs::schema {

// ---- /meta: the model and the run every result file records (tools/common.cpp write_meta fills it)
struct MetaRecord {
    std::string tool_version, git_commit, command_line, utc_time;
    std::string model_path, weights_sha256;
    std::string model_format, hub_repo, hub_revision, hub_commit;  // "" when the model was named by a path
    std::string architecture, family;
    int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0, d_model = 0, d_head = 0, vocab_size = 0;
    std::string dtype, device;
    bool fused_attention = false;  // the fused kernel where nothing observes the pattern
    int64_t threads = 0, seed = 0;
    std::string study_config;  // --config's file as read ("": none, no attribute)
};
void write_run_meta(ResultWriter& w, const MetaRecord& m);

// ---- `detect`: /scores/<probe> of the head probes (probes/detect/attention_detectors.h)
// How the run's probes read their input: attributes every group of the run shares.
struct HeadProbeRun {
    bool stripe = true;                                              // [BOS, R, R] rows, else given sequences
    int64_t seq_len = 0, batch = 0, seed = 0, token_lo = 0, token_hi = 0;  // stripe
    int64_t n_sequences = 0;                                         // detector
    std::string source_file;                                         // detector
    std::string error_measure;                                       // detector: mul or abs
    bool exclude_bos = false, exclude_current_token = false;         // detector
};
struct HeadProbeRecord {
    std::string probe;
    std::string description;             // probe_description(p, stripe)
    int64_t L = 0, H = 0;
    std::vector<float> score;            // [L, H]
    int64_t n_samples = 0;
    std::vector<float> samples;          // [n_samples, L, H]; empty: not written
    std::optional<double> baseline_loss; // induction-loss: the loss with no head zeroed
    bool detector_options = false;       // the run's error measure and exclusions shaped this score
    // sink-rate: Gu et al.'s rates from the per-sequence alpha_0 (probes/detect SinkRates)
    struct SinkRates {
        double epsilon = 0, model_rate = 0;
        std::vector<float> head_rate;   // [L, H]
        std::vector<float> layer_rate;  // [L]
    };
    std::optional<SinkRates> sink;
};
// The group /scores/<probe> (replaced): score, samples, baseline, and the run's attributes.
void write_head_probe(ResultWriter& w, const HeadProbeRun& run, const HeadProbeRecord& r);

// ---- `copy-suppression`: /scores/copy-suppression
struct RankStatsRecord {
    std::vector<float> median, frac_rank0, frac_lt10, summary;  // [L, H] each
};
struct CopySuppressionRecord {
    int64_t L = 0, H = 0;
    int64_t block_size = 0, n_tokens = 0, seed = 0;
    RankStatsRecord ov, qk;
    std::vector<int32_t> scored_tokens;  // [n_tokens]
    // The dynamic score on a text (written when text_file is not empty).
    std::string text_file;
    double threshold = 0;
    int64_t n_windows = 0;
    std::vector<float> dynamic_frac_rank0, dynamic_n_pairs, dynamic_mean_effect;  // [L, H]
};
void write_copy_suppression(ResultWriter& w, const CopySuppressionRecord& r);

// ---- `dla`: /scores/dla (P prompts)
struct DlaRecord {
    int64_t L = 0, H = 0, P = 0;
    std::string prompts_file;
    std::vector<float> score;                   // [L, H] mean over prompts
    std::vector<float> per_prompt;              // [P, L, H]
    std::vector<float> mlp, attn_bias;          // [P, L]
    std::vector<float> embed, final_bias, logit_diff;  // [P]
    struct PerPosition {
        int64_t T = 0;
        std::vector<float> values;              // [L, H, T]
    };
    std::vector<PerPosition> per_position;      // prompt i's split by key position (--per-position), else empty
};
void write_dla(ResultWriter& w, const DlaRecord& r);

// ---- `maps`: /scores/maps/<relation> and the /scores/maps group
struct MapsRelationRecord {
    int64_t L = 0, H = 0, N = 0;                // N single-token pairs kept
    std::string relation, relation_file, category;
    int64_t k = 0, block_size = 0, n_pairs_total = 0, min_pairs = 0;
    std::vector<float> score;                   // [L, H]
    std::vector<float> suppression;             // [L, H]; empty: not scored
    std::vector<int64_t> target_rank;           // [L, H, N]
    std::vector<int32_t> source_tokens, target_tokens;  // [N]
    std::vector<float> dynamic;                 // [L, H]; empty: not scored
    std::vector<std::string> templates;         // the dynamic score's templates
    double static_dynamic_pearson = 0;          // with dynamic
};
void write_maps_relation(ResultWriter& w, const MapsRelationRecord& r);
struct MapsRunRecord {
    std::vector<std::string> relations, skipped;  // scored; too few single-token pairs
    int64_t min_pairs = 0;
};
void write_maps_run(ResultWriter& w, const MapsRunRecord& r);

// ---- `qk-spectrum`: /scores/qk_rank
struct QkRankRecord {
    int64_t L = 0, H = 0, S = 0;                // S singular values a head at most
    std::vector<float> effective_rank;          // [L, H]
    std::vector<float> singular_values;         // [L, H, S]
    // What the weights-only form means for this family (the rope, qk_norm and biases attributes).
    bool learned_positions = false;
    double rotary_pct = 1.0;
    bool qk_norm = false, qk_norm_full = false, gemma = false;
    bool attention_bias = false;
};
void write_qk_rank(ResultWriter& w, const QkRankRecord& r);

// ---- `successor`: /scores/successor (N scored pairs over the tasks kept)
struct SuccessorRecord {
    int64_t L = 0, H = 0, N = 0;
    std::string tasks_file;                     // "": the reference's default tasks
    struct Task {
        std::string name;
        std::string form;                       // "": skipped (no pair of single-token words)
        int64_t words = 0, single_tokens = 0;
        int64_t pairs = 0, skipped_pairs = 0;   // pairs dropped for a multi-token word
    };
    std::vector<Task> tasks;                    // every task, in order
    std::string embedding, source_representation, ties;
    double threshold = 0.4;
    std::vector<std::string> successor_heads;   // the heads above the threshold ("L1H7"), in (layer, head) order
    std::vector<float> score;                   // [L, H]
    std::vector<int32_t> successor_head;        // [L, H] 1 where score > threshold
    std::vector<float> task_score;              // [T, L, H], T the tasks kept
    std::vector<int64_t> successor_rank;        // [L, H, N]
    std::vector<int32_t> predicted;             // [L, H, N]
    std::vector<int32_t> source_tokens, target_tokens, task_index;  // [N]
};
void write_successor(ResultWriter& w, const SuccessorRecord& r);

// ---- `patch`: the attributes of /patching/<name> (the datasets are PatchingRecord's)
struct PatchingRun {
    std::string metric, pairs;
    int64_t n_pairs = 0;
    bool path = false;                          // path patching, else the head table
    int64_t forwards = 0;
    // the head table
    std::string method, what, positions;        // exact or attribution; the site; all or each
    bool kv_units = false;                      // the site is per key/value head
    double seconds = 0;
};
// `p` with its attributes from `run`, written (an existing group of that name is replaced).
void write_patching_run(ResultWriter& w, PatchingRecord p, const PatchingRun& run);

// ---- `fv-heads`: function-vector heads as a patching group (scores = the AIE [L, H]) with the
// prompts it drew, so that a file can be recomputed by another implementation (tests/fv_check.py)
struct FvHeadsRun {
    std::string task;                           // the task file
    int64_t n_shots = 0, n_trials = 0;
    uint64_t seed = 0;
    double test_split = 0;
    std::string input_prefix, output_prefix, input_sep, output_sep;
    bool prepend_space = true;
    double top1_clean = 0;
    int64_t forwards = 0;
    double seconds = 0;
};
struct FvPromptsRecord {
    std::vector<int64_t> clean_shape, corrupt_shape;              // [N, T]
    std::vector<int32_t> clean_tokens, corrupt_tokens;            // right-padded with 0
    std::vector<int32_t> clean_lengths, corrupt_lengths, clean_answer, corrupt_answer;  // [N]
};
void write_fv_heads(ResultWriter& w, PatchingRecord p, const FvHeadsRun& run, const FvPromptsRecord& prompts);
// Several tasks: their mean AIE as one more group (Todd et al. pick heads by the AIE averaged over
// tasks); `groups` names each task's group, written with write_fv_heads.
void write_fv_heads_mean(ResultWriter& w, PatchingRecord p, const std::vector<std::string>& tasks,
                         const std::vector<std::string>& groups);

}  // namespace hs::schema
