// The needle test's decode: the head sets it runs under, the prefix cache of kept prefills, LOCOS's
// mean-query calibration and the greedy decode loop (trials as rows of one batch, every decode step
// scored by needle_scoring.h). Methods: docs/methods.md ("Retrieval heads and LOCOS").
//
// Prefill runs in query chunks through the KV cache and each decode step keeps one attention row
// per head: memory grows linearly with the context.
#pragma once

#include "heads.h"
#include "hooks.h"
#include "intervention.h"
#include "model.h"
#include "needle_trials.h"
#include "scores.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace hs {

// The interventions a needle test can run (src/interp/intervention.h), in the order --help lists them.
const std::vector<Intervention>& needle_ablations();  // zero-query, mean-query, zero, stream

// Zero-query and zero act on the query after RoPE and on z; mean-query replaces the query BEFORE
// RoPE (after q-norm) with q_mean, which the family then rotates at each position (LOCOS's
// nolima_ablation.py). `rows` >= 0 aims the ablation at one batch row only.
// Stream gives each head the attention window `window` (sink, recent, compensation: Hooks::window).
struct HeadSet {
    std::vector<Head> heads;
    Intervention mode = Intervention::kNone;
    at::Tensor q_mean;  // [L, H, d] for kMeanQuery: pre-RoPE query mean (calibrate_query_mean)
    StreamWindow window;  // kStream
    // KV-cache policies (probes/needle/kv/kv_policy.h). kv_from: where a trial's cache is compressed (the
    // positions before it were prefilled whole; unset: the prompt's length P).
    // window_after_prompt (kStream): the window acts only on queries at kv_from and later
    // (StreamWindow::from): DuoAttention's deployment, a whole prefill and then sink + recent.
    // keep: the positions before kv_from each head keeps, for a trial: [L, H, kv_from] bool
    // (Hooks::keep); later keys (the decoded tokens) stay visible. keep_compensate: RazorAttention's
    // mean token for what is dropped.
    std::function<int64_t(const Trial&)> kv_from;
    bool window_after_prompt = false;
    std::function<at::Tensor(const Trial&)> keep;
    bool keep_compensate = false;
    // pack_cache: decode through a compressed cache (src/model/packed_kv.h) instead of masking the
    // whole one: once the first token is decoded from the whole cache (kv_from must be the prompt's
    // length), each row's kept entries (keep, keep_compensate's mean token; kStream heads with
    // window_after_prompt: the sink and the window) are packed per head and the later steps attend over
    // them alone. A batch with such a row packs every row (rows without a set keep every position);
    // needs scope decode, no per-step scores, and sets of kept positions or such windows only
    // (HS_REQUIRE). keep_query_heads: the kept entries are held one copy a query head (SnapKV and
    // HeadKV select after repeat_kv), else one a KV head, shared by its query heads.
    bool pack_cache = false;
    bool keep_query_heads = false;
    bool empty() const { return heads.empty() && !keep; }  // decodes as the unablated model
    // row >= 0: that batch row only; `trial` (the row's) is needed by keep and window_after_prompt.
    void apply(Hooks& hooks, int64_t row = -1, const Trial* trial = nullptr) const;
};

// Where a needle test's time goes (seconds, summed over its decodes): the prefill forwards, the
// decode steps' forwards, the per-step scoring, QRHead's query passes.
struct DecodeTimes {
    double prefill = 0, decode = 0, score = 0;
    double query = 0;  // QRHead's query passes (NeedleConfig::qrhead): the suffix with the question and the null query
    int64_t forwards = 0, rows = 0;  // the decode steps' forwards, and their batch rows summed
    void step(double seconds, int64_t batch_rows) { decode += seconds, ++forwards, rows += batch_rows; }
};

// A decode's cache, step by step (DecodeSettings::cache_log): each step's forward time and the bytes
// of the cache's allocated buffers after it, and whether it read a packed cache.
struct CacheLog {
    std::vector<double> step_seconds;
    std::vector<int64_t> cache_bytes;
    std::vector<char> packed;
    double pack_seconds = 0;  // building the packed cache from the whole one
    bool keep_logits = false;         // also each step's logits [B, V] (tests)
    std::vector<at::Tensor> logits;
};

struct DecodeSettings {
    int64_t max_new_tokens = 50;
    // Prompt positions a prefill forward: 2048 measured faster than 512 (docs/performance.md, "Prefill
    // chunks without a mask"): the GEMMs' rows; activations O(chunk x d_ff).
    int64_t prefill_chunk = 2048;
    bool score = true;  // capture rows and compute per-step scores
    NeedleScoreSet scores = NeedleScoreSet::all();  // which scores a step computes (the run's --score)
    bool keep_stop = false;  // StopOrder::kAfter: a stop token is kept and scored, then the row ends (Wu)
    DecodeTimes* times = nullptr;  // optional: time accumulated here
    AblationScope scope = AblationScope::kAll;
    // NeedleTest: keep the last prompt's KV cache and prefill only past the prefix the next batch
    // shares with it (PrefixCache). Off: every trial prefilled whole.
    bool reuse_prefix = true;
    CacheLog* cache_log = nullptr;  // optional: per step (one decode of one or more rows)
    // Each row reads its trial's prompt cache where it is (KVCache::shared, the kept prefill itself):
    // no copy into a batch cache, and rows of one trial (decode_batch_sets, scope decode) read its keys
    // once a step. Only where no step score reads the values (LOCOS: NeedleScoreRow::step_reads_values)
    // and no set hides keys by position (kept positions, windows, a packed cache); off: the rows'
    // prefills are copied into one batch cache (the same tokens; scores within float rounding).
    bool share_prompt = true;
};

