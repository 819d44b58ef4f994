// KV policy "duo" (mit-han-lab/duo-attention): the KV groups first in the gates' order kept whole, the
// others streaming: a sink and a recent window sliding with the query, past a whole prefill. The
// streaming deployment (KvStreamingPolicy) is stream:S's too (kv_stream.cpp).
#include "kv_policy.h"

#include <fmt/format.h>

#include <algorithm>

namespace hs {

int64_t KvStreamingPolicy::entries(const KvCompareSpec& s, int64_t P) const { return std::min(P, s.duo_sink + s.duo_recent); }

void KvStreamingPolicy::compress(const std::vector<Head>& streamed, const KvContext& ctx, KvConfig* c) const {
    const KvCompareSpec& s = ctx.spec;
    c->set.heads = streamed;
    c->set.mode = Intervention::kStream;
    // The cache holds sink + recent keys; the query sees them and itself (duo_attn/patch/llama.py:234-290).
    c->set.window = StreamWindow{s.duo_sink, s.duo_recent + 1, false, 0};
    c->set.window_after_prompt = true;
    c->key += fmt::format(" duo {} {}", s.duo_sink, s.duo_recent);
}

namespace {

class Duo final : public KvStreamingPolicy {
public:
    const char* name() const override { return "duo"; }
    KvScoreFrom score_from() const override { return KvScoreFrom::kGates; }
    Attrs attrs(const KvCompareSpec& s) const override { return {{"duo_sink", s.duo_sink}, {"duo_recent", s.duo_recent}}; }
};

}  // namespace

const KvPolicy& kv_duo() {
    static const Duo p;
    return p;
}

}  // namespace hs
