// Every family against its float64 reference (tests/fixtures/families, written by
// scripts/reference_forward.py from the transformers modeling files), the traps each family
// hides (Conv1D orientation, NeoX qkv interleaving, partial rotary, Gemma's norm offset and
// embedding scale, soft-caps, sliding windows, local RoPE), and the configs the loaders refuse.
#include <doctest/doctest.h>

#include "blocks.h"
#include "errors.h"
#include "model.h"
#include "safetensors.h"
#include "tmpdir.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace hs;
using namespace torch::indexing;

namespace {

constexpr double kLogitTol = 1e-4;    // fp32 forward vs float64 reference, absolute
constexpr double kPatternTol = 1e-5;  // every head's attention pattern, absolute
// A mutation (a trap deliberately fallen into) must move the outputs by far more than the tolerance.
constexpr double kMutationMin = 1e-2;

const std::vector<std::string> kFixtures = {"gpt2",   "gpt_neox", "gpt_neox_sequential", "gemma",
                                            "gemma2", "gemma3",   "olmo2",               "qwen3",
                                            "llama3_rope", "mistral_window", "qwen2_bias"};

std::string fixture(const std::string& name) { return std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + name; }

struct Reference {
    at::Tensor tokens;    // [1, T]
    at::Tensor logits;    // [T, V]
    at::Tensor patterns;  // [L, H, T, T]
};

Reference read_reference(const std::string& name) {
    SafetensorsFile f(fixture(name) + "/reference.safetensors");
    return {f.get("tokens").to(torch::kLong).unsqueeze(0), f.get("logits").to(torch::kFloat).clone(),
            f.get("patterns").to(torch::kFloat).clone()};
}

struct Run {
    at::Tensor logits;    // [T, V]
    at::Tensor patterns;  // [L, H, T, T]
};

Run run_with_patterns(const Model& m, const at::Tensor& tokens) {
    Hooks hooks;
    std::vector<at::Tensor> pats(m.config.n_layers);
    hooks.capture(Point::kAttnPattern, [&](int l, const at::Tensor& x) { pats[l] = x[0].clone(); });
    torch::NoGradGuard ng;
    auto logits = m.forward(tokens, &hooks)[0];
    return {logits, torch::stack(pats)};
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Copy of a fixture folder with config.json edited by `edit` (model.safetensors copied if not yet there).
std::string variant(const TempDir& dir, const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    namespace fs = std::filesystem;
    std::ifstream in(fixture(name) + "/config.json");
    auto j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(dir.file("config.json")) << j.dump(2);
    if (!fs::exists(dir.file("model.safetensors")))
        fs::copy_file(fixture(name) + "/model.safetensors", dir.file("model.safetensors"));
    return dir.path;
}

// Rewrites the folder's model.safetensors with `edit` applied to the fixture's tensors.
void rewrite_weights(const TempDir& dir, const std::string& name,
                     const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
    SafetensorsFile f(fixture(name) + "/model.safetensors");
    std::map<std::string, at::Tensor> t;
    for (const auto& [n, e] : f.entries()) t[n] = f.get(n).clone();
    edit(t);
    write_safetensors(dir.file("model.safetensors"), t);
}

template <typename E>
std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const E& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("family fixtures: logits and every head's pattern match the float64 references") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto ref = read_reference(name);
        auto got = run_with_patterns(*m, ref.tokens);
        REQUIRE(got.logits.sizes() == ref.logits.sizes());
        REQUIRE(got.patterns.sizes() == ref.patterns.sizes());
        const double el = max_diff(got.logits, ref.logits), ep = max_diff(got.patterns, ref.patterns);
        MESSAGE(name << " (" << m->config.architecture << "): max |logit - ref| = " << el
                     << ", max |pattern - ref| = " << ep);
        CHECK_MESSAGE(el < kLogitTol, name << ": logits differ from the reference by " << el);
        CHECK_MESSAGE(ep < kPatternTol, name << ": attention patterns differ from the reference by " << ep);
    }
}

