// GGUF files (src/formats/gguf.h, src/formats/gguf_model.h): every family fixture and tinystories-656k written as
// llama.cpp's converter writes them (scripts/make_gguf.py with PyPI's gguf package; skipped, saying
// so, where that package cannot be installed) give the safetensors load's logits within each
// dtype's stated tolerance; the file's own tokenizer gives the shared tokenizer vectors' ids; and
// bad files (truncated, an unknown or unsupported tensor type, a mistyped key) are one line naming
// the file, from files this test writes byte by byte.
#include <doctest/doctest.h>

#include "errors.h"
#include "gguf.h"
#include "model.h"
#include "safetensors.h"
#include "testdata.h"
#include "tmpdir.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace hs;
namespace fs = std::filesystem;

namespace {

// The GGUF files of scripts/make_gguf_fixtures.sh, made once per build tree; "" when the gguf
// package could not be installed (no PyPI).
const std::string& gguf_dir() {
    static const std::string dir = [] {
        const std::string out = (fs::path(HS_BINARY).parent_path() / "gguf-fixtures").string();
        const std::string cmd = fmt::format("bash '{}/scripts/make_gguf_fixtures.sh' '{}' >&2", HS_SOURCE_DIR, out);
        const int rc = std::system(cmd.c_str());
        return rc == 0 && fs::exists(out + "/READY") ? out : std::string();
    }();
    return dir;
}

#define HS_REQUIRE_GGUF(dir)                                                                      \
    const std::string dir = gguf_dir();                                                           \
    if (dir.empty()) {                                                                            \
        MESSAGE("skipped: no GGUF fixtures (scripts/setup_gguf.sh could not install PyPI's gguf)"); \
        return;                                                                                   \
    }

std::string family(const std::string& name) { return std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + name; }

at::Tensor logits_of(const Model& m, const at::Tensor& tokens) {
    torch::NoGradGuard ng;
    return m.forward(tokens)[0].to(torch::kFloat);
}

// What a GGUF file cannot carry, set in a copy of the fixture's config.json the way llama.cpp
// runs the file: Gemma 2's query scale 1/sqrt(head_dim) (no query_pre_attn_scalar key), Mistral
// with no sliding window (the converter writes none).
std::string as_llama_cpp_runs(const std::string& name, TempDir& tmp) {
    if (name != "gemma2" && name != "mistral_window") return family(name);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(family(name) + "/config.json"));
    if (name == "gemma2") j["query_pre_attn_scalar"] = j["head_dim"];
    if (name == "mistral_window") j.erase("sliding_window");
    const std::string dir = tmp.file(name);
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << j.dump();
    fs::create_symlink(family(name) + "/model.safetensors", dir + "/model.safetensors");
    return dir;
}

// Largest |a - b| relative to the largest |b| (logits' scale differs by family).
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
    return (a - b).abs().max().item<double>() / std::max(1e-6, b.abs().max().item<double>());
}

// Tolerances, relative to the largest logit. The fixtures are stored F16, so F32 and F16 GGUFs
// hold the same values and differ only by float32 rounding of the transforms; BF16 keeps 8 bits of
// mantissa (relative rounding 2^-9 per weight), Q8_0 a scale per 32 values (1/254 of the block's
// largest value).
double tolerance(const std::string& type, Family family = Family::kLlama) {
    // Gemma: the converter adds 1 to every norm weight in the source dtype (F16 here), so its norms
    // carry one F16 rounding of w + 1 (checked exactly below); 3e-3 bounds what that moves.
    if ((type == "f32" || type == "f16") && family == Family::kGemma) return 3e-3;
    if (type == "f32" || type == "f16") return 1e-5;
    if (type == "bf16") return 0.03;
    return 0.1;  // q8_0 (measured up to 0.06 on these random fixtures, 0.01 on tinystories-656k)
}

