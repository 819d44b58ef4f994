// Shared prompt caches (KVCache::shared, issue 44): rows that read one prompt cache together (the
// ablation rows of a trial) decode as rows that each hold a copy of it. On every family fixture
// (GPT-2's learned positions, Qwen3's GQA and q-norm, Gemma 2's soft-cap and sliding window, Gemma 3's
// mixed local/global layers, Mistral's window, NeoX's parallel block) the shared attention's logits
// and attention patterns equal the copied cache's within float32 rounding (kTol, relative to the
// largest value), with per-row interventions, observers of the pattern and a whole-tensor edit of the
// scores; a hook that reads whole keys gets them gathered. Then the needle decode: rows of a trial
// decoded with shared prompts (DecodeSettings::share_prompt) give the tokens their copies give, hold
// less memory, and trials of the CI toy keep their answers. Ragged rows (shared caches of different
// lengths, KVCache::ragged) decode as each row's own cache alone.
#include <doctest/doctest.h>

#include "blocks.h"
#include "ci_toy.h"
#include "cpu_attention.h"
#include "hooks.h"
#include "model.h"
#include "needle_decode.h"

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace hs;

namespace {

// The shared attention stacks the rows of a prompt into one product, the copied one runs a product a
// row: the sums are the same, the BLAS kernels may differ in the last bits.
constexpr double kTol = 1e-5;

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
    REQUIRE(a.sizes() == b.sizes());
    const double scale = std::max(1.0, a.abs().max().item<double>());
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

struct Run {
    std::vector<at::Tensor> logits;    // a step's [B, 1, V]
    std::vector<at::Tensor> patterns;  // a step's layer-0 and last-layer pattern rows [B, H, S]
    std::vector<at::Tensor> values;    // the attn.v seen at the last layer (when asked)
};

// Four decode steps of the rows over `cache` (shared or whole), with a zero-query ablation on the last
// row, LOCOS-style pattern observers, and optionally a whole-tensor score edit or a value reader.
Run decode_steps(const Model& m, KVCache cache, const at::Tensor& steps, bool edit_scores, bool read_values) {
    const int L = m.config.n_layers;
    Run r;
    Hooks h;
    HeadIntervention zq;
    zq.layer = L - 1, zq.head = 0, zq.row = steps.size(0) - 1, zq.op = HeadOp::kZero;
    h.intervene_q(zq);
    h.capture_rows(Point::kAttnPattern, [&](int l, int64_t, const at::Tensor& rows) {
        if (l == 0 || l == L - 1) r.patterns.push_back(rows.select(2, 0).clone());
    });
    if (edit_scores)  // a whole-tensor edit: scores of head 1 at the last layer halved
        h.edit(Point::kAttnScores, [](int, const at::Tensor& s) -> std::optional<at::Tensor> {
            auto out = s.clone();
            out.select(1, 1).mul_(0.5);
            return out;
        }, L - 1);
    if (read_values) h.capture(Point::kAttnV, [&](int, const at::Tensor& v) { r.values.push_back(v.clone()); }, L - 1);
    ForwardOptions fold;
    fold.gemm = GemmMode::kFolded;
    for (int64_t t = 0; t < steps.size(1); ++t) r.logits.push_back(m.forward(steps.narrow(1, t, 1), &h, &cache, fold));
    return r;
}

// rows: the prompt cache each row reads. {0, 1, 0, 1, 0}: a cache's rows stacked into one product
// against its keys; {1, 0}: one row a cache (the needle scan's rows, each its own trial), a product a
// row and kv head.
void check_family(const std::string& dir, const std::vector<int64_t>& rows) {
    CAPTURE(dir);
    CAPTURE(rows.size());
    auto m = load_model(dir);
    const auto& cfg = m->config;
    torch::manual_seed(5);
    const int64_t n = 9;  // past every fixture's sliding window (5, 6)
    std::vector<KVCache> prompts(2);
    for (auto& c : prompts) m->forward(torch::randint(1, cfg.vocab_size, {1, n}, torch::kLong), nullptr, &c);
    const int64_t B = static_cast<int64_t>(rows.size());
    const auto steps = torch::randint(1, cfg.vocab_size, {B, 4}, torch::kLong);
    if (B == 5) steps[4].copy_(steps[0]);  // rows 0 and 4: one prompt, one input, row 4 ablated
    KVCache shared;
    shared.shared = std::make_shared<const std::vector<KVCache>>(prompts);
    shared.shared_rows = rows;
    CHECK(shared.length() == n);
    KVCache copied = shared;
    copied.unshare();
    CHECK(!copied.shared);
    CHECK(copied.length() == n);
    REQUIRE(copied.k[0].size(0) == B);
    for (const bool edit : {false, true}) {
        CAPTURE(edit);
        const Run a = decode_steps(*m, shared, steps, edit, false), b = decode_steps(*m, copied, steps, edit, false);
        REQUIRE(a.logits.size() == b.logits.size());
        double worst = 0;
        for (size_t t = 0; t < a.logits.size(); ++t) worst = std::max(worst, rel_diff(a.logits[t], b.logits[t]));
        REQUIRE(a.patterns.size() == b.patterns.size());
        for (size_t i = 0; i < a.patterns.size(); ++i) worst = std::max(worst, rel_diff(a.patterns[i], b.patterns[i]));
        CHECK(worst <= kTol);
        MESSAGE(dir << std::string(edit ? " (scores edited)" : "") << ": shared against copied, largest difference " << worst);
        // The ablated row differs from its twin (row 0: the same prompt and inputs): its own intervention acted.
        if (B == 5) CHECK(rel_diff(a.logits.back()[4], a.logits.back()[0]) > 1e-6);
    }
    // A reader of whole values sees every position, the shared ones gathered in front.
    const Run c = decode_steps(*m, shared, steps, false, true), d = decode_steps(*m, copied, steps, false, true);
    REQUIRE(c.values.size() == d.values.size());
    for (size_t t = 0; t < c.values.size(); ++t) {
        REQUIRE(c.values[t].size(1) == n + static_cast<int64_t>(t) + 1);
        CHECK(torch::equal(c.values[t].narrow(1, 0, n), d.values[t].narrow(1, 0, n)));  // the prompt's, as kept
        CHECK(rel_diff(c.values[t], d.values[t]) <= kTol);  // the decoded tokens' (through layers in rounding)
    }
    for (size_t t = 0; t < c.logits.size(); ++t) CHECK(rel_diff(c.logits[t], d.logits[t]) <= kTol);
}

}  // namespace

