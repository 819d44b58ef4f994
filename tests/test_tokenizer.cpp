// Tokenizer tests: synthetic tokenizers (always run) and the shared reference data
// (tokenizer_vectors.json, llama2.c references; skipped when ../shared/testdata is absent).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "errors.h"
#include "testdata.h"
#include "tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<int32_t>;

namespace {

// A fresh temporary folder per test, removed at the end.
struct TempDir {
    fs::path path;
    TempDir() {
        static int counter = 0;
        std::random_device rd;
        path = fs::temp_directory_path() /
               ("hs_tok_test_" + std::to_string(rd()) + "_" + std::to_string(counter++));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string write(const std::string& name, const std::string& bytes) const {
        fs::path p = path / name;
        std::ofstream(p, std::ios::binary) << bytes;
        return p.string();
    }
};

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Runs f, which must throw hs::DataError; returns its message ("" if nothing was thrown).
template <class F>
std::string data_error_of(F&& f) {
    try {
        f();
    } catch (const hs::DataError& e) {
        return e.what();
    }
    return "";
}

// Printable SUBCASE names for texts with tabs and newlines.
std::string printable(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else out += c;
    }
    return out + "\"";
}

// Id lists that doctest can print when a comparison fails.
struct Toks {
    Ids v;
    bool operator==(const Toks& o) const { return v == o.v; }
};
Toks T(const Ids& v) { return Toks{v}; }
std::ostream& operator<<(std::ostream& os, const Toks& t) {
    os << "[";
    for (size_t i = 0; i < t.v.size(); ++i) os << (i ? ", " : "") << t.v[i];
    return os << "]";
}

bool is_ascii(const std::string& s) {
    for (char c : s)
        if (static_cast<unsigned char>(c) >= 0x80) return false;
    return true;
}

// Reads an int32 tensor from a safetensors file: 8-byte little-endian header length, JSON
// header, then the data.
Ids read_safetensors_i32(const std::string& path, const std::string& name) {
    std::string bytes = read_bytes(path);
    REQUIRE(bytes.size() >= 8);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    REQUIRE(8 + n <= bytes.size());
    json h = json::parse(bytes.substr(8, n));
    REQUIRE(h.contains(name));
    REQUIRE(h[name]["dtype"] == "I32");
    size_t b = h[name]["data_offsets"][0], e = h[name]["data_offsets"][1];
    Ids out((e - b) / 4);
    std::memcpy(out.data(), bytes.data() + 8 + n + b, e - b);
    return out;
}

// A small SentencePiece-style tokenizer.json: Prepend/Replace normalizer, byte fallback (only
// <0xC3> and <0xA9> exist), fused unk, a BOS template and a non-special added token.
json sp_tokenizer_json() {
    return json::parse(R"({
      "version": "1.0",
      "added_tokens": [
        {"id": 0, "content": "<unk>", "special": true, "normalized": false},
        {"id": 1, "content": "<s>", "special": true, "normalized": false},
        {"id": 2, "content": "</s>", "special": true, "normalized": false},
        {"id": 11, "content": "<sep>", "special": false, "normalized": false}
      ],
      "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
      "pre_tokenizer": null,
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
      "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
        "byte_fallback": true, "ignore_merges": false,
        "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xC3>": 3, "<0xA9>": 4, "\u2581": 5,
                  "a": 6, "b": 7, "ab": 8, "\u2581ab": 9, "c": 10},
        "merges": ["a b", ["\u2581", "ab"]]}
    })");
}

std::string write_json(const TempDir& d, const json& j, const std::string& name = "tokenizer.json") {
    return d.write(name, j.dump());
}

// A llama2.c tokenizer .bin from (text, score) pairs.
std::string llama2c_bin(const std::vector<std::pair<std::string, float>>& toks) {
    std::string out;
    auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
    uint32_t max_len = 0;
    for (const auto& t : toks) max_len = std::max<uint32_t>(max_len, static_cast<uint32_t>(t.first.size()));
    put(&max_len, 4);
    for (const auto& [s, score] : toks) {
        auto len = static_cast<uint32_t>(s.size());
        put(&score, 4);
        put(&len, 4);
        out += s;
    }
    return out;
}

