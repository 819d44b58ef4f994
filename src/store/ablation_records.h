// The files of the ablation engine's studies (docs/hdf5-schema.md, "Ablation experiments" and
// "AttentionInfluence"): a `headscope run` file whole as plain records (probes/ablation/ablation_study.h
// fills them), written in one order, /influence's attributes (probes/ablation/influence_study.h), and
// every description attribute those groups carry, beside the schema's paths rather than in the
// studies and commands that fill the records.
#pragma once

#include "experiment.h"
#include "schema.h"

#include <optional>
#include <string>
#include <vector>

namespace hs::schema {

// One study's groups: /ablation/<study> and its sweep's own (juice, gates, duo), attributes included.
struct AblationStudyFile {
    StudyRecord study;
    std::optional<JuiceRecord> juice;  // scale-grid
    std::optional<GatesRecord> gates;  // gating
    std::optional<DuoRecord> duo;      // duo-gates
};
// A `headscope run` file less /meta: /experiment, /data/<name>, /scores/<probe>, /ablation/<study>.
struct AblationRunFile {
    Attrs experiment;
    std::vector<DataRecord> data;
    std::vector<ScoreGroup> probes;
    std::vector<AblationStudyFile> studies;
};
// Writes it into w (after the caller's /meta), in the order the file has always been written.
void write_ablation_run(ResultWriter& w, const AblationRunFile& f);
// `merge`: marks a merged study's group (its shard attribute "merged").
void mark_study_merged(ResultWriter& w, const std::string& study_name);

// /ablation/<study>'s attributes: the spec, and each sweep's own settings.
Attrs study_attrs(const StudySpec& s, int64_t n_configurations, const std::string& shard, int64_t resample_seed);
// What a study's metric measures, in words (its metric_description attribute).
std::string metric_description(const MetricSpec& m);
// The attributes of /ablation/<study>/gates, /duo (with the fit's distillation losses) and /juice.
Attrs gates_attrs(const StudySpec& s);
// What a duo-gates study's fit and deployment give beside its spec (duo_attrs).
struct DuoFitFacts {
    double distill_full = 0, distill_stream = 0, distill_final = 0;  // the distillation losses at alpha = 1, 0, fitted
    double deploy_threshold = 0;     // what the gates were compared with (the quantile, 2 / -1; or the threshold)
    double deploy_streamed = 0;      // the share of KV heads streamed (the reference's returned sparsity)
    int64_t deploy_noise_seed = -1;  // the quantile's tie-noise seed (select sparsity)
    int64_t fresh_seed = -1;         // fit_data fresh: step s draws from seed fresh_seed + s
};
Attrs duo_attrs(const StudySpec& s, const DuoFitFacts& f);
Attrs juice_attrs();

// ---- AttentionInfluence: /influence's attributes (probes/ablation/influence_study.h fills them).
// What defines an influence job, and where its head sets came from.
struct InfluenceParams {
    std::string corpus, corpus_sha256;       // the JSONL file and its contents' hash
    std::vector<std::string> heads;          // each set's heads ("L1H0,L1H3"): the named ones, then the controls
    std::string heads_source;                // how set 0 was chosen ("--heads ...", "top K of FILE:DATASET")
    int64_t distinct_controls_possible = 0;  // random_head_sets' count of distinct control sets
    int64_t control_seed = 0, max_tokens = 0, n_truncated = 0, max_rows = 0, chunk = 0;
    bool last_only = false;                  // loss_tokens "last" (the last token alone), else "all"
    std::string masking;                     // the intervention's name: "zero-query" or "zero"
    double select_fraction = 0;
    std::string select_by;                   // "tokens" or "samples": what the fraction counts
    // --detect: set 0 is the top share of the retrieval score on the key -> value task
    // (probes/ablation/influence_detect.h); false: --heads or --from.
    bool detect = false;
    double top_share = 0;
    std::string detect_format, detect_values;  // "json" or "toy-recall"; where the values' words come from
    int64_t detect_trials = 0, detect_length = 0, detect_shots = 0, detect_seed = 0;
    int64_t detect_passed = 0, detect_max_prompt = 0, detect_min_pairs = 0, detect_max_pairs = 0, detect_max_new_tokens = 0;
};
// /influence's attributes for them, the descriptions included (the shard's, the ranking's counts and
// the forwards are added as the job runs).
Attrs influence_attrs(const InfluenceParams& p);
// /influence's description attributes (masking_description, loss, score) for the masking's name
// ("zero-query", "zero"); last_only: --loss-tokens last.
Attrs influence_descriptions(const std::string& masking, bool last_only);
// The attributes two files of one influence job agree on (a resume and a merge compare them), in the
// order a difference is reported.
const std::vector<std::string>& influence_identity_keys();
// The ranking's counts (n_selected, n_done, tokens_selected, tokens_done), recomputed by every write
// and by a merge.
Attrs influence_ranking_attrs(int64_t n_selected, int64_t n_done, int64_t tokens_selected, int64_t tokens_done);
// The forward passes this run made (a merge keeps the first shard's).
Attrs influence_run_attrs(int64_t forwards);
// A stored /influence's shard attributes (jobs::shard_attrs, jobs::merged_attrs) as a merge reads them:
// the "I/N" text ("merged" for a merged file), the index and count (nullopt when absent or not
// integers), complete.
struct InfluenceShardInfo {
    std::string shard;
    std::optional<int64_t> index, count;
    bool complete = false;
};
InfluenceShardInfo influence_shard_info(const Attrs& a);
// Its select_fraction (nullopt when absent: a damaged file).
std::optional<double> influence_select_fraction(const Attrs& a);
// Its select_by ("samples" for a file written before the attribute existed, which selected by samples).
std::string influence_select_by(const Attrs& a);

}  // namespace hs::schema
