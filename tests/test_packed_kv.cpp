// The packed (compressed) KV cache (src/model/packed_kv.h, issue 44): every registered KV policy's head
// set decoded through the packed cache (HeadSet::pack_cache: each row's kept entries alone, per query
// head or per KV head as the policy keeps them, its streaming heads' sink and sliding window, razor's
// mean token) gives the tokens the masked model gives bit for bit, and logits within kLogitTol of the
// largest logit, in less memory; on the CI toy recall model (4 query = 4 KV heads), tinystories-656k
// from ../shared/testdata (8 query / 4 KV heads), and the gpt2 (learned positions) and qwen3 (GQA,
// q-norm) family fixtures.
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "kv_policy.h"
#include "model.h"
#include "needle_decode.h"
#include "packed_kv.h"
#include "testdata.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

using namespace hs;

namespace {

// The packed attention sums the kept keys' weights in another order than the masked one's product
// over the whole cache (whose hidden keys weigh exactly 0): float32 rounding, measured below 1e-5.
constexpr double kLogitTol = 1e-4;
constexpr int64_t kSteps = 6;

Trial trial_of(std::vector<int64_t> prompt) {
    Trial t;
    t.length = static_cast<int64_t>(prompt.size());
    t.prompt = std::move(prompt);
    return t;
}

struct Decoded {
    std::vector<DecodeOut> outs;
    CacheLog log;
};

Decoded decode(const Model& m, const std::vector<const Trial*>& rows, const std::vector<const HeadSet*>& sets) {
    DecodeSettings s;
    s.max_new_tokens = kSteps, s.score = false, s.scope = AblationScope::kDecode, s.prefill_chunk = 16;
    Decoded d;
    d.log.keep_logits = true;
    s.cache_log = &d.log;
    d.outs = decode_batch_sets(m, rows, sets, s, [](int64_t) { return false; });
    return d;
}

// The packed decode against the masked one: the same tokens in every row, logits within kLogitTol, the
// steps after the first through the packed cache. Returns the largest logit difference (relative).
double compare(const Decoded& masked, const Decoded& packed) {
    REQUIRE(masked.outs.size() == packed.outs.size());
    for (size_t r = 0; r < masked.outs.size(); ++r) {
        CAPTURE(r);
        CHECK(masked.outs[r].generated == packed.outs[r].generated);
    }
    REQUIRE(masked.log.logits.size() == packed.log.logits.size());
    double worst = 0;
    for (size_t t = 0; t < masked.log.logits.size(); ++t) {
        const auto& a = masked.log.logits[t];
        const auto& b = packed.log.logits[t];
        const double scale = std::max(1.0, a.abs().max().item<double>());
        worst = std::max(worst, (a - b).abs().max().item<double>() / scale);
        CHECK(masked.log.packed[t] == 0);
        CHECK(packed.log.packed[t] == (t > 0 ? 1 : 0));
    }
    CHECK(worst <= kLogitTol);
    return worst;
}

void check_policies(const std::string& dir) {
    auto m = load_model(dir);
    const auto& cfg = m->config;
    const int64_t L = cfg.n_layers, H = cfg.n_heads, K = cfg.n_kv_heads;
    torch::manual_seed(11);
    auto rnd = [&](int64_t n) {
        auto t = torch::randint(1, cfg.vocab_size, {n}, torch::kLong);
        return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
    };
    // Two prompts of one length (rows of one batch) and one of another (decoded alone), within the
    // model's context (the fixtures hold 32 positions).
    const int64_t n = cfg.max_seq_len > 0 ? std::min<int64_t>(48, cfg.max_seq_len - kSteps) : 48, n2 = std::min<int64_t>(33, n - 7);
    const std::vector<Trial> trials = {trial_of(rnd(n)), trial_of(rnd(n)), trial_of(rnd(n2))};
    KvCompareSpec spec;
    spec.snap = SnapKVSettings{4, 3};
    spec.duo_sink = 2, spec.duo_recent = 6;
    spec.razor_sink = 2, spec.razor_recent = 9;
    const KvShape sh{L, H, K, H / K, L * K};
    auto pooled = std::make_shared<std::map<const Trial*, at::Tensor>>();
    auto vo = std::make_shared<std::map<const Trial*, at::Tensor>>();
    for (const auto& t : trials) {
        (*pooled)[&t] = snapkv_scores(*m, t.prompt, spec.snap, 16);
        (*vo)[&t] = critical_vo_norms(*m, t.prompt, 16);
    }
    const KvContext ctx{spec, sh, trials, pooled, vo};
    const auto score = torch::rand({L, H});
    std::vector<HeadSet> mixed;  // every policy at 0.25, as rows of one batch
    double worst = 0;
    for (const KvPolicy* p : kv_policies()) {
        const bool scored = p->score_from() != KvScoreFrom::kNone;
        const std::string name = p->score_from() == KvScoreFrom::kArgument ? std::string(p->name()) + ":random" : p->name();
        const KvPolicySpec ps{p, name, scored ? score : at::Tensor(), "random"};
        for (const double budget : {0.25, 0.6}) {
            CAPTURE(name);
            CAPTURE(budget);
            const KvConfig c = p->config(ps, budget, ctx);
            HeadSet masked = c.set, packed = c.set;
            packed.pack_cache = true;
            if (budget == 0.25) mixed.push_back(packed);
            // The policy's rows beside a row of the whole cache (no set: its every position packed).
            const auto a = decode(*m, {&trials[0], &trials[1], &trials[0]}, {&masked, &masked, nullptr});
            const auto b = decode(*m, {&trials[0], &trials[1], &trials[0]}, {&packed, &packed, nullptr});
            worst = std::max(worst, compare(a, b));
            // A compressing policy's packed cache is smaller than the whole one it replaces (a cache
            // that keeps everything is the whole one's size, plus 8 bytes an entry for its position).
            double frac = 0;
            for (double f : c.frac) frac += f / static_cast<double>(c.frac.size());
            if (frac < 0.5) CHECK(b.log.cache_bytes.back() < a.log.cache_bytes.back());
            // A prompt of another length decoded alone.
            worst = std::max(worst, compare(decode(*m, {&trials[2]}, {&masked}), decode(*m, {&trials[2]}, {&packed})));
        }
    }
    // Every policy in one batch: per-query-head and shared segments, windows and mean tokens side by side.
    std::vector<const Trial*> rows;
    std::vector<const HeadSet*> msets, psets;
    std::vector<HeadSet> unpacked = mixed;
    for (auto& hs : unpacked) hs.pack_cache = false;
    for (size_t i = 0; i < mixed.size(); ++i) rows.push_back(&trials[i % 2]), psets.push_back(&mixed[i]), msets.push_back(&unpacked[i]);
    worst = std::max(worst, compare(decode(*m, rows, msets), decode(*m, rows, psets)));
    MESSAGE(dir << ": the largest logit difference, packed against masked, relative to the largest logit: " << worst);
}

}  // namespace

