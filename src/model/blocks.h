// Building blocks shared by the family forwards (internal header: includes torch).
// Each block does one published operation; the families call them top to bottom.
#pragma once

#include "model.h"

#include <torch/torch.h>

namespace hs::blocks {

// One Model::forward call as the blocks see it, made once by Model::forward and handed to the
// family's forward: the model, its hooks and cache, the options, and what they resolve to (GEMM
// mode, attention block size, the layers to run). Everything a block does differently for this
// call comes from here, explicitly: nothing is read from a global or a thread-local.
struct Pass {
    const Model& m;
    const Hooks* hooks;
    KVCache* cache;
    const ForwardOptions& opts;
    bool per_row_gemm = false;  // one GEMM per batch row (rows with their own interventions stay exact)

    int first_layer() const { return opts.start_layer; }
    int last_layer() const;
    // The residual stream entering first_layer(): `embed()` (the family's embedding), or
    // opts.start_resid when the call resumes at a later layer (prefix reuse).
    template <class F>
    at::Tensor start(F&& embed) const {
        return opts.start_layer > 0 ? opts.start_resid : embed();
    }
    // Logits of the final residual (final norm, unembedding), or an undefined tensor when the call
    // asked for none or stopped early.
    at::Tensor finish(const at::Tensor& x) const;

