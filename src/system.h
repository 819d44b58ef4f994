// Host facts every run reports: threads, which BLAS serves libtorch's fp32 matmuls, versions.
#pragma once

#include <string>

namespace hs {

struct SystemInfo {
    std::string torch_version;
    std::string blas_library;  // resolved path of the loaded BLAS ("" if none found)
    std::string blas_kind;     // "OpenBLAS", "MKL", "BLIS", "reference BLAS (slow)", "unknown"
    bool blas_slow = false;    // the reference BLAS: fp32 GEMM 20-30x slower
    int threads = 1;           // libtorch intra-op threads in force
    int cores = 1;             // hardware threads available
    bool cuda_available = false;
};

// Sets libtorch's intra-op threads (n <= 0: every available core) and returns the count set.
int set_threads(int n);
SystemInfo system_info();
// Measured fp32 GEMM rate (GFLOP/s) on an n x n product, best of `reps`.
double measure_gemm_gflops(int n = 512, int reps = 5);

}  // namespace hs
