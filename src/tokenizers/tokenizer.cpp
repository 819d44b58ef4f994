// Tokenizer factory: decides from a path which loader applies.
#include "tokenizer.h"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "errors.h"
#include "gguf.h"
#include "tokenizer_internal.h"

namespace hs {

namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec);
}

// First non-blank byte: '{' means JSON (a tokenizer.json under another name); llama2.c files
// start with a small binary uint32.
char first_non_blank(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char c = 0;
    while (f.get(c))
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return c;
    return 0;
}

// A tokenizer in a folder, or nullptr. prefer_llama2c: look for tok<V>.bin / tokenizer.bin
// first (the folder of a llama2.c checkpoint).
std::unique_ptr<Tokenizer> load_from_folder(const fs::path& dir, int vocab, bool prefer_llama2c) {
    auto llama2c = [&]() -> std::unique_ptr<Tokenizer> {
        if (vocab > 0) {
            fs::path p = dir / fmt::format("tok{}.bin", vocab);
            if (is_file(p)) return detail::load_llama2c_tokenizer(p.string(), vocab);
        }
        if (is_file(dir / "tokenizer.bin"))
            return detail::load_llama2c_tokenizer((dir / "tokenizer.bin").string(), vocab);
        return nullptr;
    };
    if (prefer_llama2c)
        if (auto t = llama2c()) return t;
    if (is_file(dir / "tokenizer.json")) return detail::load_hf_tokenizer_json((dir / "tokenizer.json").string());
    if (is_file(dir / "vocab.json") && is_file(dir / "merges.txt"))
        return detail::load_gpt2_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
    if (!prefer_llama2c) return llama2c();
    return nullptr;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int expected_vocab) {
    std::error_code ec;
    fs::path p(path);
    if (!fs::exists(p, ec)) throw DataError(fmt::format("{}: no such file or directory", path));
    if (fs::is_directory(p, ec)) {
        if (auto t = load_from_folder(p, expected_vocab, false)) return t;
        throw DataError(fmt::format(
            "{}: no tokenizer.json, vocab.json + merges.txt, or llama2.c tokenizer.bin in this folder", path));
    }
    const std::string name = p.filename().string();
    const fs::path dir = p.parent_path();
    if (name == "vocab.json" && is_file(dir / "merges.txt"))
        return detail::load_gpt2_vocab_merges(path, (dir / "merges.txt").string());
    if (name == "merges.txt") {
        if (!is_file(dir / "vocab.json"))
            throw DataError(fmt::format("{}: merges.txt needs vocab.json next to it", path));
        return detail::load_gpt2_vocab_merges((dir / "vocab.json").string(), path);
    }
    if (p.extension() == ".gguf" || is_gguf_file(path)) return detail::load_gguf_tokenizer(path);
    if (p.extension() == ".model")
        throw DataError(fmt::format("{}: SentencePiece .model files are not supported; use the model's "
                                    "tokenizer.json or a llama2.c tokenizer .bin", path));
    if (p.extension() == ".json" || first_non_blank(path) == '{') return detail::load_hf_tokenizer_json(path);
    return detail::load_llama2c_tokenizer(path, expected_vocab);
}

std::unique_ptr<Tokenizer> find_tokenizer_for_model(const std::string& model_path, int vocab_size) {
    std::error_code ec;
    fs::path p(model_path);
    if (!fs::exists(p, ec)) return nullptr;
    if (fs::is_directory(p, ec)) return load_from_folder(p, vocab_size, false);
    if (p.extension() == ".gguf" || is_gguf_file(model_path)) return detail::load_gguf_tokenizer(model_path, false);  // its own
    fs::path dir = p.parent_path();
    if (dir.empty()) dir = ".";
    return load_from_folder(dir, vocab_size, p.extension() == ".bin");
}

}  // namespace hs