TEST_CASE("family capture points: q has [B, T, H, d] and head outputs (+ o bias) sum to attn_out") {
    for (const auto& name : kFixtures) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        Hooks hooks;
        at::Tensor head_out, attn_out, q;
        hooks.capture(Point::kAttnHeadOut, [&](int, const at::Tensor& x) { head_out = x.clone(); }, 1);
        hooks.capture(Point::kAttnOut, [&](int, const at::Tensor& x) { attn_out = x.clone(); }, 1);
        hooks.capture(Point::kAttnQ, [&](int, const at::Tensor& x) { q = x.clone(); }, 1);
        torch::NoGradGuard ng;
        m->forward(read_reference(name).tokens, &hooks);
        CHECK(q.sizes() == std::vector<int64_t>{1, 24, m->config.n_heads, m->config.d_head});
        auto sum = head_out.sum(2);  // attn_out = sum of heads + the o_proj bias (GPT-2, NeoX)
        if (m->weights.layers[1].bo.defined()) sum = sum + m->weights.layers[1].bo;
        CHECK(max_diff(sum, attn_out) < 1e-5);
    }
}

TEST_CASE("family GPT-2: Conv1D weights are transposed at load, and a Linear-shaped c_attn is refused") {
    auto m = load_model(fixture("gpt2"));
    const int64_t D = m->config.d_model;
    SafetensorsFile f(fixture("gpt2") + "/model.safetensors");
    auto c_attn = f.get("h.0.attn.c_attn.weight").to(torch::kFloat);  // [D, 3D] = [in, out]
    REQUIRE(c_attn.sizes() == std::vector<int64_t>{D, 3 * D});
    CHECK(torch::equal(m->weights.layers[0].wk, c_attn.index({Slice(), Slice(D, 2 * D)}).t()));
    CHECK(m->weights.embed.is_same(m->weights.unembed));

    TempDir dir;
    variant(dir, "gpt2", [](nlohmann::json&) {});
    rewrite_weights(dir, "gpt2", [](auto& t) {  // stored as nn.Linear would store it
        t["h.1.attn.c_attn.weight"] = t["h.1.attn.c_attn.weight"].t().contiguous();
    });
    auto msg = error_of<ModelLoadError>([&] { load_model(dir.path); });
    CHECK(msg.find("h.1.attn.c_attn.weight") != std::string::npos);
    CHECK(msg.find("[96, 32]") != std::string::npos);

    TempDir dir2;
    variant(dir2, "gpt2", [](nlohmann::json& j) { j["scale_attn_by_inverse_layer_idx"] = true; });
    msg = error_of<ConfigError>([&] { load_model(dir2.path); });
    CHECK(msg.find("scale_attn_by_inverse_layer_idx") != std::string::npos);
}

TEST_CASE("family GPT-2: GPT2LMHeadModel's transformer.* names load like GPT2Model's") {
    TempDir dir;
    variant(dir, "gpt2", [](nlohmann::json&) {});
    rewrite_weights(dir, "gpt2", [](auto& t) {
        std::map<std::string, at::Tensor> renamed;
        for (auto& [n, v] : t) renamed["transformer." + n] = v;
        t = renamed;
    });
    auto m = load_model(dir.path);
    auto ref = read_reference("gpt2");
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).logits, ref.logits) < kLogitTol);
}

TEST_CASE("family GPT-NeoX: query_key_value rows are [H, 3, d], and the [3, H, d] reading is wrong") {
    auto m = load_model(fixture("gpt_neox"));
    const int64_t D = m->config.d_model, H = m->config.n_heads, d = m->config.d_head;
    SafetensorsFile f(fixture("gpt_neox") + "/model.safetensors");
    auto qkv = f.get("gpt_neox.layers.0.attention.query_key_value.weight").to(torch::kFloat);  // [3D, D]
    // Head 1's key is rows [1*3d + d, 1*3d + 2d) of the fused weight.
    CHECK(torch::equal(m->weights.layers[0].wk.index({Slice(d, 2 * d)}), qkv.index({Slice(3 * d + d, 3 * d + 2 * d)})));
    auto ref = read_reference("gpt_neox");
    for (int l = 0; l < m->config.n_layers; ++l) {  // the GPT-2-style split, as a mutation
        auto w = f.get(fmt::format("gpt_neox.layers.{}.attention.query_key_value.weight", l)).to(torch::kFloat);
        auto b = f.get(fmt::format("gpt_neox.layers.{}.attention.query_key_value.bias", l)).to(torch::kFloat);
        auto& lw = m->weights.layers[l];
        lw.wq = w.index({Slice(0, D)}).contiguous();
        lw.wk = w.index({Slice(D, 2 * D)}).contiguous();
        lw.wv = w.index({Slice(2 * D, 3 * D)}).contiguous();
        lw.bq = b.index({Slice(0, D)}).contiguous();
        lw.bk = b.index({Slice(D, 2 * D)}).contiguous();
        lw.bv = b.index({Slice(2 * D, 3 * D)}).contiguous();
    }
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).logits, ref.logits) > kMutationMin);
    CHECK(H * d == D);
}

