#include "blocks.h"

#include "cpu_attention.h"
#include "errors.h"
#include "packed_kv.h"
#include "torch_compat.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <torch/torch.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

namespace hs::blocks {

using namespace torch::indexing;

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, bool plus_one) {
    auto xf = x.to(torch::kFloat);
    auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
    if (plus_one) return (y * (1.0 + w.to(torch::kFloat))).to(x.scalar_type());  // Gemma: cast after scaling
    return w.defined() ? w * y.to(x.scalar_type()) : y.to(x.scalar_type());
}

at::Tensor norm(const ModelConfig& cfg, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    switch (cfg.norm) {
        case NormKind::kRms: return rms_norm(x, w, cfg.norm_eps, false);
        case NormKind::kRmsPlusOne: return rms_norm(x, w, cfg.norm_eps, true);
        case NormKind::kLayerNorm: {
            auto y = torch::layer_norm(x.to(torch::kFloat), {x.size(-1)}, w.defined() ? w.to(torch::kFloat) : w,
                                       b.defined() ? b.to(torch::kFloat) : b, cfg.norm_eps);
            return y.to(x.scalar_type());
        }
    }
    return x;
}

// At most this many rows go through gemv_rows instead of a GEMM (blocks::linear, unembed): a
// needle scan's decode step of a length's 12 trials streams the weights once. With AVX-512 (float32
// weights), up to kGemvRowsWide: the kernel's fused multiply-adds keep pace with a GEMM's where the
// GEMM of a few dozen rows first packs every weight (MKL: as long as its products, measured on the
// needle scan's 24-row decode steps). On AVX2 with FMA (float32), up to kGemvRowsWide through its own
// kernel: 1.1-5.7x MKL's GEMM at 1-24 rows on a Zen 3 CPU (headscope_bench_gemv; docs/performance.md,
// "AVX2 kernels"); on AVX2 without FMA, through the portable kernel's AVX2 clone.
constexpr int64_t kGemvRows = 16;
constexpr int64_t kGemvRowsWide = 64;

namespace {

// y[r, n] = sum_d w[n, d] x[r, d] for rows r < R of x, outputs n in [n0, n1): each weight row is
// read once for every row of x. A row's sum is formed in the same order whatever R, so a row's bits
// do not depend on the rows beside it (a row decoded alone equals itself in a batch).
// W is float, or bfloat16 (uint16_t: its bits, widened to float exactly by a 16-bit shift).
typedef float v8 __attribute__((vector_size(32)));
// (Out-parameters: a vector returned by value from a function built without AVX changes the ABI.)
inline __attribute__((always_inline)) void load8(v8& v, const float* p) { std::memcpy(&v, p, sizeof v); }
inline __attribute__((always_inline)) void load8(v8& v, const uint16_t* p) {
    typedef uint16_t u16x8 __attribute__((vector_size(16)));
    typedef uint32_t u32x8 __attribute__((vector_size(32)));
    u16x8 h;
    std::memcpy(&h, p, sizeof h);
    const u32x8 bits = __builtin_convertvector(h, u32x8) << 16;
    std::memcpy(&v, &bits, sizeof v);
}
inline float widen(float w) { return w; }
inline float widen(uint16_t w) {
    const uint32_t bits = static_cast<uint32_t>(w) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// The weight rows NB at a time: each x vector loaded feeds NB products (a row's R x-vectors are loads
// from L1 that, one weight row at a time, bound the loop at about 20 GB/s a core, below the memory's
// share), and the weights kPrefetchRows rows ahead are prefetched (streamed without it, the loop waits
// on memory between its products: R = 6 read ~9-14 GB/s, with both 16-21 GB/s over 2 threads; R = 1
// reads ~25-28). NB = 2 where its 2R accumulators, two weight vectors and a product fit AVX2's 16
// registers (R <= 6, float32 weights). Each output's sum is formed as with NB = 1, lane by lane in d
// order, then the same reduction: the same bits whatever NB, R or the prefetch.
constexpr int64_t kPrefetchRows = 4;

template <int R, int NB, class W>
inline __attribute__((always_inline)) void dot_block(const W* w, const float* x, int64_t D, int64_t n, float* y, int64_t ldy) {
    const W* wn[NB];
    for (int j = 0; j < NB; ++j) wn[j] = w + (n + j) * D;
    v8 acc[NB][R];
    for (int j = 0; j < NB; ++j)
        for (int r = 0; r < R; ++r) acc[j][r] = v8{0, 0, 0, 0, 0, 0, 0, 0};
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
        v8 wv[NB];
        for (int j = 0; j < NB; ++j) {
            __builtin_prefetch(wn[j] + kPrefetchRows * D + d);
            load8(wv[j], wn[j] + d);
        }
        for (int r = 0; r < R; ++r) {
            v8 xv;
            std::memcpy(&xv, x + r * D + d, sizeof xv);
            for (int j = 0; j < NB; ++j) acc[j][r] += wv[j] * xv;
        }
    }
    for (int j = 0; j < NB; ++j)
        for (int r = 0; r < R; ++r) {
            const v8 a = acc[j][r];
            float sum = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
            for (int64_t e = d; e < D; ++e) sum += widen(wn[j][e]) * x[r * D + e];
            y[r * ldy + n + j] = sum;
        }
}

template <int R, class W>
inline __attribute__((always_inline)) void dot_rows(const W* w, const float* x, int64_t D, int64_t n0, int64_t n1,
                                                    float* y, int64_t ldy) {
    constexpr int NB = (R <= 6 && sizeof(W) == sizeof(float)) ? 2 : 1;
    int64_t n = n0;
    for (; n + NB <= n1; n += NB) dot_block<R, NB>(w, x, D, n, y, ldy);
    for (; n < n1; ++n) dot_block<R, 1>(w, x, D, n, y, ldy);
}

// A kernel's pass of R <= 6 rows over weight rows [n0, n1): Kernel::template rows<R>(w, x, D, n0, n1,
// y, ldy). Here the AVX2 / baseline one (dot_rows); the AVX-512 one below.
struct PortableRows {
    static constexpr int kGroup = 6;
    template <int R, class W>
    static inline __attribute__((always_inline)) void rows(const W* w, const float* x, int64_t D, int64_t n0, int64_t n1,
                                                           float* y, int64_t ldy) {
        dot_rows<R>(w, x, D, n0, n1, y, ldy);
    }
};

// Up to 6 rows in one pass over the weights (their accumulators stay in registers); more rows in
// groups of at most Kernel::kGroup (6; 4 for the AVX2 FMA kernel, whose 4-row tile of 3 weight rows
// ran 1.5x its 6-row tile of 2 on 24 rows), block by block of weight rows small enough to stay in L2, so the weights come
// from memory once and the later groups read the block from L2. A row's sum is the same whatever
// its group (the kernel's pass).
template <class Kernel, class W>
inline __attribute__((always_inline)) void dot_rows_few(int R, const W* w, const float* x, int64_t D, int64_t n0, int64_t n1,
                                                        float* y, int64_t ldy) {
    switch (R) {
        case 1: return Kernel::template rows<1>(w, x, D, n0, n1, y, ldy);
        case 2: return Kernel::template rows<2>(w, x, D, n0, n1, y, ldy);
        case 3: return Kernel::template rows<3>(w, x, D, n0, n1, y, ldy);
        case 4: return Kernel::template rows<4>(w, x, D, n0, n1, y, ldy);
        case 5: return Kernel::template rows<5>(w, x, D, n0, n1, y, ldy);
        default: return Kernel::template rows<6>(w, x, D, n0, n1, y, ldy);
    }
}

template <class Kernel, class W>
inline __attribute__((always_inline)) void dot_rows_r(int R, const W* w, const float* x, int64_t D, int64_t n0, int64_t n1,
                                                      float* y, int64_t ldy) {
    if (R <= 6) return dot_rows_few<Kernel>(R, w, x, D, n0, n1, y, ldy);
    constexpr int kMax = Kernel::kGroup;
    const int G = (R + kMax - 1) / kMax;
    const int64_t block = std::max<int64_t>(8, (int64_t{256} << 10) / std::max<int64_t>(1, D * static_cast<int64_t>(sizeof(W))));
    for (int64_t b0 = n0; b0 < n1; b0 += block) {
        const int64_t b1 = std::min(n1, b0 + block);
        for (int g = 0; g < G; ++g) {
            const int r0 = R * g / G, r1 = R * (g + 1) / G;
            dot_rows_few<Kernel>(r1 - r0, w, x + r0 * D, D, b0, b1, y + r0 * ldy, ldy);
        }
    }
}

// One clone for AVX2 machines and a baseline one, picked at load time (no CPU feature assumed); no
// FMA contraction in either, so both give the same bits.
__attribute__((target_clones("avx2", "default"))) void dot_rows_any(int R, const float* w, const float* x,
                                                                             int64_t D, int64_t n0, int64_t n1,
                                                                             float* y, int64_t ldy) {
    dot_rows_r<PortableRows>(R, w, x, D, n0, n1, y, ldy);
}
__attribute__((target_clones("avx2", "default"))) void dot_rows_any(int R, const uint16_t* w, const float* x,
                                                                             int64_t D, int64_t n0, int64_t n1,
                                                                             float* y, int64_t ldy) {
    dot_rows_r<PortableRows>(R, w, x, D, n0, n1, y, ldy);
}

#if defined(__x86_64__)
// (GCC 12 warns inside _mm512_reduce_add_ps: its extracts take an _mm256_undefined_pd() operand.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The AVX-512 kernel (float32 weights): 16 lanes, fused multiply-adds, NB = 4 weight rows a pass
// (4 x R <= 24 accumulators, 4 weight vectors and an x vector within the 32 registers). A row's sum is
// formed in one order whatever R or NB: lane by lane in d order (the tail a masked load in the same
// pass), then _mm512_reduce_add_ps. Its bits differ from the portable kernel's (unfused products), so a
// machine takes one kernel for every row count (gemv_rows): a row alone still equals itself in a batch.
template <int R, int NB>
__attribute__((target("avx512f"), always_inline)) inline void dot_block16(const float* w, const float* x, int64_t D,
                                                                          int64_t n, float* y, int64_t ldy) {
    const float* wn[NB];
    for (int j = 0; j < NB; ++j) wn[j] = w + (n + j) * D;
    __m512 acc[NB][R];
    for (int j = 0; j < NB; ++j)
        for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) {
        __m512 wv[NB];
        for (int j = 0; j < NB; ++j) {
            _mm_prefetch(reinterpret_cast<const char*>(wn[j] + kPrefetchRows * D + d), _MM_HINT_T0);
            wv[j] = _mm512_loadu_ps(wn[j] + d);
        }
        for (int r = 0; r < R; ++r) {
            const __m512 xv = _mm512_loadu_ps(x + r * D + d);
            for (int j = 0; j < NB; ++j) acc[j][r] = _mm512_fmadd_ps(wv[j], xv, acc[j][r]);
        }
    }
    if (d < D) {
        const __mmask16 m = static_cast<__mmask16>((1u << (D - d)) - 1u);
        __m512 wv[NB];
        for (int j = 0; j < NB; ++j) wv[j] = _mm512_maskz_loadu_ps(m, wn[j] + d);
        for (int r = 0; r < R; ++r) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * D + d);
            for (int j = 0; j < NB; ++j) acc[j][r] = _mm512_fmadd_ps(wv[j], xv, acc[j][r]);
        }
    }
    for (int j = 0; j < NB; ++j)
        for (int r = 0; r < R; ++r) y[r * ldy + n + j] = _mm512_reduce_add_ps(acc[j][r]);
}

template <int R>
__attribute__((target("avx512f"), always_inline)) inline void dot_rows16(const float* w, const float* x, int64_t D,
                                                                         int64_t n0, int64_t n1, float* y, int64_t ldy) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) dot_block16<R, 4>(w, x, D, n, y, ldy);
    for (; n < n1; ++n) dot_block16<R, 1>(w, x, D, n, y, ldy);
}

// The AVX-512 pass (not always_inline: the generic dot_rows_r, inlined into dot_rows_avx512, calls it;
// GCC refuses to force an AVX-512 function into a generic template).
struct Avx512Rows {
    static constexpr int kGroup = 6;
    template <int R>
    __attribute__((target("avx512f"))) static void rows(const float* w, const float* x, int64_t D, int64_t n0, int64_t n1,
                                                        float* y, int64_t ldy) {
        dot_rows16<R>(w, x, D, n0, n1, y, ldy);
    }
};

__attribute__((target("avx512f"))) void dot_rows_avx512(int R, const float* w, const float* x, int64_t D, int64_t n0,
                                                        int64_t n1, float* y, int64_t ldy) {
    dot_rows_r<Avx512Rows>(R, w, x, D, n0, n1, y, ldy);
}

