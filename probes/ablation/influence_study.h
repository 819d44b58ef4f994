// AttentionInfluence as a resumable job (`headscope influence`; its file: docs/hdf5-schema.md,
// "AttentionInfluence"): the corpus cut into chunks of samples, chunk k the job's item k (so a shard,
// a resumed run and the whole run compute each sample in the same forwards, hence to the same bits),
// the ranking and selection over the samples done, what a resumed file already holds, the file's
// record, and the merge of a sharded run's files. The command turns flags into the spec, checks a
// resumed file's identity (difference()), calls this with the job runner (src/jobs/jobs.h: the shard,
// the checkpoint), writes the record and prints. The method itself: influence.h.
#pragma once

#include "ablation_records.h"
#include "influence.h"
#include "influence_detect.h"
#include "jobs.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hs {

struct InfluenceStudySpec {
    std::string corpus_path;                // the JSONL file (its name and sha256 are attributes)
    std::vector<CorpusSample> corpus;       // read_corpus's samples, cut to max_tokens
    std::vector<std::vector<Head>> sets;    // set 0 the named heads, then the random controls
    std::string heads_source;               // how set 0 was chosen (an attribute)
    int64_t distinct_controls_possible = 0; // random_head_sets' count (an attribute)
    int64_t control_seed = 0, max_tokens = 0;
    int64_t max_rows = 8;                   // rows a forward (samples x sets)
    bool last_only = false;                 // the last token's loss alone, not every token's
    Intervention masking = Intervention::kZeroQuery;  // how a head is masked (influence_maskings())
    int64_t chunk = 64;                     // samples a work item
    double select_fraction = 0.2;           // the top share of the done samples marked selected,
    SelectBy select_by = SelectBy::kSamples; // counted in samples (the paper's top 20%) or tokens
    jobs::Shard shard;
    // --detect: set 0 is detection->heads, found on detect_task with top_share (influence_detect.h);
    // the file keeps the score and the task's parameters, and a resume or merge compares them.
    std::optional<RetrievalDetection> detection;
    KeyValueTask detect_task;
    double top_share = 0;
};

class InfluenceStudy {
public:
    // The file's record with nothing done (NaN losses; lines, previews, masks, attributes); hashes the
    // corpus file. The model must outlive the study.
    InfluenceStudy(InfluenceStudySpec spec, const Model& m);

    // "" when `r` holds this job's /influence (the same work, shard and model), else the first that
    // differs, in that order: "NAME: STORED vs NOW" (values cut to 60 characters), the shard's or the
    // model's words, or the shapes ("N samples x S sets vs N x S"). StorageError naming the file when
    // /influence is absent or damaged.
    std::string difference(const ResultReader& r) const;
    // --resume: the chunks `r` holds whole are copied, not run. The caller has checked difference().
    void resume(const ResultReader& r);
    // Every chunk the shard owns: copied from the resumed file or run, a progress bar over the owned
    // samples, the checkpoint consulted after each. Returns the forwards run.
    int64_t run(jobs::Checkpoint& checkpoint);
    // The file's record as it stands: ranked and selected over the samples done, the shard's attributes
    // (complete once run() has finished) and the forwards.
    const schema::InfluenceRecord& record();

    int64_t n_chunks() const;
    int64_t owned_samples() const;  // in the chunks the shard owns
    const InfluenceStudySpec& spec() const { return spec_; }

private:
    InfluenceStudySpec spec_;
    const Model& m_;
    schema::InfluenceRecord x_;
    std::optional<schema::InfluenceRecord> prev_;  // the resumed file's
    int64_t forwards_ = 0;
    bool finished_ = false;
};

// `headscope merge` of a sharded influence run: each sample from the first shard that computed it,
// the ranking and selection recomputed over them. Shards are added in order; the caller refuses an
// incomplete shard or missing samples in its own words (partial merges allowed) before record().
class InfluenceMerge {
public:
    explicit InfluenceMerge(const ResultReader& first);
    // Checks `r` is a shard of the first's job (StorageError naming it and what differs, or that it is
    // merged already, of another shard count, or given twice) and takes its samples. Returns its
    // shard attributes.
    schema::InfluenceShardInfo add(const ResultReader& r);
    // The samples in none of the shards added.
    int64_t missing() const;
    // The merged record: ranked and selected (the first shard's select_fraction and select_by:
    // StorageError when it has no fraction or an unknown select_by), the merge's shard attributes
    // (jobs::merged_attrs).
    schema::InfluenceRecord record(const std::vector<std::string>& inputs);

private:
    const ResultReader& first_;
    schema::InfluenceRecord all_;
    std::vector<bool> seen_;
};

}  // namespace hs
