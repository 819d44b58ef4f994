// The ablation engine behind `headscope run` and `headscope ablate` (methods: docs/methods.md,
// "Ablation experiments"; methods-reference.md section 6).
//
// A configuration is a head mask [L, H] (1 = ablated). Many configurations run in ONE batched
// forward: row j*b + r of a forward is dataset row r under configuration j, and each layer's z (or
// q) is edited through one per-row mask (keep [B, 1, H, 1]). Layers below the first ablated layer
// of a batch are computed once for the b dataset rows and shared by every configuration
// (ForwardOptions::start_layer). The metric reads only the scored positions of the final residual
// (unembedding just those), so a sweep never materialises [B, T, V] logits.
#pragma once

#include "experiment.h"
#include "model.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

// One dataset of an experiment, ready for forwards.
struct AblationData {
    std::string name;
    DataKind kind = DataKind::kTokens;
    at::Tensor tokens;               // [N, T] int64, right-padded with id 0 past each row's length
    std::vector<int64_t> lengths;    // [N]
    int64_t n = 0;                   // repeated: |R| (T = 2n + 1)
    std::vector<int64_t> answers;    // prompts: first token of the answer
    std::vector<int64_t> counterfactuals;  // prompts: first token of the counterfactual answer (-1: none)
    // conflicts: answers = the parametric answer's first token, counterfactuals = the context answer's;
    // variants[i] = 0 for a question alone (clean), c for the question after the line's c-th context.
    std::vector<int64_t> variants;
    int64_t rows() const { return tokens.size(0); }
    // [N, T] with -1 past each row's end (as stored in /data/<name>/tokens).
    std::vector<int64_t> file_tokens() const;
};

// Builds a dataset from its spec (files are read relative to the current directory). Throws
// DataError naming the file and line, ConfigError (at the spec's mark) for what the model cannot
// take (ids out of range, sequences over the context).
AblationData make_data(const Experiment& e, const DataSpec& d, const Model& m, const Tokenizer* tok);
// Repeated-random data without an experiment: [BOS, R, R] rows, |R| = n.
AblationData repeated_data(const Model& m, int64_t n, int64_t count, int64_t seed, int64_t lo = -1, int64_t hi = -1,
                           const Tokenizer* tok = nullptr);
// Token-id sequences as given (one row each).
AblationData sequence_data(const std::string& name, const std::vector<std::vector<int64_t>>& seqs);

// The intervention (src/interp/intervention.h) and the metric (src/experiment/experiment.h: MetricKind, Positions)
// use the experiment's vocabularies.
struct AblationSetup {
    Intervention mode = Intervention::kZero;  // any but kNone
    double factor = 0.0;             // scale
    StreamWindow window;             // stream: the window ablated heads get (Hooks::window)
    bool per_position = true;        // mean / mean-query
    const AblationData* reference = nullptr;  // mean, mean-query, resample
    int64_t resample_seed = 0;
    MetricKind metric = MetricKind::kLoss;
    Positions positions = Positions::kAll;  // loss / kl
    bool counterfactual = false;     // prob: p(counterfactual) (a conflicts dataset's context answer)
    int64_t max_rows = 64;           // rows per forward (configurations x dataset rows)
    bool prefix_reuse = true;        // share layers below the first ablated layer of a batch
};

class Ablator {
public:
    // Runs the clean references it needs (mean activations, resample sources, clean log-probs for
    // kl) once. The data must outlive the Ablator.
    Ablator(const Model& m, const AblationData& data, const AblationSetup& setup);
    ~Ablator();

    // masks [C, L, H] (nonzero = ablated) -> metric per configuration and row [C, N] float32 CPU.
    // on_batch(indices, rows [g, N]) runs after each batch of configurations completes.
    using BatchFn = std::function<void(const std::vector<int64_t>& configs, const at::Tensor& rows)>;
    // factors (scale mode only): one per configuration, z *= factors[c] on its heads (a scale-grid
    // sweep: many factors share one forward); empty = the setup's factor for all.
    at::Tensor evaluate(const at::Tensor& masks, const BatchFn& on_batch = {}, const std::vector<double>& factors = {}) const;
    // The batches evaluate() forms for `masks` (configuration indices, each batch one forward over
    // its configurations x the dataset rows): sorted by first ablated layer, then cut by max_rows.
    // A batch's results depend only on its own configurations, so running the same batches in any
    // order or process (shards, a resumed run) gives the same bits as one evaluate() call.
    std::vector<std::vector<int64_t>> plan(const at::Tensor& masks) const;
    // One planned batch: its configurations' metric rows [g, N] (the rows evaluate() gives them).
    at::Tensor evaluate_batch(const at::Tensor& masks, const std::vector<int64_t>& batch,
                              const std::vector<double>& factors = {}) const;

