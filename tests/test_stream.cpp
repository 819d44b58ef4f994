// Attention windows (Intervention::kStream: sink + recent keys, optional compensation token) on the
// family fixtures: exactness where the window changes nothing, the value vector where it leaves
// one key, untouched rows, blocked attention against the whole reference (blocks::attention_reference,
// which applies the windows with a plain [B, H, T, S] mask and averages the hidden keys directly in
// double), and the KV-cached decode against recomputing the whole sequence. GQA: olmo2, gemma (one
// kv head); sliding windows: mistral_window, gemma2. The YAML mode's bad input.
#include <doctest/doctest.h>

#include "attention_detectors.h"
#include "blocks.h"
#include "errors.h"
#include "experiment.h"
#include "yaml_errors.h"
#include "model.h"

#include <torch/torch.h>

using namespace hs;

namespace {

// Blocked vs whole: the same products over fewer columns (docs/forward.md); z within 1e-6 of its
// largest magnitude; logits carry earlier layers' last bits: 1e-5 (as tests/test_blocks.cpp).
constexpr double kBlockTol = 1e-6;
constexpr double kCarriedTol = 1e-5;

const std::vector<std::string> kFixtures = {"gpt2", "gemma", "gemma2", "olmo2", "qwen3", "mistral_window", "llama3_rope"};

std::string fixture(const std::string& name) { return std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + name; }

at::Tensor tokens_for(const Model& m, int64_t B, int64_t T, uint64_t seed) {
    torch::manual_seed(seed);
    return torch::randint(m.config.vocab_size, {B, T}, torch::kLong);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
    return max_diff(a, b) / std::max(1.0, b.abs().max().item<double>());
}

// A mixed set of windows over rows 0 and 1: every layer, several heads, different sizes; with
// `compensate`, some of them carry the compensation token. Without it, row 1's groups read only
// their sink and recent keys (blocks::attention skips the rest), row 0's the whole block.
void add_mixed_windows(Hooks& h, const Model& m, bool compensate) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    for (int l = 0; l < L; ++l) {
        h.window({l, 0, -1, 2, 3, compensate, {}});             // every row
        h.window({l, (l + 1) % H, 0, 0, 1, false, {}});          // row 0: its own value
        for (int hh = 0; hh < H; ++hh)                           // row 1: every head, so its (row, kv head)
            h.window({l, hh, 1, 1, 4, compensate && hh == H - 1, {}});  // groups all stream (the skipping path)
    }
}

}  // namespace

TEST_CASE("stream: a window at least as long as the context gives bit-identical logits") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        const int L = m->config.n_layers, H = m->config.n_heads;
        auto tokens = tokens_for(*m, 2, 23, 3);
        torch::NoGradGuard ng;
        const auto plain = m->forward(tokens);
        for (auto [sink, recent] : std::vector<std::pair<int64_t, int64_t>>{{0, 23}, {23, 1}, {4, 64}, {30, 30}}) {
            CAPTURE(sink);
            CAPTURE(recent);
            Hooks h;
            for (int l = 0; l < L; ++l)
                for (int hh = 0; hh < H; ++hh) h.window({l, hh, -1, sink, recent, true, {}});
            CHECK(torch::equal(m->forward(tokens, &h), plain));
            ForwardOptions blocked;
            blocked.attn_block = 5;
            CHECK(torch::equal(m->forward(tokens, &h, nullptr, blocked), m->forward(tokens, nullptr, nullptr, blocked)));
        }
    }
}

TEST_CASE("stream: sink 0, recent 1 makes the head output its own value vector, exactly; other rows untouched") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        const int L = m->config.n_layers, H = m->config.n_heads, K = m->config.n_kv_heads;
        auto tokens = tokens_for(*m, 3, 17, 5);
        torch::NoGradGuard ng;
        std::vector<at::Tensor> z(L), v(L);
        Hooks h;
        h.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = x.clone(); });
        h.capture(Point::kAttnV, [&](int l, const at::Tensor& x) { v[l] = x.clone(); });
        for (int l = 0; l < L; ++l) h.window({l, 1, 2, 0, 1, false, {}});  // head 1 of row 2
        for (int l = 0; l < L; ++l) h.window({l, H - 1, 2, 0, 1, false, {}});
        const auto logits = m->forward(tokens, &h);
        for (int l = 0; l < L; ++l) {
            CAPTURE(l);
            for (int hh : {1, H - 1}) {
                // Query head hh reads kv head hh / (H / K).
                CHECK(torch::equal(z[l][2].select(1, hh), v[l][2].select(1, hh / (H / K))));
                CHECK(!torch::equal(z[l][0].select(1, hh), v[l][0].select(1, hh / (H / K))));
            }
        }
        // Rows 0 and 1 carry no window: bit-identical to their unbatched runs (per-row GEMMs).
        for (int64_t r = 0; r < 2; ++r) CHECK(torch::equal(logits[r], m->forward(tokens.narrow(0, r, 1))[0]));
        CHECK(max_diff(logits[2], m->forward(tokens.narrow(0, 2, 1))[0]) > 1e-4);  // the window did act
    }
}

