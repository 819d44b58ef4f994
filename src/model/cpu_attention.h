// Causal attention of a prefill chunk on an AVX2 or AVX-512 CPU, float32 (internal to the forward: blocks.cpp).
//
// libtorch's CPU flash kernel runs each block's two products through the BLAS as small GEMMs (k = d,
// n = d): at the needle scan's chunk shapes (25-1500 queries after 0-1800 cached keys, d = 64) it ran
// at 100-180 GFLOP/s of useful (causal) work where the machine's GEMM runs at ~320, and the masked
// call it needs after a cache computes the keys no query sees (issue 44; docs/performance.md
// "A prefill attention kernel"). This kernel keeps a block of Q queries in the vector lanes (Q = 32 in
// two 16-lane vectors on AVX-512, 16 in two 8-lane vectors on AVX2 with FMA: one body for both widths,
// cpu_attention_body.inc; the widest the running CPU has is taken):
//   scores^T [keys, Q] = K_block q^T    (each key's element broadcast against the queries' lanes)
//   softmax over keys, online (flash): a lane's running max and sum, its output rescaled a block
//   z^T [d, Q] += V_block^T p^T          (each value element broadcast against the lanes)
// so the softmax's max, exp and sum are lane-wise (no horizontal reduction), q^T is packed once a
// task, K and V are read in place (any row stride: the cache's [B, K, capacity, d] buffers), and a
// block of queries stops at the last key its last query sees (only the diagonal block is masked).
//
// Bits: a query's result depends on its own row of q, the keys and values it sees, and the fixed
// key blocks (absolute positions 0, 128, 256, ...): not on the queries beside it, the chunk it came
// in, the batch row or the thread. A prompt prefilled in one chunk or several gives the same bits,
// and a row of a batch equals its unbatched run. (On one machine: AVX-512's bits are not AVX2's.)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hs::blocks {

// Whether cpu_attention_z takes these operands: an AVX-512 or AVX2 + FMA CPU (the running machine), float32 q
// [B, T, H, d] and k, v [B, S, K, d] on the CPU with S >= T (a causal chunk after S - T cached keys),
// K dividing H, d <= kCpuAttentionMaxHead, the last dimension of each contiguous, no autograd.
bool cpu_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
constexpr int64_t kCpuAttentionMaxHead = 256;
// blocks::attention's fused path takes the kernel from this many queries a call: a task holds 32
// queries (AVX-512), so fewer leave lanes idle; measured against libtorch's masked call at 1000 keys
// (d = 64, 12 heads, 2 threads, AVX-512): 0.35x at 2 queries, 0.91x at 16, 1.20x at 24, 1.5-4.6x from 25 up.
constexpr int64_t kCpuAttentionMinQueries = 20;

// z [B, T, H, d] (contiguous): query t of row b (absolute position S - T + t) against keys 0..S-T+t,
// softmax(q k^T * scale) v, query head h reading kv head h / (H / K). Requires cpu_attention_applies.
at::Tensor cpu_attention_z(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale);

// A decode step's shared prompt attention on an AVX2 or AVX-512 CPU, float32 (blocks' shared prompt caches, read
// piece by piece: blocks::shared_pieces): whether the kernels below take head width d (16-256, a
// multiple of 16).
bool cpu_piece_kernels(int64_t d);
// out[i][j] = q_i . k_j for query rows i < nq (each d floats) and keys j < len (k_j at k + j * ldk):
// a product's bits depend on q_i and k_j alone (d / 16 or d / 8 lane-wise fused products, then a fixed
// reduction), not on the rows or keys beside it.
void cpu_piece_scores(const float* const* q, int nq, const float* k, int64_t ldk, int64_t len, int64_t d, float* const* out);
// acc_i[c] += sum_j w_i[j] v_j[c] for rows i < nq (acc_i: d floats, read and written), keys j < len (v_j at
// v + j * ldv) in order, one fused multiply-add a key: a row's keys split over calls in position order
// give the bits of one call.
void cpu_piece_values(const float* const* w, int nq, const float* v, int64_t ldv, int64_t len, int64_t d, float* const* acc);

}  // namespace hs::blocks
