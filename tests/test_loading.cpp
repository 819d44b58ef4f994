// Checkpoint loading: the safetensors reader's checks, sharded folders, tied weights, and every
// bad-input path naming the file and the problem.
#include <doctest/doctest.h>

#include "errors.h"
#include "model.h"
#include "safetensors.h"
#include "testdata.h"
#include "tmpdir.h"

#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace hs;

namespace {

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
    std::ofstream f(path, std::ios::binary);
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    f << std::string(data_bytes, '\0');
}

template <typename E>
std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const E& e) {
        return e.what();
    }
    return "<no error>";
}

template <typename E>
void expect_error(const std::function<void()>& fn, const std::string& want) {
    const std::string got = error_of<E>(fn);
    INFO("error: " << got);
    CHECK(got.find(want) != std::string::npos);
}

void copy_file(const std::string& a, const std::string& b) {
    std::ifstream in(a, std::ios::binary);
    std::ofstream out(b, std::ios::binary);
    out << in.rdbuf();
}

}  // namespace

TEST_CASE("safetensors round trip keeps names, dtypes, shapes and bytes") {
    TempDir dir;
    std::map<std::string, at::Tensor> t = {{"a", torch::randn({3, 5})},
                                           {"b", torch::randn({7}).to(torch::kBFloat16)},
                                           {"c", torch::arange(6, torch::kInt).view({2, 3})}};
    write_safetensors(dir.file("x.safetensors"), t, {{"format", "pt"}});
    SafetensorsFile f(dir.file("x.safetensors"));
    CHECK(f.metadata().at("format") == "pt");
    for (auto& [k, v] : t) {
        auto got = f.get(k);
        CHECK((got.scalar_type() == v.scalar_type()));
        CHECK(torch::equal(got, v));
    }
    CHECK(f.entry("b").dtype == "BF16");
}

TEST_CASE("safetensors reader rejects corrupt files with the file and the problem named") {
    TempDir dir;
    const auto p = dir.file("m.safetensors");
    std::ofstream(p) << "abc";
    expect_error<ModelLoadError>([&] { SafetensorsFile f(p); }, "m.safetensors: truncated");
    write_raw(p, "{not json", 0);
    expect_error<ModelLoadError>([&] { SafetensorsFile f(p); }, "not valid JSON");
    write_raw(p, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
    expect_error<ModelLoadError>([&] { SafetensorsFile f(p); }, "past end");
    write_raw(p, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16);
    expect_error<ModelLoadError>([&] { SafetensorsFile f(p); }, "needs 12");
    write_raw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 24);
    expect_error<ModelLoadError>([&] { SafetensorsFile f(p); }, "overlap");
    write_raw(p, R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,2]}})", 2);
    expect_error<ModelLoadError>([&] { SafetensorsFile f(p); }, "unsupported dtype 'Q4'");
    std::ofstream(p, std::ios::binary) << std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8);
    expect_error<ModelLoadError>([&] { SafetensorsFile f(p); }, "header length");
}

