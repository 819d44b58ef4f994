// Capture and intervention points. Each family's forward calls `hooks.run(point, layer, x)` at
// the canonical points below, only after `hooks.wants(point, layer)`: a point nobody subscribed
// to is never materialised (attn.head_out and the [B,H,T,T] scores/pattern in particular).
//
// Shapes (B batch rows, T query positions, S key positions incl. any cache, H query heads,
// K key/value heads, d head dim, D model dim). Query head h reads key/value head h / (H / K).
//   resid_pre, resid_mid, resid_post, attn_out, mlp_out   [B, T, D]
//   attn.q_pre_rope                                         [B, T, H, d]  after q-norm, before RoPE
//   attn.q                                                  [B, T, H, d]  after RoPE (and q-norm)
//   attn.k, attn.v                                          [B, S, K, d]  after RoPE (k)
//   attn.scores                                             [B, H, T, S]  scaled, soft-capped, masked (-inf)
//   attn.pattern                                            [B, H, T, S]  softmax of scores
//   attn.z                                                  [B, T, H, d]  pattern @ v, before W_O
//   attn.head_out                                           [B, T, H, D]  z_h W_O^h (no bias)
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hs {

enum class Point : int {
    kResidPre, kAttnQPreRope, kAttnQ, kAttnK, kAttnV, kAttnScores, kAttnPattern, kAttnZ, kAttnHeadOut,
    kAttnOut, kResidMid, kMlpOut, kResidPost, kCount
};
constexpr int kNumPoints = static_cast<int>(Point::kCount);

const char* point_name(Point p);            // "attn.pattern"
Point parse_point(const std::string& name); // throws ConfigError listing the valid names
std::vector<std::string> all_point_names();

// What happens to one head's activation. Rows: -1 = every batch row.
enum class HeadOp {
    kZero,     // value := 0
    kScale,    // value *= scale
    kReplace,  // value := `value` ([d], [T, d] or [B?] broadcast to [T, d] for that row)
    kAddPeer,  // value += scale x the same head's value in batch row `peer` (before this layer's
               // interventions): JUICE's dual run as two rows of one forward (probes/decoding/decoding.h)
};

struct HeadIntervention {
    int layer = 0;
    int head = 0;
    int64_t row = -1;
    HeadOp op = HeadOp::kZero;
    double scale = 0.0;
    at::Tensor value;  // for kReplace
    int64_t peer = -1;  // for kAddPeer: the row read (row must be >= 0 and differ from it)
};

// An attention window's settings (Intervention::kStream; docs/forward.md, "Attention windows"):
// query position q sees keys [0, sink) and (q - recent, q], and on a sliding-window layer only those
// the layer's window shows too (the tighter of the two). With `compensate`, one more key and value,
// the means of the keys and values the window hides from q that the layer would show
// (RazorAttention's compensation token), scored like any key. The defaults are the command line's.
// `from` > 0: only queries at positions >= from get the window (DuoAttention's deployment: a whole
// prefill of `from` prompt tokens, then the streaming heads' cache trimmed to sink + recent).
// `block` > 1: the window in blocks of `block` positions, as DuoAttention trains (block_sparse_attn's
// block_streaming_attn_func with num_sink_blocks = ceil(sink / block), num_recent_blocks =
// ceil(recent / block), duo_attn/patch/llama.py l. 450-452): the query at p sees the keys of blocks
// [0, ceil(sink / block)) and of blocks p / block - ceil(recent / block) + 1 .. p / block up to p
// itself (causal in its block). block 1 is the token window above; a block window does not compensate.
struct StreamWindow {
    int64_t sink = 4;
    int64_t recent = 64;  // >= 1: the query always sees itself
    bool compensate = false;
    int64_t from = 0;
    int64_t block = 1;    // >= 1
};

// Which query heads get a window: `head` in batch row `row` (-1: every row), or, when `rows_heads`
// is defined, every (row, head) where that [B, H] tensor is nonzero (the ablation engine's per-row
// configurations).
struct HeadWindow {
    int layer = 0;
    int head = 0;
    int64_t row = -1;
    StreamWindow window;
    at::Tensor rows_heads;  // [B, H], optional
};

// One layer's windows as the attention reads them: [B, H] on the attention's device. A head
// without a window has sink 0 and recent kNoWindow (it sees every key the layer shows). A block
// window is held in token terms: sink = ceil(sink / b) b, recent = (ceil(recent / b) - 1) b + 1 and
// block = b, and the query at p sees key s < sink or s > p - recent - (p mod b) (block 1: the token
// window itself).
struct LayerWindows {
    static constexpr int64_t kNoWindow = int64_t{1} << 60;
    at::Tensor sink, recent;  // int64
    at::Tensor compensate;    // bool
    at::Tensor from;          // int64: the first query position the window acts on
    at::Tensor block;         // int64: 1 for a token window
    bool any_compensate = false, any_from = false, any_block = false;
    bool defined() const { return sink.defined(); }
};

// A compressed prompt cache (KV-cache policies: SnapKV / HeadKV's per-head kept positions,
// RazorAttention's sink + compensation + recent; docs/forward.md "Kept positions"): queries at
// positions >= `from` (what is decoded after a prompt of `from` tokens) see a key s < from only where
// keep[h][s]; keys >= from (the decoded tokens, never evicted) and every key of queries < from (the
// prefill, which ran whole) stay as the layer shows them. With `compensate`, those queries get one
// more key and value: the means of the hidden keys s < from and of their values (RazorAttention's
// `_compress`), scored like any key. `keep` is [H, from] bool (every query head; the KV-group rule is
// the caller's; a head that keeps every position is untouched), in batch row `row` (-1: every row).
struct HeadKeep {
    int layer = 0;
    int64_t row = -1;
    int64_t from = 0;
    at::Tensor keep;  // [H, from] bool
    bool compensate = false;
};

// One layer's kept positions as the attention reads them, on the attention's device. Rows without
// a keep have from 0 (nothing hidden).
struct LayerKeeps {
    at::Tensor visible;     // [B, H, F] bool, F = the largest from: key s < from[b] seen by later queries
    at::Tensor from;        // [B] int64
    at::Tensor compensate;  // [B, H] bool
    bool any_compensate = false;
    int64_t max_from = 0;
    bool defined() const { return visible.defined(); }
};

// Observer: sees the tensor, may keep a reduction. Editor: returns a replacement or nullopt.
using CaptureFn = std::function<void(int layer, const at::Tensor& x)>;
using EditFn = std::function<std::optional<at::Tensor>(int layer, const at::Tensor& x)>;
// Row-block observer for attn.scores and attn.pattern: sees query rows [q0, q0 + x.size(2)) of the
// layer's [B, H, T, S] tensor (q0 counts from the first query of this forward call, not from any
// cache). While a layer's scores and pattern have only row-block observers (no whole-tensor
// capture, no edit), attention runs in query blocks and the [B, H, T, S] tensor is never formed:
// scratch memory is O(block x S) per head (docs/forward.md, "Attention in query blocks").
using RowCaptureFn = std::function<void(int layer, int64_t q0, const at::Tensor& rows)>;

class Hooks {
public:
    // layer -1 subscribes to every layer.
    void capture(Point p, CaptureFn fn, int layer = -1);
    void edit(Point p, EditFn fn, int layer = -1);
    // Only attn.scores and attn.pattern (ConfigError otherwise). The rows handed to `fn` live in
    // scratch that the next block overwrites: reduce them, or clone what must be kept.
    void capture_rows(Point p, RowCaptureFn fn, int layer = -1);
    // Head-level interventions on z (before W_O) and on the query (after RoPE). A zeroed query
    // gives uniform attention over the visible prefix: the retrieval-head masking convention.
    void intervene_z(const HeadIntervention& iv);
    void intervene_q(const HeadIntervention& iv);
    // Head-level interventions on the query before RoPE (after q-norm where the family has one):
    // the family then rotates the result at each position like any query. A replaced pre-RoPE
    // query is LOCOS's mean-query ablation (mean-query-pre-rope in src/interp/intervention.h; docs/methods.md); a zeroed one equals a zeroed query.
    void intervene_q_pre_rope(const HeadIntervention& iv);
    // An attention window (above). ConfigError for sink < 0, recent < 1, block < 1 or a compensated block window.
    void window(const HeadWindow& w);
    // Kept positions (above). ConfigError for a keep that is not [H', from] with from >= 1.
    void keep(const HeadKeep& k);
    void clear();

    bool wants(Point p, int layer) const;
    // Anything at `layer`: a capture, edit or row observer at any point (or at every layer), a head
    // intervention, a window or a kept-position set.
    bool touches(int layer) const;
    // A whole-tensor capture or an edit is subscribed at (p, layer): the tensor must be formed whole.
    bool needs_whole(Point p, int layer) const;
    // Any head intervention aimed at one batch row (row >= 0): rows then differ, and the forward
    // keeps one GEMM per row so that the other rows stay bit-identical to their unbatched runs.
    bool has_row_specific_interventions() const;
    bool has_z_interventions(int layer) const;
    bool has_q_interventions(int layer) const;
    bool has_q_pre_rope_interventions(int layer) const;
    bool has_windows(int layer) const;
    // The layer's windows for B rows of H heads on `device` (undefined when it has none). ConfigError
    // for a head or row out of range or a rows_heads mask of another shape.
    LayerWindows windows(int layer, int64_t B, int64_t H, c10::Device device) const;
    bool has_keeps(int layer) const;
    // The layer's kept positions for B rows of H heads (undefined when it has none). ConfigError for
    // a keep of another head count, a row out of range, or two keeps on one (row, layer).
    LayerKeeps keeps(int layer, int64_t B, int64_t H, c10::Device device) const;
    // Applies edits (in subscription order) then captures; returns the possibly replaced tensor.
    // Row-block observers see the whole tensor here with q0 = 0.
    at::Tensor run(Point p, int layer, at::Tensor x) const;
    // Row-block observers of (p, layer) see rows [q0, q0 + rows.size(2)).
    void run_rows(Point p, int layer, int64_t q0, const at::Tensor& rows) const;
    // z [B,T,H,d] / q [B,T,H,d] with this layer's head interventions applied (out of place).
    at::Tensor apply_z(int layer, const at::Tensor& z) const;
    at::Tensor apply_q(int layer, const at::Tensor& q) const;
    at::Tensor apply_q_pre_rope(int layer, const at::Tensor& q) const;

private:
    struct Entry {
        int layer;
        CaptureFn capture;
        EditFn edit;
        RowCaptureFn rows;
    };
    std::array<std::vector<Entry>, kNumPoints> entries_;
    std::vector<HeadIntervention> z_ivs_, q_ivs_, q_pre_ivs_;
    std::vector<HeadWindow> windows_;
    std::vector<HeadKeep> keeps_;
};

}  // namespace hs