TEST_CASE("stream: blocked attention with windows equals the whole reference (GQA, sliding windows, compensation, a KV cache)") {
    for (const auto& name : kFixtures) {
        for (bool compensate : {false, true}) {
            CAPTURE(name);
            CAPTURE(compensate);
            auto m = load_model(fixture(name));
            const int L = m->config.n_layers, H = m->config.n_heads;
            auto tokens = tokens_for(*m, 2, 23, 11);
            KVCache cache;
            torch::NoGradGuard ng;
            for (auto part : {tokens.narrow(1, 0, 9), tokens.narrow(1, 9, 14)}) {  // prefill, then 14 more
                std::vector<at::Tensor> q(L), k(q), v(q), z(q);
                Hooks h;
                add_mixed_windows(h, *m, compensate);
                h.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { q[l] = x.clone(); });
                h.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { k[l] = x.clone(); });
                h.capture(Point::kAttnV, [&](int l, const at::Tensor& x) { v[l] = x.clone(); });
                h.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = x.clone(); });
                ForwardOptions fo;
                fo.attn_block = 4;
                m->forward(part, &h, &cache, fo);
                for (int l = 0; l < L; ++l) {
                    CAPTURE(l);
                    const auto w = h.windows(l, 2, H, torch::kCPU);
                    const auto ref = blocks::attention_reference(m->config, l, q[l], k[l], v[l], &w);
                    CHECK(rel_diff(z[l], ref) < kBlockTol);
                    // The windows change the layer: the reference without them differs.
                    CHECK(rel_diff(z[l], blocks::attention_reference(m->config, l, q[l], k[l], v[l])) > 1e-4);
                }
            }
            // Whole (one block) and blocked forwards agree on the logits.
            Hooks h;
            add_mixed_windows(h, *m, compensate);
            ForwardOptions whole, blocked;
            blocked.attn_block = 5;
            CHECK(rel_diff(m->forward(tokens, &h, nullptr, blocked), m->forward(tokens, &h, nullptr, whole)) < kCarriedTol);
        }
    }
}

TEST_CASE("stream: the KV-cached decode equals recomputing the whole sequence with the same windows") {
    for (const auto& name : kFixtures) {
        for (bool compensate : {false, true}) {
            CAPTURE(name);
            CAPTURE(compensate);
            auto m = load_model(fixture(name));
            auto tokens = tokens_for(*m, 2, 21, 13);
            Hooks h;
            add_mixed_windows(h, *m, compensate);
            torch::NoGradGuard ng;
            const auto whole = m->forward(tokens, &h);
            KVCache cache;
            std::vector<at::Tensor> parts = {m->forward(tokens.narrow(1, 0, 7), &h, &cache)};  // a prefill chunk
            ForwardOptions blocked;
            blocked.attn_block = 2;
            parts.push_back(m->forward(tokens.narrow(1, 7, 5), &h, &cache, blocked));  // a second chunk, in blocks
            for (int64_t t = 12; t < 21; ++t) parts.push_back(m->forward(tokens.narrow(1, t, 1), &h, &cache));  // decode
            CHECK(rel_diff(torch::cat(parts, 1), whole) < kCarriedTol);
        }
    }
}

TEST_CASE("stream: a (row, head) mask equals the same windows named one by one; bad windows are refused") {
    auto m = load_model(fixture("olmo2"));
    const int L = m->config.n_layers, H = m->config.n_heads;
    auto tokens = tokens_for(*m, 3, 15, 17);
    auto mask = torch::zeros({3, H}, torch::kBool);
    mask[0][1] = true, mask[2][0] = true, mask[2][3] = true;
    Hooks a, b;
    for (int l = 0; l < L; ++l) {
        a.window({l, 0, -1, {1, 3, true, 0}, mask});
        b.window({l, 1, 0, 1, 3, true, {}});
        b.window({l, 0, 2, 1, 3, true, {}});
        b.window({l, 3, 2, 1, 3, true, {}});
    }
    torch::NoGradGuard ng;
    CHECK(torch::equal(m->forward(tokens, &a), m->forward(tokens, &b)));
    Hooks bad;
    CHECK_THROWS_AS(bad.window({0, 0, -1, -1, 3, false, {}}), ConfigError);
    CHECK_THROWS_AS(bad.window({0, 0, -1, 0, 0, false, {}}), ConfigError);
    bad.window({0, H, -1, 0, 2, false, {}});
    CHECK_THROWS_AS(m->forward(tokens, &bad), ConfigError);
    Hooks wrong_shape;
    wrong_shape.window({0, 0, -1, {0, 2, false, 0}, torch::ones({2, H}, torch::kBool)});
    CHECK_THROWS_AS(m->forward(tokens, &wrong_shape), ConfigError);
}

TEST_CASE("stream: the YAML mode needs a window of sink >= 0 and recent >= 1") {
    const std::string head = "model: m\ndata:\n  r: {kind: repeated, length: 5, count: 2}\n";
    auto study = [](const std::string& mode) {
        return "studies:\n  - name: s\n    sweep: single\n    mode: " + mode + "\n    metric: {kind: loss, data: r}\n";
    };
    CHECK(cfg_error(head + study("{kind: stream, sink: 4, recent: 64}")) == "(no error)");
    CHECK(cfg_error(head + study("{kind: stream, sink: 0, recent: 1, compensate: true}")) == "(no error)");
    CHECK(cfg_error(head + study("{kind: stream, sink: 4}")).find("exp.yaml:7:11: mode stream: needs 'recent'") != std::string::npos);
    CHECK(cfg_error(head + study("{kind: stream, recent: 4}")).find("exp.yaml:7:11: mode stream: needs 'sink'") != std::string::npos);
    CHECK(cfg_error(head + study("{kind: stream, sink: -1, recent: 4}"))
              .find("exp.yaml:7:32: 'sink': expected an integer >= 0, got -1") != std::string::npos);
    CHECK(cfg_error(head + study("{kind: stream, sink: 1, recent: 0}"))
              .find("exp.yaml:7:43: 'recent': expected a positive integer, got 0") != std::string::npos);
    CHECK(cfg_error(head + study("stream")).find("exp.yaml:7:11: mode stream: needs a window") != std::string::npos);
    CHECK(cfg_error(head + study("{kind: zero, sink: 4}")).find("'sink' applies to mode stream only") != std::string::npos);
}
