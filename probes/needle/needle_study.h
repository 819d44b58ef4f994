// The needle study (`headscope retrieval`): a spec in, the scan run and its file written, a result
// out. It reads the needles and haystacks, builds the trials (NeedleTest), runs this shard's work
// items through the job runner (src/jobs/jobs.h: the shard, the checkpoint timer, the resume identity
// check): the scored baseline pass, the mean-query calibration, the ablation sets (named, the top K of
// a score, random controls) and their passes, the decoding pass (--decoding decore|juice), and
// writes the whole file atomically at checkpoints and at the end (src/store/needle_records.h for its
// static parts, needle_results.h for the results). The stream sweep runs after it on the same trials.
// The command (tools/cmd_retrieval.cpp) turns flags into the spec; tools/needle_print.cpp prints the result.
#pragma once

#include "jobs.h"
#include "needle_results.h"
#include "razor.h"
#include "scores.h"
#include "stream_sweep.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hs {

// What --stream-sweep ranks heads by: this run's score, razor's, or a file's [L, H] score.
struct StreamOrderSpec {
    enum class Kind { kRunScore, kRazor, kFile } kind = Kind::kRunScore;
    NeedleScore score = NeedleScore::kLocos;  // kRunScore
    RazorPreset preset = RazorPreset::kReference;  // kRazor: golden-stick's selection, as --razor-preset's default
    std::string file;  // kFile: FILE.h5:DATASET
};

// Everything the study needs, as plain values (the command's flags, parsed and cross-checked).
struct NeedleStudySpec {
    // inputs: "" = the shipped default (datasets/needles/), or haystack_dir's needles.jsonl
    std::string needles, haystack, haystack_dir;
    std::string tmpl;                       // the template as given (recorded)
    NeedleProtocol proto;                   // every construction, stop and seed choice, resolved
    bool record_protocol = false;           // the protocol's choices recorded (named, or not headscope)
    NeedleConfig cfg;                       // all but max_positions (the model's)
    std::vector<int64_t> extra_stop_ids;    // more ids that end a response
    NeedleScoreSet scores;
    std::string scores_text;                // the score list as given (recorded)
    double flag_threshold = 0.1;
    int64_t bootstrap = 1000;
    // ablation
    bool ablating = false;
    Intervention ablation = Intervention::kZeroQuery;
    std::vector<Head> ablate_heads;         // named heads (ablate_top == 0)
    int64_t ablate_top = 0;                 // the top K of from_score, else of this run's score
    at::Tensor from_score;                  // [L, H] or undefined
    std::string from;                       // its FILE.h5:DATASET ("" = this run's)
    int64_t random_controls = 0;
    int64_t calibration_trials = 50;
    StreamWindow window;                    // the stream ablation's and the stream sweep's window
    int64_t sweep_rows = 8;                 // rows of one forward for sets decoding together
    // decoding pass: rule kIndependent = none
    CombineRule decoding = CombineRule::kIndependent;
    DecodingSpec decoding_spec;             // of set 0 (the named heads)
    // the job
    jobs::Shard shard;
    bool resume = false;
    double checkpoint_seconds = 60;
    int pause_ms = 0;
    std::string out;
    WriteMode mode = WriteMode::kCreate;
    // the stream sweep (run_needle_stream_sweep)
    StreamOrderSpec order;
    std::vector<double> full_fractions;
    int64_t random_orders = 3;
};

// LOCOS caps each calibration prompt at this many tokens (nolima_ablation.py, max_cal_tokens).
constexpr int64_t kCalibrationMaxTokens = 5000;

// The grid's values: "1000,2000" (UsageError with `param`: "'x' is not an integer", "no value given"),
// the lengths at least 2 context tokens each (param "lengths"), the depths in percent (param "depths").
std::vector<int64_t> parse_needle_int_list(const std::string& text, const std::string& param);
void check_needle_lengths(const std::vector<int64_t>& lengths);
std::vector<double> parse_needle_depths(const std::string& text);

// The needles and one haystack text per needle (lengthened as the protocol repeats it), with the
// tokenizer's facts and the stop ids.
struct NeedleInputs {
    std::string needles_path, hay_path;
    std::vector<Needle> needles;
    std::vector<std::string> haystacks;  // per needle
    std::string hay_sha256;              // of the haystack texts as read (before repetition)
    TokenFacts facts;
};
// UsageError (param "lengths") for a length whose context exceeds the model's positions (before any
// haystack is read); DataError for an empty haystack, a file that is not JSON; UsageError (param
// "stop_ids") for an extra stop id outside the vocabulary.
NeedleInputs read_needle_inputs(const NeedleStudySpec& s, const Model& m, const Tokenizer& tok);
// The trials of the spec's grid (UsageError "length N: ..." for a length that does not fit).
std::unique_ptr<NeedleTest> make_needle_test(const NeedleStudySpec& s, const Model& m, const Tokenizer& tok,
                                             const NeedleInputs& in);

