// The merge of a needle scan's shards (`headscope merge` on retrieval files) and what it checks: the
// shards' parameters agree, the merged file is staged beside its destination. The per-trial results
// it joins are probes/needle/needle_results.h's NeedleResults, stored as schema::NeedleRecord.
#pragma once

#include "needle_results.h"
#include "store.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hs::cli {

// The parameters two files of one needle scan must share (the /retrieval and /retrieval/ablation
// attributes that define the work, the haystack's and needles' sha256, the model's weights and
// dtype), compared by the job runner's identity check (jobs::compare); "" when they agree, else
// "NAME A vs B" for the first that differs (values cut to 80 characters).
std::string needle_config_difference(const ResultReader& a, const ResultReader& b);

// Where a merge writes: a copy of the first shard next to `out` ("<out>.tmp-<pid>-merge"), removed
// by the destructor unless the caller renamed it into place. StorageError naming `out` when the
// copy cannot be made.
class MergeStage {
public:
    MergeStage(const std::string& first, const std::string& out);
    ~MergeStage();
    MergeStage(const MergeStage&) = delete;
    MergeStage& operator=(const MergeStage&) = delete;
    const std::string& path() const { return tmp_; }

private:
    std::string tmp_;
};

struct MergeArgs {
    std::vector<std::string> inputs;
    std::string out;
    bool force = false, partial = false;
};
// headscope merge for retrieval shards.
void merge_retrieval(const MergeArgs& o, const std::vector<std::unique_ptr<ResultReader>>& rs);
// headscope merge for `headscope influence --shard` files (tools/cmd_influence.cpp): each sample from
// the shard that computed it, the ranking and selection recomputed over them.
void merge_influence(const MergeArgs& o, const std::vector<std::unique_ptr<ResultReader>>& rs);

}  // namespace hs::cli
