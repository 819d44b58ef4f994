// KV policy "razor" (mindspore-ai/golden-stick RazorAttention): the KV groups first in RazorAttention's
// head order (razor.h, by its preset) kept whole, the others compressed once at the compression point:
// a sink, one mean token for what is dropped, and the recent keys.
#include "kv_policy.h"

#include "errors.h"
#include "razor.h"

#include <torch/torch.h>

#include <fmt/format.h>

namespace hs {

at::Tensor razor_keep_mask(const at::Tensor& full, int64_t P, int64_t sink, int64_t recent, bool compensate) {
    auto f = full.to(torch::kCPU).to(torch::kBool);
    auto k = torch::ones({f.size(0), f.size(1), P}, torch::kBool);
    if (P <= sink + recent + (compensate ? 1 : 0)) return k;  // _compress: T <= local_capacity stays whole
    // The compressed heads drop [sink, P - recent).
    k.narrow(2, sink, P - recent - sink).copy_(f.unsqueeze(2).expand({f.size(0), f.size(1), P - recent - sink}));
    return k;
}

namespace {

class Razor final : public KvOrderPolicy {
public:
    const char* name() const override { return "razor"; }
    KvScoreFrom score_from() const override { return KvScoreFrom::kOwn; }
    at::Tensor own_score(const Model& m, const KvCompareSpec& s, std::string* source) const override {
        RazorPreset preset;
        try {
            preset = parse_razor_preset(s.razor_preset);
        } catch (const UsageError& e) {  // a value parser's error: this setting's
            throw UsageError(e.what(), "razor_preset");
        }
        *source = fmt::format("razor, preset {} (echo and induction scores on repeated random tokens, max over each KV group)",
                              razor_preset_name(preset));
        return razor_preset_score(m, RazorSettings{}, preset);
    }
    Attrs attrs(const KvCompareSpec& s) const override {
        return {{"razor_sink", s.razor_sink},
                {"razor_recent", s.razor_recent},
                {"razor_compensate", std::string(s.razor_compensate ? "true" : "false")}};
    }

protected:
    int64_t entries(const KvCompareSpec& s, int64_t P) const override {
        const int64_t cap = s.razor_sink + s.razor_recent + (s.razor_compensate ? 1 : 0);
        return P > cap ? cap : P;  // _compress leaves T <= local_capacity whole
    }
    void compress(const std::vector<Head>& streamed, const KvContext& ctx, KvConfig* c) const override {
        const KvCompareSpec s = ctx.spec;  // copied: the head set's functions keep what they read
        auto mask = torch::ones({ctx.sh.L, ctx.sh.H}, torch::kBool);
        for (const auto& hd : streamed) mask[hd.first][hd.second] = false;
        c->set.keep = [mask, s](const Trial& t) {
            return razor_keep_mask(mask, s.compress_at(t), s.razor_sink, s.razor_recent, s.razor_compensate);
        };
        c->set.keep_compensate = s.razor_compensate;
        c->key += fmt::format(" razor {} {} {}", s.razor_sink, s.razor_recent, s.razor_compensate);
    }
};

}  // namespace

const KvPolicy& kv_razor() {
    static const Razor p;
    return p;
}

}  // namespace hs
