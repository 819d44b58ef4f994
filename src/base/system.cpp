#include "system.h"
#include "errors.h"

#include <ATen/Version.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>
#include <malloc.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace hs {

void tune_allocator() {
    // libtorch frees and reallocates activation buffers of the same few sizes on every layer. With
    // glibc's defaults, buffers over the (adaptive) mmap threshold are mapped and unmapped each
    // time and freed heap tops are trimmed, so every new activation page faults and is zeroed by
    // the kernel again (~15% of a GPT-2-small-shaped forward's time on the 2-core machine,
    // docs/performance.md "Threads and the allocator"). Keep buffers up to 32 MiB (glibc's
    // maximum threshold) in the heap and keep up to 512 MiB of freed heap. A user's own
    // GLIBC_TUNABLES / MALLOC_*_ settings win.
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if ((tunables && std::strstr(tunables, "malloc")) || std::getenv("MALLOC_MMAP_THRESHOLD_") ||
        std::getenv("MALLOC_TRIM_THRESHOLD_"))
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

int64_t available_memory_bytes() {
    int64_t avail = -1;
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        long long kb = 0;
        while (std::fgets(line, sizeof line, f))
            if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
                avail = static_cast<int64_t>(kb) * 1024;
                break;
            }
        std::fclose(f);
    }
    auto read_num = [](const char* path, int64_t* v) {
        std::FILE* f = std::fopen(path, "r");
        if (!f) return false;
        long long x = 0;
        const bool ok = std::fscanf(f, "%lld", &x) == 1;  // "max" (no limit) reads as no number
        std::fclose(f);
        if (ok) *v = static_cast<int64_t>(x);
        return ok;
    };
    int64_t limit = 0, used = 0;
    if (read_num("/sys/fs/cgroup/memory.max", &limit) && read_num("/sys/fs/cgroup/memory.current", &used)) {
        const int64_t left = std::max<int64_t>(0, limit - used);
        avail = avail < 0 ? left : std::min(avail, left);
    }
    return avail;
}

int set_threads(int n) {
    if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    torch::set_num_threads(n);
    // libtorch sets only its own (OpenMP) pool; OpenBLAS's pthread pool follows the core count
    // unless told, so --threads 1 would still run every GEMM on all cores.
    using SetFn = void (*)(int);
    if (auto* f = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
    return n;
}

static int find_blas(struct dl_phdr_info* info, size_t, void* data) {
    std::string name = info->dlpi_name ? info->dlpi_name : "";
    auto base = name.substr(name.find_last_of('/') + 1);
    // cuBLAS (loaded by a CUDA build of libtorch, e.g. the pip wheel's) multiplies on the GPU only.
    if (base.find("cublas") != std::string::npos) return 0;
    if (base.find("blas") != std::string::npos || base.find("mkl_rt") != std::string::npos) {
        auto* out = static_cast<std::string*>(data);
        if (out->empty()) *out = name;
    }
    return 0;
}

SystemInfo system_info() {
    SystemInfo s;
    s.torch_version = fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
    s.threads = torch::get_num_threads();
    s.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    s.cuda_available = torch::cuda::is_available();
    std::string lib;
    dl_iterate_phdr(find_blas, &lib);
    if (!lib.empty()) {
        char buf[PATH_MAX];
        s.blas_library = realpath(lib.c_str(), buf) ? std::string(buf) : lib;
    }
    const std::string& p = s.blas_library;
    if (p.empty() && at::show_config().find("BLAS_INFO=mkl") != std::string::npos) {
        s.blas_kind = "MKL (linked into libtorch)";  // the pip wheel and the libtorch archives
    } else if (p.empty()) {
        s.blas_kind = "none found (libtorch's own kernels)";
    } else if (p.find("openblas") != std::string::npos) {
        s.blas_kind = "OpenBLAS";
    } else if (p.find("mkl") != std::string::npos) {
        s.blas_kind = "MKL";
    } else if (p.find("blis") != std::string::npos) {
        s.blas_kind = "BLIS";
    } else if (p.find("atlas") != std::string::npos) {
        s.blas_kind = "ATLAS";
    } else if (p.find("/blas/") != std::string::npos) {
        s.blas_kind = "reference BLAS (slow: apt-get install libopenblas0-pthread)";
        s.blas_slow = true;
    } else {
        s.blas_kind = "unknown";
    }
    return s;
}

std::vector<CudaDevice> cuda_devices(std::string* why) {
    // The driver API's C functions have kept these signatures since CUDA 3.2 (the _v2 memory query).
    using InitFn = int (*)(unsigned);
    using CountFn = int (*)(int*);
    using GetFn = int (*)(int*, int);
    using NameFn = int (*)(char*, int, int);
    using MemFn = int (*)(size_t*, int);
    using AttrFn = int (*)(int*, int, int);
    std::vector<CudaDevice> out;
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!lib) {
        if (why) *why = "no NVIDIA driver (libcuda.so.1 not found)";
        return out;
    }
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
    auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
    auto get = reinterpret_cast<GetFn>(dlsym(lib, "cuDeviceGet"));
    auto name = reinterpret_cast<NameFn>(dlsym(lib, "cuDeviceGetName"));
    auto mem = reinterpret_cast<MemFn>(dlsym(lib, "cuDeviceTotalMem_v2"));
    auto attr = reinterpret_cast<AttrFn>(dlsym(lib, "cuDeviceGetAttribute"));
    int n = 0;
    if (!init || !count || !get || !name || !mem || !attr) {
        if (why) *why = "libcuda.so.1 lacks the driver API functions headscope reads";
    } else if (int rc = init(0); rc != 0) {
        if (why) *why = fmt::format("the NVIDIA driver did not initialise (cuInit error {})", rc);
    } else if (count(&n) == 0) {
        for (int i = 0; i < n; ++i) {
            int dev = 0;
            if (get(&dev, i) != 0) continue;
            CudaDevice d;
            d.index = i;
            char buf[256] = {0};
            if (name(buf, sizeof buf - 1, dev) == 0) d.name = buf;
            size_t bytes = 0;
            if (mem(&bytes, dev) == 0) d.total_bytes = static_cast<int64_t>(bytes);
            attr(&d.cc_major, 75, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
            attr(&d.cc_minor, 76, dev);  // ..._MINOR
            out.push_back(std::move(d));
        }
        if (out.empty() && why) *why = "the driver reports no CUDA device";
    }
    dlclose(lib);
    return out;
}

double measure_cuda_gemm_tflops(int index, int n, int reps) {
    if (!torch::cuda::is_available() || index >= static_cast<int>(torch::cuda::device_count())) return -1;
    torch::NoGradGuard ng;
    const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::Device(torch::kCUDA, index));
    auto a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
    auto c = torch::matmul(a, b);
    torch::cuda::synchronize(index);
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < 5; ++k) at::mm_out(c, a, b);
        torch::cuda::synchronize(index);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 5);
    }
    return 2.0 * n * n * static_cast<double>(n) / best / 1e12;
}