// The AVX2 kernel with fused multiply-adds (float32 weights; a CPU with AVX2 and FMA): 8 lanes, NB weight
// rows a pass with NB x R accumulators, NB weight vectors and an x vector within AVX2's 16 registers
// (the portable kernel's AVX2 clone, without fused products, spilled them: ~40 GFLOP/s at 6 rows on a
// Zen 3 core pair whose GEMM runs at ~130). A row's sum is formed in one order whatever R or NB: lane by
// lane in d order (the tail a masked load in the same pass), then the same reduction. Its bits differ
// from the portable kernel's (fused products), so such a machine takes it for every row count.
template <int R, int NB>
__attribute__((target("avx2,fma"), always_inline)) inline void dot_block8f(const float* w, const float* x, int64_t D,
                                                                           int64_t n, float* y, int64_t ldy) {
    const float* wn[NB];
    for (int j = 0; j < NB; ++j) wn[j] = w + (n + j) * D;
    __m256 acc[NB][R];
    for (int j = 0; j < NB; ++j)
        for (int r = 0; r < R; ++r) acc[j][r] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
        __m256 wv[NB];
        for (int j = 0; j < NB; ++j) {
            _mm_prefetch(reinterpret_cast<const char*>(wn[j] + kPrefetchRows * D + d), _MM_HINT_T0);
            wv[j] = _mm256_loadu_ps(wn[j] + d);
        }
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_loadu_ps(x + r * D + d);
            for (int j = 0; j < NB; ++j) acc[j][r] = _mm256_fmadd_ps(wv[j], xv, acc[j][r]);
        }
    }
    if (d < D) {
        alignas(32) static constexpr int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
        const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 8 - (D - d)));
        __m256 wv[NB];
        for (int j = 0; j < NB; ++j) wv[j] = _mm256_maskload_ps(wn[j] + d, m);
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_maskload_ps(x + r * D + d, m);
            for (int j = 0; j < NB; ++j) acc[j][r] = _mm256_fmadd_ps(wv[j], xv, acc[j][r]);
        }
    }
    for (int j = 0; j < NB; ++j)
        for (int r = 0; r < R; ++r) {
            const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[j][r]), _mm256_extractf128_ps(acc[j][r], 1));
            const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
            y[r * ldy + n + j] = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
        }
}

template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void dot_rows8f(const float* w, const float* x, int64_t D,
                                                                          int64_t n0, int64_t n1, float* y, int64_t ldy) {
    constexpr int NB = R <= 2 ? 4 : R <= 4 ? 3 : 2;  // NB x R + NB + 1 <= 16 registers
    int64_t n = n0;
    for (; n + NB <= n1; n += NB) dot_block8f<R, NB>(w, x, D, n, y, ldy);
    for (; n < n1; ++n) dot_block8f<R, 1>(w, x, D, n, y, ldy);
}

struct Avx2FmaRows {
    static constexpr int kGroup = 4;  // 12 accumulators of 3 weight rows x 4 rows (dot_rows_r)
    template <int R>
    __attribute__((target("avx2,fma"))) static void rows(const float* w, const float* x, int64_t D, int64_t n0, int64_t n1,
                                                         float* y, int64_t ldy) {
        dot_rows8f<R>(w, x, D, n0, n1, y, ldy);
    }
};

__attribute__((target("avx2,fma"))) void dot_rows_avx2fma(int R, const float* w, const float* x, int64_t D, int64_t n0,
                                                          int64_t n1, float* y, int64_t ldy) {
    dot_rows_r<Avx2FmaRows>(R, w, x, D, n0, n1, y, ldy);
}

#pragma GCC diagnostic pop

bool has_avx512() {
    static const bool yes = __builtin_cpu_supports("avx512f");
    return yes;
}
bool has_avx2() {
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes;
}
bool has_avx2_fma() {
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
}
#else
bool has_avx512() { return false; }
bool has_avx2() { return false; }
bool has_avx2_fma() { return false; }
void dot_rows_avx2fma(int, const float*, const float*, int64_t, int64_t, int64_t, float*, int64_t) {}
void dot_rows_avx512(int, const float*, const float*, int64_t, int64_t, int64_t, float*, int64_t) {}
#endif

}  // namespace

// x [..., D] with 1..kGemvRows rows in all (kGemvRowsWide with float32 weights on an AVX2 or AVX-512 machine), w [N, D] (+ b [N]), all float32 or all bfloat16, on the
// CPU, no autograd: x w^T + b as [..., N]; otherwise an undefined tensor (the caller takes the GEMM).
// bfloat16: widened to float32 exactly, summed in float32 (as the BLAS's bf16 GEMM accumulates), the
// bias added in float32 and the result rounded to bfloat16 once.
at::Tensor gemv_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    if (x.dim() < 1 || w.dim() != 2) return {};
    const int64_t D = x.size(-1), N = w.size(0);
    const int64_t rows = D > 0 ? x.numel() / D : 0;
    const auto dt = w.scalar_type();
    const bool wide = dt == torch::kFloat && has_avx512();
    // float32 on an AVX2 CPU: its kernel (with FMA) or the portable kernel's AVX2 clone up to kGemvRowsWide rows too.
    if (rows < 1 || rows > (dt == torch::kFloat && (wide || has_avx2()) ? kGemvRowsWide : kGemvRows) || w.size(1) != D || !x.device().is_cpu() || !w.device().is_cpu() ||
        (dt != torch::kFloat && dt != torch::kBFloat16) || x.scalar_type() != dt || !w.is_contiguous() ||
        (b.defined() && (b.scalar_type() != dt || b.numel() != N)) ||
        (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()))))
        return {};
    const auto xc = x.reshape({rows, D}).to(torch::kFloat).contiguous();
    auto y = at::empty({rows, N}, xc.options());
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int R = static_cast<int>(rows);
    if (wide) {
        const float* wp = w.data_ptr<float>();
        at::parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) { dot_rows_avx512(R, wp, xp, D, n0, n1, yp, N); });
    } else if (dt == torch::kFloat && has_avx2_fma()) {
        const float* wp = w.data_ptr<float>();
        at::parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) { dot_rows_avx2fma(R, wp, xp, D, n0, n1, yp, N); });
    } else if (dt == torch::kFloat) {
        const float* wp = w.data_ptr<float>();
        at::parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) { dot_rows_any(R, wp, xp, D, n0, n1, yp, N); });
    } else {
        const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
        at::parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) { dot_rows_any(R, wp, xp, D, n0, n1, yp, N); });
    }
    if (b.defined()) y.add_(b.reshape({1, N}).to(torch::kFloat));
    auto sizes = x.sizes().vec();
    sizes.back() = N;
    return y.to(dt).view(sizes);
}

// The BLAS runs a bmm's N small products one after another, each too small for it to split, so a
// decode step's attention ran on one core (issue 44: on the needle scan a third of a decode step).
// Here the batch is split over the threads; each matrix is still its own product (blocks.h).
at::Tensor bmm_small(const at::Tensor& a, const at::Tensor& b) {
    const int64_t N = a.size(0);
    const bool small = a.size(1) * a.size(2) * b.size(2) <= (int64_t{1} << 22);
    const bool grad = at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad());
    if (N < 2 || !small || grad || !a.device().is_cpu() || at::get_num_threads() < 2 || at::in_parallel_region())
        return at::bmm(a, b);
    auto out = at::empty({N, a.size(1), b.size(2)}, a.options());
    // InferenceMode and the grad mode are thread-local: the other threads take this one's.
    const at::ThreadLocalState state;
    at::parallel_for(0, N, 1, [&](int64_t s, int64_t e) {
        at::ThreadLocalStateGuard guard(state);
        auto o = out.narrow(0, s, e - s);
        at::bmm_out(o, a.narrow(0, s, e - s), b.narrow(0, s, e - s));
    });
    return out;
}

static std::atomic<bool> g_autograd_core{true};

// The BLAS's sgemm_ where this libtorch's own products call it: found in the process (libtorch loaded it),
// so the very function libtorch's calls reach. Null where none is loaded.
using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
                         const float*, const int*, const float*, float*, const int*);
static SgemmFn blas_sgemm() {
    static const SgemmFn f = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
    return f;
}

// out = a b for a [N, M, K], b [N, K, P] float32 on the CPU, out [N, M, P] with unit last stride. Where
// at::bmm runs its per-item loop (a libtorch without MKL, as Debian's 1.13: bmm_out_or_baddbmm_ calls
// addmm_impl_cpu_(out[i], out[i], a[i], b[i], 0, 1) for each item once contraction * rows * cols >= 400),
// each item takes the very BLAS call that loop makes: addmm_impl_cpu_'s choice of transposes and leading
// dimensions from the item's strides, cpublas::gemm's normalize_last_dims and its use_blas_gemm test, then
// sgemm_ with alpha 1, beta 0. That loop's per-item bookkeeping (three selects, size checks, resolve_conj:
// ~5 us an item) was most of a toy-training step's attention products (issue 44). Anything else, a layout
// whose item that loop would first copy included: at::bmm_out, as before.
void bmm_items(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
    const int64_t N = a.size(0), M = a.size(1), K = a.size(2), P = b.size(2);
    const SgemmFn sgemm = blas_sgemm();
    auto fallback = [&] { at::bmm_out(out, a, b); };
    if (!sgemm || at::hasMKL() || a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || out.scalar_type() != at::kFloat ||
        !a.device().is_cpu() || !b.device().is_cpu() || !out.device().is_cpu() || a.is_conj() || b.is_conj() ||
        N == 0 || M == 0 || K == 0 || P == 0 || K * M * P < 400 || out.size(0) != N || out.size(1) != M || out.size(2) != P)
        return fallback();
    // addmm_impl_cpu_(result = out[i], m1 = a[i], m2 = b[i]).
    const int64_t rs0 = out.stride(1), rs1 = out.stride(2);
    bool tc;
    if (rs0 == 1 && (P == 1 || rs1 >= std::max<int64_t>(1, M))) tc = false;
    else if (rs1 == 1 && (M == 1 || rs0 >= std::max<int64_t>(1, P))) tc = true;
    else return fallback();  // addmm would gemm into a copy of c
    const float *p1 = a.data_ptr<float>(), *p2 = b.data_ptr<float>();
    int64_t s1[2] = {a.stride(1), a.stride(2)}, s2[2] = {b.stride(1), b.stride(2)}, z1[2] = {M, K}, z2[2] = {K, P};
    int64_t bs1 = a.stride(0), bs2 = b.stride(0);
    if (tc) {
        std::swap(p1, p2), std::swap(bs1, bs2);
        for (int i = 0; i < 2; ++i) std::swap(s1[i], s2[i]), std::swap(z1[i], z2[i]);
    }
    const int64_t m = tc ? P : M, n = tc ? M : P, k = z1[tc ? 0 : 1];
    bool ta, tb;
    if (s1[tc ? 1 : 0] == 1 && s1[tc ? 0 : 1] >= std::max<int64_t>(1, m)) ta = false;
    else if (s1[tc ? 0 : 1] == 1 && s1[tc ? 1 : 0] >= std::max<int64_t>(1, k)) ta = true;
    else return fallback();  // addmm would copy the item first
    if (s2[tc ? 1 : 0] == 1 && s2[tc ? 0 : 1] >= std::max<int64_t>(1, k)) tb = false;
    else if (s2[tc ? 0 : 1] == 1 && s2[tc ? 1 : 0] >= std::max<int64_t>(1, n)) tb = true;
    else return fallback();
    int64_t lda = s1[(ta == tc) ? 1 : 0], ldb = s2[(tb == tc) ? 1 : 0], ldc = tc ? rs0 : rs1;
    // cpublas::gemm: normalize_last_dims, then sgemm_ only where use_blas_gemm holds (else its own kernel).
    if (n == 1) ldc = m;
    if (ta) { if (m == 1) lda = k; } else if (k == 1) lda = m;
    if (tb) { if (k == 1) ldb = n; } else if (n == 1) ldb = k;
    constexpr int64_t kMax = std::numeric_limits<int>::max();
    if (m > kMax || n > kMax || k > kMax || lda > kMax || ldb > kMax || ldc > kMax || lda < std::max<int64_t>(1, ta ? k : m) ||
        ldb < std::max<int64_t>(1, tb ? n : k) || ldc < std::max<int64_t>(1, m))
        return fallback();
    const char ca = ta ? 'T' : 'N', cb = tb ? 'T' : 'N';
    const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k), ila = static_cast<int>(lda),
              ilb = static_cast<int>(ldb), ilc = static_cast<int>(ldc);
    const float alpha = 1.0f, beta = 0.0f;
    float* pc = out.data_ptr<float>();
    const int64_t bsc = out.stride(0);
    for (int64_t i = 0; i < N; ++i) sgemm(&ca, &cb, &im, &in, &ik, &alpha, p1 + i * bs1, &ila, p2 + i * bs2, &ilb, &beta, pc + i * bsc, &ilc);
}

