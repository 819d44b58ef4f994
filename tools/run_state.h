// Shared by `headscope run` and `headscope merge`: the names of an experiment's result file
// (docs/hdf5-schema.md, "Ablation experiments") and the shard arithmetic.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {
class ResultWriter;
}

namespace hs::cli {

struct Shard {
    int64_t index = 0, count = 1;  // this run does work items i (batches) with i % count == index
    bool owns(int64_t i) const { return i % count == index; }
    std::string str() const;       // "0/1"
};
Shard parse_shard(const std::string& s);  // "I/N" (UsageError otherwise)
// out/x.h5 -> out/x.shard-1-of-4.h5 (for a sharded run with no --out).
std::string shard_path(const std::string& out, const Shard& s);

// A scale-grid study's JUICE selection (probes/decoding/juice.h) into /ablation/<study>/juice (schema.h
// write_juice), replacing what is there: `run` after each batch, `merge` from the merged rows
// (rows [S, N], masks [S, L, H], factors [S], variants [N] or empty).
void write_juice(ResultWriter& w, const std::string& study, const at::Tensor& rows, const at::Tensor& masks,
                 const std::vector<double>& factors, const std::vector<int64_t>& variants);

}  // namespace hs::cli