TEST_CASE("packed kv: every policy decodes through its packed cache as through the masked model (CI toy, MHA)") {
    check_policies(ci_toy_model("recall"));
}

TEST_CASE("packed kv: every policy decodes through its packed cache as through the masked model (tinystories-656k, GQA)") {
    HS_REQUIRE_TESTDATA(data);
    check_policies(data + "/tinystories-656k");
}

TEST_CASE("packed kv: every policy decodes through its packed cache as through the masked model (gpt2, qwen3 fixtures)") {
    for (const char* f : {"gpt2", "qwen3"}) check_policies(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + f);
}

TEST_CASE("packed kv: the packed cache holds each segment's kept entries, grows past its room, and refuses what it cannot show") {
    auto m = load_model(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/qwen3");
    const auto& cfg = m->config;
    const int64_t L = cfg.n_layers, H = cfg.n_heads, K = cfg.n_kv_heads, g = H / K, F = 12;
    torch::NoGradGuard ng;
    torch::manual_seed(3);
    auto tokens = torch::randint(cfg.vocab_size, {1, F + 4}, torch::kLong);
    KVCache whole;
    m->forward(tokens.narrow(1, 0, F), nullptr, &whole);
    // Per query head: head h keeps positions h, h + 1 .. (F - h of them); the bytes are exactly theirs.
    PackRow r;
    r.keep = torch::zeros({L, H, F}, torch::kBool);
    for (int64_t h = 0; h < H; ++h) r.keep.narrow(2, h, F - h).select(1, h).fill_(true);
    r.per_query_head = true;
    auto packed = pack_kv_cache(cfg, whole, {r}, 0);
    const int64_t elem = static_cast<int64_t>(c10::elementSize(m->options.dtype));
    int64_t entries = 0;
    for (int64_t h = 0; h < H; ++h) entries += F - h;
    CHECK(packed->bytes() == L * entries * (2 * cfg.d_head * elem + 8));
    CHECK(packed_length(*packed) == F);
    for (const auto& seg : packed->layers[0].segs) {
        CHECK(seg.nh == 1);
        CHECK(seg.kv_head == seg.h0 / g);
        CHECK(torch::equal(packed->layers[0].k.narrow(0, seg.off, seg.len),
                           whole.k[0][0].select(1, seg.kv_head).narrow(0, seg.h0, F - seg.h0)));
    }
    // Shared by a group: its query heads must keep the same positions.
    PackRow shared = r;
    shared.per_query_head = false;
    if (g > 1) CHECK_THROWS_AS(pack_kv_cache(cfg, whole, {shared}, 0), std::logic_error);
    // No room packed: the decode grows the segments, and the result equals the masked model's.
    KVCache c;
    c.packed = packed;
    Hooks masked;
    for (int l = 0; l < L; ++l) masked.keep({l, -1, F, r.keep[l], false});
    KVCache full = whole;
    for (int64_t t = F; t < F + 4; ++t) {
        const auto x = tokens.narrow(1, t, 1);
        const auto a = m->forward(x, &masked, &full), b = m->forward(x, nullptr, &c);
        CHECK((a - b).abs().max().item<double>() <= kLogitTol * std::max(1.0, a.abs().max().item<double>()));
    }
    CHECK(c.length() == F + 4);
    // A packed cache shows no keys, scores or pattern.
    Hooks observe;
    observe.capture(Point::kAttnPattern, [](int, const at::Tensor&) {});
    CHECK_THROWS_AS(m->forward(tokens.narrow(1, 0, 1), &observe, &c), std::logic_error);
}