at::Tensor bmm_items(const at::Tensor& a, const at::Tensor& b) {
    auto out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
    bmm_items(out, a, b);
    return out;
}

namespace {

// f(s, c) over items [s, s + c) of N, split over the intra-op threads, each thread's share in chunks of
// about 2^16 floats of an item's per_item scores (fp32 [g*n, m]: a chunk stays in the core's cache
// through its products, mask and softmax). Grad mode and the rest of the thread-local state follow.
template <class F>
void for_item_chunks(int64_t N, int64_t per_item, const F& f) {
    const int64_t c = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, per_item));
    const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
    const int64_t grain = std::max<int64_t>(1, std::min(c, (N + threads - 1) / threads));
    const at::ThreadLocalState state;
    at::parallel_for(0, N, grain, [&](int64_t s0, int64_t e0) {
        at::ThreadLocalStateGuard guard(state);
        for (int64_t s = s0; s < e0; s += c) f(s, std::min(c, e0 - s));
    });
}

// The causal attention of one query block under autograd (training, the gates' fits): z = softmax(mask(
// qb k^T [* scale])) v for qb [N, g*n, d] (query rows q0.. of g heads a kv head), k, v [N, m, d] whose
// last n columns face the block's queries (so the causal mask is the upper triangle of those columns).
// Autograd of the plain ops kept [N, g*n, m] scores, pattern and their gradients whole, ran each bmm's N
// products on one thread (at::bmm loops over them) and cloned the whole score gradient for the in-place
// mask (CopySlices): the toy models' training spent most of a step there (issue 44). Here the items go
// in chunks over the threads, forward and backward. Each item takes the very kernels, in the order and on
// the operand layouts, that autograd of the plain ops takes (libtorch 1.13 derivatives: bmm's
// self grad.bmm(mat2^T) and mat2 self^T.bmm(grad); _softmax_backward_data; masked_fill's grad
// masked_fill(mask, 0); mul by a scalar grad * scalar), and the gradients are returned in the layouts
// autograd hands on (k's as the transpose of a contiguous [N, d, m]): the same bits, tests/test_blocks.cpp.
struct CausalCore : public torch::autograd::Function<CausalCore> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qb, const at::Tensor& k,
                              const at::Tensor& v, int64_t g, int64_t n, double scale) {
        const int64_t N = qb.size(0), gn = qb.size(1), m = k.size(1), d = v.size(2);
        const auto upper = torch::ones({n, n}, qb.options().dtype(torch::kBool)).triu(1);
        auto pattern = at::empty({N, gn, m}, qb.options());
        auto z = at::empty({N, gn, d}, qb.options());
        const float neg_inf = -std::numeric_limits<float>::infinity();
        for_item_chunks(N, gn * m, [&](int64_t s, int64_t c) {
            auto sc = bmm_items(qb.narrow(0, s, c), k.narrow(0, s, c).transpose(1, 2));
            if (scale != 0) sc.mul_(scale);
            if (n > 1) sc.view({c, g, n, m}).narrow(3, m - n, n).masked_fill_(upper, neg_inf);
            auto p = pattern.narrow(0, s, c);
            at::_softmax_out(p, sc, -1, false);
            auto zc = z.narrow(0, s, c);
            bmm_items(zc, p, v.narrow(0, s, c));
        });
        ctx->save_for_backward({qb, k, v, pattern, upper});
        ctx->saved_data["g"] = g;
        ctx->saved_data["scale"] = scale;
        return z;
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
        const auto saved = ctx->get_saved_variables();
        const auto &qb = saved[0], &k = saved[1], &v = saved[2], &pattern = saved[3], &upper = saved[4];
        const int64_t g = ctx->saved_data["g"].toInt();
        const double scale = ctx->saved_data["scale"].toDouble();
        const int64_t N = qb.size(0), gn = qb.size(1), m = k.size(1), d = v.size(2), n = upper.size(0);
        const at::Tensor& gz = grads[0];
        auto gq = at::empty({N, gn, d}, qb.options());
        auto gkt = at::empty({N, d, m}, qb.options());  // the gradient of k^T, as bmm's backward makes it
        auto gv = at::empty({N, m, d}, qb.options());
        for_item_chunks(N, gn * m, [&](int64_t s, int64_t c) {
            const auto gzc = gz.narrow(0, s, c), pc = pattern.narrow(0, s, c);
            auto gp = bmm_items(gzc, v.narrow(0, s, c).transpose(1, 2));
            auto gvc = gv.narrow(0, s, c);
            bmm_items(gvc, pc.transpose(1, 2), gzc);
            auto gs = at::_softmax_backward_data(gp, pc, -1, pc.scalar_type());
            if (n > 1) gs.view({c, g, n, m}).narrow(3, m - n, n).masked_fill_(upper, 0);
            if (scale != 0) gs = gs * scale;
            auto gqc = gq.narrow(0, s, c), gktc = gkt.narrow(0, s, c);
            bmm_items(gqc, gs, k.narrow(0, s, c));
            bmm_items(gktc, qb.narrow(0, s, c).transpose(1, 2), gs);
        });
        return {gq, gkt.transpose(1, 2), gv, at::Tensor(), at::Tensor(), at::Tensor()};
    }
};

}  // namespace

void set_autograd_attention_core(bool on) { g_autograd_core = on; }

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool per_row) {
    // A decode step's few rows on the CPU: gemv_rows streams the weight once for all of them. A GEMM
    // of a few rows packs the whole weight into its panel buffers first (OpenBLAS's small-matrix
    // kernels stop at 1200 output entries), which cost a one-row decode step more than the product
    // itself, and a second row (DeCoRe's masked copy) ~1.4x (issue 44; docs/performance.md "Decoding
    // with intervention rows"). Its rows are independent bit for bit, so it serves per-row mode too:
    // each row gets the bits its unbatched run (which takes it as well) gets.
    if (auto y = gemv_rows(x, w, b); y.defined()) return y;
    if (x.dim() == 3 && x.size(0) > 1 && per_row) {
        // One GEMM per batch row: BLAS picks kernels by matrix size, so in a folded GEMM a row's
        // last bits depend on what else is in the batch. Each row goes through the very call an
        // unbatched run ([1, T, D], folded to [T, D]) makes, so a row of a batch whose other rows
        // carry interventions equals its unbatched run bit for bit, whatever the BLAS (a batched
        // bmm is another kernel: MKL's differs from its plain GEMM in the last bits).
        std::vector<at::Tensor> rows;
        rows.reserve(x.size(0));
        for (int64_t r = 0; r < x.size(0); ++r) rows.push_back(linear(x[r], w, b, false));
        return torch::stack(rows);
    }
    // Folded: [B*T, D] x [D, N] in one GEMM (addmm with the bias).
    return b.defined() ? at::linear(x, w, b) : torch::matmul(x, w.t());
}

int Pass::last_layer() const { return opts.stop_after_layer >= 0 ? opts.stop_after_layer : m.config.n_layers - 1; }

at::Tensor Pass::finish(const at::Tensor& x) const {
    if (!opts.compute_logits || opts.stop_after_layer >= 0) return {};
    return unembed(m, x, per_row_gemm);
}

at::Tensor unembed(const Model& m, const at::Tensor& resid, bool per_row) {
    const auto& w = m.weights;
    auto mul = [&](const at::Tensor& x) {  // one GEMM; a few rows (a decode step's batch) against [D, V]
        if (auto y = gemv_rows(x, w.unembed, w.unembed_b); y.defined()) return y;
        const bool few = x.numel() <= 32 * x.size(-1) && w.unembed_t.defined() && x.scalar_type() == w.unembed_t.scalar_type();
        return few ? torch::matmul(x, w.unembed_t) : linear(x, w.unembed, w.unembed_b, false);
    };
    const auto x = m.final_norm(resid);
    at::Tensor logits;
    if (x.dim() == 3 && x.size(0) > 1 && per_row) {  // per row, each the call its unbatched run makes (linear())
        logits = gemv_rows(x, w.unembed, w.unembed_b);  // few rows in all: one pass, each row's bits its own
        if (!logits.defined()) {
            std::vector<at::Tensor> rows;
            for (int64_t r = 0; r < x.size(0); ++r) rows.push_back(mul(x[r]));
            logits = torch::stack(rows);
        }
    } else {
        logits = mul(x);
    }
    if (m.config.final_softcap > 0) logits = torch::tanh(logits / m.config.final_softcap) * m.config.final_softcap;
    return logits;
}

at::Tensor Pass::linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
    return blocks::linear(x, w, b, per_row_gemm);
}

at::Tensor Pass::mlp(const LayerWeights& lw, const at::Tensor& x) const { return blocks::mlp(m.config, lw, x, per_row_gemm); }

at::Tensor Pass::attention(int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
    return blocks::attention(m, layer, q, k, v, hooks, cache, opts.attn_block, per_row_gemm);
}

at::Tensor Pass::query_pre_rope(int layer, at::Tensor q) const { return blocks::query_pre_rope(hooks, layer, std::move(q)); }

at::Tensor Pass::hook(Point p, int layer, at::Tensor x) const { return blocks::hook(hooks, p, layer, std::move(x)); }

bool Pass::keys_only(int layer) const {
    return layer == m.config.n_layers - 1 && !opts.compute_logits && opts.stop_after_layer < 0 && cache && !cache->packed &&
           !cache->shared && !(hooks && hooks->touches(layer));
}

void Pass::keep_keys(int layer, const at::Tensor& k, const at::Tensor& v) const { cache->append(layer, k, v); }

at::Tensor activation(Activation a, const at::Tensor& x, bool per_row) {
    if (x.dim() == 3 && x.size(0) > 1 && per_row) {
        // Per row too, like linear(): libtorch 2.x's vectorized SiLU/GELU and its scalar tail loop
        // round differently (one float step in ~4% of elements), and which elements fall in the
        // tail depends on the tensor's size, so a batch row's last bits would depend on the batch.
        std::vector<at::Tensor> rows;
        for (int64_t r = 0; r < x.size(0); ++r) rows.push_back(activation(a, x.narrow(0, r, 1), false));
        return torch::cat(rows, 0);
    }
    switch (a) {
        case Activation::kSilu: return torch::silu(x);
        case Activation::kGeluTanh: return torch::gelu(x, "tanh");
        case Activation::kGeluExact: return torch::gelu(x);
        case Activation::kRelu: return torch::relu(x);
    }
    return x;
}

at::Tensor mlp(const ModelConfig& cfg, const LayerWeights& lw, const at::Tensor& x, bool per_row) {
    if (cfg.gated_mlp) {
        auto g = activation(cfg.act, linear(x, lw.w_gate, lw.b_gate, per_row), per_row);
        return linear(g * linear(x, lw.w_up, lw.b_up, per_row), lw.w_down, lw.b_down, per_row);
    }
    return linear(activation(cfg.act, linear(x, lw.w_up, lw.b_up, per_row), per_row), lw.w_down, lw.b_down, per_row);
}

// Inverse frequencies [rot_dim / 2], with Hugging Face's "linear" and "llama3" scalings.
static at::Tensor inv_freq(const ModelConfig& cfg, int64_t rot_dim, double theta) {
    auto idx = torch::arange(0, rot_dim, 2, torch::kLong).to(torch::kFloat);
    auto f = 1.0 / torch::pow(theta, idx / static_cast<double>(rot_dim));
    const auto& s = cfg.rope_scaling;
    if (s.type == "linear") return f / s.factor;
    if (s.type == "factors") {
        if (static_cast<int64_t>(s.freq_factors.size()) != f.size(0))
            throw ConfigError(fmt::format("{} RoPE frequency divisors for {} frequencies", s.freq_factors.size(), f.size(0)));
        return f / torch::tensor(s.freq_factors, torch::kDouble).to(torch::kFloat);
    }
    if (s.type == "llama3") {
        const double low_wavelen = s.original_max_position / s.low_freq_factor;
        const double high_wavelen = s.original_max_position / s.high_freq_factor;
        auto wavelen = 2 * M_PI / f;
        auto scaled = torch::where(wavelen > low_wavelen, f / s.factor, f);
        auto smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
        auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
        return torch::where(medium, smoothed, scaled);
    }
    return f;
}