TEST_CASE("family GPT-NeoX: partial rotary rotates the first rotary_pct of each head only") {
    auto m = load_model(fixture("gpt_neox"));
    REQUIRE(m->config.rotary_pct == 0.25);
    REQUIRE(m->config.parallel_residual);
    const int64_t H = m->config.n_heads, d = m->config.d_head, rot = d / 4;
    auto tokens = read_reference("gpt_neox").tokens;
    Hooks hooks;
    at::Tensor q, resid_pre;
    hooks.capture(Point::kAttnQ, [&](int, const at::Tensor& x) { q = x.clone(); }, 0);
    hooks.capture(Point::kResidPre, [&](int, const at::Tensor& x) { resid_pre = x.clone(); }, 0);
    torch::NoGradGuard ng;
    m->forward(tokens, &hooks);
    const auto& lw = m->weights.layers[0];
    auto q_lin = blocks::linear(blocks::norm(m->config, resid_pre, lw.attn_norm_w, lw.attn_norm_b), lw.wq, lw.bq, false)
                     .view({1, -1, H, d});  // before RoPE
    CHECK(max_diff(q.index({"...", Slice(rot, None)}), q_lin.index({"...", Slice(rot, None)})) < 1e-6);
    CHECK(max_diff(q.index({0, 0}), q_lin.index({0, 0})) < 1e-6);  // position 0: identity rotation
    CHECK(max_diff(q.index({"...", Slice(0, rot)}), q_lin.index({"...", Slice(0, rot)})) > kMutationMin);
    // Full rotary instead of partial is visible in the logits.
    auto ref = read_reference("gpt_neox");
    m->config.rotary_pct = 1.0;
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).logits, ref.logits) > kMutationMin);
}

TEST_CASE("family GPT-NeoX: the sequential and parallel residuals are told apart") {
    for (const std::string name : {"gpt_neox", "gpt_neox_sequential"}) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto ref = read_reference(name);
        CHECK(m->config.parallel_residual == (name == "gpt_neox"));
        m->config.parallel_residual = !m->config.parallel_residual;
        CHECK(max_diff(run_with_patterns(*m, ref.tokens).logits, ref.logits) > kMutationMin);
    }
}

TEST_CASE("family Gemma: embeddings scaled by sqrt(d_model), norms by (1 + w)") {
    for (const std::string name : {"gemma", "gemma2", "gemma3"}) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto ref = read_reference(name);
        CHECK(m->config.embed_scale == doctest::Approx(std::sqrt(32.0)));
        Hooks hooks;
        at::Tensor resid_pre;
        hooks.capture(Point::kResidPre, [&](int, const at::Tensor& x) { resid_pre = x.clone(); }, 0);
        torch::NoGradGuard ng;
        m->forward(ref.tokens, &hooks);
        auto want = m->weights.embed.index_select(0, ref.tokens[0]) * std::sqrt(32.0);
        CHECK(max_diff(resid_pre[0], want) < 1e-5);
        m->config.embed_scale = 1.0;
        CHECK(max_diff(run_with_patterns(*m, ref.tokens).logits, ref.logits) > kMutationMin);
        m->config.embed_scale = std::sqrt(32.0);
        m->config.norm = NormKind::kRms;  // w instead of (1 + w)
        CHECK(max_diff(run_with_patterns(*m, ref.tokens).logits, ref.logits) > kMutationMin);
    }
}

