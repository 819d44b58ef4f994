// Shared by the resumable commands (`run`, `influence`, `retrieval`) and `merge`: the job runner's
// shard arithmetic (src/jobs/jobs.h) and the identity check taken a part at a time, so that each
// command reports the first difference in the order its messages always have.
#pragma once

#include "jobs.h"

#include <string>

namespace hs::cli {

// The shard arithmetic is the job runner's (src/jobs/jobs.h).
using jobs::Shard;
using jobs::parse_shard;
using jobs::shard_path;

// jobs::compare of each part of `now` alone against the stored file's: the model's weights, the
// parameters (now.keys, or every key of now.params), the shard (when now.shard is set). jobs::compare
// reports the model first; `run` reports the experiment first and `influence` the parameters and
// shard before the model, so they look at the parts in their own order.
struct IdentityParts {
    jobs::Difference model, params, shard;
};
inline IdentityParts compare_parts(const std::string& stored_sha256, const Attrs& stored, const std::string& stored_shard,
                                   const jobs::Identity& now) {
    IdentityParts p;
    p.model = jobs::compare(stored_sha256, {}, "", jobs::Identity{now.weights_sha256, {}, {}, {}, {}});
    jobs::Identity params = now;
    params.weights_sha256 = stored_sha256, params.shard.clear();
    p.params = jobs::compare(stored_sha256, stored, "", params);
    if (!now.shard.empty())
        p.shard = jobs::compare(stored_sha256, {}, stored_shard, jobs::Identity{stored_sha256, {}, {}, {}, now.shard});
    return p;
}

}  // namespace hs::cli