// Rows of one decode forward when the command leaves them to the study (`--batch auto`,
// `--sweep-rows auto`, the defaults), as llama.cpp sizes its batches from the model and the memory:
// batch = the trials of one length (depths x needles), at most 16 (a decode step's product of up to
// 16 rows reads each weight from memory once: blocks::gemv_rows); sweep rows = batch x the head sets decoding
// together (the ablation set and its random controls, or the stream sweep's sets), at most 64; both
// at most what half the free memory holds of KV caches (2 L K d_head (longest prompt + steps) x
// the dtype's bytes a row, the kept prefills' bound set aside). The choice changes time and memory,
// not a token: rows of one forward run folded GEMMs, equal to their solo runs up to the last bits
// of the scores (tests/test_needle.cpp kBatchRelTol). `note` is the log line.
struct NeedleBatching {
    int64_t batch = 1, sweep_rows = 8;
    std::string note;
};
// available_bytes < 0: unknown (no memory cap; the note says so).
// The memory the model's KV caches may take: the host's free memory (available_memory_bytes), or on
// CUDA the device's memory less the weights; -1 when unknown.
int64_t free_cache_memory(const Model& m);
NeedleBatching auto_needle_batching(const NeedleStudySpec& s, const Model& m, const NeedleInputs& in, bool batch_auto,
                                    bool rows_auto, int64_t available_bytes);

// The decoding pass (--decoding decore|juice): set 0 the named heads, sets 1.. random controls
// (DeCoRe), each with every trial's outcome.
struct NeedleDecodingPass {
    DecodingSpec spec;  // of set 0
    std::vector<std::vector<Head>> sets;
    std::vector<std::vector<NeedleTest::Decoded>> trials;
    int64_t control_seed = 0;
};

// A scan while it runs: the results so far (with what a resumed file had), the ablation sets, the
// mean-query calibration, the work this shard owns, and the whole file written atomically at
// checkpoints and at the end.
//
// Work items: baseline batch g, then ablation set s's batch g; this shard owns item k when
// k % N == I (k = g for the baseline, (1 + s) * G + g for set s).
class NeedleStudy {
public:
    // write_meta writes /meta into each write of the file (and refuses a file of another model).
    // Resuming (spec.resume and the file exists): the file's done trials are kept; StorageError when
    // it holds another model's, another scan's (param "resume") or another shard's results.
    NeedleStudy(const NeedleStudySpec& spec, const Model& m, const NeedleTest& test, const NeedleInputs& in,
                std::function<void(ResultWriter&)> write_meta);
    NeedleStudy(const NeedleStudy&) = delete;  // the checkpoint timer writes through `this`
    NeedleStudy& operator=(const NeedleStudy&) = delete;

    // Runs every pass this shard owns (a progress bar, the prefix and time log lines) and writes the
    // file. UsageError (param "random_controls") when too few heads remain for a random control.
    void run();
    // The head scores, intervals and accuracies over the done trials.
    NeedleSummary summary() const;

    const NeedleResults& results() const { return res_; }
    const std::vector<std::vector<Head>>& sets() const { return sets_; }
    const std::optional<NeedleDecodingPass>& decoding() const { return decoding_; }

private:
    bool owns(int64_t set, int64_t g) const { return spec_.shard.owns(work_.item(set, g)); }
    void choose_sets(std::vector<Head> heads, std::string source);
    void choose_sets(const NeedleSummary* scored_here);
    void run_pass(int64_t set, const HeadSet* ablate, const std::function<void()>& tick);
    void run_sets_pass(const std::vector<HeadSet>& sets, const std::function<void()>& tick);
    void run_decoding_pass(const std::function<void()>& tick);
    void keep_owned_prefills();
    uint64_t calibration_seed() const;
    bool complete(int64_t n_sets_planned) const;
    int64_t n_sets_planned() const;
    void write(int64_t n_sets_planned);

    const NeedleStudySpec& spec_;
    const Model& m_;
    const NeedleTest& test_;
    NeedleWork work_;
    Attrs params_;
    std::function<void(ResultWriter&)> write_meta_;
    std::unique_ptr<NeedleResults> prev_;
    bool resuming_ = false, first_write_ = true;
    NeedleResults res_;
    std::vector<std::vector<Head>> sets_;
    std::string ablate_source_;
    int64_t n_calib_ = 0, possible_controls_ = 0;
    std::vector<int64_t> calib_idx_;
    at::Tensor q_mean_;
    std::optional<NeedleDecodingPass> decoding_;
    jobs::Checkpoint checkpoint_;
};

// --stream-sweep's order, resolved before the scan (a bad file fails before anything is written): a
// file's [L, H] score (read_head_score's errors) or razor's; undefined for this run's score (known
// after the scan). *source: the order_source attribute's text.
at::Tensor stream_order_score(const StreamOrderSpec& o, const Model& m, std::string* source);

// The stream sweep after the scan (probes/needle/stream_sweep.h): appends /retrieval/streaming to
// spec.out (docs/hdf5-schema.md). `score`: stream_order_score's, or undefined for this run's score
// in `sum`.
StreamSweep run_needle_stream_sweep(const NeedleStudySpec& spec, const NeedleTest& test, const Model& m,
                                    const NeedleSummary& sum, const at::Tensor& score, const std::string& source);


}  // namespace hs
