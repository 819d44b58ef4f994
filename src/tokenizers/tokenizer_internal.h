// Private building blocks shared by the tokenizer_*.cpp files (not part of the public API):
// text helpers, the Hugging Face normalizer / pre-tokenizer / decoder stages, the BPE merge
// engine, and the loaders that load_tokenizer() dispatches to.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer.h"

namespace hs::detail {

// ---- UTF-8 and byte-level helpers (tokenizer_text.cpp) ----

// Length of the UTF-8 sequence starting at s[i]; malformed bytes count as one-byte characters so
// that arbitrary input still splits into pieces that byte fallback can handle.
size_t utf8_char_len(std::string_view s, size_t i);
std::string utf8_encode(uint32_t cp);
// Replaces each malformed UTF-8 subsequence by U+FFFD, as Rust's String::from_utf8_lossy does.
std::string utf8_lossy(std::string_view bytes);
bool utf8_valid(std::string_view bytes);
// GPT-2's reversible byte <-> printable-character map.
const std::array<std::string, 256>& byte_to_unicode();
// Inverse of byte_to_unicode(): codepoint -> byte, -1 when the codepoint is not in the map.
int unicode_to_byte(uint32_t cp);
// Decodes one codepoint at s[i] (len from utf8_char_len); malformed bytes yield 0xFFFFFFFF.
uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len);
// Whole file as bytes; throws DataError "<path>: cannot open ..." on failure.
std::string read_file_bytes(const std::string& path);
// "<0x0A>" -> 10; -1 for anything else.
int parse_byte_token(std::string_view tok);

// The GPT-2 pre-tokenizer pattern (also the one Hugging Face's ByteLevel uses).
extern const char* const kGpt2Pattern;

// PCRE2 regex (UTF + UCP, invalid UTF-8 tolerated), JIT-compiled when available.
class Regex {
public:
    // `where` names the file and field for the error thrown on a bad pattern.
    Regex(const std::string& pattern, const std::string& where);
    // Non-overlapping matches [begin, end) left to right; empty matches are skipped.
    void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

private:
    struct Impl;
    std::shared_ptr<Impl> impl_;
};

// ---- Hugging Face pipeline stages (tokenizer_text.cpp) ----

class Normalizer {
public:
    virtual ~Normalizer() = default;
    virtual void normalize(std::string& s) const = 0;
};
// nullptr for a JSON null; throws DataError naming `where` for unknown or malformed stages.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);

class PreTokenizer {
public:
    virtual ~PreTokenizer() = default;
    // Splits every piece further. at_start: pieces[0] begins at offset 0 of the original input
    // (Metaspace's prepend_scheme "first" depends on it).
    virtual void split(std::vector<std::string>& pieces, bool at_start) const = 0;
    virtual bool byte_level() const { return false; }
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where);
// GPT-2: ByteLevel(add_prefix_space=false, use_regex=true).
std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space, bool use_regex);

struct DecodeMode {
    // Piece mode decodes one token for streaming: byte tokens come out as raw bytes (possibly an
    // incomplete UTF-8 sequence) so that concatenated pieces give the right text.
    bool piece = false;
    // The first token is the start of the text (strip the prefix space SentencePiece added).
    bool at_start = true;
};
class Decoder {
public:
    virtual ~Decoder() = default;
    virtual void decode(std::vector<std::string>& tokens, const DecodeMode& mode) const = 0;
    virtual bool byte_level() const { return false; }
};
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);
std::unique_ptr<Decoder> make_byte_level_decoder();
// Default when tokenizer.json has no decoder: '▁' -> ' ', byte fallback, fuse, strip one space.
std::unique_ptr<Decoder> make_metaspace_like_decoder(bool strip_leading_space);

// Leftmost-longest matcher for added-token strings (what the Aho-Corasick trie in Hugging Face
// tokenizers does), over bytes.
class TokenMatcher {
public:
    void add(const std::string& content, int32_t id);
    bool empty() const { return nodes_.size() <= 1; }
    // Splits text into (text, -1) and (token text, id) segments, in order; no empty text segments.
    std::vector<std::pair<std::string, int32_t>> split(const std::string& text) const;

private:
    struct Node {
        std::vector<std::pair<unsigned char, int32_t>> next;  // byte -> node index
        int32_t id = -1;
    };
    std::vector<Node> nodes_{Node{}};
    std::array<bool, 256> first_{};
};

// ---- BPE merge engine (tokenizer_bpe.cpp) ----

struct BpeOptions {
    std::optional<int32_t> unk_id;
    bool byte_fallback = false;
    bool fuse_unk = false;
    bool ignore_merges = false;
    std::string continuing_subword_prefix;
    std::string end_of_word_suffix;
};

class BpeModel {
public:
    BpeModel(std::unordered_map<std::string, int32_t> vocab, BpeOptions opts);
    // Merges are ranked in the order added (rank 0 merges first).
    void add_merge(int32_t left, int32_t right, int32_t merged);
    const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
    std::optional<int32_t> find(const std::string& token) const;
    // Appends the ids of one pre-tokenized word; short words are cached.
    void encode_word(const std::string& word, std::vector<int32_t>& out) const;

private:
    void merge_word(const std::string& word, std::vector<int32_t>& out) const;

    std::unordered_map<std::string, int32_t> vocab_;
    BpeOptions opts_;
    std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (l,r) -> (rank, merged)
    int32_t next_rank_ = 0;
    std::array<int32_t, 256> byte_ids_{};  // <0xNN> ids, -1 when absent
    bool all_byte_ids_ = false;
    mutable std::mutex cache_mutex_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// ---- The tokenizer built from those stages (tokenizer_hf.cpp) ----

struct AddedToken {
    std::string content;
    int32_t id = -1;
    bool special = false;
    bool normalized = false;
};

struct BpeTokenizerParts {
    std::string path;  // for messages
    std::string kind;  // "hf-bpe-sentencepiece", "hf-bpe-bytelevel", "gpt2-bpe"
    std::unique_ptr<Normalizer> normalizer;
    std::unique_ptr<PreTokenizer> pre_tokenizer;
    std::unique_ptr<Decoder> decoder;
    std::unique_ptr<BpeModel> model;
    std::vector<AddedToken> added;
    std::vector<int32_t> prefix_ids, suffix_ids;  // what add_special puts around the text
    std::optional<int32_t> bos, eos;
};
std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeTokenizerParts parts);

// ---- Loaders ----
// tokenizer.json (+ tokenizer_config.json, special_tokens_map.json next to it).
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);
// GPT-2 vocab.json + merges.txt.
std::unique_ptr<Tokenizer> load_gpt2_vocab_merges(const std::string& vocab_path,
                                                  const std::string& merges_path);
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int expected_vocab);
// A GGUF file's own tokenizer (tokenizer.ggml.*: "llama" SentencePiece or "gpt2" byte-level BPE);
// nullptr when the file has none and !required.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path, bool required = true);

}  // namespace hs::detail
