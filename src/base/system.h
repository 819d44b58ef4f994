// Host facts every run reports: threads, which BLAS serves libtorch's fp32 matmuls, versions.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

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

// A CUDA device as the driver reports it (libcuda.so.1, loaded at run time: any build can list the
// GPUs, whether or not its libtorch has CUDA).
struct CudaDevice {
    int index = 0;
    std::string name;
    int64_t total_bytes = 0;
    int cc_major = 0, cc_minor = 0;  // compute capability
};
// The devices, or empty with `why` set ("no NVIDIA driver (libcuda.so.1 not found)", "cuInit failed: ...").
std::vector<CudaDevice> cuda_devices(std::string* why = nullptr);
// Measured bf16 GEMM rate (TFLOP/s) on CUDA device `index` through libtorch, n x n, best of `reps`;
// a negative value when this build's libtorch has no CUDA.
double measure_cuda_gemm_tflops(int index, int n = 8192, int reps = 10);

// Host memory a run may still take (bytes): /proc/meminfo's MemAvailable, or less when a cgroup v2
// limit (memory.max - memory.current) is tighter; -1 when neither can be read.
int64_t available_memory_bytes();

// Sets libtorch's intra-op threads (n <= 0: every available core) and returns the count set.
int set_threads(int n);

// Keeps activation-sized buffers (up to 32 MiB) in glibc's heap between uses instead of mapping,
// faulting in and unmapping them on every layer. Called once at the start of main().
void tune_allocator();
SystemInfo system_info();
// Measured GEMM rate (GFLOP/s) on an n x n product in `dtype` on the CPU, best of `reps`.
double measure_gemm_gflops(int n = 512, int reps = 5, c10::ScalarType dtype = c10::kFloat);
// Measured host memory bandwidth in GB/s (1e9 bytes a second), the rate a decode step that reads
// every weight once can at best stream them: `read` a sum over a float buffer of `bytes` (far larger
// than the caches), counting the bytes read; `copy` its first half copied into its second, counting
// bytes read + written. Each the best of `reps` passes over libtorch's intra-op threads; the buffer is
// written once before timing, so no pass faults pages in.
struct MemoryBandwidth {
    double read_gbs = 0, copy_gbs = 0;
    int64_t bytes = 0;  // the buffer's size
};
MemoryBandwidth measure_memory_bandwidth(int64_t bytes = int64_t{1} << 30, int reps = 5);
// Whether this build can multiply matrices of `dtype` on the CPU at all (libtorch 1.13 has no CPU
// float16 product, for one).
bool cpu_gemm_supported(c10::ScalarType dtype);

}  // namespace hs