Rope rope_tables(const ModelConfig& cfg, const at::Tensor& positions, double theta, c10::ScalarType dtype) {
    Rope r;
    r.rot_dim = static_cast<int64_t>(cfg.d_head * cfg.rotary_pct);
    r.rot_dim -= r.rot_dim % 2;
    if (r.rot_dim == 0) return r;
    auto f = inv_freq(cfg, r.rot_dim, theta).to(positions.device());
    // [T, rot/2], or [B, T, rot/2] for ragged rows' positions [B, T] (the same products)
    auto ang = positions.dim() == 1 ? torch::outer(positions.to(torch::kFloat), f) : positions.to(torch::kFloat).unsqueeze(-1) * f;
    auto emb = torch::cat({ang, ang}, -1);                    // [T, rot]
    r.cos = emb.cos().to(dtype);
    r.sin = emb.sin().to(dtype);
    return r;
}

at::Tensor query_pre_rope(const Hooks* hooks, int layer, at::Tensor q) {
    if (!hooks) return q;
    if (hooks->has_q_pre_rope_interventions(layer)) q = hooks->apply_q_pre_rope(layer, q);
    return hook(hooks, Point::kAttnQPreRope, layer, std::move(q));
}

at::Tensor apply_rope(const at::Tensor& x, const Rope& rope) {
    if (rope.rot_dim == 0) return x;
    const int64_t d = x.size(-1), half = rope.rot_dim / 2;
    auto xr = rope.rot_dim == d ? x : x.index({"...", Slice(0, rope.rot_dim)});
    const int64_t rows = rope.cos.dim() == 3 ? rope.cos.size(0) : 1;  // ragged rows: a table a row
    auto cos = rope.cos.view({rows, -1, 1, rope.rot_dim});
    auto sin = rope.sin.view({rows, -1, 1, rope.rot_dim});
    auto rotated = torch::cat({-xr.index({"...", Slice(half, None)}), xr.index({"...", Slice(0, half)})}, -1);
    auto out = xr * cos + rotated * sin;
    if (rope.rot_dim == d) return out;
    return torch::cat({out, x.index({"...", Slice(rope.rot_dim, None)})}, -1);
}

at::Tensor positions_for(const at::Tensor& tokens, const KVCache* cache) {
    const auto opts = torch::TensorOptions().dtype(torch::kLong).device(tokens.device());
    if (cache && cache->ragged()) {  // each row continues from its own length: [B, T]
        const int64_t B = tokens.size(0);
        HS_REQUIRE(static_cast<int64_t>(cache->shared_rows.size()) == B, "positions_for: one shared cache a row");
        std::vector<int64_t> lens(static_cast<size_t>(B));
        for (int64_t b = 0; b < B; ++b) lens[static_cast<size_t>(b)] = cache->row_length(b);
        return torch::tensor(lens, torch::kLong).to(tokens.device()).view({B, 1}) + torch::arange(tokens.size(1), opts).view({1, -1});
    }
    const int64_t past = cache ? cache->length() : 0;
    return torch::arange(past, past + tokens.size(1), opts);
}

// [T, S] true where query i (absolute past + i) may attend to key j.
static at::Tensor visible_mask(int64_t T, int64_t S, int64_t past, int window, c10::Device dev) {
    auto qi = torch::arange(past, past + T, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(1);
    auto kj = torch::arange(0, S, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(0);
    auto vis = kj <= qi;
    if (window > 0) vis = vis & (kj > qi - window);
    return vis;
}

int64_t attention_block_rows(int64_t requested, int64_t B, int64_t H, int64_t T, int64_t S) {
    if (requested > 0) return std::min(requested, std::max<int64_t>(T, 1));
    // At most 128 query rows a block, so a causal block skips the keys it cannot see (T = 512 in
    // blocks of 128 computes 62.5% of the full T x T scores), and at most ~32 MiB of fp32 scores
    // per block (2^23 elements); never below 16 rows, never above T.
    constexpr int64_t kBudget = int64_t{1} << 23, kMaxRows = 128;
    const int64_t per_row = std::max<int64_t>(1, B * H * S);
    return std::max<int64_t>(1, std::min({T, kMaxRows, std::max<int64_t>(16, kBudget / per_row)}));
}

at::Tensor attention_reference(const ModelConfig& cfg, int layer, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const LayerWindows* windows, const LayerKeeps* keeps) {
    const int64_t B = q.size(0), T = q.size(1), S = k.size(1), H = q.size(2), K = k.size(2), d = q.size(3);
    // Query head h reads key/value head h / (H / K) (grouped-query attention).
    auto kh = k.repeat_interleave(H / K, 2), vh = v.repeat_interleave(H / K, 2);  // [B, S, H, d]
    const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
    auto scores = torch::einsum("bthd,bshd->bhts", {q, kh}) * scale;  // [B, H, T, S]
    if (cfg.attn_softcap > 0) scores = cfg.attn_softcap * torch::tanh(scores / cfg.attn_softcap);
    // Query t sits at absolute position past + t: it sees key s <= past + t, and on a sliding-window
    // layer only the last `window` of those.
    const int64_t past = S - T;
    auto qpos = torch::arange(past, S, torch::kLong).unsqueeze(1), kpos = torch::arange(S, torch::kLong).unsqueeze(0);
    auto visible = kpos <= qpos;
    if (cfg.is_sliding(layer)) visible = visible & (kpos > qpos - cfg.sliding_window);
    const double inf = std::numeric_limits<double>::infinity();
    const bool win = windows && windows->defined(), kept = keeps && keeps->defined();
    if (!win && !kept) {
        scores = scores.masked_fill(visible.logical_not().to(q.device()), -inf);
        auto pattern = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());  // [B, H, T, S]
        return torch::einsum("bhts,bshd->bthd", {pattern, vh});                            // z [B, T, H, d]
    }
    auto layer_vis = visible.to(q.device()).view({1, 1, T, S});
    auto kp = kpos.to(q.device()).view({1, 1, 1, S}), qp = qpos.to(q.device()).view({1, 1, T, 1});
    auto seen = layer_vis.expand({B, H, T, S});  // [B, H, T, S]
    at::Tensor use;                              // [B, H, T, 1]: queries that get a compensation column
    if (win) {
        // Attention windows: head h of row b at query position p also needs key s < sink[b, h] or
        // s > p - recent[b, h]. With compensation, the keys the window hides (visible to the layer, not
        // to the window) are averaged into one more key and value, scored like any key.
        auto sink = windows->sink.view({B, H, 1, 1}), recent = windows->recent.view({B, H, 1, 1});
        // A block window (LayerWindows) also counts the query's place in its block.
        auto last_hidden = qp - recent;
        if (windows->any_block) last_hidden = last_hidden - qp.remainder(windows->block.view({B, H, 1, 1}));
        seen = seen & ((kp < sink) | (kp > last_hidden) | (qp < windows->from.view({B, H, 1, 1})));
        if (windows->any_compensate) use = windows->compensate.view({B, H, 1, 1}).expand({B, H, T, 1});
    }
    if (kept) {
        // Kept positions: a query at p >= from[b] sees key s < from[b] only where visible[b, h, s].
        HS_REQUIRE(!(use.defined() && keeps->any_compensate), "attention_reference: windows and kept positions both compensate");
        auto from = keeps->from.view({B, 1, 1, 1});
        auto vis = torch::ones({B, H, S}, torch::TensorOptions().dtype(torch::kBool).device(q.device()));
        const int64_t F = std::min(S, keeps->max_from);
        vis.narrow(2, 0, F).copy_(keeps->visible.narrow(2, 0, F));
        auto hide = (qp >= from) & (kp < from) & vis.view({B, H, 1, S}).logical_not();
        seen = seen & hide.logical_not();
        if (keeps->any_compensate) use = keeps->compensate.view({B, H, 1, 1}) & (qp >= from);
    }
    scores = scores.masked_fill(seen.logical_not(), -inf);
    if (!use.defined()) {
        auto pattern = torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type());
        return torch::einsum("bhts,bshd->bthd", {pattern, vh});
    }
    auto hidden = (layer_vis & seen.logical_not()).to(torch::kDouble);        // [B, H, T, S]
    auto count = hidden.sum(-1, true);                                          // [B, H, T, 1]
    auto kbar = torch::einsum("bhts,bshd->bhtd", {hidden, kh.to(torch::kDouble)}) / count.clamp_min(1);
    auto vbar = torch::einsum("bhts,bshd->bhtd", {hidden, vh.to(torch::kDouble)}) / count.clamp_min(1);
    auto extra = (q.permute({0, 2, 1, 3}).to(torch::kDouble) * kbar).sum(-1, true) * scale;  // [B, H, T, 1]
    if (cfg.attn_softcap > 0) extra = cfg.attn_softcap * torch::tanh(extra / cfg.attn_softcap);
    use = (count > 0) & use;
    extra = extra.masked_fill(use.logical_not(), -inf);
    auto pattern = torch::softmax(torch::cat({scores.to(torch::kDouble), extra}, -1), -1);  // [B, H, T, S + 1]
    auto z = torch::einsum("bhts,bshd->bthd", {pattern.narrow(3, 0, S), vh.to(torch::kDouble)}) +
             (pattern.narrow(3, S, 1) * vbar).permute({0, 2, 1, 3});
    return z.to(q.scalar_type());
}

static at::Tensor attention_output(const Model& m, int layer, at::Tensor z, const Hooks* hooks, bool per_row);

bool uses_fused_attention(const Model& m, int layer, const Hooks* hooks) {
    if (!fused_attention_enabled(m.options) || m.config.attn_softcap > 0) return false;
    return !(hooks && (hooks->wants(Point::kAttnScores, layer) || hooks->wants(Point::kAttnPattern, layer)));
}

bool uses_lane_attention(const Model& m, int layer, const Hooks* hooks) {
    if (m.options.attention == AttentionKernel::kBlocked || m.config.attn_softcap > 0 || m.config.is_sliding(layer)) return false;
    return !(hooks && (hooks->wants(Point::kAttnScores, layer) || hooks->wants(Point::kAttnPattern, layer)));
}

namespace {

double attention_scale(const ModelConfig& cfg) {
    return cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(cfg.d_head));
}

// libtorch's fused kernel: [B, H, T, d] against the K kv heads (GQA: compat::fused_attention), the causal
// mask as a flag when there is no cache, else as [T, S] with the sliding window folded in. -> z [B, T, H, d].
// lane: attention() found the lane kernel applies (cpu_attention.h): it runs instead, causal after the
// cache without a mask tensor.
at::Tensor fused_z(const ModelConfig& cfg, int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool lane) {
    const double scale = attention_scale(cfg);
    if (lane) return cpu_attention_z(q, k, v, scale);
    const int64_t T = q.size(1), S = k.size(1);
    const int window = cfg.is_sliding(layer) ? cfg.sliding_window : 0;
    auto q4 = q.permute({0, 2, 1, 3});
    auto k4 = k.permute({0, 2, 1, 3}), v4 = v.permute({0, 2, 1, 3});  // [B, K, S, d]
    // A long prefill chunk, or one after a long past, on the CPU: without the mask (compat::chunk_attention).
    if (S > T && window == 0 && (T >= kChunkAttentionQueries || S - T >= kChunkAttentionPast) && q.device().is_cpu() &&
        compat::has_chunk_attention())
        return compat::chunk_attention(q4, k4, v4, scale).permute({0, 2, 1, 3});
    const at::Tensor mask = S > T || window > 0 ? visible_mask(T, S, S - T, window, q.device()) : at::Tensor();
    return compat::fused_attention(q4, k4, v4, mask, !mask.defined(), scale).permute({0, 2, 1, 3});
}

// The first `shape` elements of a flat scratch buffer, as that shape.
at::Tensor from(const at::Tensor& buf, at::IntArrayRef shape) {
    return buf.narrow(0, 0, c10::multiply_integers(shape)).view(shape);
}

// attention_reference() computed the way that scales: one layer in query blocks through the KV cache,
// with its capture points, attention windows and scratch reuse. z() runs the blocks; each block takes
// the steps below in order (block_scores, mask_block, compensation, softmax, @ v), or, where every
// head of a group streams, a product over only the keys its windows show (streaming_block_z).
//
// Query head h reads kv head h / g (grouped-query attention). The g query heads of a kv head are
// stacked into one product against that kv head's keys, [g*n, d] x [d, S], so k and v are never
// expanded to H heads; products are [B*K, g*n, .], which is [B, H, n, .] in memory. q, k, v are made
// contiguous once per layer, so each block's products read them in place.
class BlockedAttention {
public:
    BlockedAttention(const ModelConfig& cfg, int layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const Hooks* hooks, int64_t attn_block, LayerKeeps keeps = {});
    at::Tensor z();  // [B, T, H, d]

private:
    // Queries [q0, q0 + n) at absolute positions [first, first + n), against keys [lo, hi).
    struct Block {
        int64_t q0 = 0, n = 0, first = 0, lo = 0, hi = 0;
        at::Tensor qb;  // [B*K, g*n, d]
        int64_t m() const { return hi - lo; }
    };
    // Compensation (RazorAttention): per query, the score of the mean hidden key and the mean hidden value.
    struct Compensation {
        at::Tensor extra;  // [B*K, g*n] float, -inf where a query has none
        at::Tensor vbar;   // [B*K, g*n, d] in acc_
    };
    void plan_windows();
    void plan_blocks(int64_t attn_block);
    void plan_streaming_groups();
    void need_kv3();
    Block block_at(int64_t q0) const;
    at::Tensor block_z(const Block& b);
    at::Tensor streaming_block_z(const Block& b, int64_t gap_lo, int64_t gap_hi);
    at::Tensor part(const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& kpos,
                    const at::Tensor& snk, const at::Tensor& rec, const Block& b) const;
    at::Tensor block_scores(const Block& b);
    void mask_block(at::Tensor& scores, const Block& b);
    void mask_keeps(at::Tensor& scores, const Block& b);
    Compensation compensation(const Block& b) const;
    Compensation keep_compensation(const Block& b) const;
    at::Tensor full_width(const at::Tensor& block, const Block& b, float fill);

