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

constexpr int kQ = 32;         // queries a task: two vectors of 16 lanes
constexpr int64_t kKB = 128;   // keys a block (absolute: blocks start at multiples of kKB)
constexpr int kJ = 12;         // keys a scores tile: 12 x 2 accumulators
constexpr int kC = 8;          // value columns an output tile: 8 x 2 accumulators

bool avx512() {
    static const bool yes = __builtin_cpu_supports("avx512f");
    return yes;
}

// exp(x) for x <= 0 (scores less their running max), to about 1 ulp: x = n ln2 + r, |r| <= ln2 / 2,
// Cephes' degree-6 polynomial for exp(r), times 2^n (scalef). Clamped below at -87.3: exp never
// yields a denormal (whose products stall), and a masked lane is zeroed by its caller.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// The kernel's one product: R rows of 32 lanes, out[r][0..32) (+)= sum_t a[t][0..32) b[r * b_r + t * b_t]
// over t < n, each b element broadcast against the lanes (R x 2 accumulators). The scores take it with
// a = q^T (t over d), b = the keys (r a key); the output with a = p^T (t over keys), b = the values (r a
// value column), accumulating onto what the earlier key blocks left.
template <int R>
__attribute__((target("avx512f"), always_inline)) inline void lane_tile(const float* a, int64_t n, const float* b, int64_t b_r,
                                                                        int64_t b_t, float* out, bool accumulate) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r)
        acc[r][0] = accumulate ? _mm512_loadu_ps(out + r * kQ) : _mm512_setzero_ps(),
        acc[r][1] = accumulate ? _mm512_loadu_ps(out + r * kQ + 16) : _mm512_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
        const __m512 a0 = _mm512_loadu_ps(a + t * kQ), a1 = _mm512_loadu_ps(a + t * kQ + 16);
        for (int r = 0; r < R; ++r) {
            const __m512 x = _mm512_set1_ps(b[r * b_r + t * b_t]);
            acc[r][0] = _mm512_fmadd_ps(a0, x, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a1, x, acc[r][1]);
        }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kQ, acc[r][0]), _mm512_storeu_ps(out + r * kQ + 16, acc[r][1]);
}

// A tail of R < kJ keys or < kC value columns: one out-of-line instance a row count.
template <int R>
__attribute__((target("avx512f"))) void lane_tail(const float* a, int64_t n, const float* b, int64_t b_r, int64_t b_t,
                                                  float* out, bool accumulate) {
    lane_tile<R>(a, n, b, b_r, b_t, out, accumulate);
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, bool);
template <int... I>
constexpr auto tail_table(std::integer_sequence<int, I...>) {
    return std::array<TileFn, sizeof...(I)>{&lane_tail<I + 1>...};
}

struct Operands {
    const float *q, *k, *v;
    float* z;
    int64_t q_b, q_t, q_h;  // strides (elements); the last dimension is contiguous
    int64_t k_b, k_s, k_h;
    int64_t v_b, v_s, v_h;
    int64_t T, S, P, H, g, d;
    float scale;
};