TEST_CASE("family Gemma 2: soft-caps and the sliding window show in logits and captured patterns") {
    auto m = load_model(fixture("gemma2"));
    const auto& c = m->config;
    REQUIRE(c.attn_softcap == 2.0);
    REQUIRE(c.final_softcap == 3.0);
    REQUIRE(c.sliding_window == 5);
    auto ref = read_reference("gemma2");
    auto got = run_with_patterns(*m, ref.tokens);
    CHECK(got.logits.abs().max().item<double>() <= 3.0);
    const int64_t T = ref.tokens.size(1), W = c.sliding_window;
    auto i = torch::arange(T).unsqueeze(1), j = torch::arange(T).unsqueeze(0);
    auto outside = (j <= i - W).to(torch::kFloat);  // keys a sliding layer must not see
    for (int l = 0; l < c.n_layers; ++l) {
        CAPTURE(l);
        const double leaked = (got.patterns[l] * outside).abs().max().item<double>();
        if (l % 2 == 0)
            CHECK(leaked == 0.0);  // even layers slide
        else
            CHECK(leaked > 1e-3);  // odd layers attend globally
    }
    m->config.attn_softcap = 0;
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).patterns, ref.patterns) > kMutationMin);
    m->config.attn_softcap = 2.0;
    m->config.final_softcap = 0;
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).logits, ref.logits) > kMutationMin);
    m->config.final_softcap = 3.0;
    m->config.sliding_window = 0;
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).patterns, ref.patterns) > kMutationMin);
}

TEST_CASE("family Gemma 3: q/k norms, local RoPE base and the layer pattern") {
    auto m = load_model(fixture("gemma3"));
    const auto& c = m->config;
    CHECK(c.layer_sliding == std::vector<bool>{true, false, true});  // sliding_window_pattern 2
    CHECK(c.rope_local_theta == 10.0);
    CHECK(c.rope_scaling.type == "linear");
    auto ref = read_reference("gemma3");
    m->config.rope_local_theta = 0;  // every layer on the global base and scaling
    // Layer 0 slides and sees the unchanged embeddings: only its RoPE base differs.
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).patterns[0], ref.patterns[0]) > kMutationMin);
    m->config.rope_local_theta = 10.0;
    m->config.qk_norm = false;
    CHECK(max_diff(run_with_patterns(*m, ref.tokens).patterns, ref.patterns) > kMutationMin);
}

TEST_CASE("family Gemma 3: a nested text_config and a layer_types list read as the flat config") {
    TempDir nested;
    variant(nested, "gemma3", [](nlohmann::json& j) {
        nlohmann::json top = {{"architectures", j["architectures"]}, {"model_type", "gemma3"}, {"text_config", j}};
        j = top;
    });
    auto m = load_model(nested.path);
    auto ref = read_reference("gemma3");
    auto got = run_with_patterns(*m, ref.tokens);
    CHECK(max_diff(got.logits, ref.logits) < kLogitTol);
    TempDir typed;  // layer_types wins over sliding_window_pattern
    variant(typed, "gemma3", [](nlohmann::json& j) {
        j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
    });
    CHECK(load_model(typed.path)->config.layer_sliding == std::vector<bool>{false, true, false});
    TempDir bad;
    variant(bad, "gemma3", [](nlohmann::json& j) {
        j["layer_types"] = {"chunked_attention", "full_attention", "full_attention"};
    });
    CHECK(error_of<ConfigError>([&] { load_model(bad.path); }).find("chunked_attention") != std::string::npos);
}

TEST_CASE("family OLMo-2 and Qwen3: the q/k norms are part of the function") {
    for (const std::string name : {"olmo2", "qwen3"}) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto ref = read_reference(name);
        if (name == "olmo2") {
            CHECK(m->weights.layers[0].q_norm_w.numel() == m->config.d_q());
            for (auto& lw : m->weights.layers) lw.q_norm_w = torch::ones_like(lw.q_norm_w);
        } else {
            m->config.qk_norm = false;
        }
        CHECK(max_diff(run_with_patterns(*m, ref.tokens).patterns, ref.patterns) > kMutationMin);
    }
}