    const ModelConfig& cfg_;
    const int layer_;
    const Hooks* hooks_;
    at::Tensor k_, v_;  // [B, S, K, d]
    at::TensorOptions q_opts_;
    c10::ScalarType dtype_;
    c10::Device device_;
    int64_t B_, T_, H_, K_, d_, g_, S_, past_;
    at::Tensor q3_;      // [B*K, g, T, d], scaled when scale_in_q_
    at::Tensor k3_, v3_;  // [B*K, S, d], made on first use (need_kv3)
    double scale_ = 1.0;
    bool scale_in_q_ = false;
    int window_ = 0;  // the layer's sliding window (0: none)
    at::TensorOptions pos_opts_;
    const float neg_inf_ = -std::numeric_limits<float>::infinity();
    // Attention windows and compensation's prefix sums.
    LayerWindows win_;
    // Kept positions (Hooks::keep) and, with compensation, each (row, head)'s mean hidden key and value.
    LayerKeeps keep_;
    at::Tensor keep_kbar_, keep_vbar_, keep_has_;  // [B*K, g, d] in acc_ (twice), [B*K, g] bool
    c10::ScalarType acc_ = torch::kDouble;
    at::Tensor pk_, pv_;  // [B*K, S + 1, d]: sums of the first s keys / values
    // Blocks and scratch.
    bool whole_ = false, see_scores_ = false, see_pattern_ = false, reuse_ = false, fp32_ = false, core_ = false;
    int64_t rows_ = 1, cap_ = 0;
    at::Tensor scores_buf_, pattern_buf_, wide_buf_;
    at::Tensor upper_;  // the causal corner mask, built once per block height
    // Streaming groups (plan_streaming_groups): idx_s_ stream, idx_f_ do not.
    at::Tensor idx_s_, idx_f_, sink_s_, recent_s_, sink_f_, recent_f_;
    at::Tensor b_s_, kv_s_, b_f_, kv_f_;  // each group's (row, kv head), to read its keys from k and v
    int64_t smax_ = 0, rmax_ = 0;
};

BlockedAttention::BlockedAttention(const ModelConfig& cfg, int layer, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const Hooks* hooks, int64_t attn_block, LayerKeeps keeps)
    : cfg_(cfg), layer_(layer), hooks_(hooks), k_(k), v_(v), q_opts_(q.options()), dtype_(q.scalar_type()),
      device_(q.device()), keep_(std::move(keeps)) {
    B_ = q.size(0), T_ = q.size(1), H_ = cfg.n_heads, K_ = cfg.n_kv_heads, d_ = cfg.d_head, g_ = H_ / K_;
    S_ = k.size(1), past_ = S_ - T_;
    q3_ = q.permute({0, 2, 1, 3}).reshape({B_ * K_, g_, T_, d_}).contiguous();
    scale_ = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d_));
    // A power-of-two scale (d_head 64: 1/8) is applied to q before the product: scaling by 2^k is
    // exact, so the scores are bit-identical to (q k^T) * scale, at a [T, d] pass instead of [T, S].
    int exponent = 0;
    scale_in_q_ = std::frexp(scale_, &exponent) == 0.5;
    if (scale_in_q_) q3_ = q3_ * scale_;
    window_ = cfg.is_sliding(layer) ? cfg.sliding_window : 0;
    pos_opts_ = torch::TensorOptions().dtype(torch::kLong).device(device_);
    plan_windows();
    plan_blocks(attn_block);
    plan_streaming_groups();
}

// k3, v3 [B*K, S, d] are made on first use: a block whose groups all stream reads its few keys
// straight from k and v, and a decode step of such a layer never copies the cache. A KV cache's
// views are already [B*K] matrices of [S, d] rows (KVCache: [B, K, capacity, d] buffers): the
// reshape is then a view and nothing is copied; a fresh k is copied once.
void BlockedAttention::need_kv3() {
    if (k3_.defined()) return;
    auto as_kv3 = [&](const at::Tensor& x) {
        auto r = x.permute({0, 2, 1, 3}).reshape({B_ * K_, S_, d_});
        return r.stride(2) == 1 && r.stride(1) == d_ ? r : r.contiguous();
    };
    k3_ = as_kv3(k_), v3_ = as_kv3(v_);
}

// Attention windows (Intervention::kStream, docs/forward.md "Attention windows"): a [B, H, n, m]
// mask per block on top of the layer's own; with compensation, prefix sums of the keys and values
// give each query the means of the keys its window hides, one more column of the softmax.
void BlockedAttention::plan_windows() {
    if (hooks_ && hooks_->has_windows(layer_)) win_ = hooks_->windows(layer_, B_, H_, device_);
    // Kept positions: attention() has built them once for its fused-or-blocked choice and hands them over.
    if (!keep_.defined() && hooks_ && hooks_->has_keeps(layer_)) keep_ = hooks_->keeps(layer_, B_, H_, device_);
    acc_ = device_.is_mps() ? torch::kFloat : torch::kDouble;  // prefix sums: double where there is one
    if (keep_.any_compensate) {
        if (win_.any_compensate) throw ConfigError(fmt::format("layer {}: windows and kept positions cannot both compensate", layer_));
        if (window_ > 0) throw ConfigError(fmt::format("layer {}: kept-position compensation on a sliding-window layer is not supported", layer_));
        // The hidden keys of a (row, head) are the same for every query that sees the compressed
        // cache (s < from, not kept): their means once per layer.
        need_kv3();
        const int64_t F = std::min(S_, keep_.max_from);
        auto s = torch::arange(F, pos_opts_).view({1, 1, F});
        auto hidden = (keep_.visible.narrow(2, 0, F).logical_not() & (s < keep_.from.view({B_, 1, 1})))
                          .reshape({B_ * K_, g_, F}).to(acc_);
        auto count = hidden.sum(-1, true);  // [B*K, g, 1]
        keep_has_ = count.squeeze(-1).gt(0) & keep_.compensate.reshape({B_ * K_, g_});
        keep_kbar_ = at::bmm(hidden, k3_.narrow(1, 0, F).to(acc_)) / count.clamp_min(1);
        keep_vbar_ = at::bmm(hidden, v3_.narrow(1, 0, F).to(acc_)) / count.clamp_min(1);
    }
    if (!win_.any_compensate) return;
    need_kv3();
    auto zero = torch::zeros({B_ * K_, 1, d_}, k3_.options().dtype(acc_));
    pk_ = torch::cat({zero, k3_.to(acc_).cumsum(1)}, 1);
    pv_ = torch::cat({zero, v3_.to(acc_).cumsum(1)}, 1);
}

// Whole [B, H, T, S] scores only when someone needs them whole; otherwise query blocks, each
// against only the keys some row of the block can see: keys [lo, hi) with hi = the block's
// last position + 1 (causal) and lo = its first position - window + 1 (sliding window). Row i
// of a block is row q0 + i of the whole, computed the same way (the skipped keys are the ones
// the mask sets to -inf, whose softmax weight is exactly 0); observers are handed rows of full
// width S, padded with -inf (scores) or 0 (pattern).
// Blocks reuse one scratch buffer per tensor for the whole layer (allocated once, at the largest
// block), instead of allocating, page-faulting and freeing fresh [B, H, rows, m] tensors block
// after block: at T = 4096 that was ~4 x 25 MiB x 32 blocks per layer. Row observers are told
// not to keep what they are handed (src/interp/hooks.h); whole-tensor hooks get fresh tensors.
void BlockedAttention::plan_blocks(int64_t attn_block) {
    whole_ = hooks_ && (hooks_->needs_whole(Point::kAttnScores, layer_) || hooks_->needs_whole(Point::kAttnPattern, layer_));
    see_scores_ = !whole_ && hooks_ && hooks_->wants(Point::kAttnScores, layer_);
    see_pattern_ = !whole_ && hooks_ && hooks_->wants(Point::kAttnPattern, layer_);
    rows_ = whole_ ? T_ : attention_block_rows(attn_block, B_, H_, T_, S_);
    // Not under autograd (the duo-gates fit differentiates through later layers' q, k, v): the
    // scratch buffers are written with out= kernels, which autograd refuses.
    const bool grad = at::GradMode::is_enabled() && (q3_.requires_grad() || k_.requires_grad() || v_.requires_grad());
    reuse_ = !whole_ && T_ > rows_ && !grad;
    // Under autograd, causal float32 attention on the CPU that nobody observes or edits: CausalCore.
    core_ = grad && g_autograd_core && device_.is_cpu() && dtype_ == at::kFloat && !whole_ && !see_scores_ && !see_pattern_ &&
            window_ == 0 && cfg_.attn_softcap <= 0 && !win_.defined() && !keep_.defined();
    fp32_ = dtype_ == at::kFloat;
    cap_ = B_ * H_ * rows_ * S_;
    if (!reuse_) return;
    scores_buf_ = at::empty({cap_}, q3_.options());
    if (fp32_) pattern_buf_ = at::empty({cap_}, q3_.options());
}

// Streaming groups read only the keys their windows show. When nobody observes the scores or the
// pattern and no window compensates or acts in blocks, the (row, kv head) groups whose every query head has a
// window (idx_s) run their own product over the block's sink keys [lo, gap_lo) and recent keys
// [gap_hi, hi), skipping the keys between, which no head of theirs can see; the other groups
// (idx_f) run over [lo, hi) as usual. The same scores, masks and softmax over fewer columns.
void BlockedAttention::plan_streaming_groups() {
    if (!win_.defined() || win_.any_compensate || win_.any_from || win_.any_block || keep_.defined() || whole_ || see_scores_ ||
        see_pattern_)
        return;
    auto rec = win_.recent.to(torch::kCPU).reshape({B_ * K_, g_}), snk = win_.sink.to(torch::kCPU).reshape({B_ * K_, g_});
    auto streams = (rec < LayerWindows::kNoWindow).all(1);  // [B*K]
    if (!streams.any().item<bool>()) return;
    auto is = streams.nonzero().view(-1), isf = streams.logical_not().nonzero().view(-1);
    smax_ = snk.index_select(0, is).max().item<int64_t>();
    rmax_ = rec.index_select(0, is).max().item<int64_t>();
    auto dev = [&](const at::Tensor& t) { return t.to(device_); };
    sink_s_ = dev(snk.index_select(0, is)), recent_s_ = dev(rec.index_select(0, is));
    sink_f_ = dev(snk.index_select(0, isf)), recent_f_ = dev(rec.index_select(0, isf));
    b_s_ = dev(at::div(is, K_, "floor")), kv_s_ = dev(is.remainder(K_));
    b_f_ = dev(at::div(isf, K_, "floor")), kv_f_ = dev(isf.remainder(K_));
    idx_s_ = dev(is), idx_f_ = dev(isf);
}

BlockedAttention::Block BlockedAttention::block_at(int64_t q0) const {
    Block b;
    b.q0 = q0, b.n = std::min(rows_, T_ - q0);
    b.first = past_ + q0;  // absolute position of the block's first query
    b.lo = 0, b.hi = S_;
    if (!whole_) {
        b.hi = std::min(S_, b.first + b.n);
        if (window_ > 0) b.lo = std::max<int64_t>(0, b.first - window_ + 1);
    }
    b.qb = (b.n == T_ ? q3_ : q3_.narrow(2, q0, b.n)).reshape({B_ * K_, g_ * b.n, d_});
    return b;
}

at::Tensor BlockedAttention::z() {
    std::vector<at::Tensor> zs;
    for (int64_t q0 = 0; q0 < T_; q0 += rows_) zs.push_back(block_z(block_at(q0)));
    return (zs.empty() ? torch::zeros({B_, H_, 0, d_}, q_opts_) : zs.size() == 1 ? zs[0] : torch::cat(zs, 2))
        .permute({0, 2, 1, 3});  // [B, T, H, d]
}

