// Head-level KV-cache policies as their reference codes deploy them, compared at equal KV memory on
// one needle grid (`headscope retrieval --kv-compare`; docs/methods.md "KV-cache policies"; output
// /retrieval/kv_compare, docs/hdf5-schema.md), as a job that resumes after a kill (KvCompareJob).
//
// Every policy prefills the prompt whole (as the references' needle settings do) and then decides which prompt keys
// each head keeps for the decode: the decode steps see the kept keys and every decoded token (Hooks::keep,
// HeadSet::keep), or, for DuoAttention's streaming heads, a fixed sink and a window sliding with the
// query (StreamWindow::from). The masked model is exact: the cache holds every key and the policy
// hides what a compressed cache would have dropped; the bytes a real cache would hold are counted.
//
//   policy   reference (file:lines in docs/methods.md)          what a head keeps of a P-token prompt
//   full     -                                                 everything
//   snapkv   FYYFU/HeadKV SnapKVCluster (uniform baseline)      the same capacity B per head: its B - w
//                                                              best prefix positions by SnapKV's pooled
//                                                              observation-window attention, + the window w
//   headkv   FYYFU/HeadKV ReasonSnapKVCluster                   as snapkv with a capacity per head from an
//                                                              importance score (R2 by default): headkv_caps
//   duo      mit-han-lab/duo-attention                          full KV heads by the gates' order; the others
//                                                              sink + a sliding recent window (64 + 256)
//   razor    mindspore-ai/golden-stick RazorAttention           full KV heads by the razor order (golden-stick's
//                                                              selection by default); the others compressed once:
//                                                              4 sink + 1 mean token + 251 recent (4 + 252 without it)
//   stream:S any [L, H] score S                                as duo, ordered by S
//   adakv    NVIDIA/kvpress AdaKVPress (FFY0/AdaKV)             a layer's K C entries (C = g B per KV head) by
//                                                              SnapKV's score across its KV heads, each head
//                                                              at least its int(0.2 C) best (kv_adakv.h)
//   critical-adakv  kvpress CriticalAdaKVPress                 as adakv, half of each head's budget then
//                                                              refilled by score x ||v W_O||_1
//
// A column of the comparison is a budget, a fraction of the full cache (L K P entries; P: the positions
// compressed, the prompt or its context, KvCompareSpec::question_tokens), or a capacity C in tokens per
// query head (--kv-capacity, as the references' run scripts give it). snapkv/headkv get capacity
// B = round(budget P K / H) per query head at a budget (both references select per query head after
// repeat_kv), C itself at a capacity; the order policies keep whole the most KV groups whose measured
// cache stays within the budget (at a capacity: the fraction C is of the cache, kv_capacity_fraction).
//
// Each policy is a KvPolicy in its own file, kv_<name>.cpp (what it needs, how a budget becomes the
// positions each (layer, KV head) keeps, its settings' attributes), with one row in kv_policies()
// (kv_registry.cpp); run_kv_compare (kv_policy.cpp) runs the rows the spec lists and names none.
#pragma once

#include "needle.h"
#include "schema.h"
#include "scores.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hs {

class Model;

// SnapKV's selection as HeadKV runs it (headkv/snapkv_utils.py, window_size 8, kernel_size 7,
// pooling "maxpool" from run_longbench.py).
struct SnapKVSettings {
    int64_t window = 8;  // observation window: the prompt's last `window` queries, whose keys are always kept
    int64_t kernel = 7;  // max_pool1d kernel (stride 1, padding kernel / 2)
};

// The pooled observation-window scores of a prompt (one whole, unablated prefill): per layer and query
// head, the attention of the last `window` queries over the prefix keys [0, P - window), averaged over
// the window queries (ReasonSnapKVCluster: mean; SnapKVCluster sums, the same order), max-pooled over
// positions. [L, H, P - window] float, CPU; width 0 when P <= window.
at::Tensor snapkv_scores(const Model& m, const std::vector<int64_t>& prompt, const SnapKVSettings& s, int64_t chunk);