// One task: row b, query head h, queries [i0, i0 + nq) (nq <= 32). Scratch: qt, ot [d][32], st [kKB][32].
__attribute__((target("avx512f"))) void attend_block(const Operands& o, int64_t b, int64_t h, int64_t i0, int64_t nq,
                                                     float* qt, float* ot, float* st) {
    static constexpr auto tails = tail_table(std::make_integer_sequence<int, std::max(kJ, kC)>{});
    const int64_t d = o.d, kvh = h / o.g;
    const float* q = o.q + b * o.q_b + h * o.q_h;
    const float* k = o.k + b * o.k_b + kvh * o.k_h;
    const float* v = o.v + b * o.v_b + kvh * o.v_h;
    // q^T scaled, padding lanes zero; the output and the lanes' running max and sum.
    std::memset(qt, 0, sizeof(float) * d * kQ);
    for (int64_t r = 0; r < nq; ++r)
        for (int64_t c = 0; c < d; ++c) qt[c * kQ + r] = q[(i0 + r) * o.q_t + c] * o.scale;
    std::memset(ot, 0, sizeof(float) * d * kQ);
    const float inf = std::numeric_limits<float>::infinity();
    __m512 m[2] = {_mm512_set1_ps(-inf), _mm512_set1_ps(-inf)}, l[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    // Lane r's absolute position (padding lanes: the last query's, so that no lane sees no key).
    alignas(64) int32_t pos[kQ];
    for (int r = 0; r < kQ; ++r) pos[r] = static_cast<int32_t>(o.P + i0 + std::min<int64_t>(r, nq - 1));
    const __m512i qpos[2] = {_mm512_loadu_si512(pos), _mm512_loadu_si512(pos + 16)};
    const int64_t first = o.P + i0, end = o.P + i0 + nq;  // the first query's position; keys [0, end) seen by some query
    for (int64_t j0 = 0; j0 < end; j0 += kKB) {
        const int64_t n = std::min(kKB, end - j0);
        int64_t j = 0;
        for (; j + kJ <= n; j += kJ) lane_tile<kJ>(qt, d, k + (j0 + j) * o.k_s, o.k_s, 1, st + j * kQ, false);
        if (j < n) tails[n - j - 1](qt, d, k + (j0 + j) * o.k_s, o.k_s, 1, st + j * kQ, false);
        const bool diagonal = j0 + n - 1 > first;  // some key here is after some query
        __m512 bm[2] = {_mm512_set1_ps(-inf), _mm512_set1_ps(-inf)};
        for (j = 0; j < n; ++j)
            for (int s = 0; s < 2; ++s) {
                __m512 x = _mm512_loadu_ps(st + j * kQ + 16 * s);
                if (diagonal) {
                    const __mmask16 seen = _mm512_cmp_epi32_mask(_mm512_set1_epi32(static_cast<int32_t>(j0 + j)), qpos[s], _MM_CMPINT_LE);
                    x = _mm512_mask_mov_ps(_mm512_set1_ps(-inf), seen, x);
                    _mm512_storeu_ps(st + j * kQ + 16 * s, x);
                }
                bm[s] = _mm512_max_ps(bm[s], x);
            }
        __m512 alpha[2], sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int s = 0; s < 2; ++s) {
            const __m512 mn = _mm512_max_ps(m[s], bm[s]);
            alpha[s] = exp_ps(_mm512_sub_ps(m[s], mn));
            m[s] = mn;
        }
        for (j = 0; j < n; ++j)
            for (int s = 0; s < 2; ++s) {
                const __m512 x = _mm512_loadu_ps(st + j * kQ + 16 * s);
                __m512 p = exp_ps(_mm512_sub_ps(x, m[s]));
                if (diagonal) p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-inf), _CMP_NEQ_OQ), p);
                _mm512_storeu_ps(st + j * kQ + 16 * s, p);
                sum[s] = _mm512_add_ps(sum[s], p);
            }
        for (int s = 0; s < 2; ++s) l[s] = _mm512_fmadd_ps(l[s], alpha[s], sum[s]);
        if (j0 > 0)
            for (int64_t c = 0; c < d; ++c)
                for (int s = 0; s < 2; ++s)
                    _mm512_storeu_ps(ot + c * kQ + 16 * s, _mm512_mul_ps(_mm512_loadu_ps(ot + c * kQ + 16 * s), alpha[s]));
        int64_t c = 0;
        for (; c + kC <= d; c += kC) lane_tile<kC>(st, n, v + j0 * o.v_s + c, 1, o.v_s, ot + c * kQ, true);
        if (c < d) tails[d - c - 1](st, n, v + j0 * o.v_s + c, 1, o.v_s, ot + c * kQ, true);
    }
    const __m512 inv[2] = {_mm512_div_ps(_mm512_set1_ps(1.0f), l[0]), _mm512_div_ps(_mm512_set1_ps(1.0f), l[1])};
    for (int64_t c = 0; c < d; ++c)
        for (int s = 0; s < 2; ++s)
            _mm512_storeu_ps(ot + c * kQ + 16 * s, _mm512_mul_ps(_mm512_loadu_ps(ot + c * kQ + 16 * s), inv[s]));
    float* z = o.z + (b * o.T + i0) * o.H * d + h * d;
    for (int64_t r = 0; r < nq; ++r)
        for (int64_t c = 0; c < d; ++c) z[r * o.H * d + c] = ot[c * kQ + r];
}

// Decode pieces (blocks' shared prompt attention): C = d / 16 vectors a row, held in registers.
// Scores: a (query, key) product is its C products lane by lane in d order (FMA), then
// _mm512_reduce_add_ps: the same bits whichever rows or keys share the call.
template <int C>
__attribute__((target("avx512f"))) void piece_scores(const float* const* q, int nq, const float* k, int64_t ldk, int64_t len,
                                                     float* const* out) {
    constexpr int64_t kKeys = 32;  // a block of keys (at most 32 KiB at d = 256) read from L1 by every query
    for (int64_t j0 = 0; j0 < len; j0 += kKeys) {
        const int64_t j1 = std::min(len, j0 + kKeys);
        for (int i = 0; i < nq; ++i) {
            __m512 qv[C];
            for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q[i] + 16 * c);
            for (int64_t j = j0; j < j1; ++j) {
                const float* kj = k + j * ldk;
                __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kj));
                for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kj + 16 * c), acc);
                out[i][j] = _mm512_reduce_add_ps(acc);
            }
        }
    }
}