// One block's z [B, H, n, d].
at::Tensor BlockedAttention::block_z(const Block& b) {
    const int64_t gap_lo = std::min(std::max(smax_, b.lo), b.hi);
    const int64_t gap_hi = std::min(b.hi, std::max(gap_lo, b.first - rmax_ + 1));
    if (idx_s_.defined() && gap_hi > gap_lo) return streaming_block_z(b, gap_lo, gap_hi);
    need_kv3();
    const int64_t n = b.n, m = b.m();
    if (core_)
        return CausalCore::apply(b.qb, m == S_ ? k3_ : k3_.narrow(1, b.lo, m), m == S_ ? v3_ : v3_.narrow(1, b.lo, m), g_, n,
                                 scale_in_q_ ? 0.0 : scale_)
            .view({B_, H_, n, d_});
    auto scores = block_scores(b);  // [B*K, g*n, m] = [B, H, n, m]
    mask_block(scores, b);
    if (keep_.defined()) mask_keeps(scores, b);
    const Compensation comp = win_.any_compensate ? compensation(b) : keep_.any_compensate ? keep_compensation(b) : Compensation{};
    if (whole_) scores = hook(hooks_, Point::kAttnScores, layer_, scores.view({B_, H_, n, m})).reshape({B_ * K_, g_ * n, m});
    else if (see_scores_) hooks_->run_rows(Point::kAttnScores, layer_, b.q0, full_width(scores, b, neg_inf_));
    at::Tensor pattern;  // [B*K, g*n, m], softmax in fp32
    at::Tensor extra_w;  // compensation: the weight of the mean key [B*K, g*n, 1]
    if (comp.extra.defined()) {
        auto p = torch::softmax(torch::cat({scores.to(torch::kFloat), comp.extra.unsqueeze(-1)}, -1), -1);
        pattern = p.narrow(2, 0, m).contiguous().to(dtype_);
        extra_w = p.narrow(2, m, 1);
    } else if (reuse_ && fp32_) {
        pattern = from(pattern_buf_, {B_ * K_, g_ * n, m});
        at::_softmax_out(pattern, scores, -1, false);
    } else {
        pattern = torch::softmax(scores.to(torch::kFloat), -1).to(dtype_);
    }
    scores = at::Tensor();
    if (whole_) pattern = hook(hooks_, Point::kAttnPattern, layer_, pattern.view({B_, H_, n, m})).reshape({B_ * K_, g_ * n, m});
    else if (see_pattern_) hooks_->run_rows(Point::kAttnPattern, layer_, b.q0, full_width(pattern, b, 0.0f));
    auto zb = bmm_small(pattern, m == S_ ? v3_ : v3_.narrow(1, b.lo, m));
    if (extra_w.defined()) zb = (zb.to(acc_) + extra_w.to(acc_) * comp.vbar).to(zb.scalar_type());
    return zb.view({B_, H_, n, d_});
}

// The block's scores q k^T, scaled and soft-capped: [B*K, g*n, m] (in the scratch buffer when reused).
at::Tensor BlockedAttention::block_scores(const Block& b) {
    const int64_t m = b.m();
    auto kt = (m == S_ ? k3_ : k3_.narrow(1, b.lo, m)).transpose(1, 2);
    at::Tensor scores;
    if (reuse_) {
        scores = from(scores_buf_, {B_ * K_, g_ * b.n, m});
        at::bmm_out(scores, b.qb, kt);
    } else {
        scores = bmm_small(b.qb, kt);
    }
    if (!scale_in_q_) scores.mul_(scale_);
    if (cfg_.attn_softcap > 0) scores.div_(cfg_.attn_softcap).tanh_().mul_(cfg_.attn_softcap);
    return scores;
}

// -inf where a query may not look: later keys (causal), keys past the layer's sliding window, and
// keys an attention window hides.
void BlockedAttention::mask_block(at::Tensor& scores, const Block& b) {
    const int64_t n = b.n, m = b.m();
    if (window_ == 0 && b.hi == b.first + n && n >= 1) {
        // Causal only: the masked entries all lie in the last n columns, above the diagonal.
        if (n > 1) {
            if (!upper_.defined() || upper_.size(0) != n)
                upper_ = torch::ones({n, n}, torch::TensorOptions().dtype(torch::kBool).device(device_)).triu(1);
            scores.view({B_ * K_, g_, n, m}).narrow(3, m - n, n).masked_fill_(upper_, neg_inf_);
        }
    } else {
        auto vis = visible_mask(n, m, b.first - b.lo, window_, device_);
        scores.view({B_ * K_, g_, n, m}).masked_fill_(vis.logical_not(), neg_inf_);
    }
    if (!win_.defined()) return;
    auto kpos = torch::arange(b.lo, b.hi, pos_opts_).view({1, 1, 1, m});
    auto qpos = torch::arange(b.first, b.first + n, pos_opts_).view({1, 1, n, 1});
    auto sink = win_.sink.view({B_, H_, 1, 1}), recent = win_.recent.view({B_, H_, 1, 1});
    // A block window (LayerWindows): the recent blocks end where the query's own block starts.
    auto hide = (kpos >= sink) & (kpos <= (win_.any_block ? qpos - recent - qpos.remainder(win_.block.view({B_, H_, 1, 1}))
                                                          : qpos - recent));
    if (win_.any_from) hide = hide & (qpos >= win_.from.view({B_, H_, 1, 1}));
    scores.view({B_, H_, n, m}).masked_fill_(hide, neg_inf_);
}

// Kept positions: a query at p >= from[b] sees key s < from[b] only where visible[b, h, s] (the
// mask is true from from[b] on, so the columns [lo, min(hi, F)) need no second test).
void BlockedAttention::mask_keeps(at::Tensor& scores, const Block& b) {
    const int64_t n = b.n, m = b.m(), F = std::min(b.hi, keep_.max_from);
    if (F <= b.lo) return;
    auto vis = keep_.visible.narrow(2, b.lo, F - b.lo).view({B_, H_, 1, F - b.lo});
    auto qpos = torch::arange(b.first, b.first + n, pos_opts_).view({1, 1, n, 1});
    auto late = qpos >= keep_.from.view({B_, 1, 1, 1});  // [B, 1, n, 1]
    scores.view({B_, H_, n, m}).narrow(3, 0, F - b.lo).masked_fill_(late & vis.logical_not(), neg_inf_);
}

// Kept-position compensation: queries at p >= from[b] of a compensating (row, head) with hidden keys
// score the mean hidden key (keep_kbar_) and take the mean hidden value.
BlockedAttention::Compensation BlockedAttention::keep_compensation(const Block& b) const {
    const int64_t n = b.n;
    auto qpos = torch::arange(b.first, b.first + n, pos_opts_).view({1, 1, n});
    auto late = qpos >= keep_.from.repeat_interleave(K_).view({B_ * K_, 1, 1});  // [B*K, 1, n]
    auto use = (late & keep_has_.view({B_ * K_, g_, 1})).reshape({B_ * K_, g_ * n});
    Compensation c;
    if (!use.any().item<bool>()) return c;
    auto q4 = b.qb.view({B_ * K_, g_, n, d_}).to(acc_);
    auto extra = (q4 * keep_kbar_.view({B_ * K_, g_, 1, d_})).sum(-1).reshape({B_ * K_, g_ * n});
    if (!scale_in_q_) extra.mul_(scale_);
    if (cfg_.attn_softcap > 0) extra.div_(cfg_.attn_softcap).tanh_().mul_(cfg_.attn_softcap);
    c.extra = extra.to(torch::kFloat).masked_fill(use.logical_not(), neg_inf_);
    c.vbar = keep_vbar_.view({B_ * K_, g_, 1, d_}).expand({B_ * K_, g_, n, d_}).reshape({B_ * K_, g_ * n, d_});
    return c;
}

// Hidden keys of query p: [a, e) with a = max(sink, p - window + 1), e = p - recent + 1. Only when
// some query of the block has hidden keys: otherwise (a window as long as the context) no extra
// column (undefined), and the block is computed exactly as without it.
BlockedAttention::Compensation BlockedAttention::compensation(const Block& b) const {
    const int64_t n = b.n;
    auto qp = torch::arange(b.first, b.first + n, pos_opts_).view({1, 1, n});
    auto a = win_.sink.view({B_, H_, 1}).expand({B_, H_, n});
    if (window_ > 0) a = torch::maximum(a, qp - window_ + 1);
    auto e = qp - win_.recent.view({B_, H_, 1}) + 1;
    auto count = e - a;
    auto use = (count > 0) & win_.compensate.view({B_, H_, 1});
    if (win_.any_from) use = use & (qp >= win_.from.view({B_, H_, 1}));
    use = use.reshape({B_ * K_, g_ * n});
    Compensation c;
    if (!use.any().item<bool>()) return c;
    auto at_ = [&](const at::Tensor& P, const at::Tensor& i) {
        return P.gather(1, i.clamp(0, S_).reshape({B_ * K_, g_ * n, 1}).expand({B_ * K_, g_ * n, d_}));
    };
    auto cnt = count.clamp_min(1).reshape({B_ * K_, g_ * n, 1}).to(acc_);
    auto kbar = (at_(pk_, e) - at_(pk_, a)) / cnt;
    c.vbar = (at_(pv_, e) - at_(pv_, a)) / cnt;
    auto extra = (b.qb.to(acc_) * kbar).sum(-1);  // qb carries the scale when scale_in_q
    if (!scale_in_q_) extra.mul_(scale_);
    if (cfg_.attn_softcap > 0) extra.div_(cfg_.attn_softcap).tanh_().mul_(cfg_.attn_softcap);
    c.extra = extra.to(torch::kFloat).masked_fill(use.logical_not(), neg_inf_);
    return c;
}

// Observers see rows of full width S: the block's columns [lo, hi), the rest -inf or 0.
at::Tensor BlockedAttention::full_width(const at::Tensor& block, const Block& b, float fill) {
    const int64_t n = b.n, m = block.size(2), lo = b.lo;
    auto b4 = block.view({B_, H_, n, m});
    if (lo == 0 && m == S_) return b4;
    if (!wide_buf_.defined()) wide_buf_ = at::empty({cap_}, b4.options());
    auto out = from(wide_buf_, {B_, H_, n, S_});
    if (lo > 0) out.narrow(3, 0, lo).fill_(fill);
    if (lo + m < S_) out.narrow(3, lo + m, S_ - lo - m).fill_(fill);
    out.narrow(3, lo, m).copy_(b4);
    return out;
}

// One part's attention: qp [P, g*n, d] against keys kp, vp [P, m', d] at absolute positions kpos [m'],
// masked causally, by the layer's sliding window and by the part's windows [P, g].
at::Tensor BlockedAttention::part(const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp, const at::Tensor& kpos,
                                  const at::Tensor& snk, const at::Tensor& rec, const Block& b) const {
    const int64_t P = qp.size(0), mk = kp.size(1), n = b.n;
    auto sc = at::bmm(qp, kp.transpose(1, 2));
    if (!scale_in_q_) sc.mul_(scale_);
    if (cfg_.attn_softcap > 0) sc.div_(cfg_.attn_softcap).tanh_().mul_(cfg_.attn_softcap);
    auto kk = kpos.view({1, 1, 1, mk}), qq = torch::arange(b.first, b.first + n, pos_opts_).view({1, 1, n, 1});
    auto hide = kk > qq;
    if (window_ > 0) hide = hide | (kk <= qq - window_);
    hide = hide | ((kk >= snk.view({P, g_, 1, 1})) & (kk <= qq - rec.view({P, g_, 1, 1})));
    sc.view({P, g_, n, mk}).masked_fill_(hide, neg_inf_);
    return at::bmm(torch::softmax(sc.to(torch::kFloat), -1).to(dtype_), vp);  // [P, g*n, d]
}

// A block where some groups stream: those over their sink keys [lo, gap_lo) and recent keys
// [gap_hi, hi) only, the others over [lo, hi). z [B, H, n, d].
at::Tensor BlockedAttention::streaming_block_z(const Block& b, int64_t gap_lo, int64_t gap_hi) {
    const int64_t lo = b.lo, hi = b.hi, m = b.m();
    auto kv4 = k_.permute({0, 2, 1, 3}), vv4 = v_.permute({0, 2, 1, 3});  // [B, K, S, d] views
    auto cols = [&](const at::Tensor& x4) {  // the streaming groups' keys: [lo, gap_lo) and [gap_hi, hi)
        auto recent = x4.narrow(2, gap_hi, hi - gap_hi);
        auto c = gap_lo > lo ? torch::cat({x4.narrow(2, lo, gap_lo - lo), recent}, 2) : recent;
        return c.index({b_s_, kv_s_});  // [P_s, keys, d]
    };
    auto kpos_s = gap_lo > lo ? torch::cat({torch::arange(lo, gap_lo, pos_opts_), torch::arange(gap_hi, hi, pos_opts_)})
                              : torch::arange(gap_hi, hi, pos_opts_);
    auto zb = at::empty({B_ * K_, g_ * b.n, d_}, b.qb.options());
    zb.index_copy_(0, idx_s_, part(b.qb.index_select(0, idx_s_), cols(kv4), cols(vv4), kpos_s, sink_s_, recent_s_, b));
    if (idx_f_.numel() > 0) {
        auto kf = kv4.narrow(2, lo, m).index({b_f_, kv_f_}), vf = vv4.narrow(2, lo, m).index({b_f_, kv_f_});
        zb.index_copy_(0, idx_f_, part(b.qb.index_select(0, idx_f_), kf, vf, torch::arange(lo, hi, pos_opts_), sink_f_,
                                       recent_f_, b));
    }
    return zb.view({B_, H_, b.n, d_});
}