// CriticalKV's value norms (kvpress criticalkv_press.py l. 57-76, vwl1norm) of a prompt (one whole,
// unablated prefill): per layer, KV head and position, ||v W_O^h||_1 (W_O without the output bias)
// averaged over the group's query heads. [L, K, P] float, CPU (kv_critical-adakv.cpp).
at::Tensor critical_vo_norms(const Model& m, const std::vector<int64_t>& prompt, int64_t chunk);

// One layer's kept positions [H, P] bool: head h keeps its cap[h] best prefix positions (descending
// pooled score; ties to the earlier position) and the window [P - w, P). pooled [H, P - w].
at::Tensor snapkv_keep(const at::Tensor& pooled, const std::vector<int64_t>& caps, int64_t P, int64_t w);

// HeadKV's capacities (ReasonSnapKVCluster.__init__, snapkv_utils.py:343-389): B' = base - window,
// p = floor(B' / beta), pool = p L H, m = B' - p; score s normalised to sum 1 over all L H heads, raised
// to `temp`, normalised again; cap = round-half-even(s pool + m) prefix positions per query head (one
// pool across layers). scores [L, H] >= 0 (NaN counts as 0). [L, H] int64.
at::Tensor headkv_caps(const at::Tensor& scores, int64_t base, int64_t window, double beta, double temp);

// RazorAttention's compressed cache (golden-stick attention_wrappers.py _compress, AW:188-204): heads
// not kept `full` ([L, H] bool) keep [0, sink) and [P - recent, P) of P positions (the rest averaged
// into one mean key and value when compensating: Hooks::keep); a cache of at most local_capacity =
// sink + recent (+ 1 with the mean token) positions is left whole, as _compress leaves T <=
// local_capacity. [L, H, P] bool.
at::Tensor razor_keep_mask(const at::Tensor& full, int64_t P, int64_t sink, int64_t recent, bool compensate);
// golden-stick's _compress keeps local_capacity = 256 positions of a compressed head (ra_config.py:57-58:
// sink_size 4, local_capacity 256), the mean token among them when compensating: the recent window is
// local_capacity - sink - 1 = 251 with it (AW:198-202), local_capacity - sink = 252 without (AW:193-196).
constexpr int64_t kRazorSink = 4, kRazorLocalCapacity = 256;
constexpr int64_t razor_reference_recent(bool compensate) { return kRazorLocalCapacity - kRazorSink - (compensate ? 1 : 0); }

class KvPolicy;

struct KvPolicySpec {
    const KvPolicy* policy = nullptr;  // its row in kv_policies()
    std::string name;    // as listed: "full", "stream:locos", ...
    at::Tensor score;    // [L, H]: headkv's importance; duo's gates, razor's and stream's order
    std::string source;  // where the score came from
};