    at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
    at::Tensor mlp(const LayerWeights& lw, const at::Tensor& x) const;
    // blocks::attention with this call's hooks, cache and block size.
    at::Tensor attention(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
    // blocks::query_pre_rope with this call's hooks; hook() likewise.
    at::Tensor query_pre_rope(int layer, at::Tensor q) const;
    at::Tensor hook(Point p, int layer, at::Tensor x) const;
    // The model's last layer in a call that computes no logits into a KV cache (a prefill), with no hook,
    // intervention, window or keep at that layer: its keys and values are all that is read later (the
    // next call's attention), so the family appends them (keep_keys) and stops there, skipping that
    // layer's attention, W_O and MLP over the chunk (docs/forward.md, "The last layer of a prefill").
    bool keys_only(int layer) const;
    void keep_keys(int layer, const at::Tensor& k, const at::Tensor& v) const;
};
// Query rows per attention block for B x H heads over S keys (requested 0 = automatic).
int64_t attention_block_rows(int64_t requested, int64_t B, int64_t H, int64_t T, int64_t S);

// Normalisation by config.norm, computed in float32 and cast back (as Hugging Face does).
at::Tensor norm(const ModelConfig& cfg, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, bool plus_one);
// x W^T + b. per_row: one GEMM per batch row (BLAS picks kernels by matrix size, so in a folded
// GEMM a row's last bits depend on the other rows; per row, a row equals its unbatched run).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool per_row);
// x [..., D] with 1-16 rows in all (float32: up to 64 on an AVX2 or AVX-512 CPU), w [N, D] (+ b [N]), float32
// or bfloat16 on the CPU, no autograd: x W^T + b
// streaming W once for every row (a decode step; each row's bits independent of the others), else
// an undefined tensor. linear() and unembed() take it when it applies.
at::Tensor gemv_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
// at::bmm(a, b) for [N, M, k] x [N, k, n] products of small matrices (M k n <= 2^22: a decode step's
// query rows against each (row, kv head)'s keys, its pattern against the values) on the CPU: the N
// products split over the intra-op threads, each on one thread (OpenBLAS: at::bmm's bits; MKL picks
// its kernel by a thread's share, within float rounding of at::bmm). Otherwise at::bmm.
at::Tensor bmm_small(const at::Tensor& a, const at::Tensor& b);
// out = a b (no autograd) for a [N, M, K], b [N, K, P] of any strides, out [N, M, P]: at::bmm_out's bits. Where
// at::bmm loops over the items (float32 on the CPU, a libtorch without MKL: Debian's), each item takes
// the BLAS call that loop makes, without its per-item tensor bookkeeping; otherwise at::bmm_out.
void bmm_items(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);
at::Tensor bmm_items(const at::Tensor& a, const at::Tensor& b);
// Under autograd, the blocked attention's causal float32 blocks on the CPU run as one function whose
// forward and backward split the (row, kv head) products over the threads, bit-identical to autograd of
// the plain ops (training; blocks.cpp CausalCore). Off: the plain ops (for the tests that compare them).
void set_autograd_attention_core(bool on);
// Rows reading shared prompt caches (KVCache::shared), their positions as pieces: cache `cache`'s
// positions [a, b) read by `rows` (ascending), each row's keys at those very positions. A row whose
// cache was filled from another's positions (KVCache::origins) reads them from the root-most such cache
// of the batch, so positions the rows' caches have in common are one piece of all their rows; its
// other positions are pieces of its own cache. Each (row, position) lies in exactly one piece. The
// shared attention on the CPU reads the caches piece by piece (one product of the piece's queries),
// following the origins where its piece kernels (AVX2 or AVX-512) run.
struct SharedPiece {
    int64_t cache, a, b;
    std::vector<int64_t> rows;
};
// follow_origins = false: one piece a cache and its rows (the origins ignored).
std::vector<SharedPiece> shared_pieces(const std::vector<KVCache>& shared, const std::vector<int64_t>& shared_rows,
                                       bool follow_origins = true);
// per_row: row by row, as linear() (libtorch 2.x's vectorized activations round their scalar tail
// differently, and the tail depends on the tensor's size).
at::Tensor activation(Activation a, const at::Tensor& x, bool per_row);
// Final norm, unembedding (per_row as in linear) and Gemma 2's final soft-cap: Model::unembed.
at::Tensor unembed(const Model& m, const at::Tensor& resid, bool per_row);
at::Tensor mlp(const ModelConfig& cfg, const LayerWeights& lw, const at::Tensor& x, bool per_row);

// RoPE tables for absolute positions [T] (or a ragged batch's [B, T]): cos, sin [T, rot_dim] (or
// [B, T, rot_dim]) in the rotate_half layout.
struct Rope {
    at::Tensor cos, sin;
    int64_t rot_dim = 0;
};
Rope rope_tables(const ModelConfig& cfg, const at::Tensor& positions, double theta, c10::ScalarType dtype);
// x [B, T, N, d]: rotates the first rot_dim dims of each head (rotate_half), passes the rest.
at::Tensor apply_rope(const at::Tensor& x, const Rope& rope);

// The query before RoPE, q [B, T, H, d] after the family's q-norm (if any): the layer's pre-RoPE
// query interventions, then the attn.q_pre_rope capture point. Every family calls it on its way
// to RoPE (GPT-2, which has none, just before attention).
at::Tensor query_pre_rope(const Hooks* hooks, int layer, at::Tensor q);

// The attention of one layer from projected q [B,T,H,d] (after RoPE) and k, v [B,T,K,d]:
// query interventions, cache, scores, mask (causal, sliding window), soft-cap, softmax,
// z interventions, W_O, with every capture point from attn.q to attn_out. Returns attn_out [B,T,D].
// attn_block: query rows per block (0 = automatic); per_row: linear()'s W_O GEMM per batch row.
at::Tensor attention(const Model& m, int layer, at::Tensor q, at::Tensor k, at::Tensor v, const Hooks* hooks,
                     KVCache* cache, int64_t attn_block, bool per_row);

// Whether attention() hands this layer's product to libtorch's fused kernel (LoadOptions::attention,
// AttentionKernel): not where a hook observes or edits scores or pattern, or the family soft-caps
// scores. A window that hides keys needs the blocked attention: in a per-row forward only the rows
// that carry one take it (the others stay fused, one kernel call a row, bit-identical to their
// unbatched runs); in a folded forward the whole layer does. A window that hides nothing at the
// call's key count (sink + recent >= keys) changes nothing and keeps the fused kernel.
bool uses_fused_attention(const Model& m, int layer, const Hooks* hooks);

// Whether attention() may hand this layer's calls of kCpuAttentionMinQueries queries or more to the
// lane kernel (cpu_attention.h) where the operands allow it (float32 on an AVX2 or AVX-512 CPU): not under
// AttentionKernel::kBlocked, not where a hook observes or edits scores or pattern, not on a
// sliding-window or soft-capped layer. Any libtorch (Debian's 1.13 too). Rows whose windows or kept
// positions hide keys take the blocked attention, as from the fused kernel (a window that hides
// nothing keeps the kernel: the same bits as no window).
bool uses_lane_attention(const Model& m, int layer, const Hooks* hooks);

// A prefill chunk of T queries after P cached keys that the lane kernel does not take (bfloat16, or a
// CPU without AVX2) takes compat::chunk_attention (CPU, libtorch >= 2.5, no sliding window) where T >= kChunkAttentionQueries or P >= kChunkAttentionPast; other chunks keep
// the masked call. Measured against the masked call (docs/performance.md, "Prefill chunks without a
// mask"): 1.09-1.65x on every measured shape past either bound (2048-query chunks 1.31-1.65x), 0.85-1.06x
// below both (the diagonal call's overhead against a short past).
constexpr int64_t kChunkAttentionQueries = 1024;
constexpr int64_t kChunkAttentionPast = 2048;

// The same attention written whole, as a reader learns it (no cache bookkeeping, no query blocks,
// no scratch reuse, no hooks): q [B, T, H, d] after RoPE, k, v [B, S, K, d] holding every key the
// queries see (S - T of them from before: `past`), -> z [B, T, H, d] before W_O. attention() must
// equal it (tests/test_blocks.cpp); read this one first.
// windows (optional): the layer's attention windows (Hooks::windows), applied as attention()
// applies them, compensation included (in double, from the hidden keys directly).
// keeps (optional): the layer's kept positions (Hooks::keeps), likewise. A layer may compensate for
// windows or for kept positions, not both.
at::Tensor attention_reference(const ModelConfig& cfg, int layer, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const LayerWindows* windows = nullptr,
                               const LayerKeeps* keeps = nullptr);

// Positions [T] int64 continuing from the cache; [B, T] for ragged rows (KVCache::ragged: each row from its own length).
at::Tensor positions_for(const at::Tensor& tokens, const KVCache* cache);

inline at::Tensor hook(const Hooks* h, Point p, int layer, at::Tensor x) {
    return (h && h->wants(p, layer)) ? h->run(p, layer, std::move(x)) : x;
}

}  // namespace hs::blocks
