// A masking/ablation experiment described in YAML (schema: docs/experiments.md). Parsing checks
// the file's shape and types; every error names "FILE:LINE:COL:" (1-based, from yaml-cpp's marks)
// and what was expected, and throws ConfigError (exit 3). Checks that need the model (head ranges,
// score shapes) happen in the engine with the same marks (probes/ablation/ablation.h).
#pragma once

#include "heads.h"         // head names (L1H3) as the YAML writes them
#include "intervention.h"  // mode kinds: the one intervention vocabulary
#include "names.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hs {

struct YamlMark {
    int line = 0, col = 0;  // 1-based; 0 = unknown
};

// Where something is in the experiment file: "exp.yaml:12:5".
std::string mark_str(const std::string& file, const YamlMark& m);

// The spec's vocabularies: one enum and one name table each (the YAML's words, in its order).
enum class DataKind { kRepeated, kText, kTokens, kPrompts, kConflicts };
enum class SweepKind { kSingle, kLayer, kSet, kCumulative, kPrune, kScaleGrid, kGating, kDuoGates };
enum class MetricKind { kLoss, kAccuracy, kLogitDiff, kKl, kProb };
enum class Positions { kAll, kRepeatedHalf, kAnswer };  // where loss / kl are read
const NameTable<DataKind>& data_kind_names();    // repeated, text, tokens, prompts, conflicts
const NameTable<SweepKind>& sweep_names();       // single, layer, set, cumulative, prune, scale-grid, gating, duo-gates
const NameTable<MetricKind>& metric_names();     // loss, accuracy, logit-diff, kl, prob
const NameTable<Positions>& positions_names();   // all, repeated-half, answer
inline const char* name_of(DataKind k) { return name_in(data_kind_names(), k); }
inline const char* name_of(SweepKind k) { return name_in(sweep_names(), k); }
inline const char* name_of(MetricKind k) { return name_in(metric_names(), k); }
inline const char* name_of(Positions k) { return name_in(positions_names(), k); }
inline const char* name_of(Intervention k) { return intervention_name(k); }

struct DataSpec {
    std::string name;
    DataKind kind = DataKind::kRepeated;
    int64_t length = 0;                  // repeated: |R|
    int64_t count = 0;                   // rows (repeated), at most (text, tokens, prompts; 0 = all)
    int64_t token_lo = -1, token_hi = -1;  // repeated: [lo, hi)
    int64_t seq_len = 0;                 // text: tokens per sequence
    int64_t seed = -1;                   // repeated: generator seed (-1 = the experiment's)
    std::string file;                    // text, tokens, prompts, conflicts
    // conflicts (JUICE's head-selection data): each line gives a row for the question alone (clean,
    // variant 0) and one per context (variant i: context i + separator + question); the answer's first
    // token is the one that follows prompt + answer_prefix + answer when encoded together.
    bool clean = true;
    std::string separator = " ", answer_prefix = " ";
    // continuation (default): the token after the prompt in encode(prompt + prefix + answer); alone:
    // the first token of encode(prefix + answer) by itself (JUICE's get_tokenized_first_word), for
    // tokenizers whose merges cross spaces, where the continuation is not a token boundary
    bool answer_alone = false;
    YamlMark mark, file_mark;
};

struct ProbeSpec {
    std::string probe, data;
    YamlMark mark, data_mark;
};

// A set of heads. Names are "L<layer>H<head>".
struct HeadSpec {
    enum class Kind { kList, kLayers, kAll, kTop, kBottom, kThreshold, kComplement };
    Kind kind = Kind::kAll;
    std::vector<std::pair<int, int>> heads;  // kList
    std::vector<YamlMark> head_marks;
    std::vector<int> layers;                 // kLayers
    std::vector<int64_t> ks;                 // kTop / kBottom (a list for cumulative sweeps)
    double threshold = 0;                    // kThreshold
    bool above = true;                       // kThreshold: score >= threshold (false: <=)
    std::string by;                          // score: "scores/<probe>/score" or "file.h5:/path"
    YamlMark by_mark;
    std::shared_ptr<HeadSpec> inner;         // kComplement: every head not in inner
    YamlMark mark;
};

struct ModeSpec {
    Intervention kind = Intervention::kZero;
    std::string data;           // mean, mean-query, resample: the reference dataset
    bool per_position = true;   // mean, mean-query: per position (true) or pooled over positions
    double factor = 0.0;        // scale
    StreamWindow window;        // stream: sink, recent (both required), compensate (default false), block (default 1)
    YamlMark mark;
};

