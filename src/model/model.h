// A loaded model: config, canonical weights, and the forward pass with capture points.
#pragma once

#include "config.h"
#include "hooks.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hs {

// Canonical weights. Linear weights are [out, in] as in torch.nn.Linear; a tensor a family does
// not use stays undefined. q/k rows are in the rotate_half RoPE layout (llama2.c checkpoints are
// permuted at load), so one RoPE serves every family.
struct LayerWeights {
    at::Tensor attn_norm_w, attn_norm_b;          // [D]
    at::Tensor wq, wk, wv, wo;                    // [H*d, D], [K*d, D], [K*d, D], [D, H*d]
    at::Tensor bq, bk, bv, bo;                    // [H*d], [K*d], [K*d], [D]
    at::Tensor q_norm_w, k_norm_w;                // [d] per head (or [H*d]/[K*d] for OLMo-2)
    at::Tensor post_attn_norm_w, post_attn_norm_b;// Gemma 2/3 sandwich, OLMo-2 post-norm
    at::Tensor mlp_norm_w, mlp_norm_b;            // [D]
    at::Tensor w_gate, w_up, w_down;              // [F, D], [F, D], [D, F]
    at::Tensor b_gate, b_up, b_down;
    at::Tensor post_mlp_norm_w, post_mlp_norm_b;
};

struct ModelWeights {
    at::Tensor embed;        // [V, D]
    at::Tensor pos_embed;    // [P, D] learned positions (GPT-2)
    at::Tensor final_norm_w, final_norm_b;
    at::Tensor unembed;      // [V, D]
    at::Tensor unembed_b;    // [V]
    // [D, V] contiguous, CPU models only (load_model): a few rows (decode steps) multiply by it, as
    // MKL's and OpenBLAS's small-M GEMM against the transposed [V, D] is up to 2x slower.
    at::Tensor unembed_t;
    std::vector<LayerWeights> layers;
};

// Which attention kernel computes z where no hook needs the scores or the pattern (docs/forward.md,
// "Attention kernels"). Wherever a hook observes or edits scores or pattern, a window or a soft-cap
// acts, or rows need per-row exactness, the blocked attention runs whatever is chosen here.
enum class AttentionKernel {
    kAuto,     // the lane kernel (AVX2 or AVX-512 CPU, float32, blocks::uses_lane_attention), else fused where libtorch
               // has it (libtorch >= 2.1, CUDA or CPU), where nothing needs the pattern
    kBlocked,  // headscope's query-blocked attention (blocks::attention) everywhere
    kFused,    // libtorch's fused scaled-dot-product attention (libtorch >= 2.1) on any device
};

struct LoadOptions {
    c10::ScalarType dtype = c10::kFloat;
    c10::Device device = c10::Device(c10::kCPU);
    AttentionKernel attention = AttentionKernel::kAuto;
};
// Whether `o` lets the forward hand attention to libtorch's fused kernel at all (this libtorch has
// one, and kFused or kAuto); blocks::uses_fused_attention then decides per layer.
bool fused_attention_enabled(const LoadOptions& o);

// Keys and values of earlier positions, per layer: k, v [B, S, K, d]. The forward appends through
// append(): the positions go into per-layer buffers laid out [B, K, capacity, d] and k[l], v[l]
// become [B, S, K, d] views of them, so a decode step writes its one position in place instead of
// copying the whole cache, and each kv head's keys are one [S, d] matrix the attention reads
// without a copy. Capacity grows to reserve()'s hint, else doubles. Code may replace k[l], v[l] by
// any [B, S, K, d] tensors (a slice, a row expanded to a batch): the next append copies them into a
// fresh buffer. A copy of a cache shares the views, never the buffers (its appends go to its own).
// A compressed cache (`packed`, src/model/packed_kv.h: the entries a KV-cache policy keeps, ragged per
// (row, layer, head), and the tokens decoded after them) replaces k and v: pack_kv_cache() makes one
// from a whole cache, attention() reads it, length() is then its absolute length.
// Prompt caches shared by rows (`shared`): row b's keys are every position of the batch-1 cache
// (*shared)[shared_rows[b]] (all of one length, read only: never written through this cache), then the
// row's own positions k[l], v[l] [B, S_own, K, d]; length() counts both, and appends go to the own
// buffers alone. blocks::attention reads each shared cache once for all the rows that share it (the
// ablation rows of one trial, docs/forward.md "Shared prompt caches"); a reader of whole keys gets
// them gathered by whole() (a copy), and unshare() turns the cache into an ordinary one.
// Ragged rows (ragged()): shared caches of different lengths, so rows of trials of different prompt
// lengths decode in one forward (docs/forward.md "Ragged rows"): row b's positions continue from
// row_length(b), its keys are its shared cache's then its own, and length() is the longest row's.
// blocks::attention reads such a cache through the shared path only (no whole keys: whole(), unshare()
// and truncate() refuse it).
struct PackedKV;
struct KVCache {
    std::vector<at::Tensor> k, v;
    std::shared_ptr<PackedKV> packed;  // when set, k and v are empty (a copy of the cache clones it)
    std::shared_ptr<const std::vector<KVCache>> shared;
    std::vector<int64_t> shared_rows;  // [B]: the shared cache each row reads
    // Positions this cache has bit for bit in common with others, for rows whose shared caches were
    // filled from one another (the needle study's kept prefills): `content_id` names this cache's
    // positions (0: unnamed; new_content_id() gives a name never given before), `origins` lists
    // (id, n): positions [0, n) are those of the cache named id, root-most first (n non-decreasing).
    // Whoever fills a cache from another's positions sets them; truncate() and clear() drop them.
    // blocks::attention reads the positions that rows' shared caches have in common once for all of
    // them (docs/forward.md "Shared prefixes").
    uint64_t content_id = 0;
    std::vector<std::pair<uint64_t, int64_t>> origins;
    static uint64_t new_content_id();
    KVCache() = default;
    KVCache(const KVCache& o);
    KVCache& operator=(const KVCache& o);
    KVCache(KVCache&&) = default;
    KVCache& operator=(KVCache&&) = default;
    int64_t length() const;         // the positions a row sees (ragged rows: the longest row's)
    int64_t shared_length() const;  // the positions a row reads from its shared cache (ragged: the most; 0: none)
    bool ragged() const;            // shared caches of different lengths
    int64_t row_length(int64_t row) const;  // the positions row `row` sees (its shared cache's and the own)
    // Layer `layer`'s keys and values [B, S, K, d] of every position a row sees: with shared caches a
    // copy gathering them in front of the own positions, else k[l], v[l].
    std::pair<at::Tensor, at::Tensor> whole(int layer) const;
    void unshare();  // the shared positions copied into this cache's own (k[l], v[l] = whole(l))
    void clear();
    // The positions the cache will hold (e.g. prompt + new tokens): buffers are made that large at once.
    void reserve(int64_t positions) { reserved_ = positions; }
    // Keep the first `positions`; later appends overwrite the rest of this cache's own buffers.
    void truncate(int64_t positions);
    // Appends k_new, v_new [B, T, K, d] at `layer`; returns the layer's whole keys and values [B, S, K, d].
    std::pair<at::Tensor, at::Tensor> append(int layer, const at::Tensor& k_new, const at::Tensor& v_new);

private:
    std::vector<at::Tensor> kbuf_, vbuf_;  // [B, K, capacity, d]
    std::vector<const void*> owned_;       // the views of k[l] this cache handed out (else k[l] is foreign)
    int64_t reserved_ = 0;
};

