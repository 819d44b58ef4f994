// KV policy "full": the whole prompt cache, every head (the baseline every budget is a fraction of).
#include "kv_policy.h"

namespace hs {

namespace {

class Full final : public KvPolicy {
public:
    const char* name() const override { return "full"; }
    KvConfig config(const KvPolicySpec&, double, const KvContext& ctx) const override {
        KvConfig c;
        c.key = "full";
        c.frac.assign(ctx.trials.size(), 1.0);
        return c;
    }
};

}  // namespace

const KvPolicy& kv_full() {
    static const Full p;
    return p;
}

}  // namespace hs