// Whether a decode under settings `s` reads its trials' prompt caches in place (DecodeSettings::share_prompt
// and no step score reading the values), before any head set's say: the rule decode_batch applies to its
// rows (then also: no set hiding keys), and NeedleTest's to batching trials of any lengths (ragged rows).
bool reads_prompts_in_place(const DecodeSettings& s);

// Prefills kept between decodes of one pass. The trials of a grid share the haystack before the
// needle (every needle at one depth; the next depth up to the earlier insertion point; other lengths
// when the haystack is one text). Each trial is prefilled alone (batch 1) in chunks that end at the
// multiples of the chunk size and at its cuts (Trial::cuts: where it parts from another trial of
// the grid), so every trial that shares a prefix computes it in the same chunks with the same bits.
// Every prefill is kept here (the least recently used dropped first beyond max_bytes); a trial takes
// the positions it shares with the kept prefill that shares most, up to the last chunk end the two
// have in common, and prefills the rest: over the grid each node of the prompts' prefix tree is
// computed about once. The results equal a whole prefill's bit for bit, whatever ran before (shards
// and resumed runs agree with the whole run), and the rows of a batch are stacked from their trials'
// own prefills. Valid only between forwards with the same prefill interventions (the caller keys
// it; NeedleTest per pass) and while the trials live. Trials in `keep` stay (are not dropped) until
// release(): the scan's, for the ablation sets' rows (scope decode).
struct PrefixCache {
    struct Entry {
        KVCache cache;              // batch 1, the trial's prompt but its last token
        std::vector<int64_t> ends;  // its prefill's chunk ends
        int64_t bytes = 0, used = 0;
        bool pinned = false;
    };
    std::map<const Trial*, Entry> entries;
    int64_t reused = 0;     // prompt positions (summed over trials) taken from kept prefills
    int64_t computed = 0;   // prompt positions (summed over trials) prefilled
    int64_t max_bytes = 0;  // > 0: the kept prefills' bound
    int64_t bytes = 0, clock = 0;
    std::set<const Trial*> keep;
    void release(const Trial* t);  // t's prefill may be dropped again
    // Keeps t's prefill, dropping the least recently used unpinned ones to make room; false when it
    // does not fit.
    bool put(const Trial* t, const KVCache& cache, std::vector<int64_t> ends);
};

// Each prompt's Trial::cuts within its grid: the distinct lengths of its longest common prefix with
// every other prompt, ascending.
std::vector<std::vector<int64_t>> prefill_cuts(const std::vector<const std::vector<int64_t>*>& prompts);

// LOCOS's mean-query calibration (nolima_ablation.py calibrate_mean_activations): one prefill
// forward per prompt (no decode, unablated), the pre-RoPE query averaged over that prompt's
// positions, then the prompts' means averaged, each prompt weighing equally. [L, H, d] float.
// after_each (optional) runs after each prompt (progress).
at::Tensor calibrate_query_mean(const Model& m, const std::vector<std::vector<int64_t>>& prompts, int64_t prefill_chunk,
                                const std::function<void()>& after_each = {});

// One greedy decode. Step t feeds prompt[P-1] (t = 0) or generated[t-1] and produces
// generated[t] from that query's logits; a stop token ends the loop without being kept or scored.
struct DecodeOut {
    std::vector<int64_t> generated;
    // Per step t and head, every score's step arrays (score_rows: retrieval credit, LOCOS L+ and L-
    // already scaled by n/(K-n), HeadKV's R2 credit): [score][part] [steps, L, H] double; [0, L, H] for
    // a score DecodeSettings::scores does not name.
    PerNeedleScore<at::Tensor> steps;
    int64_t peak_keys = 0;
    const at::Tensor& step(NeedleScore s, size_t part = 0) const { return steps[static_cast<size_t>(s)][part]; }
};
DecodeOut decode_trial(const Model& m, const Trial& trial, const DecodeSettings& s,
                       const std::function<bool(int64_t)>& stop, const HeadSet* ablate = nullptr);

// Several trials decoded as rows of one batch (each row equals its trial decoded alone: the forward is
// batch-independent). Prompts of different lengths decode as ragged rows (KVCache::ragged) where the rows
// read their prompt caches in place (DecodeSettings::share_prompt, no step score reading the values, no
// set hiding keys), else as one batch a prompt length. A finished row keeps feeding its last
// token until every row stops; its outputs are not extended.
// With `prefix`, the prefill reuses and then replaces it (PrefixCache); s.reuse_prefix is not read here.
std::vector<DecodeOut> decode_batch(const Model& m, const std::vector<const Trial*>& trials, const DecodeSettings& s,
                                    const std::function<bool(int64_t)>& stop, const HeadSet* ablate = nullptr,
                                    PrefixCache* prefix = nullptr);

// Rows with their own head sets: row b decodes *trials[b] (unscored when s.score is false) under
// *sets[b] (nullptr: unablated); one trial may fill several rows. The rows share each GEMM
// (GemmMode::kFolded: a row equals its run alone up to fp rounding, docs/forward.md "Batch rows and
// GEMMs"). With AblationScope::kDecode the prefill is unablated, so each distinct trial is prefilled
// once and its KV cache copied to its rows, and `prefix` (optional, scope decode only) serves its chunks
// as for decode_batch.
std::vector<DecodeOut> decode_batch_sets(const Model& m, const std::vector<const Trial*>& trials,
                                         const std::vector<const HeadSet*>& sets, const DecodeSettings& s,
                                         const std::function<bool(int64_t)>& stop, PrefixCache* prefix = nullptr);

}  // namespace hs
