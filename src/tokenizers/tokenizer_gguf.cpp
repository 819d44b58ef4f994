// Tokenizers from a GGUF file's own metadata (llama.cpp's tokenizer.ggml.* keys):
//   "llama": SentencePiece vocabulary with scores, encoded as llama.cpp's llm_tokenizer_spm does
//            (spaces -> "▁", a "▁" prefix when add_space_prefix, UTF-8 characters merged pairwise by the
//            highest score of the merged token, leftmost on ties, byte fallback <0xNN> for the rest);
//   "gpt2":  byte-level BPE from tokens + merges, the pre-tokenizer regex chosen by tokenizer.ggml.pre.
// Token types (llama.cpp's llama_token_type): 1 normal, 2 unknown, 3 control, 4 user-defined,
// 5 unused, 6 byte. Control tokens are special (matched in text only with parse_special, dropped by
// decode with skip_special); user-defined tokens are matched in text always, as llama.cpp does.
#include <cstring>
#include <queue>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "errors.h"
#include "gguf.h"
#include "safetensors.h"
#include "tokenizer_internal.h"

namespace hs::detail {

namespace {

constexpr int kControl = 3, kUserDefined = 4, kByte = 6;
const std::string kSpace = "\xE2\x96\x81";  // U+2581 "▁"

struct GgufVocab {
    std::string path;
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int> types;
    std::optional<int32_t> bos, eos, unk;
    bool add_bos = false, add_eos = false, add_space_prefix = true;
};

class SpmTokenizer : public Tokenizer {
public:
    explicit SpmTokenizer(GgufVocab v) : v_(std::move(v)) {
        for (size_t i = 0; i < v_.tokens.size(); ++i) {
            lookup_.emplace(v_.tokens[i], static_cast<int32_t>(i));
            const int t = type(static_cast<int32_t>(i));
            if (t == kControl || t == kUserDefined) specials_.add(v_.tokens[i], static_cast<int32_t>(i));
            if (t == kUserDefined) user_only_.add(v_.tokens[i], static_cast<int32_t>(i));
        }
        byte_ids_.fill(-1);
        for (int b = 0; b < 256; ++b)
            if (auto it = lookup_.find(fmt::format("<0x{:02X}>", b)); it != lookup_.end()) byte_ids_[b] = it->second;
    }

    std::vector<int32_t> encode(const std::string& text, bool add_special, bool parse_special) const override {
        std::vector<int32_t> ids;
        if (add_special && v_.add_bos && v_.bos) ids.push_back(*v_.bos);
        const TokenMatcher& m = parse_special ? specials_ : user_only_;
        // llama.cpp (llama-vocab.cpp, SPM): a text fragment gets the "▁" prefix at the start and after
        // each special token matched in the text.
        bool prev_special = true;
        for (const auto& [seg, id] : m.empty() ? std::vector<std::pair<std::string, int32_t>>{{text, -1}} : m.split(text)) {
            if (id >= 0) {
                ids.push_back(id);
                prev_special = true;
            } else if (!seg.empty()) {
                encode_text(seg, prev_special && v_.add_space_prefix, ids);
                prev_special = false;
            }
        }
        if (add_special && v_.add_eos && v_.eos) ids.push_back(*v_.eos);
        return ids;
    }

    std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
        std::string out;
        bool start = true;
        for (int32_t id : ids) {
            check_id(id);
            if (skip_special && is_special(id)) continue;
            std::string piece = piece_text(id);
            // llama.cpp drops the space the "▁" prefix added, from the first text token.
            if (start && v_.add_space_prefix && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
            if (type(id) != kControl) start = false;
            out += piece;
        }
        return utf8_lossy(out);
    }