// The shared tokenizer vectors' ids for `key` ("tinystories" or "gpt2"), null entries skipped;
// round_trip: decode must give the text back too. Returns how many were checked.
int check_vectors(const Tokenizer& tok, const std::string& td, const char* key, bool round_trip) {
    const auto vectors = nlohmann::json::parse(std::ifstream(td + "/tokenizer_vectors.json"));
    int n = 0;
    for (const auto& v : vectors["cases"]) {
        if (v[key].is_null()) continue;
        const std::string text = v["text"];
        CAPTURE(text);
        CHECK(tok.encode(text, false) == v[key].get<std::vector<int32_t>>());
        if (round_trip) CHECK(tok.decode(tok.encode(text, false)) == text);
        ++n;
    }
    return n;
}

}  // namespace

TEST_CASE("gguf: every family's GGUF gives the safetensors logits within the dtype's tolerance") {
    HS_REQUIRE_GGUF(dir);
    TempDir tmp;
    int checked = 0;
    for (const auto& entry : fs::directory_iterator(family(""))) {
        if (!entry.is_directory()) continue;
        const std::string name = entry.path().filename().string();
        auto ref = load_model(as_llama_cpp_runs(name, tmp));
        SafetensorsFile r(family(name) + "/reference.safetensors");
        const auto tokens = r.get("tokens").to(torch::kLong).unsqueeze(0);
        const auto want = logits_of(*ref, tokens);
        for (const std::string type : {"f32", "f16", "bf16", "q8_0"}) {
            const std::string path = fmt::format("{}/{}-{}.gguf", dir, name, type);
            if (!fs::exists(path)) continue;
            CAPTURE(path);
            auto m = load_model(path);
            CHECK(m->source.format == "gguf");
            CHECK(m->config.family == ref->config.family);  // Mistral is "llama" to llama.cpp
            const double d = rel_diff(logits_of(*m, tokens), want);
            MESSAGE(name << " " << type << ": largest logit difference " << d << " of the largest logit");
            CHECK(d <= tolerance(type, ref->config.family));
            if (ref->config.family == Family::kGemma && type == "f32") {
                // Exactly what the converter stored: fp16(w + 1), less 1.
                const auto& w = ref->weights.layers[0].attn_norm_w;
                CHECK(torch::equal(m->weights.layers[0].attn_norm_w, (w.to(torch::kHalf) + 1).to(torch::kFloat) - 1));
            }
            ++checked;
        }
    }
    CHECK(checked >= 25);
}

TEST_CASE("gguf: tinystories-656k in four dtypes; its own tokenizer gives the shared vectors' ids") {
    HS_REQUIRE_TESTDATA(td);
    HS_REQUIRE_GGUF(dir);
    auto ref = load_model(td + "/tinystories-656k");
    auto hf_tok = load_tokenizer(td + "/tinystories-656k");
    const auto ids = hf_tok->encode("Once upon a time, there was a little girl named Lily. She liked to play.");
    const auto tokens = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kLong).unsqueeze(0);
    const auto want = logits_of(*ref, tokens);
    for (const std::string type : {"f32", "f16", "bf16", "q8_0"}) {
        const std::string path = fmt::format("{}/tinystories-656k-{}.gguf", dir, type);
        CAPTURE(path);
        auto m = load_model(path);
        const double d = rel_diff(logits_of(*m, tokens), want);
        MESSAGE("tinystories-656k " << type << ": largest logit difference " << d << " of the largest logit");
        CHECK(d <= (type == "q8_0" ? 0.03 : tolerance(type)));  // a trained model: Q8_0 within 3%
    }
    auto tok = find_tokenizer_for_model(dir + "/tinystories-656k-f32.gguf", 2048);
    REQUIRE(tok);
    CHECK(tok->kind() == "gguf-spm");
    CHECK(tok->bos_id() == hf_tok->bos_id());
    CHECK(tok->encode("Once upon a time") == hf_tok->encode("Once upon a time"));
    CHECK(check_vectors(*tok, td, "tinystories", false) >= 5);
}