// Values: acc_i += sum_j w_i[j] v_j, one fused multiply-add a key in key order into each of the row's
// C accumulators, loaded from and stored to acc_i: pieces of a row taken in position order give the
// bits of its positions taken in one call.
template <int C>
__attribute__((target("avx512f"))) void piece_values(const float* const* w, int nq, const float* v, int64_t ldv, int64_t len,
                                                     float* const* acc) {
    constexpr int64_t kKeys = 32;
    for (int64_t j0 = 0; j0 < len; j0 += kKeys) {
        const int64_t j1 = std::min(len, j0 + kKeys);
        int i = 0;
        for (; i + 2 <= nq; i += 2) {  // two rows a pass: 2C independent chains
            __m512 a0[C], a1[C];
            for (int c = 0; c < C; ++c) a0[c] = _mm512_loadu_ps(acc[i] + 16 * c), a1[c] = _mm512_loadu_ps(acc[i + 1] + 16 * c);
            for (int64_t j = j0; j < j1; ++j) {
                const __m512 w0 = _mm512_set1_ps(w[i][j]), w1 = _mm512_set1_ps(w[i + 1][j]);
                const float* vj = v + j * ldv;
                for (int c = 0; c < C; ++c) {
                    const __m512 x = _mm512_loadu_ps(vj + 16 * c);
                    a0[c] = _mm512_fmadd_ps(w0, x, a0[c]);
                    a1[c] = _mm512_fmadd_ps(w1, x, a1[c]);
                }
            }
            for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc[i] + 16 * c, a0[c]), _mm512_storeu_ps(acc[i + 1] + 16 * c, a1[c]);
        }
        for (; i < nq; ++i) {
            __m512 a0[C];
            for (int c = 0; c < C; ++c) a0[c] = _mm512_loadu_ps(acc[i] + 16 * c);
            for (int64_t j = j0; j < j1; ++j) {
                const __m512 w0 = _mm512_set1_ps(w[i][j]);
                const float* vj = v + j * ldv;
                for (int c = 0; c < C; ++c) a0[c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(vj + 16 * c), a0[c]);
            }
            for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc[i] + 16 * c, a0[c]);
        }
    }
}

template <template <int> class F, class... A>
void by_width(int64_t d, A... a) {
    switch (d / 16) {
        case 1: return F<1>::run(a...);
        case 2: return F<2>::run(a...);
        case 3: return F<3>::run(a...);
        case 4: return F<4>::run(a...);
        case 5: return F<5>::run(a...);
        case 6: return F<6>::run(a...);
        case 7: return F<7>::run(a...);
        case 8: return F<8>::run(a...);
        case 9: return F<9>::run(a...);
        case 10: return F<10>::run(a...);
        case 11: return F<11>::run(a...);
        case 12: return F<12>::run(a...);
        case 13: return F<13>::run(a...);
        case 14: return F<14>::run(a...);
        case 15: return F<15>::run(a...);
        default: return F<16>::run(a...);
    }
}
template <int C>
struct ScoresOf {
    static void run(const float* const* q, int nq, const float* k, int64_t ldk, int64_t len, float* const* out) {
        piece_scores<C>(q, nq, k, ldk, len, out);
    }
};
template <int C>
struct ValuesOf {
    static void run(const float* const* w, int nq, const float* v, int64_t ldv, int64_t len, float* const* acc) {
        piece_values<C>(w, nq, v, ldv, len, acc);
    }
};

}  // namespace

bool cpu_attention_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    if (!avx512() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
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
    const int64_t blocks = (T + kQ - 1) / kQ, tasks = B * H * blocks;
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
            attend_block(o, b, h, i0, std::min<int64_t>(kQ, T - i0), qt, ot, st);
        }
    });
    return z;
}

bool cpu_piece_kernels(int64_t d) { return avx512() && d >= 16 && d <= kCpuAttentionMaxHead && d % 16 == 0; }

void cpu_piece_scores(const float* const* q, int nq, const float* k, int64_t ldk, int64_t len, int64_t d, float* const* out) {
    HS_REQUIRE(cpu_piece_kernels(d), "cpu_piece_scores: an AVX-512 CPU and a head width of 16-256, a multiple of 16");
    by_width<ScoresOf>(d, q, nq, k, ldk, len, out);
}

void cpu_piece_values(const float* const* w, int nq, const float* v, int64_t ldv, int64_t len, int64_t d, float* const* acc) {
    HS_REQUIRE(cpu_piece_kernels(d), "cpu_piece_values: an AVX-512 CPU and a head width of 16-256, a multiple of 16");
    by_width<ValuesOf>(d, w, nq, v, ldv, len, acc);
}

#pragma GCC diagnostic pop
#else
bool cpu_piece_kernels(int64_t) { return false; }
void cpu_piece_scores(const float* const*, int, const float*, int64_t, int64_t, int64_t, float* const*) {
    throw hs::Error("cpu_piece_scores: an x86-64 AVX-512 kernel; this build is for another architecture");
}
void cpu_piece_values(const float* const*, int, const float*, int64_t, int64_t, int64_t, float* const*) {
    throw hs::Error("cpu_piece_values: an x86-64 AVX-512 kernel; this build is for another architecture");
}
bool cpu_attention_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }
at::Tensor cpu_attention_z(const at::Tensor&, const at::Tensor&, const at::Tensor&, double) {
    throw hs::Error("cpu_attention_z: an x86-64 AVX-512 kernel; this build is for another architecture");
}
#endif

}  // namespace hs::blocks