    std::string token_text(int32_t id) const override {
        check_id(id);
        return v_.tokens[static_cast<size_t>(id)];
    }
    std::string decode_piece(int32_t prev_id, int32_t id) const override {
        check_id(id);
        std::string piece = piece_text(id);
        if (v_.add_space_prefix && v_.bos && prev_id == *v_.bos && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        return piece;
    }
    int32_t vocab_size() const override { return static_cast<int32_t>(v_.tokens.size()); }
    std::optional<int32_t> bos_id() const override { return v_.bos; }
    std::optional<int32_t> eos_id() const override { return v_.eos; }
    bool is_special(int32_t id) const override { return id >= 0 && id < vocab_size() && type(id) == kControl; }
    std::optional<int32_t> token_to_id(const std::string& token) const override {
        auto it = lookup_.find(token);
        if (it == lookup_.end()) return std::nullopt;
        return it->second;
    }
    std::string kind() const override { return "gguf-spm"; }
    std::string source_path() const override { return v_.path; }

private:
    int type(int32_t id) const { return v_.types.empty() ? 1 : v_.types[static_cast<size_t>(id)]; }
    void check_id(int32_t id) const {
        if (id < 0 || id >= vocab_size())
            throw DataError(fmt::format("{}: token id {} out of range (vocabulary size {})", v_.path, id, vocab_size()));
    }
    std::string piece_text(int32_t id) const {
        const std::string& t = v_.tokens[static_cast<size_t>(id)];
        if (type(id) == kByte) {
            const int b = parse_byte_token(t);
            if (b >= 0) return std::string(1, static_cast<char>(b));
        }
        std::string out;
        for (size_t i = 0; i < t.size();) {
            if (t.compare(i, 3, kSpace) == 0) out += ' ', i += 3;
            else out += t[i++];
        }
        return out;
    }

    struct Symbol {
        size_t begin, len;
        int prev, next;
    };
    struct Bigram {
        float score;
        int left;
        size_t len;
        bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
    };

    void encode_text(const std::string& raw, bool prefix, std::vector<int32_t>& ids) const {
        std::string s = prefix ? kSpace : std::string();
        for (char c : raw) {
            if (c == ' ') s += kSpace;
            else s += c;
        }
        std::vector<Symbol> sym;
        for (size_t i = 0; i < s.size();) {
            const size_t n = std::min(utf8_char_len(s, i), s.size() - i);
            sym.push_back({i, n, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
            i += n;
        }
        if (sym.empty()) return;
        sym.back().next = -1;
        std::priority_queue<Bigram> q;
        auto try_add = [&](int l, int r) {
            if (l < 0 || r < 0) return;
            const size_t len = sym[l].len + sym[r].len;
            auto it = lookup_.find(s.substr(sym[l].begin, len));
            if (it == lookup_.end()) return;
            q.push({v_.scores.empty() ? 0.0f : v_.scores[static_cast<size_t>(it->second)], l, len});
        };
        for (size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
        while (!q.empty()) {
            const Bigram b = q.top();
            q.pop();
            Symbol& l = sym[b.left];
            if (l.len == 0 || l.next < 0) continue;
            Symbol& r = sym[l.next];
            if (l.len + r.len != b.len) continue;  // stale: one side merged since
            l.len += r.len;
            r.len = 0;
            l.next = r.next;
            if (r.next >= 0) sym[r.next].prev = b.left;
            try_add(l.prev, b.left);
            try_add(b.left, l.next);
        }
        for (int i = 0; i >= 0; i = sym[i].next) {
            const std::string piece = s.substr(sym[i].begin, sym[i].len);
            if (auto it = lookup_.find(piece); it != lookup_.end()) {
                ids.push_back(it->second);
                continue;
            }
            for (unsigned char c : piece) {
                if (byte_ids_[c] >= 0) ids.push_back(byte_ids_[c]);
                else if (v_.unk) ids.push_back(*v_.unk);
                else throw DataError(fmt::format("{}: cannot encode byte 0x{:02X}: no byte token and no unknown token", v_.path, c));
            }
        }
    }

    GgufVocab v_;
    std::unordered_map<std::string, int32_t> lookup_;
    TokenMatcher specials_, user_only_;
    std::array<int32_t, 256> byte_ids_{};
};

// Pre-tokenizer regexes by tokenizer.ggml.pre (llama.cpp's llama-vocab.cpp regex_exprs).
std::string pre_pattern(const std::string& pre, const std::string& path) {
    const std::string llama3 =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    const std::string qwen2 =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    if (pre.empty() || pre == "default" || pre == "gpt-2" || pre == "olmo" || pre == "pythia") return kGpt2Pattern;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe") return llama3;
    if (pre == "qwen2") return qwen2;
    throw DataError(fmt::format("{}: tokenizer.ggml.pre '{}' is not supported (gpt-2, llama-bpe, qwen2)", path, pre));
}

std::unique_ptr<Tokenizer> make_gpt2_type(const GgufFile& f, GgufVocab v) {
    const auto* merges = f.get_strings("tokenizer.ggml.merges");
    if (!merges) throw DataError(fmt::format("{}: a gpt2 tokenizer without tokenizer.ggml.merges", v.path));
    std::unordered_map<std::string, int32_t> vocab;
    for (size_t i = 0; i < v.tokens.size(); ++i) vocab.emplace(v.tokens[i], static_cast<int32_t>(i));
    BpeTokenizerParts parts;
    parts.path = v.path;
    parts.kind = "gguf-bpe-bytelevel";
    const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
    nlohmann::json pj = {{"type", "Sequence"},
                         {"pretokenizers",
                          {{{"type", "Split"}, {"pattern", {{"Regex", pre_pattern(pre, v.path)}}}, {"behavior", "Isolated"}, {"invert", false}},
                           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
    parts.pre_tokenizer = make_pre_tokenizer(pj, v.path + " (tokenizer.ggml.pre)");
    parts.decoder = make_byte_level_decoder();
    BpeOptions o;
    if (v.unk) o.unk_id = v.unk;
    parts.model = std::make_unique<BpeModel>(std::move(vocab), o);
    for (size_t i = 0; i < merges->size(); ++i) {
        const std::string& m = (*merges)[i];
        const size_t sp = m.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 >= m.size())
            throw DataError(fmt::format("{}: tokenizer.ggml.merges[{}] '{}' is not two tokens", v.path, i, m));
        auto l = parts.model->find(m.substr(0, sp)), r = parts.model->find(m.substr(sp + 1)), lr = parts.model->find(m.substr(0, sp) + m.substr(sp + 1));
        if (!l || !r || !lr) continue;  // as Hugging Face: a merge of unknown tokens never applies
        parts.model->add_merge(*l, *r, *lr);
    }
    for (size_t i = 0; i < v.tokens.size(); ++i) {
        const int t = v.types.empty() ? 1 : v.types[i];
        if (t == kControl || t == kUserDefined) parts.added.push_back({v.tokens[i], static_cast<int32_t>(i), t == kControl, false});
    }
    if (v.add_bos && v.bos) parts.prefix_ids.push_back(*v.bos);
    if (v.add_eos && v.eos) parts.suffix_ids.push_back(*v.eos);
    parts.bos = v.bos;
    parts.eos = v.eos;
    return make_bpe_tokenizer(std::move(parts));
}

}  // namespace

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path, bool required) {
    std::unique_ptr<GgufFile> f;
    try {
        f = std::make_unique<GgufFile>(path);
    } catch (const ModelLoadError& e) {
        throw DataError(e.what());
    }
    try {
        const auto model = f->get_string("tokenizer.ggml.model");
        if ((!model || *model == "none") && !required) return nullptr;  // the converter writes "none" for no tokenizer
        if (!model) throw DataError(fmt::format("{}: no tokenizer in the file (no tokenizer.ggml.model)", path));
        GgufVocab v;
        v.path = path;
        const auto* tokens = f->get_strings("tokenizer.ggml.tokens");
        if (!tokens || tokens->empty()) throw DataError(fmt::format("{}: no tokenizer.ggml.tokens", path));
        v.tokens = *tokens;
        const size_t n = v.tokens.size();
        if (const auto* s = f->get_numbers("tokenizer.ggml.scores")) {
            if (s->size() != n) throw DataError(fmt::format("{}: {} scores for {} tokens", path, s->size(), n));
            v.scores.assign(s->begin(), s->end());
        }
        if (const auto* t = f->get_numbers("tokenizer.ggml.token_type")) {
            if (t->size() != n) throw DataError(fmt::format("{}: {} token types for {} tokens", path, t->size(), n));
            for (double x : *t) v.types.push_back(static_cast<int>(x));
        }
        auto id = [&](const char* key) -> std::optional<int32_t> {
            auto x = f->get_int(key);
            if (!x) return std::nullopt;
            if (*x < 0 || *x >= static_cast<int64_t>(n))
                throw DataError(fmt::format("{}: {} is {}, outside the vocabulary of {}", path, key, *x, n));
            return static_cast<int32_t>(*x);
        };
        v.bos = id("tokenizer.ggml.bos_token_id");
        v.eos = id("tokenizer.ggml.eos_token_id");
        v.unk = id("tokenizer.ggml.unknown_token_id");
        if (*model == "llama") {
            if (v.scores.empty()) throw DataError(fmt::format("{}: a llama (SentencePiece) tokenizer without scores", path));
            v.add_bos = f->get_bool("tokenizer.ggml.add_bos_token").value_or(true);  // llama.cpp's SPM defaults
            v.add_eos = f->get_bool("tokenizer.ggml.add_eos_token").value_or(false);
            v.add_space_prefix = f->get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
            return std::make_unique<SpmTokenizer>(std::move(v));
        }
        if (*model == "gpt2") {
            v.add_bos = f->get_bool("tokenizer.ggml.add_bos_token").value_or(false);
            v.add_eos = f->get_bool("tokenizer.ggml.add_eos_token").value_or(false);
            return make_gpt2_type(*f, std::move(v));
        }
        throw DataError(fmt::format("{}: tokenizer.ggml.model '{}' is not supported (llama, gpt2)", path, *model));
    } catch (const ModelLoadError& e) {  // a mistyped key
        throw DataError(e.what());
    }
}

}  // namespace hs::detail