// The comparison: the policies listed, the budgets, and every policy's settings (each policy's file
// reads its own; the tool fills them from its flags).
struct KvCompareSpec {
    std::vector<KvPolicySpec> policies;
    std::vector<double> budgets;  // fractions of the full cache, in (0, 1]
    // Fixed capacities in tokens per query head (--kv-capacity; HeadKV's and SnapKV's max_capacity_prompt /
    // base_capacity), each a column after the budgets' (kv_columns).
    std::vector<int64_t> capacities;
    SnapKVSettings snap;
    double headkv_beta = 1.5, headkv_temp = 1.0;  // run_longbench.py's argparse defaults
    // DuoAttention's deployment (scripts/niah.sh): sink 64, recent 256 cached keys (the query sees
    // those and itself); also stream:S's window.
    int64_t duo_sink = 64, duo_recent = 256;
    // How duo picks its full KV groups at a column (--duo-select): "sparsity" (default), the reference's
    // deployment (duo_attn/utils.py l. 353-373, probes/ablation/duo_sparsity.h) at sparsity 1 - b, the
    // share of KV groups streamed, with tie noise seeded seed + 2; "budget": the most groups, in the
    // gates' order (ties to the earlier group), whose measured cache stays within b.
    std::string duo_select = "sparsity";
    // RazorAttention's _compress (ra_config.py): sink 4, one compensation token, 251 recent (256 in all);
    // without the compensation token the reference keeps 4 + 252: razor_reference_recent(false).
    int64_t razor_sink = kRazorSink, razor_recent = razor_reference_recent(true);
    bool razor_compensate = true;
    // How razor's order is found (razor.h RazorPreset): golden-stick's scoring and selection by default.
    std::string razor_preset = "reference";
    // Where the cache is compressed: empty, at the prompt's end (every reference: the whole prompt is
    // prefilled, the first token comes from it); else per needle the question's tokens, and the cache
    // is compressed before them (the context cached alone, the question and the answer decoded through
    // the compressed cache: a query-agnostic test, --kv-compress-at question).
    std::vector<int64_t> question_tokens;
    // > 0: DuoAttention's LongBench setting (eval/LongBench/pred.py l. 125-142, decoding_simulation_length
    // 50): the cache compressed before the prompt's last tail_tokens tokens, which decode one by one
    // through it (--kv-compress-at tail[:N]); exclusive with question_tokens.
    int64_t tail_tokens = 0;
    int64_t random_orders = 0;  // random KV-group orders for each order policy (seed + 3 + r)
    uint64_t seed = 0;
    int64_t sweep_rows = 8;
    // The position trial t's cache is compressed at (its prompt's length, or before its question).
    int64_t compress_at(const Trial& t) const;
    const char* compress_at_name() const { return !question_tokens.empty() ? "question" : tail_tokens > 0 ? "tail" : "prompt"; }
    // Compressed at the prompt's end: the policies act past a shared, unablated prefill.
    bool compresses_prompt_end() const { return question_tokens.empty() && tail_tokens == 0; }
};

// One column of the comparison: a budget (capacity 0) or a fixed capacity C (budget then the fraction of
// the cache C is, kv_capacity_fraction, which the order policies keep within).
struct KvColumn {
    double budget = 0;
    int64_t capacity = 0;
};
// The spec's columns: its budgets, then its capacities.
std::vector<KvColumn> kv_columns(const KvCompareSpec& s, const std::vector<Trial>& trials, int64_t H, int64_t K);
// The fraction of the full prompt cache (L K P) a capacity C per query head is, mean over the trials:
// min(1, C H / (K P)) each (P: the trial's compressed positions).
double kv_capacity_fraction(const KvCompareSpec& s, const std::vector<Trial>& trials, int64_t C, int64_t H, int64_t K);

// The model's heads as the policies count them: layers, query heads, KV heads, the query heads of a
// KV group (g = H / K) and the KV groups of the model (M = L K).
struct KvShape {
    int64_t L, H, K, g, M;
};

// One configuration to decode: the head set its budget builds and the cache it keeps.
struct KvConfig {
    HeadSet set;
    std::string key;           // identical configurations decode once
    std::vector<double> frac;  // per trial: prompt cache kept / (L K P)
    int64_t full_groups = -1;  // KV groups kept whole (order policies), -1 otherwise
};

// What a policy reads when it turns a budget into configurations.
struct KvContext {
    const KvCompareSpec& spec;
    KvShape sh;
    const std::vector<Trial>& trials;
    // SnapKV's pooled observation-window scores per trial [L, H, P - w] (filled when a listed policy
    // needs_snapkv()).
    std::shared_ptr<const std::map<const Trial*, at::Tensor>> pooled;
    // CriticalKV's value norms per trial [L, K, P] (filled when a listed policy needs_vo_norms()).
    std::shared_ptr<const std::map<const Trial*, at::Tensor>> vo_norms;
    // > 0: this column's fixed capacity in tokens per query head (the budget passed beside it is then
    // kv_capacity_fraction of it); 0: the column is the budget alone.
    int64_t capacity = 0;
};

