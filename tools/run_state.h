// Shared by `headscope run` and `headscope merge`: the names of an experiment's result file
// (docs/hdf5-schema.md, "Ablation experiments") and the shard arithmetic.
#pragma once

#include <cstdint>
#include <string>

namespace hs::cli {

struct Shard {
    int64_t index = 0, count = 1;  // this run does work items i (batches) with i % count == index
    bool owns(int64_t i) const { return i % count == index; }
    std::string str() const;       // "0/1"
};
Shard parse_shard(const std::string& s);  // "I/N" (UsageError otherwise)
// out/x.h5 -> out/x.shard-1-of-4.h5 (for a sharded run with no --out).
std::string shard_path(const std::string& out, const Shard& s);

}  // namespace hs::cli
