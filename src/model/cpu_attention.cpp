#include "cpu_attention.h"

#include "errors.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <cstring>
#include <limits>
#include <vector>

namespace hs::blocks {

#if defined(__x86_64__)
// (GCC 12 warns inside its own AVX-512 intrinsics: their extracts take an undefined operand.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

constexpr int64_t kKB = 128;  // keys a block (absolute: blocks start at multiples of kKB)

struct Operands {
    const float *q, *k, *v;
    float* z;
    int64_t q_b, q_t, q_h;  // strides (elements); the last dimension is contiguous
    int64_t k_b, k_s, k_h;
    int64_t v_b, v_s, v_h;
    int64_t T, S, P, H, g, d;
    float scale;
};

using PieceScoresFn = void (*)(const float* const*, int, const float*, int64_t, int64_t, float* const*);
using PieceValuesFn = void (*)(const float* const*, int, const float*, int64_t, int64_t, float* const*);
// One vector width's kernels (cpu_attention_body.inc): queries a task, the task, the piece kernels by d / 16 - 1.
struct Kernels {
    int kQ;
    void (*attend)(const Operands&, int64_t, int64_t, int64_t, int64_t, float*, float*, float*);
    const PieceScoresFn* scores;
    const PieceValuesFn* values;
};

// AVX-512: 32 queries a task in two vectors of 16 lanes; tiles of 12 keys / 8 value columns (24
// accumulators of the 32 registers).
namespace avx512 {
#define HS_ISA __attribute__((target("avx512f")))
#define HS_OP HS_ISA inline __attribute__((always_inline))
using V = __m512;
using VI = __m512i;
constexpr int kW = 16, kQ = 32, kJ = 12, kC = 8;
HS_OP V zero() { return _mm512_setzero_ps(); }
HS_OP V set1(float x) { return _mm512_set1_ps(x); }
HS_OP V load(const float* p) { return _mm512_loadu_ps(p); }
HS_OP void store(float* p, V x) { _mm512_storeu_ps(p, x); }
HS_OP V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
HS_OP V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
HS_OP V mul(V a, V b) { return _mm512_mul_ps(a, b); }
HS_OP V add(V a, V b) { return _mm512_add_ps(a, b); }
HS_OP V sub(V a, V b) { return _mm512_sub_ps(a, b); }
HS_OP V max_(V a, V b) { return _mm512_max_ps(a, b); }
HS_OP V div(V a, V b) { return _mm512_div_ps(a, b); }
HS_OP V round_nearest(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
HS_OP V scale2(V p, V n) { return _mm512_scalef_ps(p, n); }
HS_OP VI loadi(const int32_t* p) { return _mm512_loadu_si512(p); }
HS_OP V hide_after(V x, int32_t j, VI qpos) {
    const __mmask16 seen = _mm512_cmp_epi32_mask(_mm512_set1_epi32(j), qpos, _MM_CMPINT_LE);
    return _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), seen, x);
}
HS_OP V keep_seen(V p, V x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ), p);
}
HS_OP float hsum(V x) { return _mm512_reduce_add_ps(x); }
#include "cpu_attention_body.inc"
#undef HS_OP
#undef HS_ISA
}  // namespace avx512

// AVX2 with FMA: 16 queries a task in two vectors of 8 lanes; tiles of 6 keys / 6 value columns (12
// accumulators of the 16 registers). The same algorithm and block boundaries; other bits than AVX-512's
// (a machine's results are its own; tests hold both to float64).
namespace avx2 {
#define HS_ISA __attribute__((target("avx2,fma")))
#define HS_OP HS_ISA inline __attribute__((always_inline))
using V = __m256;
using VI = __m256i;
constexpr int kW = 8, kQ = 16, kJ = 6, kC = 6;
HS_OP V zero() { return _mm256_setzero_ps(); }
HS_OP V set1(float x) { return _mm256_set1_ps(x); }
HS_OP V load(const float* p) { return _mm256_loadu_ps(p); }
HS_OP void store(float* p, V x) { _mm256_storeu_ps(p, x); }
HS_OP V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
HS_OP V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
HS_OP V mul(V a, V b) { return _mm256_mul_ps(a, b); }
HS_OP V add(V a, V b) { return _mm256_add_ps(a, b); }
HS_OP V sub(V a, V b) { return _mm256_sub_ps(a, b); }
HS_OP V max_(V a, V b) { return _mm256_max_ps(a, b); }
HS_OP V div(V a, V b) { return _mm256_div_ps(a, b); }
HS_OP V round_nearest(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// p 2^n for integral n in [-126, 0] (exp_ps' clamp): the exponent field built, one exactly rounded product.
HS_OP V scale2(V p, V n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
HS_OP VI loadi(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
HS_OP V hide_after(V x, int32_t j, VI qpos) {
    const __m256 after = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(j), qpos));
    return _mm256_blendv_ps(x, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), after);
}
HS_OP V keep_seen(V p, V x) {
    return _mm256_and_ps(p, _mm256_cmp_ps(x, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ));
}
HS_OP float hsum(V x) {  // (lanes 0-3 + 4-7), then pairs, then the two halves
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#include "cpu_attention_body.inc"
#undef HS_OP
#undef HS_ISA
}  // namespace avx2

// The widest kernels this CPU runs, or none (no AVX2 with FMA).
const Kernels* kernels() {
    static const Kernels* k = __builtin_cpu_supports("avx512f")                                    ? &avx512::kKernels
                              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &avx2::kKernels
                                                                                                  : nullptr;
    return k;
}

}  // namespace