bool cpu_gemm_supported(c10::ScalarType dtype) {
    try {
        torch::NoGradGuard ng;
        auto a = torch::ones({4, 4}, torch::TensorOptions().dtype(dtype));
        auto c = torch::matmul(a, a);
        return c.size(0) == 4;
    } catch (const std::exception&) {
        return false;
    }
}

MemoryBandwidth measure_memory_bandwidth(int64_t bytes, int reps) {
    torch::NoGradGuard ng;
    MemoryBandwidth r;
    const int64_t n = std::max<int64_t>(2, bytes / 8 * 2);  // an even count of floats
    r.bytes = n * 4;
    auto buf = torch::empty({n}, torch::kFloat);
    buf.fill_(1.0f);  // every page mapped and written before the timed passes
    auto secs = [](auto t0) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    double read = 1e30, copy = 1e30;
    auto lo = buf.narrow(0, 0, n / 2), hi = buf.narrow(0, n / 2, n / 2);
    float sink = 0;
    for (int i = 0; i < std::max(1, reps); ++i) {
        auto t0 = std::chrono::steady_clock::now();
        sink += buf.sum().item<float>();
        read = std::min(read, secs(t0));
        t0 = std::chrono::steady_clock::now();
        hi.copy_(lo);
        copy = std::min(copy, secs(t0));
    }
    HS_REQUIRE(sink > 0, "measure_memory_bandwidth: the sum of a buffer of ones is not positive");
    r.read_gbs = static_cast<double>(r.bytes) / read / 1e9;
    r.copy_gbs = static_cast<double>(r.bytes) / copy / 1e9;  // n/2 floats read + n/2 written
    return r;
}

double measure_gemm_gflops(int n, int reps, c10::ScalarType dtype) {
    torch::NoGradGuard ng;
    auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
    auto c = torch::matmul(a, b);  // warm-up
    // Each sample times a run of products (~20 ms at 512 on two cores), so the figure is the
    // sustained rate, not one lucky or unlucky millisecond; the best sample is the machine's rate.
    const int per_sample = std::max(1, static_cast<int>(2e9 / (2.0 * n * n * static_cast<double>(n))));
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < per_sample; ++k) at::mm_out(c, a, b);
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / per_sample;
        best = std::min(best, dt);
    }
    return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

}  // namespace hs
