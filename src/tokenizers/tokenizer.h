// Tokenizers: Hugging Face tokenizer.json BPE (SentencePiece-style and GPT-2 byte-level),
// GPT-2 vocab.json + merges.txt, and llama2.c tokenizer .bin (score-driven merges).
// No torch here: ids are plain int32.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hs {

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Encode text. add_special: prepend BOS (and append EOS) as the tokenizer's own
    // configuration says (tokenizer.json post_processor / tokenizer_config.json add_bos_token;
    // llama2.c: BOS only). Added/special-token strings inside `text` are matched as single
    // tokens only when parse_special is true.
    virtual std::vector<int32_t> encode(const std::string& text, bool add_special = true,
                                        bool parse_special = false) const = 0;
    // Decode ids to text (byte fallback fused, SentencePiece '▁' -> ' ', GPT-2 byte map undone).
    virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const = 0;
    // The text of one token as the vocabulary spells it (for tables: "▁the", "Ġthe", "<0x0A>").
    virtual std::string token_text(int32_t id) const = 0;
    // Decoded text of one token in context-free form (for printing a single generated token).
    virtual std::string decode_piece(int32_t prev_id, int32_t id) const = 0;
    virtual int32_t vocab_size() const = 0;
    virtual std::optional<int32_t> bos_id() const = 0;
    virtual std::optional<int32_t> eos_id() const = 0;
    virtual bool is_special(int32_t id) const = 0;
    // Whether the Hugging Face tokenizers crate (0.23) drops this id in decode(skip_special_tokens=True):
    // a special token, except an added token stored normalized ("▁<|end_story|>"), which it cannot
    // find by that text and keeps. For decoding as a reference script's tokenizer does.
    virtual bool crate_skips(int32_t id) const { return is_special(id); }
    // Token id of an exact vocabulary string, if present.
    virtual std::optional<int32_t> token_to_id(const std::string& token) const = 0;
    // "hf-bpe-sentencepiece", "hf-bpe-bytelevel", "gpt2-bpe", "llama2c"
    virtual std::string kind() const = 0;
    virtual std::string source_path() const = 0;
};

// Load from a path: a tokenizer.json file, a folder holding tokenizer.json (with optional
// tokenizer_config.json / special_tokens_map.json) or vocab.json + merges.txt, or a llama2.c
// tokenizer .bin (vocab_size from the file when expected_vocab <= 0; llama2.c's format does not
// store the count, so pass the model's vocab_size when known).
// Throws hs::DataError (see errors.h) naming the file and the problem.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int expected_vocab = -1);

// Find a tokenizer for a model path: for a folder, tokenizer.json or vocab.json+merges.txt in it;
// for a llama2.c .bin, tok<V>.bin / tokenizer.bin next to it. Returns nullptr when none is found.
std::unique_ptr<Tokenizer> find_tokenizer_for_model(const std::string& model_path, int vocab_size);

}  // namespace hs