TEST_CASE("gguf: GPT-2's vocabulary from a vocab-only GGUF gives the shared vectors' ids") {
    HS_REQUIRE_TESTDATA(td);
    HS_REQUIRE_GGUF(dir);
    auto tok = load_tokenizer(dir + "/gpt2-vocab.gguf");
    CHECK(tok->vocab_size() == 50257);
    CHECK(tok->eos_id() == 50256);
    CHECK(check_vectors(*tok, td, "gpt2", true) >= 10);
    // A vocab-only file is not a model.
    CHECK_THROWS_AS(load_model(dir + "/gpt2-vocab.gguf"), ModelLoadError);
}

namespace {

// A GGUF file written byte by byte (the test's own writer, independent of the gguf package).
struct Writer {
    std::string b;
    template <class T>
    void put(T v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }
    void str(const std::string& s) { put<uint64_t>(s.size()), b += s; }
    void kv_u32(const std::string& k, uint32_t v) { str(k), put<uint32_t>(4), put<uint32_t>(v); }
    void kv_str(const std::string& k, const std::string& v) { str(k), put<uint32_t>(8), str(v); }
    void kv_f32(const std::string& k, float v) { str(k), put<uint32_t>(6), put<float>(v); }
};

// A one-layer llama (D 32, 2 heads, F 64, V 16) whose tensors are all F32 zeros except `type`
// for token_embd (0 F32, 8 Q8_0 via raw blocks, other numbers written as given), with `kvs`
// metadata appended after general.architecture.
std::string tiny_llama(uint32_t embd_type = 0, const std::function<void(Writer&, int&)>& extra_kv = {}) {
    const int64_t D = 32, F = 64, V = 16;
    std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
        {"token_embd.weight", {V, D}}, {"output_norm.weight", {D}}, {"blk.0.attn_norm.weight", {D}},
        {"blk.0.attn_q.weight", {D, D}}, {"blk.0.attn_k.weight", {D, D}}, {"blk.0.attn_v.weight", {D, D}},
        {"blk.0.attn_output.weight", {D, D}}, {"blk.0.ffn_norm.weight", {D}}, {"blk.0.ffn_gate.weight", {F, D}},
        {"blk.0.ffn_up.weight", {F, D}}, {"blk.0.ffn_down.weight", {D, F}}};
    Writer w;
    w.b = "GGUF";
    w.put<uint32_t>(3);
    w.put<uint64_t>(t.size());
    Writer kv;
    int n_kv = 0;
    kv.kv_str("general.architecture", "llama"), ++n_kv;
    kv.kv_u32("llama.embedding_length", D), ++n_kv;
    kv.kv_u32("llama.block_count", 1), ++n_kv;
    kv.kv_u32("llama.feed_forward_length", F), ++n_kv;
    kv.kv_u32("llama.attention.head_count", 2), ++n_kv;
    kv.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f), ++n_kv;
    if (extra_kv) extra_kv(kv, n_kv);
    w.put<uint64_t>(n_kv);
    w.b += kv.b;
    uint64_t off = 0;
    std::vector<uint64_t> sizes;
    for (auto& [name, shape] : t) {
        w.str(name);
        w.put<uint32_t>(static_cast<uint32_t>(shape.size()));
        for (auto it = shape.rbegin(); it != shape.rend(); ++it) w.put<uint64_t>(static_cast<uint64_t>(*it));
        const uint32_t type = name == "token_embd.weight" ? embd_type : 0;
        w.put<uint32_t>(type);
        w.put<uint64_t>(off);
        int64_t n = 1;
        for (auto s : shape) n *= s;
        const uint64_t bytes = type == 8 ? static_cast<uint64_t>(n / 32 * 34) : static_cast<uint64_t>(n * 4);
        sizes.push_back(bytes);
        off += (bytes + 31) / 32 * 32;
    }
    while (w.b.size() % 32) w.b.push_back('\0');
    for (auto s : sizes) w.b.append((s + 31) / 32 * 32, '\0');
    return w.b;
}