// How linear layers treat the batch (docs/forward.md, "Batch rows and GEMMs").
enum class GemmMode {
    kAuto,    // per-row GEMMs when a row-specific head intervention is present, folded otherwise
    kFolded,  // one [B*T, D] x [D, N] GEMM: fastest; a row's last bits may depend on the batch
    kPerRow,  // one GEMM per batch row: every row bit-identical to its unbatched run
};

struct ForwardOptions {
    bool compute_logits = true;  // false: stop after the last layer (probes that need no logits)
    int stop_after_layer = -1;   // >= 0: run layers 0..stop_after_layer only (implies no logits)
    GemmMode gemm = GemmMode::kAuto;
    // Query rows per attention block when no one needs the whole [B, H, T, S] scores/pattern;
    // 0 = automatic (blocks of about 32 MiB of fp32 scores), >= T = one block.
    int64_t attn_block = 0;
    // Prefix reuse: start_layer > 0 skips the embedding and layers 0..start_layer-1 and starts from
    // start_resid, the resid_pre of start_layer [B, T, D] (e.g. captured once and expanded over
    // ablation configurations). tokens still give B, T and the positions. No KV cache.
    int start_layer = 0;
    at::Tensor start_resid;
    // The MLP blocks are left out, the residual passing them unchanged: for a model whose MLP output is
    // exactly 0 (w_down and b_down all zero and frozen: an attention-only toy in training, issue 44). The
    // Llama family, no hooks; a nonzero or trainable w_down / b_down is refused.
    bool attention_only = false;
};

// Where a model's weights came from: the file format, and for a Hugging Face cache name the repository,
// the revision asked for and the snapshot's commit (what makes a result reproducible).
struct ModelSource {
    std::string format;        // "safetensors", "llama2c" or "gguf"
    std::string hub_repo;      // "org/name" when the user named the model through the Hugging Face cache
    std::string hub_revision;  // the revision asked for ("main" when none was given)
    std::string hub_commit;    // the snapshot folder's commit hash
    std::string snapshot;      // the snapshot folder the name resolved to
};

class Model {
public:
    ModelConfig config;
    ModelWeights weights;
    LoadOptions options;
    std::string path;          // the checkpoint on disk (a hub name's snapshot folder)
    ModelSource source;
    std::string weight_files;  // ';'-joined weight files, for hashing

    // tokens: int64 [B, T] (or [T]) on any device. Returns logits [B, T, V] float32 for fp32 runs,
    // else in the compute dtype; an undefined tensor when logits are not requested.
    // With a cache, positions continue from cache->length() and the cache is extended.
    at::Tensor forward(const at::Tensor& tokens, const Hooks* hooks = nullptr, KVCache* cache = nullptr,
                       const ForwardOptions& opts = {}) const;

    // Final norm and unembedding of a residual stream [.., D] (with Gemma's final soft-cap).
    at::Tensor unembed(const at::Tensor& resid) const;
    // Final norm alone (probes need its scale).
    at::Tensor final_norm(const at::Tensor& resid) const;
    int64_t n_params() const;
    std::string weights_sha256() const;  // sha256 over the weight files in order (cached)

private:
    mutable std::string sha_cache_;
};

// Load a Hugging Face checkpoint folder (config.json + model.safetensors or sharded with
// model.safetensors.index.json) or a llama2.c .bin. Throws ConfigError / ModelLoadError naming
// the file and the problem.
std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& opts = {});

// The text of a config.json -> a validated ModelConfig (what load_model reads first). Throws
// ConfigError naming `where`: not JSON, no or unknown "architectures", a bad or missing field.
ModelConfig parse_model_config(const std::string& json_text, const std::string& where);

// Architectures named in config.json that this build supports.
std::vector<std::string> supported_architectures();

}  // namespace hs