// Where a policy's [L, H] score comes from; the tool reads it from the flag that carries it.
enum class KvScoreFrom {
    kNone,        // no score (full, snapkv)
    kImportance,  // the importance score (headkv): a needle score of this run or FILE.h5:DATASET
    kGates,       // DuoAttention's gates file, FILE.h5:DATASET (duo)
    kOwn,         // the policy computes it from the model (razor: RazorAttention's head selection, razor.h)
    kArgument,    // the word after "<name>:" (stream:SCORE): a needle score of this run or FILE.h5:DATASET
};

// A KV-cache policy: one file a policy (probes/needle/kv/kv_<name>.cpp) and one row in kv_policies()
// (kv_registry.cpp); docs/architecture.md, "A KV policy". The driver (run_kv_compare) asks each listed
// policy for its configuration at each budget and decodes them all; nothing else names a policy.
class KvPolicy {
public:
    virtual ~KvPolicy() = default;
    virtual const char* name() const = 0;  // the --kv-compare word (kArgument: the word before ':')
    virtual KvScoreFrom score_from() const { return KvScoreFrom::kNone; }
    // Why this run's needle score `s` cannot serve as its score ("" when it can; the tool puts the flag
    // and the score's name in front).
    virtual std::string refuse_score(NeedleScore) const { return {}; }
    // kOwn: the score and *source (where it came from); UsageError with param razor_preset for a bad preset.
    virtual at::Tensor own_score(const Model& m, const KvCompareSpec& s, std::string* source) const;
    virtual bool needs_snapkv() const { return false; }  // SnapKV's pooled scores, one prefill per trial
    virtual bool needs_vo_norms() const { return false; }  // CriticalKV's value norms, one prefill per trial
    // The spec's settings of this policy, checked whether or not it is listed: UsageError with the
    // setting's name as param (snapkv_kernel, headkv_temp).
    virtual void check_settings(const KvCompareSpec&) const {}
    // The score of a listed policy, already of shape [L, H]: UsageError (param kv_score) when it cannot serve.
    virtual void check_score(const KvPolicySpec&, const KvCompareSpec&) const {}
    // This policy's settings as /retrieval/kv_compare keeps them (attributes, written for every policy).
    virtual Attrs attrs(const KvCompareSpec&) const { return {}; }
    // The configuration at one budget, and its controls (order policies: the random orders at the
    // same count of whole groups, spec.random_orders of them; others none).
    virtual KvConfig config(const KvPolicySpec& p, double budget, const KvContext& ctx) const = 0;
    virtual std::vector<KvConfig> controls(const KvPolicySpec&, double, const KvContext&) const { return {}; }
};

// The registry (kv_registry.cpp): every policy, in the order messages list them.
const std::vector<const KvPolicy*>& kv_policies();
// "full" -> its row; "stream:locos" -> stream's (a kArgument policy's "<name>:<arg>", arg not empty;
// *arg the word after ':'). nullptr for an unknown name.
const KvPolicy* find_kv_policy(const std::string& listed, std::string* arg = nullptr);
std::string kv_policy_names();  // "full, snapkv, headkv, duo, razor, stream:SCORE"
// A score of this run as score_sources names it: "this run: scores/<name>/score".
std::string run_score_source(NeedleScore s);