    // Continuous head gates xi [L, H] multiplying z (1 = intact): metric per row [N] (no grad).
    at::Tensor evaluate_gates(const at::Tensor& xi) const;
    // G gate sets xi [G, L, H] at once (each set on its own copy of the data's rows in one forward a
    // chunk): the metric of each, the mean over rows [G] float on the model's device. Differentiable:
    // autograd flows to xi when it requires grad (the caller sets the grad mode).
    at::Tensor gated_metric(const at::Tensor& xi) const;
    // Michel et al. 2019: I_h = mean over rows of |dM_row / dxi_h| at xi = 1 - pruned (pruned heads
    // stay at 0), by autograd. Raw, not normalised: [L, H] float64 CPU.
    at::Tensor gate_gradient_importance(const at::Tensor& pruned) const;
    // Resample mode: the reference row that feeds dataset row i.
    int64_t resample_source(int64_t i) const;
    // The data's rows in the chunks the engine forwards them in, with each chunk's scored positions
    // (the metric's): tokens [b, T] on the model's device, row and pos [P] int64 (row within the chunk).
    // Learned-gate probes that distil hidden states there (probes/ablation/duo_gates.h) read them.
    struct ScoredRows {
        at::Tensor tokens, row, pos;
    };
    std::vector<ScoredRows> scored_rows() const;
    int64_t forwards() const { return forwards_; }  // forward passes run so far (for benchmarks)
    c10::Device device() const { return m_.options.device; }

    struct Impl;

private:
    const Model& m_;
    const AblationData& data_;
    AblationSetup s_;
    std::unique_ptr<Impl> impl_;
    mutable int64_t forwards_ = 0;
};

// L2-normalise importance per layer (Michel et al.): I[l] / ||I[l]||_2.
at::Tensor normalise_per_layer(const at::Tensor& importance);

// A score [L, H] for `by:`: "scores/<probe>/score" from `computed` (probe name -> [L, H]) or
// "FILE.h5:/path" read from another result file. Errors name the experiment mark.
at::Tensor resolve_score(const Experiment& e, const HeadSpec& h, const std::vector<std::pair<std::string, at::Tensor>>& computed,
                         int L, int H);
// A head set as a mask [L, H] uint8 (for top/bottom with several ks: the k-th entry, index ki).
at::Tensor resolve_heads(const Experiment& e, const HeadSpec& h, const std::vector<std::pair<std::string, at::Tensor>>& computed,
                         int L, int H, size_t ki = 0);
// Range checks of every explicit head and layer in a spec (needs the model's L and H).
void check_head_ranges(const Experiment& e, const HeadSpec& h, int L, int H);

// The configurations of one study (baseline first).
struct StudyConfigs {
    std::vector<at::Tensor> masks;      // [L, H] uint8 each
    std::vector<std::string> kinds;     // baseline | single | layer | set | cumulative | control | prune | scale
    std::vector<std::string> labels;    // "L1H3", "layer 1", set name, "top-2", "control 3 of top-2"...
    std::vector<int64_t> k, control_seed;
    std::vector<double> fraction;       // prune: fraction of heads removed (0 elsewhere)
    std::vector<double> factor;         // scale-grid: z *= factor[c] on configuration c's head (1 for the
                                        // baseline); empty for other sweeps
};
// Non-prune sweeps. Controls: N random sets of each non-baseline configuration's size, drawn with
// std::mt19937_64(control_seed) uniformly among the heads NOT under test (the configuration's
// heads; in a cumulative sweep, the largest set of the sweep).
StudyConfigs build_study(const Experiment& e, const StudySpec& s,
                         const std::vector<std::pair<std::string, at::Tensor>>& computed, int L, int H);

// Prune: the order of removal and the masks per step, computing importance with `ab` (zero mode).
struct PrunePlan {
    StudyConfigs configs;            // baseline + one per step
    std::vector<int64_t> order;      // heads (l * H + h) in the order removed
    std::vector<at::Tensor> importance;  // normalised importance [L, H] used for each step
};
PrunePlan plan_prune(const StudySpec& s, const Ablator& ab, int L, int H);

}  // namespace hs
