// The files of the ablation engine's studies (docs/hdf5-schema.md, "Ablation experiments" and
// "AttentionInfluence"): a `headscope run` file whole as plain records (probes/ablation/ablation_study.h
// fills them), written in one order, and every description attribute those groups carry, beside the
// schema's paths rather than in the commands that fill the records.
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
Attrs duo_attrs(const StudySpec& s, double distill_full, double distill_stream, double distill_final);
Attrs juice_attrs();

// /influence's description attributes (masking, loss, score); last_only: --loss-tokens last.
Attrs influence_descriptions(bool last_only);

}  // namespace hs::schema