// ---- what the policies share
// An order policy (duo, razor, stream): keeps whole the KV groups first in the order of its [L, H]
// score (the max over each group's query heads, NaN last), as many as the budget holds (measured), and
// compresses the others alike; its controls are random KV-group orders (seed + 3 + r) at that count.
class KvOrderPolicy : public KvPolicy {
public:
    KvConfig config(const KvPolicySpec& p, double budget, const KvContext& ctx) const override;
    std::vector<KvConfig> controls(const KvPolicySpec& p, double budget, const KvContext& ctx) const override;

protected:
    // The cache entries a compressed KV group holds of a P-token prompt.
    virtual int64_t entries(const KvCompareSpec& s, int64_t P) const = 0;
    // The compressed heads' part of the head set (`streamed`: every query head of the compressed
    // groups), and what it adds to the configuration's key.
    virtual void compress(const std::vector<Head>& streamed, const KvContext& ctx, KvConfig* c) const = 0;
    // The configuration's key prefix (stream:S decodes as duo: the same order, the same configuration).
    virtual const char* key_name() const { return name(); }

    KvConfig keep_whole(const std::vector<int64_t>& order, int64_t n, const KvContext& ctx) const;
    int64_t groups_within(double budget, const KvContext& ctx) const;
    // The random KV-group orders (seed + 3 + r) keeping n groups whole.
    std::vector<KvConfig> random_controls(int64_t n, const KvContext& ctx) const;
};

// DuoAttention's deployment of a compressed group (duo and stream:S, kv_duo.cpp): the prefill whole,
// then a sink and a recent window sliding with the query (spec duo_sink, duo_recent).
class KvStreamingPolicy : public KvOrderPolicy {
protected:
    int64_t entries(const KvCompareSpec& s, int64_t P) const override;
    void compress(const std::vector<Head>& streamed, const KvContext& ctx, KvConfig* c) const override;
    const char* key_name() const override { return "duo"; }
};

// snapkv / headkv at one budget: per trial, capacity B = round(budget P K / H) per query head (or the
// column's fixed capacity, ctx.capacity), caps(B) the [L, H] prefix positions each query head keeps
// besides the window; `whole(B, P)`: the reference's condition for leaving a P-token prompt whole
// (default: SnapKV's, kv_snapkv_whole).
KvConfig snapkv_config(const std::string& key_name, double budget, const KvContext& ctx,
                       std::function<at::Tensor(int64_t B)> caps, std::function<bool(int64_t B, int64_t P)> whole = {});
// The per-query-head capacity B a SnapKV-like column gives a P-token prompt: the fixed capacity when
// the column has one (> 0), else round(budget P K / H). snapkv, headkv and the Ada-KV policies share it.
int64_t snapkv_capacity(double budget, int64_t capacity, int64_t P, const KvShape& sh);
// A budget column's key: "NAME capacity C" for a fixed capacity, "NAME BUDGET" otherwise.
std::string kv_column_key(const std::string& key_name, double budget, int64_t capacity);
// SnapKV's condition (FasterDecoding/SnapKV snapkv_utils.py:42, FYYFU/HeadKV SnapKVCluster l. 148):
// `q_len < max_capacity_prompt` leaves the prompt whole, P < B. (At P = B SnapKV's selection keeps every
// position, so P <= B and P < B give the same cache.)
bool kv_snapkv_whole(int64_t B, int64_t P);
// HeadKV's (ReasonSnapKVCluster.update_kv l. 444): `base_capacity > attn_score.size(-1)`, i.e.
// B - w > P - w: P < B. At P = B HeadKV compresses: a head whose capacity is below P - w drops positions.
bool kv_headkv_whole(int64_t B, int64_t P);

// The decode steps past the compression that KvCompare's memory and time are measured over.
constexpr int64_t kKvTimedSteps = 8;