std::vector<std::pair<std::string, float>> small_llama2c_vocab() {
    std::vector<std::pair<std::string, float>> v{{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
    for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        v.emplace_back(buf, 0.0f);
    }
    // 259 " ", 260 "a", 261 "b", 262 "ab", 263 " ab", 264 "ba"
    for (auto t : std::vector<std::pair<std::string, float>>{
             {" ", -10}, {"a", -11}, {"b", -12}, {"ab", -1}, {" ab", -0.5f}, {"ba", -2}})
        v.push_back(t);
    return v;
}

}  // namespace

TEST_CASE("tokenizer: synthetic SentencePiece-style tokenizer.json") {
    TempDir d;
    auto tok = hs::load_tokenizer(write_json(d, sp_tokenizer_json()));
    CHECK(tok->kind() == "hf-bpe-sentencepiece");
    CHECK(tok->vocab_size() == 12);
    CHECK(tok->bos_id() == std::optional<int32_t>(1));
    CHECK_FALSE(tok->eos_id().has_value());

    // "▁ab▁c": a+b first (rank 0), then ▁+ab.
    CHECK(T(tok->encode("ab c", false)) == T(Ids{9, 5, 10}));
    CHECK(T(tok->encode("ab c")) == T(Ids{1, 9, 5, 10}));
    CHECK(tok->encode("", false).empty());
    // Byte fallback when every byte token exists; otherwise unk, fused across a run.
    CHECK(T(tok->encode("\xC3\xA9", false)) == T(Ids{5, 3, 4}));
    CHECK(T(tok->encode("\xC3\xBC\xC3\xBCx", false)) == T(Ids{5, 0}));
    CHECK(T(tok->encode("\xC3\xBC" "a\xC3\xBC", false)) == T(Ids{5, 0, 6, 0}));
    // Added tokens are matched only when asked.
    CHECK(T(tok->encode("ab<sep>ab", false, true)) == T(Ids{9, 11, 9}));
    CHECK(T(tok->encode("<s>ab", true, true)) == T(Ids{1, 1, 9}));
    CHECK(tok->encode("ab<sep>", false, false).at(1) == 0);

    CHECK(tok->decode({1, 9, 5, 10}) == "ab c");
    CHECK(tok->decode({1, 9, 5, 10}, false) == "<s> ab c");
    CHECK(tok->decode({9, 5, 3, 4}) == "ab \xC3\xA9");
    CHECK(tok->decode({3}) == "\xEF\xBF\xBD");  // a lone lead byte decodes to U+FFFD
    CHECK(tok->decode_piece(1, 9) == "ab");
    CHECK(tok->decode_piece(9, 9) == " ab");
    CHECK(tok->decode_piece(9, 3) == "\xC3");  // raw byte for streaming
    CHECK(tok->token_text(9) == "\xE2\x96\x81" "ab");
    CHECK(tok->token_to_id("<sep>") == std::optional<int32_t>(11));
    CHECK_FALSE(tok->token_to_id("zzz").has_value());
    CHECK(tok->is_special(1));
    CHECK_FALSE(tok->is_special(11));
    CHECK_FALSE(tok->is_special(9));
    CHECK(data_error_of([&] { tok->decode({12}); }).find("out of range") != std::string::npos);
}

TEST_CASE("tokenizer: tokenizer_config.json and special_tokens_map.json") {
    TempDir d;
    std::string path = write_json(d, sp_tokenizer_json());
    d.write("tokenizer_config.json", R"({"add_bos_token": false, "add_eos_token": true,
                                         "bos_token": {"content": "<s>"}, "eos_token": null})");
    d.write("special_tokens_map.json", R"({"eos_token": "</s>"})");
    auto tok = hs::load_tokenizer(d.path.string());
    CHECK(tok->bos_id() == std::optional<int32_t>(1));
    CHECK(tok->eos_id() == std::optional<int32_t>(2));
    CHECK(T(tok->encode("ab")) == T(Ids{9, 2}));
    CHECK(tok->source_path() == path);
}