TEST_CASE("shared prompt: rows reading one prompt cache equal rows holding a copy (every family fixture)") {
    for (const char* f : {"gpt2", "qwen3", "gemma2", "gemma3", "mistral_window", "gpt_neox", "olmo2"})
        for (const auto& rows : std::vector<std::vector<int64_t>>{{0, 1, 0, 1, 0}, {1, 0}})
            check_family(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + f, rows);
}

TEST_CASE("shared prompt: ragged rows (prompts of different lengths) decode in one forward, each row as its own decode") {
    // KVCache::ragged: batch-1 prompt caches of 9, 14 and 19 positions read in place, one row each
    // ({0, 1, 2}: a product a row and kv head) or stacked ({2, 0, 1, 0}: a cache's rows in one product),
    // decoding 1 then 2 tokens a call. Each row's logits and pattern equal a decode of its own prompt
    // cache alone (batch 1, an ordinary cache: the blocked attention) within kTol of the largest value,
    // and every key past a row's length weighs exactly 0. Wrong positions (RoPE, GPT-2's learned ones,
    // llama3's scaled RoPE) or a wrong window (the fixtures' 5-6 keys) would move the logits by O(1).
    const std::vector<int64_t> lens = {9, 14, 19};
    for (const std::string f : {"gpt2", "qwen3", "gemma2", "gemma3", "mistral_window", "gpt_neox", "olmo2", "llama3_rope"})
        for (const auto& rows : std::vector<std::vector<int64_t>>{{0, 1, 2}, {2, 0, 1, 0}}) {
            CAPTURE(f);
            CAPTURE(rows.size());
            auto m = load_model(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + f);
            torch::NoGradGuard ng;
            torch::manual_seed(29);
            const int64_t B = static_cast<int64_t>(rows.size());
            auto prompts = std::make_shared<std::vector<KVCache>>(3);
            for (size_t i = 0; i < 3; ++i)
                m->forward(torch::randint(1, m->config.vocab_size, {1, lens[i]}, torch::kLong), nullptr, &(*prompts)[i]);
            const auto next = torch::randint(1, m->config.vocab_size, {B, 3}, torch::kLong);
            KVCache ragged;
            ragged.shared = prompts, ragged.shared_rows = rows;
            CHECK(ragged.ragged());
            CHECK(ragged.length() == 19);
            std::vector<KVCache> alone;  // copies: their appends go to their own buffers
            for (auto r : rows) alone.push_back((*prompts)[static_cast<size_t>(r)]);
            const int L = m->config.n_layers;
            std::vector<at::Tensor> pat(L);
            Hooks h;
            h.capture(Point::kAttnPattern, [&](int l, const at::Tensor& a) { pat[l] = a; });
            double worst = 0;
            for (auto [t0, T] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}}) {
                CAPTURE(T);
                const auto logits = m->forward(next.narrow(1, t0, T), &h, &ragged);  // [B, T, V]
                const auto pr = pat;
                for (int64_t b = 0; b < B; ++b) {
                    CAPTURE(b);
                    const auto solo = m->forward(next.select(0, b).narrow(0, t0, T).unsqueeze(0), &h, &alone[b]);
                    const int64_t S = alone[b].length();
                    CHECK(ragged.row_length(b) == S);
                    worst = std::max(worst, rel_diff(logits.narrow(0, b, 1), solo));
                    for (int l = 0; l < L; ++l) {
                        const auto row = pr[l].narrow(0, b, 1);
                        worst = std::max(worst, rel_diff(row.narrow(3, 0, S), pat[l]));
                        if (S < row.size(3)) CHECK(row.narrow(3, S, row.size(3) - S).abs().max().item<double>() == 0.0);
                    }
                }
            }
            CHECK(worst <= kTol);
            MESSAGE(f << " rows " << B << ": ragged against alone, largest difference " << worst);
            // Ragged rows have no whole [B, S, K, d] keys: a reader of attn.k is refused, in one line.
            Hooks k_hook;
            k_hook.capture(Point::kAttnK, [](int, const at::Tensor&) {});
            CHECK_THROWS_WITH_AS(m->forward(next.narrow(1, 0, 1), &k_hook, &ragged), doctest::Contains("ragged"), std::exception);
            CHECK_THROWS_WITH_AS(ragged.truncate(20), doctest::Contains("ragged"), std::exception);
        }
}