// A step's attention when rows share prompt caches (KVCache::shared): row b's keys are its shared
// cache's P positions, then its own So. The scores [B, H, T, P + So] are the whole keys' scores (the
// same products, the rows of one shared cache stacked into one product against its keys, which are
// read once for all of them), scaled, soft-capped, masked (causal, the layer's sliding window),
// observed and edited, and softmaxed as the blocked attention does them; z adds the two parts'
// values. q [B, T, H, d] after RoPE, k_own, v_own [B, So, K, d] -> z [B, T, H, d].
// Ragged rows (KVCache::ragged): row b's shared cache holds P_b <= P positions; its scores put its keys at
// their positions (the shared [0, P_b), the own [P_b, P_b + So)) and hide the rest up to S (weight 0).
}  // namespace

std::vector<SharedPiece> shared_pieces(const std::vector<KVCache>& shared, const std::vector<int64_t>& shared_rows,
                                       bool follow_origins) {
    std::map<uint64_t, int64_t> by_id;  // content id -> the first cache of the batch so named
    for (size_t c = 0; c < shared.size(); ++c)
        if (shared[c].content_id != 0) by_id.emplace(shared[c].content_id, static_cast<int64_t>(c));
    std::map<int64_t, std::vector<std::array<int64_t, 3>>> spans;  // reader cache -> (row, a, b)
    for (size_t b = 0; b < shared_rows.size(); ++b) {
        const int64_t p = shared_rows[b];
        const KVCache& c = shared.at(static_cast<size_t>(p));
        const int64_t P = c.length();
        int64_t pos = 0;
        for (const auto& [id, n] : c.origins) {
            if (!follow_origins) break;
            const auto it = by_id.find(id);
            if (it == by_id.end() || it->second == p) continue;
            const int64_t end = std::min({n, P, shared[static_cast<size_t>(it->second)].length()});
            if (end > pos) spans[it->second].push_back({static_cast<int64_t>(b), pos, end}), pos = end;
        }
        if (pos < P) spans[p].push_back({static_cast<int64_t>(b), pos, P});
    }
    std::vector<SharedPiece> pieces;
    for (const auto& [c, list] : spans) {
        std::vector<int64_t> cuts;
        for (const auto& s : list) cuts.push_back(s[1]), cuts.push_back(s[2]);
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
            SharedPiece piece{c, cuts[i], cuts[i + 1], {}};
            for (const auto& s : list)
                if (s[1] <= piece.a && piece.b <= s[2]) piece.rows.push_back(s[0]);
            std::sort(piece.rows.begin(), piece.rows.end());
            if (!piece.rows.empty()) pieces.push_back(std::move(piece));
        }
    }
    return pieces;
}

namespace {

at::Tensor shared_prompt_z(const ModelConfig& cfg, int layer, const at::Tensor& q, const KVCache& cache,
                           const at::Tensor& k_own, const at::Tensor& v_own, const Hooks* hooks) {
    const int64_t B = q.size(0), T = q.size(1), H = cfg.n_heads, K = cfg.n_kv_heads, d = cfg.d_head, g = H / K;
    const auto& shared = *cache.shared;
    const int64_t P = cache.shared_length(), So = k_own.size(1), S = P + So, gT = g * T;
    const auto dev = q.device();
    const bool ragged = cache.ragged();
    std::vector<int64_t> rowP(static_cast<size_t>(B));  // row b's shared positions
    for (int64_t b = 0; b < B; ++b)
        rowP[static_cast<size_t>(b)] = shared.at(static_cast<size_t>(cache.shared_rows.at(static_cast<size_t>(b)))).length();
    const double scale = cfg.attn_scale > 0 ? cfg.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
    int exponent = 0;
    const bool scale_in_q = std::frexp(scale, &exponent) == 0.5;  // exact, as BlockedAttention
    auto q4 = q.permute({0, 2, 1, 3}).reshape({B, K, gT, d});  // a kv head's g query heads stacked
    q4 = (scale_in_q ? q4 * scale : q4).contiguous();  // (a product keeps a permuted q's strides where T > 1)
    // Each shared cache's rows, and its keys and values [K, P, d] (views of its buffers).
    std::vector<std::vector<int64_t>> rows_of(shared.size());
    for (int64_t b = 0; b < B; ++b) rows_of.at(static_cast<size_t>(cache.shared_rows[static_cast<size_t>(b)])).push_back(b);
    auto kv_of = [&](const std::vector<at::Tensor>& x) { return x.at(static_cast<size_t>(layer)).select(0, 0).permute({1, 0, 2}); };
    std::vector<at::Tensor> idx(shared.size());
    auto scores = ragged ? at::zeros({B, K, gT, S}, q.options()) : at::empty({B, K, gT, S}, q.options());
    // On the CPU without autograd: the shared positions as pieces (shared_pieces), one product a (piece,
    // kv head) of the piece's rows' queries, split over the threads: a piece of one row goes straight
    // into the scores and z; several rows' queries (ablation rows of one trial, trials with a common
    // prefix) are stacked. (Gathering each cache's rows with index_select / index_copy_, as the general
    // path below does, cost more than the products here.)
    const bool pieces_path = dev.is_cpu() && !(at::GradMode::is_enabled() && q.requires_grad());
    // AVX2 or AVX-512, float32: the piece kernels (cpu_attention.h), each product's bits independent of the
    // piece's other rows and keys, and a row's values summed key by key in position order across its
    // pieces: a row's bits are those of its cache read alone, whatever the batch shares. Without them
    // the pieces are BLAS products, which for a few rows against a common run cost more than each row
    // reading its own copy (docs/performance.md "Decoding shared prefixes"): there the pieces ignore
    // the origins (one piece a cache, all its rows).
    bool piece_kernels = pieces_path && q.scalar_type() == torch::kFloat && cpu_piece_kernels(d);
    for (size_t p = 0; p < shared.size() && piece_kernels; ++p)
        piece_kernels = kv_of(shared[p].k).stride(2) == 1 && kv_of(shared[p].v).stride(2) == 1 &&
                        shared[p].k[static_cast<size_t>(layer)].scalar_type() == torch::kFloat;
    const auto pieces = pieces_path ? shared_pieces(shared, cache.shared_rows, piece_kernels) : std::vector<SharedPiece>{};
    const int64_t tasks = static_cast<int64_t>(pieces.size()) * K;
    const at::ThreadLocalState tls;
    auto each_piece_head = [&](const std::function<void(int64_t i, const SharedPiece& piece, int64_t h, const KVCache& c)>& f) {
        at::parallel_for(0, tasks, 1, [&](int64_t s, int64_t e) {
            at::ThreadLocalStateGuard guard(tls);
            for (int64_t i = s; i < e; ++i) {
                const SharedPiece& piece = pieces[static_cast<size_t>(i / K)];
                f(i, piece, i % K, shared[static_cast<size_t>(piece.cache)]);
            }
        });
    };
    auto row_ptrs = [&](float* base, const SharedPiece& piece, int64_t h, int64_t width, int64_t offset) {
        std::vector<float*> ptrs;  // row b, query t of kv head h: base + ((b K + h) gT + t) width + offset
        for (const auto b : piece.rows)
            for (int64_t t = 0; t < gT; ++t) ptrs.push_back(base + ((b * K + h) * gT + t) * width + offset);
        return ptrs;
    };
    if (piece_kernels)
        each_piece_head([&](int64_t, const SharedPiece& piece, int64_t h, const KVCache& c) {
            const auto keys = kv_of(c.k).select(0, h);
            const auto qs = row_ptrs(q4.data_ptr<float>(), piece, h, d, 0);
            const auto outs = row_ptrs(scores.data_ptr<float>(), piece, h, S, piece.a);
            cpu_piece_scores(qs.data(), static_cast<int>(qs.size()), keys.data_ptr<float>() + piece.a * keys.stride(0), keys.stride(0),
                             piece.b - piece.a, d, outs.data());
        });
    else each_piece_head([&](int64_t, const SharedPiece& piece, int64_t h, const KVCache& c) {  // [n gT, d] x [d, len]
        const int64_t len = piece.b - piece.a, n = static_cast<int64_t>(piece.rows.size());
        const auto keys_t = kv_of(c.k).select(0, h).narrow(0, piece.a, len).t();
        auto out_of = [&](int64_t b) { return scores.select(0, b).select(0, h).narrow(1, piece.a, len); };
        if (n == 1) {
            auto out = out_of(piece.rows[0]);
            at::mm_out(out, q4.select(0, piece.rows[0]).select(0, h), keys_t);
            return;
        }
        auto qs = at::empty({n * gT, d}, q4.options());
        for (int64_t j = 0; j < n; ++j) qs.narrow(0, j * gT, gT).copy_(q4.select(0, piece.rows[static_cast<size_t>(j)]).select(0, h));
        const auto prod = at::mm(qs, keys_t);
        for (int64_t j = 0; j < n; ++j) out_of(piece.rows[static_cast<size_t>(j)]).copy_(prod.narrow(0, j * gT, gT));
    });
    for (size_t p = 0; p < shared.size() && !pieces_path; ++p) {
        const int64_t n = static_cast<int64_t>(rows_of[p].size());
        if (n == 0) continue;
        const int64_t Pp = shared[p].length();
        idx[p] = torch::tensor(rows_of[p], torch::kLong).to(dev);
        auto qp = q4.index_select(0, idx[p]).permute({1, 0, 2, 3}).reshape({K, n * gT, d});
        auto sp = bmm_small(qp, kv_of(shared[p].k).transpose(1, 2));  // [K, n*g*T, Pp]
        scores.narrow(3, 0, Pp).index_copy_(0, idx[p], sp.view({K, n, gT, Pp}).permute({1, 0, 2, 3}));
    }
    at::Tensor vo3;
    if (So > 0) {
        auto as3 = [&](const at::Tensor& x) { return x.permute({0, 2, 1, 3}).reshape({B * K, So, d}); };
        vo3 = as3(v_own);
        auto own = bmm_small(q4.view({B * K, gT, d}), as3(k_own).transpose(1, 2)).view({B, K, gT, So});
        if (!ragged) scores.narrow(3, P, So).copy_(own);
        for (int64_t b = 0; b < B && ragged; ++b) scores.select(0, b).narrow(2, rowP[static_cast<size_t>(b)], So).copy_(own.select(0, b));
    }
    if (!scale_in_q) scores.mul_(scale);
    if (cfg.attn_softcap > 0) scores.div_(cfg.attn_softcap).tanh_().mul_(cfg.attn_softcap);
    auto s4 = scores.view({B, H, T, S});
    const int window = cfg.is_sliding(layer) ? cfg.sliding_window : 0;
    if (ragged) {  // row b's query i sits at P_b + So - T + i; its keys past P_b + So are hidden
        auto qpos = (torch::tensor(rowP, torch::kLong).to(dev) + (So - T)).view({B, 1, 1}) +
                    torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(dev)).view({1, T, 1});
        auto kj = torch::arange(S, torch::TensorOptions().dtype(torch::kLong).device(dev)).view({1, 1, S});
        auto vis = kj <= qpos;  // [B, T, S]
        if (window > 0) vis = vis & (kj > qpos - window);
        s4.masked_fill_(vis.logical_not().unsqueeze(1), -std::numeric_limits<float>::infinity());
    } else if (T > 1 || (window > 0 && window < S)) {
        s4.masked_fill_(visible_mask(T, S, S - T, window, dev).logical_not(), -std::numeric_limits<float>::infinity());
    }
    const bool whole = hooks && (hooks->needs_whole(Point::kAttnScores, layer) || hooks->needs_whole(Point::kAttnPattern, layer));
    if (whole) s4 = hook(hooks, Point::kAttnScores, layer, s4);
    else if (hooks && hooks->wants(Point::kAttnScores, layer)) hooks->run_rows(Point::kAttnScores, layer, 0, s4);
    auto pattern = torch::softmax(s4.to(torch::kFloat), -1).to(q.scalar_type());  // [B, H, T, S]
    if (whole) pattern = hook(hooks, Point::kAttnPattern, layer, pattern);
    else if (hooks && hooks->wants(Point::kAttnPattern, layer)) hooks->run_rows(Point::kAttnPattern, layer, 0, pattern);
    auto pat = pattern.reshape({B, K, gT, S});
    auto z = piece_kernels ? at::zeros({B, K, gT, d}, q.options()) : at::empty({B, K, gT, d}, q.options());
    if (piece_kernels) {
        // A task a (set of rows joined by common pieces, kv head), its pieces in position order.
        std::vector<int64_t> root(static_cast<size_t>(B));
        std::iota(root.begin(), root.end(), int64_t{0});
        std::function<int64_t(int64_t)> find = [&](int64_t x) {
            return root[static_cast<size_t>(x)] == x ? x : root[static_cast<size_t>(x)] = find(root[static_cast<size_t>(x)]);
        };
        for (const auto& p : pieces)
            for (const auto b : p.rows) root[static_cast<size_t>(find(b))] = find(p.rows[0]);
        std::map<int64_t, std::vector<size_t>> sets;
        for (size_t i = 0; i < pieces.size(); ++i) sets[find(pieces[i].rows[0])].push_back(i);
        std::vector<std::vector<size_t>> order;
        for (auto& [r, list] : sets) {
            std::sort(list.begin(), list.end(), [&](size_t x, size_t y) {
                return std::make_pair(pieces[x].a, pieces[x].cache) < std::make_pair(pieces[y].a, pieces[y].cache);
            });
            order.push_back(std::move(list));
        }
        const auto patc = pat.contiguous();
        at::parallel_for(0, static_cast<int64_t>(order.size()) * K, 1, [&](int64_t s0, int64_t s1) {
            at::ThreadLocalStateGuard guard(tls);
            for (int64_t i = s0; i < s1; ++i) {
                const int64_t h = i % K;
                for (const size_t pi : order[static_cast<size_t>(i / K)]) {
                    const SharedPiece& piece = pieces[pi];
                    const auto vals = kv_of(shared[static_cast<size_t>(piece.cache)].v).select(0, h);
                    const auto ws = row_ptrs(patc.data_ptr<float>(), piece, h, S, piece.a);
                    const auto accs = row_ptrs(z.data_ptr<float>(), piece, h, d, 0);
                    cpu_piece_values(ws.data(), static_cast<int>(ws.size()), vals.data_ptr<float>() + piece.a * vals.stride(0),
                                     vals.stride(0), piece.b - piece.a, d, accs.data());
                }
            }
        });
    } else if (pieces_path) {
        // One piece a row here (the origins ignored): a piece of one row straight into z, a cache's
        // stacked rows through one product.
        each_piece_head([&](int64_t, const SharedPiece& piece, int64_t h, const KVCache& c) {  // [n gT, len] x [len, d]
            const int64_t len = piece.b - piece.a, n = static_cast<int64_t>(piece.rows.size());
            const auto vals = kv_of(c.v).select(0, h).narrow(0, piece.a, len);
            auto weights_of = [&](int64_t b) { return pat.select(0, b).select(0, h).narrow(1, piece.a, len); };
            if (n == 1) {
                auto out = z.select(0, piece.rows[0]).select(0, h);
                at::mm_out(out, weights_of(piece.rows[0]), vals);
                return;
            }
            auto ws = at::empty({n * gT, len}, pat.options());
            for (int64_t j = 0; j < n; ++j) ws.narrow(0, j * gT, gT).copy_(weights_of(piece.rows[static_cast<size_t>(j)]));
            const auto prod = at::mm(ws, vals);
            for (int64_t j = 0; j < n; ++j) z.select(0, piece.rows[static_cast<size_t>(j)]).select(0, h).copy_(prod.narrow(0, j * gT, gT));
        });
    }
    for (size_t p = 0; p < shared.size() && !pieces_path; ++p) {
        if (!idx[p].defined()) continue;
        const int64_t n = idx[p].size(0);
        const int64_t Pp = shared[p].length();
        auto pp = pat.index_select(0, idx[p]).narrow(3, 0, Pp).permute({1, 0, 2, 3}).reshape({K, n * gT, Pp});
        z.index_copy_(0, idx[p], bmm_small(pp, kv_of(shared[p].v)).view({K, n, gT, d}).permute({1, 0, 2, 3}));
    }
    if (So > 0) {
        at::Tensor po;  // the own keys' weights [B, K, gT, So]
        if (!ragged) {
            po = pat.narrow(3, P, So);
        } else {
            po = at::empty({B, K, gT, So}, pat.options());
            for (int64_t b = 0; b < B; ++b) po.select(0, b).copy_(pat.select(0, b).narrow(2, rowP[static_cast<size_t>(b)], So));
        }
        z.view({B * K, gT, d}).add_(bmm_small(po.reshape({B * K, gT, So}), vo3));
    }
    return z.view({B, H, T, d}).permute({0, 2, 1, 3});
}

}  // namespace

