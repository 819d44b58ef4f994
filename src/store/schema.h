// The HDF5 layout in one place, as llama.cpp keeps its tensor-name table: every group and dataset a
// result file holds (layout(), in docs/hdf5-schema.md's words; tests/test_schema.cpp checks the two
// agree both ways), the path builders every other file uses, and for each result type one struct
// with one write and one read function. A path built here must match a layout() pattern (HS_REQUIRE:
// writing a name the schema does not know is a bug), so a new dataset is added here and in the doc.
//
// The needle scan's per-trial results are a record here too (NeedleRecord); its static parts (the
// trials' prompts and spans, the run's parameters) are needle_records.h's. The records of the
// single-pass probes are score_records.h's, those of `run` and influence ablation_records.h's.
#pragma once

#include "store.h"

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace hs::schema {

// ---- the layout

// One path of the layout: placeholders in angle brackets stand for one name each (<probe>,
// <relation>, <name>, <study>, <i>). kGroup entries carry attributes (and are listed where the doc
// lists them: /meta, /experiment, ...); kDataset entries are datasets.
struct PathEntry {
    enum class Kind { kGroup, kDataset };
    const char* pattern;
    Kind kind;
    const char* result;  // the result type: meta, scores, inputs, logits, retrieval, streaming, study, data, gates, duo, juice, patching, influence
};
const std::vector<PathEntry>& layout();
// `path` as one of layout()'s patterns (a placeholder matches one name: no '/'; <probe> of a
// dataset also matches "maps/<relation>"-style nesting only where the layout lists it).
bool in_layout(const std::string& path);

// ---- path builders (each checks its result against layout())

std::string meta();                                                   // /meta
std::string scores_root();                                            // /scores
std::string scores(const std::string& probe);                         // /scores/<probe>
std::string scores(const std::string& probe, const std::string& ds);  // /scores/<probe>/<ds>
std::string maps_root();                                              // /scores/maps
std::string inputs(const std::string& probe);                         // /inputs/<probe>
std::string input_tokens(const std::string& probe);                   // /inputs/<probe>/tokens
std::string logits();                                                 // /logits
std::string logit_tokens();                                           // /tokens
std::string experiment();                                             // /experiment
std::string data(const std::string& name);                            // /data/<name>
std::string data(const std::string& name, const std::string& ds);     // /data/<name>/<ds>
std::string ablation_root();                                          // /ablation
std::string study(const std::string& name);                           // /ablation/<study>
std::string study(const std::string& name, const std::string& ds);    // /ablation/<study>/<ds> (gates/g0, duo/alpha, ...)
std::string patching_root();                                          // /patching
std::string patching(const std::string& name);                        // /patching/<name>
std::string patching(const std::string& name, const std::string& ds); // /patching/<name>/<ds>
// The needle scan (docs/hdf5-schema.md, "Needle in a haystack").
std::string retrieval();                                          // /retrieval
std::string retrieval_trials(const std::string& ds = {});         // /retrieval/trials[/<ds>]
std::string retrieval_ablation(const std::string& ds = {});       // /retrieval/ablation[/<ds>]
std::string retrieval_decoding(const std::string& ds = {});       // /retrieval/decoding[/<ds>]
std::string retrieval_streaming(const std::string& ds = {});      // /retrieval/streaming[/<ds>]
std::string retrieval_kv_compare(const std::string& ds = {});     // /retrieval/kv_compare[/<ds>]
std::string retrieval_steps(const std::string& ds = {});          // /retrieval/steps[/<ds>]
std::string influence(const std::string& ds = {});                // /influence[/<ds>]

// ---- stored arrays

// One dataset as written: its shape, its values in the stored element type, its attributes.
using Values = std::variant<std::vector<float>, std::vector<int32_t>, std::vector<int64_t>, std::vector<uint8_t>,
                            std::vector<std::string>>;
struct Array {
    std::vector<int64_t> shape;
    Values values;
    Attrs attrs;  // on the dataset (none when empty)
};
void write_array(ResultWriter& w, const std::string& path, const Array& a);

// ---- /meta (every file): its attributes are named in score_records.h write_run_meta (MetaRecord)
void write_meta(ResultWriter& w, const Attrs& a);
Attrs read_meta(const ResultReader& r);  // empty when the file has no /meta
// One attribute of a group as text ("" when the group or the attribute is absent).
std::string attr_text(const ResultReader& r, const std::string& obj, const std::string& name);

// ---- scores: /scores/<probe> (detect, run's probes:, qk-spectrum, dla, maps, copy-suppression)
// (each command's record and write function, with its dataset names and descriptions: score_records.h)
struct ScoreGroup {
    std::string probe;  // "induction", "qk_rank", "dla", "copy-suppression", "maps/<relation>"
    Attrs attrs;        // on the group
    std::vector<std::pair<std::string, Array>> datasets;  // "score" [L, H] first, then the group's others
};
void write_scores(ResultWriter& w, const ScoreGroup& g);  // an existing group of that name is replaced
struct StoredScores {
    std::string probe;
    Attrs attrs;        // the group's, then the score dataset's (the group's win)
    Dataset score;      // numeric
    std::vector<std::pair<std::string, Dataset>> others;  // the group's other numeric datasets, by name
};
// Every probe with a score dataset, sorted; a group without one (maps) contributes its children
// ("maps/<relation>").
std::vector<std::string> score_probes(const ResultReader& r);
StoredScores read_scores(const ResultReader& r, const std::string& probe);

// ---- /inputs/<probe>/tokens: the token ids a probe ran on
struct InputTokens {
    std::string probe;
    std::vector<int32_t> tokens;  // [N, T], -1 past a ragged row's end
    int64_t rows = 0, cols = 0;
    bool ragged = false;
};
void write_inputs(ResultWriter& w, const InputTokens& in);

// ---- /logits and /tokens (`headscope logits`)
struct Logits {
    std::vector<float> logits;  // [T, V]
    std::vector<int32_t> tokens;  // [T]
    int64_t vocab = 0;
};
void write_logits(ResultWriter& w, const Logits& l);

// ---- an ablation experiment (`headscope run`, `merge`): /experiment, /data/<name>, /ablation/<study>
Attrs read_experiment(const ResultReader& r);  // /experiment's attributes (empty when absent)
void write_experiment(ResultWriter& w, const Attrs& a);
struct DataRecord {
    std::string name;
    std::vector<int64_t> tokens;  // [N, T], -1 past each row's end
    std::vector<int64_t> lengths, answers, counterfactuals, variants;  // [N] each; answers.. empty when none
    int64_t rows = 0, cols = 0;
    Attrs attrs;
};
void write_data(ResultWriter& w, const DataRecord& d);
std::vector<int64_t> read_data_variants(const ResultReader& r, const std::string& name);  // empty when absent

// One study: S configurations over N rows of L x H heads.
struct StudyRecord {
    std::string name;
    int64_t S = 0, N = 0, L = 0, H = 0;
    std::vector<uint8_t> masks;        // [S, L, H]
    std::vector<float> metric;         // [S]
    std::vector<float> metric_rows;    // [S, N]
    std::vector<std::string> kind, label;  // [S]
    std::vector<int64_t> k, control_seed, batch;  // [S]
    std::vector<uint8_t> done;         // [S]
    std::vector<float> factor;         // [S] scale-grid, else empty
    std::vector<float> fraction;       // [S] prune, else empty
    std::vector<int64_t> order;        // [P] prune
    std::vector<float> importance;     // [steps, L, H] prune
    Attrs attrs;
};
void write_study(ResultWriter& w, const StudyRecord& s);
// The per-configuration results alone (metric, metric_rows, done: merge rewrites them).
void write_study_results(ResultWriter& w, const StudyRecord& s);
std::vector<std::string> study_names(const ResultReader& r);  // groups below /ablation
// A study as the file holds it, each dataset as read (a missing one has an empty shape): callers
// check the shapes they rely on (merge and --resume refuse a damaged shard in their own words).
struct StoredStudy {
    Attrs attrs;
    Dataset masks, metric, metric_rows, kind, label, k, control_seed, done, batch, factor;
};
StoredStudy read_study(const ResultReader& r, const std::string& name);

// gating sweeps: /ablation/<study>/gates
struct GatesRecord {
    int64_t starts = 0, L = 0, H = 0;
    std::vector<float> g0, g_plus, g_minus;     // [starts, L, H]
    std::vector<int64_t> roles;                 // [starts, L, H]
    std::vector<int64_t> role;                  // [L, H]
    std::vector<int64_t> role_counts;           // [4, L, H]
    std::vector<float> objective;               // [3, starts]
    Attrs attrs;
};
void write_gates(ResultWriter& w, const std::string& study_name, const GatesRecord& g);
// StorageError naming the file when a dataset is missing or of another shape.
GatesRecord read_gates(const ResultReader& r, const std::string& study_name);
// duo-gates sweeps: /ablation/<study>/duo
struct DuoRecord {
    int64_t L = 0, H = 0, K = 0, steps = 0;
    std::vector<float> alpha;     // [L, H]
    std::vector<float> alpha_kv;  // [L, K]
    std::vector<float> history;   // [steps, 2]
    Attrs attrs;
};
void write_duo(ResultWriter& w, const std::string& study_name, const DuoRecord& d);
DuoRecord read_duo(const ResultReader& r, const std::string& study_name);  // StorageError as read_gates
Dataset read_duo_alpha(const ResultReader& r, const std::string& study_name);  // empty shape when absent
// scale-grid sweeps: /ablation/<study>/juice (replaced when present)
struct JuiceRecord {
    int64_t V = 0, L = 0, H = 0, F = 0;
    std::vector<float> factors;                // [F]
    std::vector<int64_t> variants;             // [V]
    std::vector<float> delta;                  // [V, L, H, F]
    std::vector<float> up, down;               // [V, L, H]
    std::vector<float> enhance, suppress;      // [L, H]
    Attrs attrs;
};
void write_juice(ResultWriter& w, const std::string& study_name, const JuiceRecord& j);

// ---- the needle test's stream sweep: /retrieval/streaming
struct StreamingRecord {
    int64_t L = 0, H = 0, R = 0, F = 0;  // R orders x F fractions
    std::vector<float> fractions;        // [F]
    std::vector<int64_t> full_heads;     // [F]
    std::vector<int64_t> order;          // [R, L H]
    std::vector<uint8_t> masks;          // [R, F, L, H]
    std::vector<float> accuracy, rougeL_f;  // [R, F]
    std::vector<float> kv_budget;        // [F]
    Attrs attrs;
};
void write_streaming(ResultWriter& w, const StreamingRecord& s);

// ---- KV-cache policies at equal memory: /retrieval/kv_compare (probes/needle/kv/kv_policy.h)
struct KvCompareRecord {
    int64_t P = 0, B = 0, R = 0;            // policies, budgets, random orders
    std::vector<std::string> policies;      // [P]
    std::vector<float> budgets;             // [B]
    std::vector<int64_t> capacities;        // [B]: tokens per query head, -1 for a budget column (empty: a file before them)
    std::vector<float> accuracy, rougeL_f, kv_fraction, same_as_full;  // [P, B]
    std::vector<int64_t> kv_bytes;          // [P, B]: rounded to the byte
    std::vector<int64_t> full_groups;       // [P, B]
    // [P, B]: the cache's allocated bytes at their peak over the timed decode, and its mean ms per
    // decode step through the compressed cache (kv_policy.h KvCompare; empty: a file before them)
    std::vector<int64_t> peak_cache_bytes;
    std::vector<float> decode_ms;
    std::vector<float> random_accuracy, random_rougeL_f, random_kv_fraction, random_same_as_full;  // [P, B, R]
    Attrs attrs;  // the comparison's parameters (KvCompare::stored); the write adds the description
};
// Replaces /retrieval/kv_compare whole (a killed run's partial state with it).
void write_kv_compare(ResultWriter& w, const KvCompareRecord& k);
// StorageError for inconsistent shapes, or a group that holds only the partial state.
KvCompareRecord read_kv_compare(const ResultReader& r);
// The comparison's resumable state: /retrieval/kv_compare/partial, written at its checkpoints and gone
// when it finishes (write_kv_compare). What each (distinct configuration, ablation trial) decode gave,
// from which the table is computed, and which work items are done.
struct KvComparePartialRecord {
    int64_t S = 0, N = 0, G = 0;                 // distinct configurations, ablation trials, work items
    std::vector<uint8_t> passed, same_as_full;   // [S, N]
    std::vector<double> rougeL_f;                // [S, N], float64 in the file (exact)
    std::vector<uint8_t> done;                   // [G]
    Attrs attrs;                                 // the comparison's identity (kv_policy.h kv_compare_params)
};
void write_kv_compare_partial(ResultWriter& w, const KvComparePartialRecord& p);  // replaces the group
// StorageError naming the file when the arrays disagree in shape.
KvComparePartialRecord read_kv_compare_partial(const ResultReader& r);

// ---- the needle scan's per-trial results: /retrieval/trials, /retrieval/steps, /retrieval/ablation
// What `retrieval` writes after every checkpoint, --resume reads back and `merge` joins; the head
// scores and accuracies are always recomputed from it (probes/needle/needle_results.h summarize), so a merged
// file equals the unsharded run's bit for bit. The score arrays are named by the caller (the needle
// score registry, probes/needle/scores.h: src/ does not see it), each a layout() row.
struct NeedleArray {
    std::string name;           // /retrieval/trials/<name> or /retrieval/steps/<name>
    bool in_every_file = true;  // false: a file written before it may lack it (read as NaN)
    std::vector<float> values;  // [N, L, H] or [N, steps, L, H]
};
// The score arrays a needle file holds, (name, in every file) each, in the order written.
struct NeedleArrayNames {
    std::vector<std::pair<std::string, bool>> trials, steps;
};
struct NeedleRecord {
    int64_t N = 0, L = 0, H = 0, steps = 0;  // trials, layers, heads, max_new_tokens
    int64_t abl_steps = 0;                   // the ablation passes' max_new_tokens
    bool with_steps = false;                 // per-step scores kept (--dump-steps)
    std::vector<uint8_t> done;               // [N] the unablated decode ran
    std::vector<int64_t> generated;          // [N, steps], -1 past the end
    std::vector<std::string> response;       // [N]
    std::vector<float> rouge1, rougeL;       // [N]
    std::vector<int32_t> passed;             // [N]
    std::vector<int64_t> answer_steps;       // [N]
    std::vector<NeedleArray> trial_arrays;   // [N, L, H] each: the scores' per-trial arrays
    std::vector<NeedleArray> step_arrays;    // [N, steps, L, H] each (with_steps), NaN past the end
    int64_t S = 0;                           // ablation sets (0: none yet)
    std::vector<int32_t> masks;              // [S, L, H]
    std::vector<uint8_t> abl_done;           // [S, N]
    std::vector<float> abl_rouge1, abl_rougeL;  // [S, N]
    std::vector<int32_t> abl_passed;         // [S, N]
    std::vector<int64_t> abl_generated;      // [S, N, abl_steps], -1 past the end

    // Every array at its shape, nothing done (NaN scores, -1 tokens), no ablation sets; the score
    // arrays named by `names` (steps only with with_steps).
    void init(int64_t n, int64_t l, int64_t h, int64_t steps, int64_t abl_steps, bool with_steps,
              const NeedleArrayNames& names);
    // S ablation sets of these [S, L, H] masks, nothing of them done.
    void init_sets(int64_t s, std::vector<int32_t> masks);
};
// One score's group /scores/<name>, computed from a NeedleRecord over the done trials.
struct NeedleScoreGroup {
    std::string name;
    std::vector<float> score;  // [L, H]
    std::vector<std::pair<std::string, std::vector<float>>> beside;  // [L, H] datasets beside score (ci_low, ci_high)
    int64_t n_scored = 0;       // the n_trials_scored attribute
    bool with_flagged = false;  // the flagged attribute (NeedleScoresRecord::flagged)
};
// What is computed from a NeedleRecord and stored beside it (over the done trials).
struct NeedleScoresRecord {
    int64_t n_done = 0, n_pass = 0;        // trials decoded, passed
    double accuracy = 0;
    std::vector<NeedleScoreGroup> scores;  // the run's scores, in the order written
    std::vector<float> abl_accuracy;       // [S]
    std::vector<std::string> flagged;      // heads whose flagging score passes the threshold
};
// Writes (replacing) every dataset and attribute that depends on the results: /retrieval/trials/
// results and done, /retrieval/steps (with_steps), /retrieval/ablation/ results, done and accuracies
// (when S > 0), each of s.scores' /scores/<name> datasets, and the n_passed, accuracy, n_trials_done,
// n_trials_scored and flagged attributes.
void write_needle_results(ResultWriter& w, const NeedleRecord& r, const NeedleScoresRecord& s);
// A retrieval file's results, the score arrays `names` (StorageError naming the file when something
// is missing or has another shape than [N, ...] with the file's own N and its /meta L, H; an array
// not in every file reads as NaN when absent).
NeedleRecord read_needle_results(const ResultReader& f, const NeedleArrayNames& names);

// ---- AttentionInfluence: /influence (`headscope influence`)
// N corpus samples, S head sets (set 0 the named heads, then random controls).
struct InfluenceRecord {
    int64_t N = 0, S = 0, L = 0, H = 0;
    std::vector<float> loss;                  // [N] mean next-token loss, no head masked
    std::vector<float> masked_loss, score;    // [S, N]; score = (masked_loss - loss) / loss
    std::vector<int64_t> n_tokens, line;      // [N] tokens scored, the corpus line
    std::vector<int64_t> length;              // [N] tokens in the corpus (before the cut; 0: a file from before it was kept)
    std::vector<int64_t> rank;                // [N] sample indices by set 0's score, highest first
    std::vector<uint8_t> selected, truncated; // [N]
    std::vector<uint8_t> done;                // [N] the sample's losses were computed (a shard's own)
    std::vector<uint8_t> masks;               // [S, L, H]
    std::vector<std::string> preview;         // [N] the sample's first characters
    std::vector<float> detect_score;          // [L, H] the retrieval score --detect chose set 0 by (empty without it)
    Attrs attrs;                              // on /influence
};
void write_influence(ResultWriter& w, const InfluenceRecord& r);  // an existing /influence is replaced
// StorageError naming the file when /influence is absent or a dataset has another shape.
InfluenceRecord read_influence(const ResultReader& r);

// ---- patching: /patching/<name>
struct PatchingRecord {
    std::string name;
    std::vector<int64_t> shape;        // of scores and patched: [L, U], [L, U, T] or [P] (path)
    std::vector<float> scores, patched;
    std::vector<std::string> paths;    // path patching: [P], else empty
    float metric_clean = 0, metric_corrupt = 0;
    Attrs attrs;
};
void write_patching(ResultWriter& w, const PatchingRecord& p);  // an existing group of that name is replaced
std::vector<std::string> patching_names(const ResultReader& r);  // groups holding scores
struct StoredPatching {
    Attrs attrs;
    Dataset scores, path;                    // path: strings, empty shape unless path patching
    double metric_clean = 0, metric_corrupt = 0;  // NaN when absent
};
StoredPatching read_patching(const ResultReader& r, const std::string& name);

}  // namespace hs::schema