TEST_CASE("sharded checkpoint folders load and agree with the single-file checkpoint") {
    HS_REQUIRE_TESTDATA(td);
    TempDir dir;
    const std::string src = td + "/tinystories-656k";
    copy_file(src + "/config.json", dir.file("config.json"));
    SafetensorsFile f(src + "/model.safetensors");
    // Two shards, plus embed stored under its own name this time (tied: either name must work).
    std::map<std::string, at::Tensor> s1, s2;
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    int i = 0;
    for (const auto& [name, e] : f.entries()) {
        std::string out_name = name == "lm_head.weight" ? "model.embed_tokens.weight" : name;
        auto& shard = (i++ % 2) ? s2 : s1;
        shard[out_name] = f.get(name).clone();
        index["weight_map"][out_name] = (&shard == &s1) ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    write_safetensors(dir.file("model-00001-of-00002.safetensors"), s1);
    write_safetensors(dir.file("model-00002-of-00002.safetensors"), s2);
    std::ofstream(dir.file("model.safetensors.index.json")) << index.dump();
    auto a = load_model(src);
    auto b = load_model(dir.path);
    torch::NoGradGuard ng;
    auto tokens = torch::randint(3, 2048, {1, 12}, torch::kLong);
    CHECK(torch::equal(a->forward(tokens), b->forward(tokens)));
    CHECK(b->weights.embed.is_same(b->weights.unembed));
    CHECK(b->weights_sha256().size() == 64);
}

TEST_CASE("bad checkpoints: missing tensor, wrong shape, wrong dtype, unknown architecture, bad config") {
    HS_REQUIRE_TESTDATA(td);
    const std::string src = td + "/tinystories-656k";
    SafetensorsFile f(src + "/model.safetensors");
    auto cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
    auto make = [&](const TempDir& dir, const std::function<void(std::map<std::string, at::Tensor>&)>& edit,
                    const nlohmann::json& c) {
        std::map<std::string, at::Tensor> t;
        for (const auto& [name, e] : f.entries()) t[name] = f.get(name).clone();
        edit(t);
        write_safetensors(dir.file("model.safetensors"), t);
        std::ofstream(dir.file("config.json")) << c.dump();
    };
    {
        TempDir d;
        make(d, [](auto& t) { t.erase("model.layers.1.mlp.up_proj.weight"); }, cfg);
        expect_error<ModelLoadError>([&] { load_model(d.path); }, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
    }
    {
        TempDir d;
        make(d, [](auto& t) { t["model.norm.weight"] = torch::ones({127}); }, cfg);
        expect_error<ModelLoadError>([&] { load_model(d.path); }, "'model.norm.weight' has shape [127], expected [128]");
    }
    {
        TempDir d;
        make(d, [](auto& t) { t["model.norm.weight"] = torch::ones({128}, torch::kLong); }, cfg);
        expect_error<ModelLoadError>([&] { load_model(d.path); }, "dtype I64");
    }
    {
        TempDir d;
        auto c = cfg;
        c["architectures"] = {"MambaForCausalLM"};
        make(d, [](auto&) {}, c);
        expect_error<ConfigError>([&] { load_model(d.path); }, "unknown architecture 'MambaForCausalLM'");
    }
    {
        TempDir d;
        auto c = cfg;
        c["num_key_value_heads"] = 3;
        make(d, [](auto&) {}, c);
        expect_error<ConfigError>([&] { load_model(d.path); }, "not divisible");
    }
    {
        TempDir d;
        auto c = cfg;
        c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
        make(d, [](auto&) {}, c);
        expect_error<ConfigError>([&] { load_model(d.path); }, "rope_scaling type 'yarn'");
    }
    {
        TempDir d;
        auto c = cfg;
        c["tie_word_embeddings"] = false;
        make(d, [](auto& t) { t["model.embed_tokens.weight"] = t["lm_head.weight"]; t.erase("lm_head.weight"); }, c);
        expect_error<ModelLoadError>([&] { load_model(d.path); }, "missing tensor 'lm_head.weight'");
    }
}

TEST_CASE("bf16 compute stays close to fp32 on every real checkpoint in testdata") {
    HS_REQUIRE_TESTDATA(td);
    for (const std::string name : {"stories260K/stories260K.bin", "aidreams260K/aidreams260K.bin", "tinystories-656k"}) {
        CAPTURE(name);
        auto m32 = load_model(td + "/" + name);
        LoadOptions o;
        o.dtype = c10::kBFloat16;
        auto m16 = load_model(td + "/" + name, o);
        torch::NoGradGuard ng;
        torch::manual_seed(11);  // own seed: tokens must not depend on which tests ran before
        auto tokens = torch::randint(3, m32->config.vocab_size, {2, 24}, torch::kLong);
        auto a = m32->forward(tokens), b = m16->forward(tokens).to(torch::kFloat);
        CHECK((b.scalar_type() == torch::kFloat));
        // bf16 keeps 8 bits of mantissa: logits of magnitude ~10 agree to a few tenths (measured
        // 0.10 / 0.21 / 0.41 on aidreams260K / tinystories-656k / stories260K with libtorch 1.13,
        // 0.16 / 0.23 / 0.56 with 2.15; largest logits 12-17). The bound is 0.6, not 0.5, for 2.x:
        // its 0.56 is one logit (stories260K, row 0, position 8, token 267), also the worst under
        // 1.13 (0.41). libtorch 2.x rounds bf16 SiLU once from fp32 (1.13 rounded an intermediate:
        // one bf16 step off in ~30% of outputs), another rounding path that moves that logit further;
        // over 40 random sequences both give the same median worst error (0.21) and mean error (0.033).
        const double err = (a - b).abs().max().item<double>();
        MESSAGE(name << ": max |bf16 - fp32| logit " << err << " (largest logit " << a.abs().max().item<double>() << ")");
        CHECK(err < 0.6);
        // The top token agrees wherever fp32's top-2 gap exceeds twice the worst error (a smaller gap
        // may flip honestly).
        auto top2 = std::get<0>(a.topk(2, -1));  // [2, T, 2]
        auto clear = (top2.select(-1, 0) - top2.select(-1, 1)) > 2 * err;
        CHECK(clear.sum().item<int64_t>() >= 4);
        CHECK(torch::equal(a.argmax(-1).masked_select(clear), b.argmax(-1).masked_select(clear)));
    }
}
