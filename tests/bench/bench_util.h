// Shared by the benchmarks in tests/bench/ (benchmarks, not tests: docs/performance.md).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace hs::bench {

// Milliseconds a call of f: one warm-up call, then the median of reps timed calls.
inline double median_ms(const std::function<void()>& f, int reps) {
    f();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace hs::bench