struct MetricSpec {
    MetricKind kind = MetricKind::kLoss;  // (retrieval: refused, see headscope retrieval)
    std::string data;
    Positions positions = Positions::kAll;  // loss, kl
    bool counterfactual = false;            // prob: p(counterfactual) instead of p(answer) (target: ...)
    YamlMark mark, positions_mark;
};

struct StudySpec {
    std::string name;
    SweepKind sweep = SweepKind::kSingle;
    HeadSpec heads;     // single / layer / cumulative / prune: the candidates (default all heads)
    bool has_heads = false;
    std::vector<std::pair<std::string, HeadSpec>> sets;  // set sweep: named sets, in file order
    ModeSpec mode;
    MetricSpec metric;
    int64_t controls = 0;  // random control sets per configuration
    std::vector<double> steps;  // prune: cumulative fractions of all heads, increasing
    std::vector<double> factors;  // scale-grid: z *= factor, each head alone at each factor
    // gating (causal head gating, probes/ablation/gating.h): random starts, Adam steps per fit, |lambda|, lr.
    // duo-gates (DuoAttention, probes/ablation/duo_gates.h): fit_steps, lambda (default 0.05), lr (0.02).
    int64_t starts = 5, fit_steps = 200;  // duo-gates: fit_steps 2000 (scripts/train.sh)
    double lambda = 0.1, lr = 1.0;
    // duo-gates only. train_window: the fit's streaming attention; where the study does not say, the
    // reference's training (scripts/train.sh: sink 128, recent 256; block_streaming_attn_func in
    // 128-token blocks); block 1 is the exact token window. The deployment window is `mode`'s.
    StreamWindow train_window{128, 256, false, 0, 128};
    // fit_data: fresh = a new toy recall sample (probes/ablation/duo_data.h) of fresh_rows x
    // fresh_length tokens every step, as the reference draws a new passkey sample a step; study (the
    // default) = the study's metric data every step.
    bool fit_fresh = false;
    int64_t fresh_rows = 8, fresh_length = 64;
    // fit_data {kind: passkey, haystack, length | length_min + length_max [+ length_intervals], passkeys,
    // words, depth_min, depth_max, depth_intervals}: the reference's multi-passkey sample for a real
    // tokenizer (probes/ablation/duo_data.h duo_passkey_sample); fit_fresh is set too. `length` N is
    // min = max = N, 1 interval; the defaults are scripts/train.sh's (50 length intervals; depths
    // linspace(0.05, 0.95, 1000)).
    bool fit_passkey = false;
    std::string passkey_haystack;
    int64_t passkey_length_min = 0, passkey_length_max = 0, passkey_length_intervals = 1;
    int64_t passkey_count = 10, passkey_words = 32;
    double passkey_depth_min = 0.05, passkey_depth_max = 0.95;
    int64_t passkey_depth_intervals = 1000;
    YamlMark passkey_length_mark;  // `length`, else `length_max`: where a length too short is refused
    // deploy: which heads the `duo` configuration streams: sparsity (the default, the reference's
    // sparsify_attention_heads at deploy_value 0.5, probes/ablation/duo_sparsity.h) or threshold
    // (alpha < deploy_value streamed).
    bool deploy_sparsity = true;
    double deploy_value = 0.5;
    YamlMark fit_data_mark;
    bool recompute = false;     // prune: recompute importance after each step
    YamlMark mark, sweep_mark, heads_mark, controls_mark;
};

struct Experiment {
    std::string file;       // as given
    std::string text;       // the YAML text (stored in the output, hashed for --resume / merge)
    std::string model, tokenizer, dtype = "auto", device = "cpu", output;  // dtype auto: bfloat16 on CUDA, float32 on the CPU
    std::string attention = "auto";  // auto | blocked | fused (docs/forward.md, "Attention kernels")
    int threads = 0;
    int64_t seed = 0;
    int64_t batch_rows = 64;  // rows per forward pass (configurations x dataset rows)
    std::vector<DataSpec> data;
    std::vector<ProbeSpec> probes;
    std::vector<StudySpec> studies;
    YamlMark model_mark;

    const DataSpec* find_data(const std::string& name) const;
    // "FILE:LINE:COL: msg" as a ConfigError.
    [[noreturn]] void fail(const YamlMark& m, const std::string& msg) const;
};

// Reads and checks the file (no model needed). Throws ConfigError (bad YAML, schema) or DataError
// (unreadable file). probe_names: what `probes:` may list (the probe table lives in probes/:
// detector_probe_names() in attention_detectors.h).
Experiment parse_experiment(const std::string& path, const std::vector<std::string>& probe_names);
Experiment parse_experiment_text(const std::string& text, const std::string& file_name,
                                 const std::vector<std::string>& probe_names);

}  // namespace hs