TEST_CASE("shared prompt: the cache's bookkeeping (length, truncate, appends to the rows' own buffers)") {
    auto m = load_model(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/qwen3");
    std::vector<KVCache> prompts(2);
    for (auto& c : prompts) m->forward(torch::randint(1, m->config.vocab_size, {1, 6}, torch::kLong), nullptr, &c);
    KVCache c;
    c.shared = std::make_shared<const std::vector<KVCache>>(prompts);
    c.shared_rows = {1, 0, 1};
    c.reserve(6 + 3);
    m->forward(torch::ones({3, 2}, torch::kLong), nullptr, &c);
    CHECK(c.length() == 8);
    CHECK(c.k[0].size(1) == 2);  // only the rows' own positions are held
    CHECK(prompts[0].length() == 6);  // the shared caches are never written
    CHECK(c.whole(0).first.size(1) == 8);
    c.truncate(7);
    CHECK(c.length() == 7);
    CHECK_THROWS(c.truncate(5));  // below the shared positions
    CHECK_THROWS(m->forward(torch::ones({2, 1}, torch::kLong), nullptr, &c));  // one shared cache a row
}

TEST_CASE("shared prompt: a trial's ablation rows decode from one prompt cache as from copies (CI toy recall)") {
    auto m = load_model(ci_toy_model("recall"));
    const auto& cfg = m->config;
    torch::manual_seed(3);
    auto rnd = [&](int64_t len) {
        auto t = torch::randint(1, cfg.vocab_size, {len}, torch::kLong);
        Trial tr;
        tr.prompt.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
        tr.length = len;
        return tr;
    };
    const Trial t1 = rnd(40), t2 = rnd(40);
    HeadSet zq{{{1, 0}, {1, 1}}, Intervention::kZeroQuery, {}};
    HeadSet zero{{{0, 2}}, Intervention::kZero, {}};
    // Three sets (one unablated) x two trials, set-major as the study lays them out.
    const std::vector<const Trial*> trials = {&t1, &t2, &t1, &t2, &t1, &t2};
    const std::vector<const HeadSet*> sets = {nullptr, nullptr, &zq, &zq, &zero, &zero};
    auto run = [&](bool share, CacheLog& log) {
        DecodeSettings s;
        s.max_new_tokens = 8, s.score = false, s.scope = AblationScope::kDecode, s.prefill_chunk = 16, s.share_prompt = share;
        log.keep_logits = true;
        s.cache_log = &log;
        return decode_batch_sets(*m, trials, sets, s, [](int64_t) { return false; });
    };
    CacheLog shared_log, copied_log;
    const auto a = run(true, shared_log), b = run(false, copied_log);
    REQUIRE(a.size() == b.size());
    for (size_t r = 0; r < a.size(); ++r) {
        CAPTURE(r);
        CHECK(a[r].generated == b[r].generated);
    }
    double worst = 0;
    for (size_t t = 0; t < shared_log.logits.size(); ++t) worst = std::max(worst, rel_diff(shared_log.logits[t], copied_log.logits[t]));
    CHECK(worst <= kTol);
    // Two prompt caches held instead of six copies.
    CHECK(shared_log.cache_bytes.front() * 2 < copied_log.cache_bytes.front());
    // The sets act: zero-query on the recall heads changes what the rows decode.
    CHECK(a[2].generated != a[0].generated);
}

TEST_CASE("shared prompt: caches filled from one another's positions (KVCache::origins) are read once, each row as its own cache alone") {
    // The needle study's kept prefills: trial B's cache takes its first 11 positions from A's (copied bit
    // for bit), C's its first 7 from B's. In one ragged batch the positions A, B and C have in common are
    // one piece of all three rows (blocks::shared_pieces), read once; each row's logits and pattern equal
    // its cache decoded alone within kTol, and on an AVX-512 CPU in float32 (the piece kernels) bit for
    // bit those of the same batch with the caches unnamed (each row reading its own copy).
    for (const std::string f : {"gpt2", "qwen3", "gemma2", "mistral_window", "llama3_rope"}) {
        CAPTURE(f);
        auto m = load_model(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + f);
        torch::NoGradGuard ng;
        torch::manual_seed(31);
        const int L = m->config.n_layers;
        auto tokens = [&](int64_t n) { return torch::randint(1, m->config.vocab_size, {1, n}, torch::kLong); };
        auto from = [&](const KVCache& src, int64_t u, const at::Tensor& own) {
            KVCache c;
            c.content_id = KVCache::new_content_id();
            for (const auto& [id, n] : src.origins) c.origins.emplace_back(id, std::min(n, u));
            c.origins.emplace_back(src.content_id, u);
            c.k.resize(static_cast<size_t>(L)), c.v.resize(static_cast<size_t>(L));
            for (size_t l = 0; l < static_cast<size_t>(L); ++l) c.k[l] = src.k[l].narrow(1, 0, u), c.v[l] = src.v[l].narrow(1, 0, u);
            m->forward(own, nullptr, &c);
            return c;
        };
        auto named = std::make_shared<std::vector<KVCache>>(3);
        m->forward(tokens(19), nullptr, &(*named)[0]);
        (*named)[0].content_id = KVCache::new_content_id();
        (*named)[1] = from((*named)[0], 11, tokens(5));  // 16 positions
        (*named)[2] = from((*named)[1], 7, tokens(6));   // 13 positions
        REQUIRE((*named)[2].origins.size() == 2);
        auto unnamed = std::make_shared<std::vector<KVCache>>(*named);
        for (auto& c : *unnamed) c.content_id = 0, c.origins.clear();
        // The pieces: A's [0, 7) for all three rows, [7, 11) for A and B, the rest each row's own.
        const std::vector<int64_t> rows = {2, 0, 1};  // row 0 reads C, row 1 A, row 2 B
        const auto pieces = blocks::shared_pieces(*named, rows);
        std::vector<std::string> got;  // "cache:a-b:rows"
        for (const auto& p : pieces) {
            std::string r;
            for (auto x : p.rows) r += std::to_string(x);
            got.push_back(std::to_string(p.cache) + ":" + std::to_string(p.a) + "-" + std::to_string(p.b) + ":" + r);
        }
        std::sort(got.begin(), got.end());
        std::string all;
        for (const auto& g : got) all += g + " ";
        CHECK(all == "0:0-7:012 0:11-19:1 0:7-11:12 1:11-16:2 2:7-13:0 ");
        CHECK(blocks::shared_pieces(*unnamed, rows).size() == 3);  // one piece a row
        // A truncated cache no longer vouches for its positions.
        KVCache cut = (*named)[1];
        cut.truncate(9);
        CHECK(cut.content_id == 0);
        CHECK(cut.origins.back().second == 9);

        const auto next = torch::randint(1, m->config.vocab_size, {3, 3}, torch::kLong);
        std::vector<at::Tensor> pat(static_cast<size_t>(L));
        Hooks h;
        h.capture(Point::kAttnPattern, [&](int l, const at::Tensor& a) { pat[static_cast<size_t>(l)] = a; });
        KVCache a, b;
        a.shared = named, a.shared_rows = rows;
        b.shared = unnamed, b.shared_rows = rows;
        std::vector<KVCache> alone;
        for (auto r : rows) alone.push_back((*named)[static_cast<size_t>(r)]);
        double worst = 0;
        const bool kernels = blocks::cpu_piece_kernels(m->config.d_head) && m->options.dtype == torch::kFloat;
        for (auto [t0, T] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}}) {
            CAPTURE(T);
            const auto la = m->forward(next.narrow(1, t0, T), &h, &a);
            const auto pa = pat;
            const auto lb = m->forward(next.narrow(1, t0, T), &h, &b);
            if (kernels) {
                CHECK(torch::equal(la, lb));
                for (int l = 0; l < L; ++l) CHECK(torch::equal(pa[static_cast<size_t>(l)], pat[static_cast<size_t>(l)]));
            }
            worst = std::max(worst, rel_diff(la, lb));
            for (int64_t r = 0; r < 3; ++r) {
                const auto solo = m->forward(next.select(0, r).narrow(0, t0, T).unsqueeze(0), nullptr, &alone[static_cast<size_t>(r)]);
                worst = std::max(worst, rel_diff(la.narrow(0, r, 1), solo));
            }
        }
        CHECK(worst <= kTol);
        MESSAGE(f << ": rows sharing prefixes against unnamed caches and alone, largest difference " << worst
                  << std::string(kernels ? " (piece kernels: named and unnamed bit for bit)" : ""));
    }
}
