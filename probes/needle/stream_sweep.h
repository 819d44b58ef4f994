// The streaming-heads sweep (DuoAttention's question, on the needle test): for each fraction rho,
// the top round(rho x L x H) heads of an order keep full attention and every other head streams
// (a sink + recent window, Hooks::window), against seeded random orders; every configuration decodes
// every trial of a NeedleTest. `headscope retrieval --stream-sweep` runs it after the scan and
// writes the result with schema::write_streaming (docs/hdf5-schema.md, "/retrieval/streaming").
#pragma once

#include "hooks.h"
#include "needle.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hs {

// "0,0.25,1" -> {0, 0.25, 1}; UsageError (param "full_fractions") for a value outside [0, 1] or not a
// number, or for none.
std::vector<double> parse_full_fractions(const std::string& text);

struct StreamSweepSpec {
    std::vector<double> fractions;  // parse_full_fractions
    at::Tensor score;               // [L, H]: the order ranks heads by it, best first (NaN last)
    int64_t random_orders = 0;      // seeded random orders: heads.h random_subset, seeds seed + 3 + r
    uint64_t seed = 0;
    StreamWindow window;
    int64_t sweep_rows = 1;  // batch rows of one forward (run_ablated_sets)
};

// R = 1 + random_orders orders x F fractions; configuration c = r * F + f.
struct StreamSweep {
    std::vector<double> fractions;                // [F]
    std::vector<int64_t> full_heads;              // [F]: round(rho L H), at most L H
    std::vector<std::vector<int64_t>> orders;     // [R][L H]: flat head indices l * H + h, first kept first
    std::vector<uint8_t> masks;                   // [R, F, L, H]: 1 = the head streams
    std::vector<float> accuracy, rougeL_f;        // [R, F] over every trial
    // The real KV fraction kept, per fraction: mean over trials of rho + (1 - rho) min(1, W / N), W =
    // sink + recent (+ 1 with the compensation token), N the trial's prompt tokens (the keys at the
    // first decode step).
    std::vector<float> kv_budget;  // [F]
    int64_t distinct_sets = 0;     // the head sets decoded (identical configurations decode once)
};

// Decodes each distinct streaming set over test.ablation_trials() (identical sets once, --sweep-rows
// rows a forward), with progress on stderr.
StreamSweep run_stream_sweep(const NeedleTest& test, int n_layers, int n_heads, const StreamSweepSpec& spec);

}  // namespace hs