// Configuration c = policy * B + column (budgets, then capacities); random controls [P, B, R].
struct KvCompare {
    std::vector<std::string> policies;
    std::vector<double> budgets;             // [B]: each column's budget (a capacity's: kv_capacity_fraction)
    std::vector<int64_t> capacities;         // [B]: each column's capacity in tokens per query head, -1 for a budget
    std::vector<float> accuracy, rougeL_f;   // [P, B] over the ablation trials
    // [P, B]: the fraction of trials whose generated tokens equal the full cache's (the output kept,
    // whether or not the model solves the task)
    std::vector<float> same_as_full;
    std::vector<float> kv_fraction;          // [P, B]: mean over trials of the prompt cache kept / L K P
    std::vector<double> kv_bytes;            // [P, B]: mean over trials of the prompt cache's bytes
    std::vector<int64_t> full_groups;        // [P, B]: KV groups kept whole (order policies), -1 otherwise
    // [P, B], measured on one trial (the longest; timing_tokens) decoded alone, kKvTimedSteps steps past
    // the compression: the cache's allocated bytes at their peak (the packed cache's, src/model/packed_kv.h,
    // or the masked path's whole one) and the mean ms of a step; the full cache's beside them.
    std::vector<int64_t> peak_cache_bytes;
    std::vector<float> decode_ms;
    int64_t full_peak_cache_bytes = 0, timing_tokens = 0, timed_steps = 0;
    double full_decode_ms = 0;
    std::vector<float> random_accuracy, random_rougeL_f, random_kv_fraction, random_same_as_full;  // [P, B, R], NaN without an order
    double full_bytes = 0;                   // mean over trials: the full prompt cache
    int64_t distinct_sets = 0, score_passes = 0;
    int64_t trials = 0, random_orders = 0;
    // The parameters as /retrieval/kv_compare keeps them: every policy's settings (KvPolicy::attrs),
    // where each score came from, the controls' seeds, the full cache.
    Attrs attrs;
    // As the file keeps it; baseline_accuracy: the scan's unablated accuracy, beside the policies'.
    schema::KvCompareRecord stored(double baseline_accuracy) const;
};

// The comparison as a resumable job (src/jobs/jobs.h). Its work items are the ablation batches
// (NeedleTest::ablation_batches()), each decoding every distinct configuration of its trials as rows
// of shared forwards, so an item holds the same rows in one forward, hence gives the same bits,
// whatever was done before it. After each item the outcomes of its decodes are kept
// (schema::KvComparePartialRecord) and written at checkpoints to /retrieval/kv_compare/partial.
struct KvCompareJob {
    std::string out;                 // the file the partial state is appended to ("": no checkpoint)
    double checkpoint_seconds = 60;  // jobs::Checkpoint's
    int pause_ms = 0;                // jobs::Checkpoint's (the kill-and-resume test's window)
    std::shared_ptr<const schema::KvComparePartialRecord> resumed;  // load_kv_compare_resume's
};

// The comparison's identity as its partial state keeps it: KvCompare::attrs' parameters, the
// policies, budgets and sweep_rows; all known before the scan (a run score is named, not read).
Attrs kv_compare_params(const NeedleTest& test, const Model& m, const KvCompareSpec& spec);
// What a killed run of this comparison left in `path` (its partial state), nullptr when the file holds
// none. Read before the scan, which rewrites /retrieval. StorageError naming the file for another
// model, or (param "resume") for another comparison, naming the first parameter that differs.
std::shared_ptr<const schema::KvComparePartialRecord> load_kv_compare_resume(const std::string& path, const NeedleTest& test,
                                                                             const Model& m, const KvCompareSpec& spec);

// Runs every (policy, budget) and its random controls over test.ablation_trials(): SnapKV's scores once
// per trial (when snapkv or headkv is listed), identical configurations once, the rest as rows of
// shared forwards from one unablated prefill per trial. Compressed at the prompt's end (the default),
// every step after the first decodes through a packed cache (HeadSet::pack_cache: each row's kept
// entries alone); compressed before the question or the tail, the masked model runs (its prefill
// queries see the compressed cache). Then each distinct configuration decodes the longest trial alone
// for its measured peak cache bytes and step time (KvCompare). job.resumed's done items are skipped (a
// StorageError, param "resume", when its configurations are not these). UsageError naming the policy
// for a score of another shape or a negative HeadKV importance.
KvCompare run_kv_compare(const NeedleTest& test, const Model& m, const KvCompareSpec& spec, const KvCompareJob& job = {});

}  // namespace hs