at::Tensor attention(const Model& m, int layer, at::Tensor q, at::Tensor k, at::Tensor v, const Hooks* hooks,
                     KVCache* cache, int64_t attn_block, bool per_row) {
    if (cache && cache->packed) {
        // A compressed cache (packed_kv.h): each segment's queries against its kept entries alone.
        HS_REQUIRE(!(hooks && (hooks->wants(Point::kAttnK, layer) || hooks->wants(Point::kAttnV, layer) ||
                               hooks->wants(Point::kAttnScores, layer) || hooks->wants(Point::kAttnPattern, layer) ||
                               hooks->has_windows(layer) || hooks->has_keeps(layer))),
                   "blocks::attention: a packed cache shows no [B, S, K, d] keys, scores or pattern, and holds its policy's "
                   "windows and kept positions itself");
        if (hooks && hooks->has_q_interventions(layer)) q = hooks->apply_q(layer, q);
        q = hook(hooks, Point::kAttnQ, layer, q);
        return attention_output(m, layer, packed_attention(m.config, layer, *cache->packed, q, k, v), hooks, per_row);
    }
    bool shared_z = false;  // rows reading shared prompt caches: their keys read once per cache
    if (cache) {
        std::tie(k, v) = cache->append(layer, k, v);  // [B, S, K, d] views of [B, K, capacity, d] buffers
        if (cache->shared) {
            // Hooks that read whole keys or hide keys by position see them gathered (a copy).
            shared_z = !(hooks && (hooks->wants(Point::kAttnK, layer) || hooks->wants(Point::kAttnV, layer) ||
                                   hooks->has_windows(layer) || hooks->has_keeps(layer)));
            HS_REQUIRE(shared_z || !cache->ragged(),
                       "blocks::attention: rows of different lengths (ragged shared caches) are read in place only: no hook may "
                       "read attn.k or attn.v, and no window or kept positions may act");
            if (!shared_z) std::tie(k, v) = cache->whole(layer);
        }
    }
    if (hooks && hooks->has_q_interventions(layer)) q = hooks->apply_q(layer, q);
    q = hook(hooks, Point::kAttnQ, layer, q);  // [B, T, H, d]
    if (shared_z) return attention_output(m, layer, shared_prompt_z(m.config, layer, q, *cache, k, v, hooks), hooks, per_row);
    k = hook(hooks, Point::kAttnK, layer, k);  // [B, S, K, d]
    v = hook(hooks, Point::kAttnV, layer, v);
    // A prefill chunk on an AVX2 or AVX-512 CPU in float32 (any libtorch): the lane kernel, run by fused_z where
    // the fused kernel would run (a row's slice passes cpu_attention_applies as the batch does): the rows
    // whose windows or kept positions hide keys go blocked.
    const bool lane = q.size(1) >= kCpuAttentionMinQueries && uses_lane_attention(m, layer, hooks) && cpu_attention_applies(q, k, v);
    // The rows where a window hides some key from some query of this call ([B] bool): a window
    // hides key j from query q when sink <= j <= q - recent, so over the S keys here it hides
    // nothing when sink + recent >= S, and such a window changes nothing: the row stays fused.
    if (!lane && !uses_fused_attention(m, layer, hooks))  // (the windows' rows below matter only to the fused path)
        return attention_output(m, layer, BlockedAttention(m.config, layer, q, k, v, hooks, attn_block).z(), hooks, per_row);
    const int64_t B = q.size(0), S = k.size(1);
    at::Tensor hiding;
    bool any_hiding = false;
    if (hooks && hooks->has_windows(layer)) {
        const LayerWindows lw = hooks->windows(layer, B, m.config.n_heads, c10::Device(c10::kCPU));
        hiding = ((lw.sink + lw.recent).lt(S) & lw.from.lt(S)).any(1);
        any_hiding = hiding.any().item<bool>();
    }
    LayerKeeps lk;  // built once here, handed to the blocked attention
    if (hooks && hooks->has_keeps(layer)) {
        // A row whose keep hides a position from a query of this call (the last one, at S - 1, is
        // the latest) takes the blocked attention; a decode step's keep rows all do.
        lk = hooks->keeps(layer, B, m.config.n_heads, q.device());
        auto keeping = (lk.from.gt(0) & lk.from.lt(S) & lk.visible.logical_not().flatten(1).any(1)).to(torch::kCPU);
        hiding = hiding.defined() ? hiding | keeping : keeping;
        any_hiding = hiding.any().item<bool>();
    }
    if (any_hiding && !per_row)
        return attention_output(m, layer, BlockedAttention(m.config, layer, q, k, v, hooks, attn_block, lk).z(), hooks, per_row);
    if (!per_row) return attention_output(m, layer, fused_z(m.config, layer, q, k, v, lane), hooks, per_row);
    // Per-row exactness: each row goes to the fused kernel alone, so that its bits are those of its
    // unbatched run whatever the batch (a fused kernel may tile or split by batch size), and a row
    // whose window hides keys takes the blocked attention (which windows need) while the others stay
    // fused like their unbatched runs.
    at::Tensor z = any_hiding ? BlockedAttention(m.config, layer, q, k, v, hooks, attn_block, lk).z().clone(at::MemoryFormat::Contiguous)
                              : at::empty({B, q.size(1), q.size(2), q.size(3)}, q.options());
    for (int64_t r = 0; r < B; ++r) {
        if (any_hiding && hiding[r].item<bool>()) continue;
        z.narrow(0, r, 1).copy_(fused_z(m.config, layer, q.narrow(0, r, 1), k.narrow(0, r, 1), v.narrow(0, r, 1), lane));
    }
    return attention_output(m, layer, z, hooks, per_row);
}

// z [B, T, H, d] -> attn_out [B, T, D]: z interventions, attn.z, W_O (per head where attn.head_out is
// observed), attn_out.
static at::Tensor attention_output(const Model& m, int layer, at::Tensor z, const Hooks* hooks, bool per_row) {
    const ModelConfig& cfg = m.config;
    const LayerWeights& lw = m.weights.layers[layer];
    const int64_t B = z.size(0), T = z.size(1), H = cfg.n_heads, d = cfg.d_head;
    if (hooks && hooks->has_z_interventions(layer)) z = hooks->apply_z(layer, z);
    z = hook(hooks, Point::kAttnZ, layer, z);

    at::Tensor out;
    if (hooks && hooks->wants(Point::kAttnHeadOut, layer)) {
        // Per (row, head) GEMMs [T, d] x [d, D], batch-independent like per-row linear().
        auto wo_h = lw.wo.view({cfg.d_model, H, d}).permute({1, 2, 0});     // [H, d, D]
        auto zb = z.permute({0, 2, 1, 3}).reshape({B * H, T, d});
        auto head_out = torch::bmm(zb, wo_h.unsqueeze(0).expand({B, H, d, cfg.d_model}).reshape({B * H, d, cfg.d_model}))
                            .view({B, H, T, cfg.d_model})
                            .permute({0, 2, 1, 3});                         // [B, T, H, D]
        head_out = hooks->run(Point::kAttnHeadOut, layer, head_out);
        out = head_out.sum(2);
        if (lw.bo.defined()) out = out + lw.bo;
    } else {
        out = linear(z.reshape({B, T, H * d}), lw.wo, lw.bo, per_row);  // [B, T, D]
    }
    return hook(hooks, Point::kAttnOut, layer, out);
}

}  // namespace hs::blocks

namespace hs {

bool fused_attention_enabled(const LoadOptions& o) {
    if (!compat::has_fused_attention()) return false;
    // auto: wherever this libtorch has the kernel, CUDA or CPU (torch 2.x's CPU flash kernel); a layer
    // whose pattern or scores someone observes, or that has windows or per-row rows, stays blocked.
    return o.attention == AttentionKernel::kFused || o.attention == AttentionKernel::kAuto;
}

}  // namespace hs