TEST_CASE("tokenizer: Metaspace pre-tokenizer prepend schemes") {
    for (const char* scheme : {"first", "always", "never"}) {
        CAPTURE(scheme);
        TempDir d;
        json j = sp_tokenizer_json();
        j["normalizer"] = nullptr;
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"},
                              {"prepend_scheme", scheme}, {"split", true}};
        j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}};
        auto tok = hs::load_tokenizer(write_json(d, j));
        std::string s = scheme;
        CHECK(T(tok->encode("ab ab", false)) == T((s == "never" ? Ids{8, 9} : Ids{9, 9})));
        // After an added token the text is no longer at the start: "first" does not prepend.
        CHECK(T(tok->encode("<sep>ab", false, true)) == T((s == "always" ? Ids{11, 9} : Ids{11, 8})));
        CHECK(tok->decode({9, 9}) == (s == "never" ? " ab ab" : "ab ab"));
    }
}

TEST_CASE("tokenizer: llama2.c synthetic vocabulary") {
    TempDir d;
    std::string path = d.write("tok.bin", llama2c_bin(small_llama2c_vocab()));
    auto tok = hs::load_tokenizer(path);
    CHECK(tok->kind() == "llama2c");
    CHECK(tok->vocab_size() == 265);
    // " abab": "ab" (-1) twice, leftmost first, then " ab" (-0.5) beats the second "ab".
    CHECK(T(tok->encode("abab", false)) == T(Ids{263, 262}));
    CHECK(T(tok->encode("abab")) == T(Ids{1, 263, 262}));
    CHECK(T(tok->encode("", true)) == T(Ids{1}));
    CHECK(T(tok->encode("\xC3\xA9", false)) == T(Ids{259, 0xC3 + 3, 0xA9 + 3}));
    CHECK(tok->decode({1, 263, 262}) == "abab");
    CHECK(tok->decode({263, 262}) == "abab");
    CHECK(tok->decode({1, 259, 0xC3 + 3, 0xA9 + 3}) == "\xC3\xA9");
    CHECK(tok->decode_piece(1, 263) == "ab");
    CHECK(tok->decode_piece(262, 263) == " ab");
    CHECK(tok->bos_id() == std::optional<int32_t>(1));
    CHECK(tok->eos_id() == std::optional<int32_t>(2));
    // With the vocabulary size given, trailing data beyond it is ignored.
    CHECK(hs::load_tokenizer(path, 260)->vocab_size() == 260);
}

