// Shared by the resumable commands (`run`, `influence`, `retrieval`) and `merge`: the names they use
// of the job runner (src/jobs/jobs.h: the shard arithmetic, the identity check a part at a time).
#pragma once

#include "jobs.h"

#include <string>

namespace hs::cli {

// The shard arithmetic is the job runner's (src/jobs/jobs.h).
using jobs::Shard;
using jobs::parse_shard;
using jobs::shard_path;

using jobs::compare_parts;

}  // namespace hs::cli