void expect_one_line(const std::function<void()>& f, const std::string& path, const std::string& what) {
    try {
        f();
        FAIL("accepted: " << what);
    } catch (const Error& e) {
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.rfind(path, 0) == 0);
        CHECK(msg.find(what) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);
    }
}

}  // namespace

TEST_CASE("gguf: the test's own tiny llama loads; bad files are one line naming the file") {
    TempDir tmp;
    const std::string f = tmp.file("m.gguf");
    auto write = [&](const std::string& bytes) { std::ofstream(f, std::ios::binary) << bytes; };
    write(tiny_llama());
    auto m = load_model(f);
    CHECK(m->config.n_layers == 1);
    CHECK(m->config.tie_embeddings);
    CHECK(m->config.vocab_size == 16);
    {
        // Q8_0: a block of 32 values d * q; the test writes d = 0.5 (fp16 0x3800) and q = -16..15.
        std::string bytes = tiny_llama(8);
        GgufFile probe_layout(f);  // the F32 file, for the data offset of token_embd
        const size_t data = probe_layout.tensors().at("token_embd.weight").begin;
        for (int blk = 0; blk < 16; ++blk) {
            const size_t at = data + static_cast<size_t>(blk) * 34;
            bytes[at] = 0x00, bytes[at + 1] = 0x38;
            for (int i = 0; i < 32; ++i) bytes[at + 2 + static_cast<size_t>(i)] = static_cast<char>(i - 16);
        }
        const std::string q = tmp.file("q.gguf");
        std::ofstream(q, std::ios::binary) << bytes;
        GgufFile g(q);
        auto e = g.get("token_embd.weight");
        REQUIRE(e.sizes().vec() == std::vector<int64_t>{16, 32});
        CHECK(e[3][0].item<float>() == -8.0f);
        CHECK(e[3][31].item<float>() == 7.5f);
    }
    const std::string good = tiny_llama();
    for (size_t cut : {size_t{3}, size_t{10}, size_t{30}, size_t{200}, good.size() / 2, good.size() - 1}) {
        write(good.substr(0, cut));
        CAPTURE(cut);
        expect_one_line([&] { load_model(f); }, f, cut < 4 ? "not a GGUF file" : "truncated");
    }
    write(tiny_llama(12));
    expect_one_line([&] { load_model(f); }, f, "tensor 'token_embd.weight' is Q4_K: headscope reads F32, F16, BF16 and Q8_0");
    write(tiny_llama(77));
    expect_one_line([&] { load_model(f); }, f, "unknown ggml type 77");
    write(tiny_llama(0, [](Writer& w, int& n) { w.kv_str("llama.context_length", "long"), ++n; }));
    expect_one_line([&] { load_model(f); }, f, "metadata key 'llama.context_length' is string, expected an integer");
    write(tiny_llama(0, [](Writer& w, int& n) { w.kv_u32("llama.attention.head_count", 2), ++n; }));
    expect_one_line([&] { load_model(f); }, f, "key 'llama.attention.head_count' appears twice");
    write(tiny_llama(0, [](Writer& w, int& n) { w.str("x"), w.put<uint32_t>(99), ++n; }));
    expect_one_line([&] { load_model(f); }, f, "key 'x' has unknown value type 99");
    std::string bad_arch = tiny_llama();
    bad_arch.replace(bad_arch.find("llama", 30), 5, "bloom");
    write(bad_arch);
    expect_one_line([&] { load_model(f); }, f, "GGUF architecture 'bloom' is not supported");
    std::string v1 = good;
    v1[4] = 1;
    write(v1);
    expect_one_line([&] { load_model(f); }, f, "GGUF version 1");
}
