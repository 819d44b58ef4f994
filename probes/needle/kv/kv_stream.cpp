// KV policy "stream:S": DuoAttention's deployment (kv_duo.cpp) ordered by any [L, H] score S, a needle
// score of this run or FILE.h5:DATASET.
#include "kv_policy.h"

namespace hs {

namespace {

class Stream final : public KvStreamingPolicy {
public:
    const char* name() const override { return "stream"; }
    KvScoreFrom score_from() const override { return KvScoreFrom::kArgument; }
};

}  // namespace

const KvPolicy& kv_stream() {
    static const Stream p;
    return p;
}

}  // namespace hs
