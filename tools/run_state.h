// Shared by `headscope run` and `headscope merge`: the names of an experiment's result file
// (docs/hdf5-schema.md, "Ablation experiments") and the shard arithmetic.
#pragma once

#include "jobs.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {
class ResultWriter;
}

namespace hs::cli {

// The shard arithmetic is the job runner's (src/jobs/jobs.h).
using jobs::Shard;
using jobs::parse_shard;
using jobs::shard_path;

// A scale-grid study's JUICE selection (probes/decoding/juice.h) into /ablation/<study>/juice (schema.h
// write_juice), replacing what is there: `run` after each batch, `merge` from the merged rows
// (rows [S, N], masks [S, L, H], factors [S], variants [N] or empty).
void write_juice(ResultWriter& w, const std::string& study, const at::Tensor& rows, const at::Tensor& masks,
                 const std::vector<double>& factors, const std::vector<int64_t>& variants);

}  // namespace hs::cli