TEST_CASE("tokenizer: malformed inputs throw DataError naming the file") {
    TempDir d;
    SUBCASE("not JSON") {
        std::string p = d.write("tokenizer.json", "{ this is not json");
        std::string msg = data_error_of([&] { hs::load_tokenizer(p); });
        CHECK(msg.find(p) != std::string::npos);
        CHECK(msg.find("not valid JSON") != std::string::npos);
    }
    SUBCASE("Unigram model") {
        json j = sp_tokenizer_json();
        j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
        std::string p = write_json(d, j);
        std::string msg = data_error_of([&] { hs::load_tokenizer(p); });
        CHECK(msg.find(p) != std::string::npos);
        CHECK(msg.find("unsupported tokenizer model type 'Unigram'") != std::string::npos);
    }
    SUBCASE("merge of a token absent from the vocabulary") {
        json j = sp_tokenizer_json();
        j["model"]["merges"] = {"a b", "x y"};
        std::string p = write_json(d, j);
        std::string msg = data_error_of([&] { hs::load_tokenizer(p); });
        CHECK(msg.find(p) != std::string::npos);
        CHECK(msg.find("model.merges[1]") != std::string::npos);
        CHECK(msg.find("'x'") != std::string::npos);
    }
    SUBCASE("malformed merge entry") {
        json j = sp_tokenizer_json();
        j["model"]["merges"] = {"a b", 17};
        std::string p = write_json(d, j);
        std::string msg = data_error_of([&] { hs::load_tokenizer(p); });
        CHECK(msg.find(p + ": model.merges[1]: expected 'a b' or [a, b]") != std::string::npos);
    }
    SUBCASE("unknown normalizer") {
        json j = sp_tokenizer_json();
        j["normalizer"] = {{"type", "Lowercase"}};
        std::string p = write_json(d, j);
        std::string msg = data_error_of([&] { hs::load_tokenizer(p); });
        CHECK(msg.find(p) != std::string::npos);
        CHECK(msg.find("unsupported normalizer 'Lowercase'") != std::string::npos);
    }
    SUBCASE("truncated llama2.c tokenizer") {
        std::string full = llama2c_bin(small_llama2c_vocab());
        std::string p = d.write("tok265.bin", full.substr(0, full.size() - 2));
        std::string msg = data_error_of([&] { hs::load_tokenizer(p, 265); });
        CHECK(msg.find(p) != std::string::npos);
        CHECK(msg.find("truncated") != std::string::npos);
        msg = data_error_of([&] { hs::load_tokenizer(p); });  // read until EOF: partial record
        CHECK(msg.find("truncated") != std::string::npos);
        msg = data_error_of([&] { hs::load_tokenizer(d.write("tok.bin", full.substr(0, 100)), 265); });
        CHECK(msg.find("tok.bin") != std::string::npos);
        msg = data_error_of([&] { hs::load_tokenizer(d.write("tiny.bin", "ab")); });
        CHECK(msg.find("tiny.bin") != std::string::npos);
    }
    SUBCASE("missing path") {
        std::string p = (d.path / "nope").string();
        CHECK(data_error_of([&] { hs::load_tokenizer(p); }).find(p) != std::string::npos);
        CHECK(hs::find_tokenizer_for_model(p, 512) == nullptr);
    }
}