bool cpu_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    if (!kernels() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
    if (!q.device().is_cpu() || !k.device().is_cpu() || !v.device().is_cpu()) return false;
    if (q.scalar_type() != at::kFloat || k.scalar_type() != at::kFloat || v.scalar_type() != at::kFloat) return false;
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3), S = k.size(1), K = k.size(2);
    if (T < 1 || S < T || S > std::numeric_limits<int32_t>::max() || K < 1 || H % K != 0 || d < 1 ||
        d > kCpuAttentionMaxHead)
        return false;
    if (k.size(0) != B || v.size(0) != B || v.size(1) != S || v.size(2) != K || k.size(3) != d || v.size(3) != d) return false;
    if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1) return false;
    return !(at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()));
}

at::Tensor cpu_attention_z(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
    HS_REQUIRE(cpu_attention_applies(q, k, v), "cpu_attention_z: operands outside the kernel (cpu_attention_applies)");
    const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3), S = k.size(1), K = k.size(2);
    auto z = at::empty({B, T, H, d}, q.options());
    const Operands o{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), z.data_ptr<float>(),
                     q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                     v.stride(0), v.stride(1), v.stride(2), T, S, S - T, H, H / K, d, static_cast<float>(scale)};
    const Kernels& kn = *kernels();
    const int64_t kQ = kn.kQ, blocks = (T + kQ - 1) / kQ, tasks = B * H * blocks;
    // Tasks in (row, head, query block) order: at::parallel_for hands each thread a contiguous run,
    // so with H a multiple of the threads each gets whole heads and the same causal work.
    at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> scratch(static_cast<size_t>(2 * d * kQ + kKB * kQ + 16));
        float* base = scratch.data();
        base += (16 - (reinterpret_cast<std::uintptr_t>(base) / sizeof(float)) % 16) % 16;  // 64-byte aligned
        float *qt = base, *ot = base + d * kQ, *st = base + 2 * d * kQ;
        for (int64_t t = t0; t < t1; ++t) {
            const int64_t blk = t % blocks, h = (t / blocks) % H, b = t / (blocks * H);
            const int64_t i0 = blk * kQ;
            kn.attend(o, b, h, i0, std::min<int64_t>(kQ, T - i0), qt, ot, st);
        }
    });
    return z;
}

bool cpu_piece_kernels(int64_t d) { return kernels() && d >= 16 && d <= kCpuAttentionMaxHead && d % 16 == 0; }

void cpu_piece_scores(const float* const* q, int nq, const float* k, int64_t ldk, int64_t len, int64_t d, float* const* out) {
    HS_REQUIRE(cpu_piece_kernels(d), "cpu_piece_scores: an AVX2 or AVX-512 CPU and a head width of 16-256, a multiple of 16");
    kernels()->scores[d / 16 - 1](q, nq, k, ldk, len, out);
}

void cpu_piece_values(const float* const* w, int nq, const float* v, int64_t ldv, int64_t len, int64_t d, float* const* acc) {
    HS_REQUIRE(cpu_piece_kernels(d), "cpu_piece_values: an AVX2 or AVX-512 CPU and a head width of 16-256, a multiple of 16");
    kernels()->values[d / 16 - 1](w, nq, v, ldv, len, acc);
}

#pragma GCC diagnostic pop
#else
bool cpu_piece_kernels(int64_t) { return false; }
void cpu_piece_scores(const float* const*, int, const float*, int64_t, int64_t, int64_t, float* const*) {
    throw hs::Error("cpu_piece_scores: an x86-64 AVX2 / AVX-512 kernel; this build is for another architecture");
}
void cpu_piece_values(const float* const*, int, const float*, int64_t, int64_t, int64_t, float* const*) {
    throw hs::Error("cpu_piece_values: an x86-64 AVX2 / AVX-512 kernel; this build is for another architecture");
}
bool cpu_attention_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }
at::Tensor cpu_attention_z(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
    throw hs::Error("cpu_attention_z: an x86-64 AVX2 / AVX-512 kernel; this build is for another architecture");
}
#endif

}  // namespace hs::blocks