TEST_CASE("family Llama fixtures: llama3 RoPE scaling, Mistral's window and Qwen2's biases matter") {
    auto check_moves = [](const std::string& name, const std::function<void(Model&)>& mutate) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        auto ref = read_reference(name);
        mutate(*m);
        CHECK(max_diff(run_with_patterns(*m, ref.tokens).patterns, ref.patterns) > kMutationMin);
    };
    check_moves("llama3_rope", [](Model& m) { m.config.rope_scaling.type = "none"; });
    check_moves("mistral_window", [](Model& m) { m.config.sliding_window = 0; });
    check_moves("qwen2_bias", [](Model& m) {
        for (auto& lw : m.weights.layers) lw.bk = torch::zeros_like(lw.bk);
    });
}

TEST_CASE("family forwards: KV-cached decoding equals the full forward") {
    for (const std::string name : {"gpt2", "gpt_neox", "gemma2", "gemma3", "olmo2"}) {
        CAPTURE(name);
        auto m = load_model(fixture(name));
        torch::NoGradGuard ng;
        auto tokens = torch::randint(0, 97, {2, 20}, torch::kLong);
        auto full = m->forward(tokens);
        KVCache cache;
        std::vector<at::Tensor> parts = {m->forward(tokens.index({Slice(), Slice(0, 7)}), nullptr, &cache)};
        for (int t = 7; t < 20; ++t)
            parts.push_back(m->forward(tokens.index({Slice(), Slice(t, t + 1)}), nullptr, &cache));
        CHECK(max_diff(torch::cat(parts, 1), full) < 1e-4);
    }
}

TEST_CASE("family loaders: a missing tensor is named") {
    TempDir dir;  // Gemma 2 weights under a Gemma 3 config: no q_norm
    variant(dir, "gemma2", [](nlohmann::json& j) {
        j["architectures"] = nlohmann::json::array({"Gemma3ForCausalLM"});
    });
    CHECK(error_of<ModelLoadError>([&] { load_model(dir.path); }).find("model.layers.0.self_attn.q_norm.weight") !=
          std::string::npos);
    TempDir dir2;
    variant(dir2, "gpt_neox", [](nlohmann::json&) {});
    rewrite_weights(dir2, "gpt_neox", [](auto& t) { t.erase("gpt_neox.layers.1.mlp.dense_4h_to_h.bias"); });
    CHECK(error_of<ModelLoadError>([&] { load_model(dir2.path); }).find("gpt_neox.layers.1.mlp.dense_4h_to_h.bias") !=
          std::string::npos);
    TempDir dir3;
    variant(dir3, "olmo2", [](nlohmann::json& j) { j["tie_word_embeddings"] = false; });
    rewrite_weights(dir3, "olmo2", [](auto& t) { t.erase("lm_head.weight"); });
    CHECK(error_of<ModelLoadError>([&] { load_model(dir3.path); }).find("lm_head.weight") != std::string::npos);
}

TEST_CASE("family loaders: an unknown rope_scaling type is refused by name") {
    for (const std::string name : {"olmo2", "gpt_neox", "gemma3"}) {
        CAPTURE(name);
        TempDir dir;
        variant(dir, name, [](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; });
        CHECK(error_of<ConfigError>([&] { load_model(dir.path); }).find("'yarn'") != std::string::npos);
    }
}

TEST_CASE("family Gemma 2: a soft-cap key absent takes the transformers default, null turns it off") {
    TempDir absent;
    variant(absent, "gemma2", [](nlohmann::json& j) {
        j.erase("attn_logit_softcapping");
        j.erase("final_logit_softcapping");
    });
    auto a = load_model(absent.path);
    CHECK(a->config.attn_softcap == 50.0);
    CHECK(a->config.final_softcap == 30.0);
    TempDir null;
    variant(null, "gemma2", [](nlohmann::json& j) {
        j["attn_logit_softcapping"] = nullptr;
        j["final_logit_softcapping"] = nullptr;
    });
    auto n = load_model(null.path);
    CHECK(n->config.attn_softcap == 0.0);
    CHECK(n->config.final_softcap == 0.0);
    TempDir neg;
    variant(neg, "gemma2", [](nlohmann::json& j) { j["attn_logit_softcapping"] = -1.0; });
    CHECK(error_of<ConfigError>([&] { load_model(neg.path); }).find("attn_logit_softcapping") != std::string::npos);
}