TEST_CASE("tokenizer: reference vectors (tokenizer_vectors.json)") {
    std::string td = hs_testdata_dir();
    if (td.empty()) {
        MESSAGE("skipped: shared/testdata not found (set HEADSCOPE_TESTDATA)");
        return;
    }
    // doctest reruns the test body once per SUBCASE: load everything once.
    struct Loaded {
        json vectors;
        std::unique_ptr<hs::Tokenizer> gpt2, tiny, hf_bytelevel, hf_split;
    };
    static const Loaded loaded = [&td] {
        Loaded l;
        l.vectors = json::parse(read_bytes(td + "/tokenizer_vectors.json"));
        l.gpt2 = hs::load_tokenizer(td + "/gpt2-tokenizer");
        l.tiny = hs::load_tokenizer(td + "/tinystories-656k/tokenizer.json");
        // The same GPT-2 vocabulary as a tokenizer.json, once with ByteLevel's own regex and
        // [a, b] merges, once with Split + ByteLevel(use_regex=false).
        TempDir d1, d2;
        json vocab = json::parse(read_bytes(td + "/gpt2-tokenizer/vocab.json"));
        json merges = json::array();
        std::istringstream in(read_bytes(td + "/gpt2-tokenizer/merges.txt"));
        std::string line;
        while (std::getline(in, line)) {
            if (line.empty() || line.rfind("#version", 0) == 0) continue;
            size_t sp = line.find(' ');
            merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
        }
        json hf = {{"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}}}},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                   {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
                   {"decoder", {{"type", "ByteLevel"}}},
                   {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
        l.hf_bytelevel = hs::load_tokenizer(write_json(d1, hf));
        hf["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {
            {{"type", "Split"}, {"behavior", "Isolated"}, {"invert", false},
             {"pattern", {{"Regex", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
        l.hf_split = hs::load_tokenizer(write_json(d2, hf));
        return l;
    }();
    const json& vectors = loaded.vectors;
    REQUIRE(vectors["cases"].is_array());
    const auto& gpt2 = loaded.gpt2;
    const auto& tiny = loaded.tiny;
    const auto& hf_bytelevel = loaded.hf_bytelevel;
    const auto& hf_split = loaded.hf_split;
    CHECK(gpt2->kind() == "gpt2-bpe");
    CHECK(tiny->kind() == "hf-bpe-sentencepiece");
    CHECK(hf_bytelevel->kind() == "hf-bpe-bytelevel");

    for (const auto& c : vectors["cases"]) {
        const std::string text = c["text"].get<std::string>();
        SUBCASE(printable(text).c_str()) {
            if (!c["gpt2"].is_null()) {
                Ids want = c["gpt2"].get<Ids>();
                CHECK(T(gpt2->encode(text, false)) == T(want));
                CHECK(T(hf_bytelevel->encode(text, false)) == T(want));
                CHECK(T(hf_split->encode(text, false)) == T(want));
                CHECK(gpt2->decode(gpt2->encode(text, false)) == text);
                CHECK(hf_bytelevel->decode(want) == text);
            }
            if (!c["tinystories"].is_null()) {
                Ids want = c["tinystories"].get<Ids>();
                CHECK(T(tiny->encode(text, false)) == T(want));
                Ids with_bos = want;
                with_bos.insert(with_bos.begin(), 1);
                CHECK(T(tiny->encode(text, true)) == T(with_bos));
                // "\t" is <unk> in this vocabulary, so only tab-free texts round-trip.
                if (is_ascii(text) && text.find('\t') == std::string::npos)
                    CHECK(tiny->decode(tiny->encode(text)) == text);
            }
        }
    }
}

TEST_CASE("tokenizer: GPT-2 and TinyStories special tokens") {
    std::string td = hs_testdata_dir();
    if (td.empty()) {
        MESSAGE("skipped: shared/testdata not found (set HEADSCOPE_TESTDATA)");
        return;
    }
    auto gpt2 = hs::load_tokenizer(td + "/gpt2-tokenizer/vocab.json");
    CHECK(gpt2->vocab_size() == 50257);
    CHECK(gpt2->bos_id() == std::optional<int32_t>(50256));
    CHECK(gpt2->eos_id() == std::optional<int32_t>(50256));
    CHECK(T(gpt2->encode("Hello world", true)) == T(Ids{15496, 995}));  // HF's GPT-2 adds no BOS
    CHECK(T(gpt2->encode("Hello<|endoftext|> world", false, true)) == T(Ids{15496, 50256, 995}));
    CHECK(gpt2->encode("<|endoftext|>", false, false).size() > 1);
    CHECK(gpt2->decode({15496, 50256, 995}) == "Hello world");
    CHECK(gpt2->decode({15496, 50256, 995}, false) == "Hello<|endoftext|> world");
    CHECK(gpt2->token_text(995) == "\xC4\xA0world");  // "Ġworld"
    CHECK(gpt2->decode_piece(15496, 995) == " world");
    CHECK(gpt2->is_special(50256));

    auto tiny = hs::load_tokenizer(td + "/tinystories-656k");
    CHECK(tiny->bos_id() == std::optional<int32_t>(1));
    CHECK(tiny->eos_id() == std::optional<int32_t>(2));
    CHECK(tiny->vocab_size() == 2048);
    Ids ids = tiny->encode("Hello world");
    CHECK(T(ids) == T(Ids{1, 80, 1288, 139, 410, 555}));
    CHECK(tiny->decode_piece(1, 80) == "");
    // Normalized added tokens are matched in normalized text: "<|start_story|>" as "▁<|start_story|>".
    CHECK(tiny->encode("<|start_story|>Hello", false, true).front() == 1);
    // ... and decoded as that form when kept (tokenizers 0.23: id_to_token(1) == "▁<|start_story|>",
    // decode([85, 10, 1, 1, 80, 147, 201], skip_special_tokens=False) == "a. <|start_story|> <|start_story|> Once "),
    // so Wu's decode/encode round trips give the reference's prompts.
    CHECK(tiny->token_text(1) == "\u2581<|start_story|>");
    CHECK(tiny->decode({85, 10, 1, 1, 80, 147, 201}, false) == "a. <|start_story|> <|start_story|> Once ");
    CHECK(tiny->decode({1, 80, 147}, false) == "<|start_story|> On");
    // The crate does not skip such a token either (it looks the stored, normalized text up):
    // decode([80, 147, 2, 80, 147], skip_special_tokens=True) == "On <|end_story|> On" (tokenizers 0.23).
    CHECK(tiny->is_special(2));
    CHECK(!tiny->crate_skips(2));
    CHECK(tiny->decode({80, 147, 2, 80, 147}, true) == "On On");  // headscope's decode skips it
    CHECK(tiny->decode({80, 147, 2, 80, 147}, false) == "On <|end_story|> On");
    CHECK(gpt2->crate_skips(50256));
    CHECK(tiny->encode("Hello world <|end_story|>", false, true).back() == 2);
    CHECK(tiny->decode({1, 80, 1288, 139, 410, 555, 2}) == "Hello world");
}

TEST_CASE("tokenizer: llama2.c stories260K matches the reference prompts") {
    std::string td = hs_testdata_dir();
    if (td.empty()) {
        MESSAGE("skipped: shared/testdata not found (set HEADSCOPE_TESTDATA)");
        return;
    }
    auto tok = hs::find_tokenizer_for_model(td + "/stories260K/stories260K.bin", 512);
    REQUIRE(tok);
    CHECK(tok->kind() == "llama2c");
    CHECK(tok->vocab_size() == 512);
    CHECK(hs::load_tokenizer(td + "/stories260K/tok512.bin")->vocab_size() == 512);  // until EOF
    for (const auto& [prompt, file] : {std::pair<std::string, std::string>{"Tom and Sue went to the park", "reference_park"},
                                       {"The cat sat on the mat. The dog", "reference_cat"}}) {
        CAPTURE(prompt);
        Ids ref = read_safetensors_i32(td + "/stories260K/" + file + ".safetensors", "tokens");
        Ids ids = tok->encode(prompt, true);
        REQUIRE(ids.size() <= ref.size());
        CHECK(T(ids) == T(Ids(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(ids.size()))));
        CHECK(tok->decode(ids) == prompt);
        std::string streamed;
        for (size_t i = 1; i < ids.size(); ++i) streamed += tok->decode_piece(ids[i - 1], ids[i]);
        CHECK(streamed == prompt);
    }

    auto aid = hs::find_tokenizer_for_model(td + "/aidreams260K", 512);
    REQUIRE(aid);
    CHECK(aid->vocab_size() == 512);
    for (const std::string s : {"The moon sings softly over the sea.", "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD", ""})
        CHECK(aid->decode(aid->encode(s)) == s);

    auto tiny = hs::find_tokenizer_for_model(td + "/tinystories-656k/model.safetensors", 2048);
    REQUIRE(tiny);
    CHECK(tiny->kind() == "hf-bpe-sentencepiece");
}

TEST_CASE("tokenizer: encoding speed") {
    std::string td = hs_testdata_dir();
    if (td.empty()) {
        MESSAGE("skipped: shared/testdata not found (set HEADSCOPE_TESTDATA)");
        return;
    }
    // Pseudo-random words so that the word cache does not do all the work.
    std::mt19937 rng(7);
    std::string text;
    const char* words[] = {"the", "little", "girl", "saw", "a", "big", "dog", "and", "they", "played",
                           "in", "park", "happy", "Lily", "Tom", "sun", "was", "very", "said"};
    while (text.size() < 400000) {
        text += words[rng() % (sizeof(words) / sizeof(words[0]))];
        if (rng() % 7 == 0) text += std::to_string(rng() % 1000);
        text += (rng() % 11 == 0) ? ". " : " ";
    }
    for (const std::string& path : {td + "/tinystories-656k", td + "/gpt2-tokenizer", td + "/stories260K/tok512.bin"}) {
        auto tok = hs::load_tokenizer(path, 512);
        auto t0 = std::chrono::steady_clock::now();
        Ids ids = tok->encode(text, false);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double rate = static_cast<double>(ids.size()) / std::max(s, 1e-9);
        MESSAGE(tok->kind() << ": " << ids.size() << " tokens in " << s << " s (" << rate << " tokens/s)");
        // Loose bound: unoptimised builds on a busy machine must still pass; -O2 is far above it.
        CHECK(rate > 20000.0);
        CHECK(tok->decode(ids) == text);
    }
}
