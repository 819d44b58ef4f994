// BPE tokenizers from Hugging Face tokenizer.json and from GPT-2's vocab.json + merges.txt.
//
// Encoding follows the Rust `tokenizers` crate: added tokens that are not "normalized" are split
// out of the raw text first; each remaining segment is normalized, then split on the normalized
// forms of "normalized" added tokens, pre-tokenized, and BPE-encoded word by word.
// Deliberate simplifications:
//  - added tokens are matched only when parse_special is true; lstrip / rstrip / single_word are
//    ignored;
//  - model.dropout is ignored (encoding is deterministic);
//  - tokenizer_config.json's clean_up_tokenization_spaces is ignored (decode is exact);
//  - the NFC normalizer is a no-op (exact for text already in NFC).
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "errors.h"
#include "tokenizer_internal.h"

namespace hs::detail {

using nlohmann::json;

namespace {

class BpeTokenizer : public Tokenizer {
public:
    explicit BpeTokenizer(BpeTokenizerParts p) : p_(std::move(p)) {
        int32_t n = 0;
        for (const auto& [tok, id] : p_.model->vocab()) n = std::max(n, id + 1);
        for (const auto& a : p_.added) n = std::max(n, a.id + 1);
        // The id table is sized by the largest id: refuse ids far beyond the number of tokens the
        // file holds (real vocabularies are dense) before allocating for them.
        const size_t entries = p_.model->vocab().size() + p_.added.size();
        if (entries == 0) throw DataError(fmt::format("{}: the vocabulary is empty", p_.path));
        if (static_cast<size_t>(n) > 2 * entries + 1024)
            throw DataError(fmt::format("{}: token id {} but only {} tokens in the file (a corrupt vocabulary?)",
                                        p_.path, n - 1, entries));
        // Ids the tokenizer itself emits (template specials, BOS/EOS, unk) must be tokens.
        auto in_vocab = [&](int32_t id, const char* what) {
            if (id < 0 || id >= n)
                throw DataError(fmt::format("{}: {} id {} is outside the vocabulary ({} tokens)", p_.path, what, id, n));
        };
        for (auto id : p_.prefix_ids) in_vocab(id, "post_processor");
        for (auto id : p_.suffix_ids) in_vocab(id, "post_processor");
        if (p_.bos) in_vocab(*p_.bos, "bos_token");
        if (p_.eos) in_vocab(*p_.eos, "eos_token");
        id_to_token_.resize(static_cast<size_t>(n));
        special_.assign(static_cast<size_t>(n), false);
        skip_.assign(static_cast<size_t>(n), false);
        for (const auto& [tok, id] : p_.model->vocab()) id_to_token_[id] = tok;
        for (const auto& a : p_.added) {
            id_to_token_[a.id] = a.content;
            if (a.special) special_[a.id] = skip_[a.id] = true;
            added_ids_.emplace(a.content, a.id);
            if (!a.normalized) {
                raw_matcher_.add(a.content, a.id);
            } else {
                // The crate matches normalized tokens by their normalized form (so with a
                // Prepend("▁") normalizer "<s>" is looked for as "▁<s>").
                std::string c = a.content;
                if (p_.normalizer) p_.normalizer->normalize(c);
                norm_matcher_.add(c, a.id);
                // ... and keep it as the token's text (Tokenizer.id_to_token(1) is "▁<|start_story|>"
                // in tinystories-656k's file), so a decode that keeps specials writes " <|start_story|>"
                // mid-text as the crate does (tokenizers 0.23), and re-encoding finds it again.
                id_to_token_[a.id] = c;
                // The crate finds a token to skip by its stored text, which for these is the normalized
                // one: its decode(skip_special_tokens=True) keeps a special token the normalizer changes
                // (tinystories-656k: decode([80, 147, 2, 80, 147], True) == "On <|end_story|> On").
                // headscope's decode skips it (is_special); crate_skips says what the crate does.
                if (c != a.content) skip_[a.id] = false;
            }
        }
    }

    std::vector<int32_t> encode(const std::string& text, bool add_special,
                                bool parse_special) const override {
        std::vector<int32_t> out;
        if (add_special) out = p_.prefix_ids;
        if (!parse_special) {
            std::string s = text;
            if (p_.normalizer) p_.normalizer->normalize(s);
            encode_normalized(s, true, out);
        } else {
            bool at_start = true;
            for (auto& [seg, id] : split_on(raw_matcher_, text)) {
                if (id >= 0) {
                    out.push_back(id);
                } else {
                    if (p_.normalizer) p_.normalizer->normalize(seg);
                    for (auto& [sub, sub_id] : split_on(norm_matcher_, seg)) {
                        if (sub_id >= 0) out.push_back(sub_id);
                        else encode_normalized(sub, at_start, out);
                        at_start = false;
                    }
                }
                at_start = false;
            }
        }
        if (add_special) out.insert(out.end(), p_.suffix_ids.begin(), p_.suffix_ids.end());
        return out;
    }

    std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
        std::vector<std::string> toks;
        toks.reserve(ids.size());
        for (int32_t id : ids) {
            check_id(id);
            if (skip_special && special_[id]) continue;
            toks.push_back(id_to_token_[id]);
        }
        return run_decoder(std::move(toks), DecodeMode{false, true});
    }

    std::string token_text(int32_t id) const override {
        check_id(id);
        return id_to_token_[id];
    }

    std::string decode_piece(int32_t prev_id, int32_t id) const override {
        check_id(id);
        bool at_start = prev_id < 0 || (p_.bos && prev_id == *p_.bos);
        return run_decoder({id_to_token_[id]}, DecodeMode{true, at_start});
    }

    int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
    std::optional<int32_t> bos_id() const override { return p_.bos; }
    std::optional<int32_t> eos_id() const override { return p_.eos; }
    bool is_special(int32_t id) const override {
        return id >= 0 && id < vocab_size() && special_[id];
    }
    bool crate_skips(int32_t id) const override { return id >= 0 && id < vocab_size() && skip_[id]; }
    std::optional<int32_t> token_to_id(const std::string& token) const override {
        if (auto id = p_.model->find(token)) return id;
        auto it = added_ids_.find(token);
        if (it != added_ids_.end()) return it->second;
        return std::nullopt;
    }
    std::string kind() const override { return p_.kind; }
    std::string source_path() const override { return p_.path; }

private:
    static std::vector<std::pair<std::string, int32_t>> split_on(const TokenMatcher& m,
                                                                 const std::string& s) {
        if (m.empty()) {
            if (s.empty()) return {};
            return {{s, -1}};
        }
        return m.split(s);
    }

    void encode_normalized(const std::string& s, bool at_start, std::vector<int32_t>& out) const {
        if (s.empty()) return;
        std::vector<std::string> pieces{s};
        if (p_.pre_tokenizer) p_.pre_tokenizer->split(pieces, at_start);
        for (const auto& w : pieces) p_.model->encode_word(w, out);
    }

    std::string run_decoder(std::vector<std::string> toks, const DecodeMode& mode) const {
        if (p_.decoder) p_.decoder->decode(toks, mode);
        std::string out;
        for (const auto& t : toks) out += t;
        return out;
    }

    void check_id(int32_t id) const {
        if (id < 0 || id >= vocab_size())
            throw DataError(fmt::format("{}: token id {} out of range (vocabulary size {})", p_.path,
                                        id, vocab_size()));
    }

    BpeTokenizerParts p_;
    std::vector<std::string> id_to_token_;
    std::vector<bool> special_;
    std::vector<bool> skip_;  // the crate's decode(skip_special_tokens=True) drops these (crate_skips)
    std::unordered_map<std::string, int32_t> added_ids_;
    TokenMatcher raw_matcher_, norm_matcher_;
};

json parse_json_file(const std::string& path) {
    std::string text = read_file_bytes(path);
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw DataError(fmt::format("{}: not valid JSON: {}", path, e.what()));
    }
}

std::unordered_map<std::string, int32_t> read_vocab(const json& v, const std::string& where) {
    if (!v.is_object()) throw DataError(fmt::format("{}: expected an object of token -> id", where));
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(v.size());
    for (auto it = v.begin(); it != v.end(); ++it) {
        if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
            it.value().get<int64_t>() > INT32_MAX)
            throw DataError(fmt::format("{}[\"{}\"]: expected a non-negative integer id", where, it.key()));
        vocab.emplace(it.key(), it.value().get<int32_t>());
    }
    return vocab;
}

// Validates one merge against the vocabulary as the crate does (both halves and the merged
// token must exist) and adds it.
void add_merge(BpeModel& model, const std::string& a, const std::string& b,
               const std::string& prefix, const std::string& where) {
    auto ia = model.find(a);
    if (!ia) throw DataError(fmt::format("{}: token '{}' is not in the vocabulary", where, a));
    auto ib = model.find(b);
    if (!ib) throw DataError(fmt::format("{}: token '{}' is not in the vocabulary", where, b));
    std::string merged = a + (!prefix.empty() && b.rfind(prefix, 0) == 0 ? b.substr(prefix.size()) : b);
    auto im = model.find(merged);
    if (!im)
        throw DataError(fmt::format("{}: merged token '{}' is not in the vocabulary", where, merged));
    model.add_merge(*ia, *ib, *im);
}

// bos_token / eos_token in tokenizer_config.json or special_tokens_map.json: a string,
// {"content": ...}, or null.
std::optional<std::string> special_name(const json& cfg, const char* key, const std::string& where) {
    if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
    const json& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
        return v["content"].get<std::string>();
    throw DataError(fmt::format("{}: {}: expected a string or {{\"content\": ...}}", where, key));
}

struct Processing {
    std::vector<int32_t> prefix, suffix;
};

Processing read_post_processor(const json& j, const std::string& where) {
    Processing out;
    if (j.is_null()) return out;
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
        throw DataError(fmt::format("{}: expected an object with a string \"type\"", where));
    std::string type = j["type"].get<std::string>();
    if (type == "ByteLevel") return out;  // only adjusts offsets
    if (type == "Sequence") {
        if (!j.contains("processors") || !j["processors"].is_array())
            throw DataError(fmt::format("{}: missing array \"processors\"", where));
        for (size_t i = 0; i < j["processors"].size(); ++i) {
            Processing p = read_post_processor(j["processors"][i],
                                               fmt::format("{}.processors[{}]", where, i));
            out.prefix.insert(out.prefix.begin(), p.prefix.begin(), p.prefix.end());
            out.suffix.insert(out.suffix.end(), p.suffix.begin(), p.suffix.end());
        }
        return out;
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
        auto id_of = [&](const char* key) {
            if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][1].is_number_integer())
                throw DataError(fmt::format("{}.{}: expected [token, id]", where, key));
            return j[key][1].get<int32_t>();
        };
        out.prefix.push_back(id_of("cls"));
        out.suffix.push_back(id_of("sep"));
        return out;
    }
    if (type != "TemplateProcessing")
        throw DataError(fmt::format("{}: unsupported post_processor '{}'", where, type));
    if (!j.contains("single") || !j["single"].is_array())
        throw DataError(fmt::format("{}: missing array \"single\"", where));
    const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
    bool seen_sequence = false;
    for (size_t i = 0; i < j["single"].size(); ++i) {
        const json& item = j["single"][i];
        std::string w = fmt::format("{}.single[{}]", where, i);
        if (item.is_object() && item.contains("Sequence")) {
            seen_sequence = true;
        } else if (item.is_object() && item.contains("SpecialToken") &&
                   item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string()) {
            std::string name = item["SpecialToken"]["id"].get<std::string>();
            if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
                !specials[name]["ids"].is_array())
                throw DataError(fmt::format("{}: special token '{}' not in special_tokens", w, name));
            for (const auto& id : specials[name]["ids"]) {
                if (!id.is_number_integer())
                    throw DataError(fmt::format("{}: special token '{}' has a non-integer id", w, name));
                (seen_sequence ? out.suffix : out.prefix).push_back(id.get<int32_t>());
            }
        } else {
            throw DataError(fmt::format("{}: expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", w));
        }
    }
    return out;
}

json read_optional_json(const std::filesystem::path& p) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(p, ec)) return json();
    return parse_json_file(p.string());
}

// tokenizer.json's added_tokens ([] when absent).
std::vector<AddedToken> read_added_tokens(const json& j, const std::string& path) {
    std::vector<AddedToken> out;
    if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return out;
    if (!j["added_tokens"].is_array()) throw DataError(fmt::format("{}: added_tokens: expected an array", path));
    for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
        const json& a = j["added_tokens"][i];
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
            !a.contains("content") || !a["content"].is_string())
            throw DataError(fmt::format("{}: added_tokens[{}]: expected {{\"id\": n, \"content\": ...}}", path, i));
        AddedToken t;
        t.id = a["id"].get<int32_t>();
        t.content = a["content"].get<std::string>();
        t.special = a.value("special", false);
        t.normalized = a.value("normalized", !t.special);
        out.push_back(std::move(t));
    }
    return out;
}

// model.merges ("a b" strings or [a, b] pairs) into the model, in rank order.
void read_merges(const json& m, BpeModel& model, const std::string& prefix, const std::string& path) {
    if (!m.contains("merges") || !m["merges"].is_array())
        throw DataError(fmt::format("{}: model.merges: expected an array", path));
    const json& merges = m["merges"];
    for (size_t i = 0; i < merges.size(); ++i) {
        const json& e = merges[i];
        std::string where = fmt::format("{}: model.merges[{}]", path, i);
        std::string a, b;
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            size_t sp = s.find(' ');
            if (sp == std::string::npos) throw DataError(where + ": expected 'a b' or [a, b]");
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            a = e[0].get<std::string>();
            b = e[1].get<std::string>();
        } else {
            throw DataError(where + ": expected 'a b' or [a, b]");
        }
        add_merge(model, a, b, prefix, where);
    }
}

// BOS/EOS and whether encode() adds them: tokenizer_config.json, then special_tokens_map.json (both
// next to `path`), then the post-processor's template.
void read_special_tokens(BpeTokenizerParts& parts, const Processing& proc, const std::string& path) {
    namespace fs = std::filesystem;
    fs::path dir = fs::path(path).parent_path();
    fs::path cfg_path = dir / "tokenizer_config.json", map_path = dir / "special_tokens_map.json";
    json cfg = read_optional_json(cfg_path), smap = read_optional_json(map_path);
    // Built here (not via BpeTokenizer::token_to_id) because the tokenizer does not exist yet.
    auto lookup = [&](const std::string& name, const std::string& where) -> int32_t {
        if (auto id = parts.model->find(name)) return *id;
        for (const auto& a : parts.added)
            if (a.content == name) return a.id;
        throw DataError(fmt::format("{}: '{}' is not in the vocabulary", where, name));
    };
    for (const char* key : {"bos_token", "eos_token"}) {
        std::optional<int32_t> id;
        if (auto n = special_name(cfg, key, cfg_path.string()))
            id = lookup(*n, fmt::format("{}: {}", cfg_path.string(), key));
        else if (auto n2 = special_name(smap, key, map_path.string()))
            id = lookup(*n2, fmt::format("{}: {}", map_path.string(), key));
        else if (std::string(key) == "bos_token" && !proc.prefix.empty())
            id = proc.prefix.front();
        else if (std::string(key) == "eos_token" && !proc.suffix.empty())
            id = proc.suffix.back();
        (std::string(key) == "bos_token" ? parts.bos : parts.eos) = id;
    }
    // add_bos_token / add_eos_token override the template, as transformers' Llama-style fast
    // tokenizers rebuild their post-processor from them.
    auto flag = [&](const char* key) -> std::optional<bool> {
        if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
        if (!cfg[key].is_boolean())
            throw DataError(fmt::format("{}: {}: expected true or false", cfg_path.string(), key));
        return cfg[key].get<bool>();
    };
    if (auto add_bos = flag("add_bos_token"); add_bos && parts.bos) {
        bool has = !parts.prefix_ids.empty() && parts.prefix_ids.front() == *parts.bos;
        if (*add_bos && !has) parts.prefix_ids.insert(parts.prefix_ids.begin(), *parts.bos);
        if (!*add_bos && has) parts.prefix_ids.erase(parts.prefix_ids.begin());
    }
    if (auto add_eos = flag("add_eos_token"); add_eos && parts.eos) {
        bool has = !parts.suffix_ids.empty() && parts.suffix_ids.back() == *parts.eos;
        if (*add_eos && !has) parts.suffix_ids.push_back(*parts.eos);
        if (!*add_eos && has) parts.suffix_ids.pop_back();
    }
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeTokenizerParts parts) {
    return std::make_unique<BpeTokenizer>(std::move(parts));
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
    json j = parse_json_file(path);
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
        throw DataError(fmt::format("{}: missing \"model\" object (not a tokenizer.json?)", path));
    const json& m = j["model"];
    std::string type = "BPE";  // very old files omit model.type; only BPE has merges
    if (m.contains("type")) {
        if (!m["type"].is_string()) throw DataError(fmt::format("{}: model.type: expected a string", path));
        type = m["type"].get<std::string>();
    } else if (!m.contains("merges")) {
        throw DataError(fmt::format("{}: model.type missing and no model.merges", path));
    }
    if (type != "BPE")
        throw DataError(fmt::format("{}: unsupported tokenizer model type '{}' (only BPE is supported)",
                                    path, type));
    if (!m.contains("vocab")) throw DataError(fmt::format("{}: model.vocab missing", path));

    BpeTokenizerParts parts;
    parts.path = path;
    auto vocab = read_vocab(m["vocab"], path + ": model.vocab");
    auto opt_str = [&](const char* key) -> std::string {
        if (!m.contains(key) || m[key].is_null()) return "";
        if (!m[key].is_string()) throw DataError(fmt::format("{}: model.{}: expected a string", path, key));
        return m[key].get<std::string>();
    };
    auto opt_bool = [&](const char* key) {
        if (!m.contains(key) || m[key].is_null()) return false;
        if (!m[key].is_boolean()) throw DataError(fmt::format("{}: model.{}: expected true or false", path, key));
        return m[key].get<bool>();
    };
    BpeOptions opts;
    opts.byte_fallback = opt_bool("byte_fallback");
    opts.fuse_unk = opt_bool("fuse_unk");
    opts.ignore_merges = opt_bool("ignore_merges");
    opts.continuing_subword_prefix = opt_str("continuing_subword_prefix");
    opts.end_of_word_suffix = opt_str("end_of_word_suffix");

    parts.added = read_added_tokens(j, path);  // first: unk_token may live only there
    std::string unk = opt_str("unk_token");
    if (!unk.empty()) {
        auto it = vocab.find(unk);
        if (it != vocab.end()) {
            opts.unk_id = it->second;
        } else {
            for (const auto& a : parts.added)
                if (a.content == unk) opts.unk_id = a.id;
            if (!opts.unk_id)
                throw DataError(fmt::format("{}: model.unk_token '{}' is not in the vocabulary", path, unk));
        }
    }
    std::string prefix = opts.continuing_subword_prefix;
    parts.model = std::make_unique<BpeModel>(std::move(vocab), opts);

    read_merges(m, *parts.model, prefix, path);

    parts.normalizer = make_normalizer(j.value("normalizer", json()), path + ": normalizer");
    parts.pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()), path + ": pre_tokenizer");
    parts.decoder = make_decoder(j.value("decoder", json()), path + ": decoder");
    bool byte_level = (parts.pre_tokenizer && parts.pre_tokenizer->byte_level()) ||
                      (parts.decoder && parts.decoder->byte_level());
    parts.kind = byte_level ? "hf-bpe-bytelevel" : "hf-bpe-sentencepiece";
    if (!parts.decoder) {
        // The crate would join tokens with spaces; nobody wants that for a BPE model.
        parts.decoder = byte_level ? make_byte_level_decoder()
                                   : make_metaspace_like_decoder(parts.normalizer || parts.pre_tokenizer);
    }

    Processing proc = read_post_processor(j.value("post_processor", json()), path + ": post_processor");
    parts.prefix_ids = proc.prefix;
    parts.suffix_ids = proc.suffix;

    read_special_tokens(parts, proc, path);
    return make_bpe_tokenizer(std::move(parts));
}

std::unique_ptr<Tokenizer> load_gpt2_vocab_merges(const std::string& vocab_path,
                                                  const std::string& merges_path) {
    BpeTokenizerParts parts;
    parts.path = vocab_path;
    parts.kind = "gpt2-bpe";
    parts.model = std::make_unique<BpeModel>(read_vocab(parse_json_file(vocab_path), vocab_path), BpeOptions{});

    std::string text = read_file_bytes(merges_path);
    size_t line_no = 0, pos = 0;
    while (pos < text.size()) {
        size_t eol = text.find('\n', pos);
        if (eol == std::string::npos) eol = text.size();
        std::string line = text.substr(pos, eol - pos);
        pos = eol + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
        std::string where = fmt::format("{}: line {}", merges_path, line_no);
        size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
            throw DataError(where + ": expected 'a b'");
        add_merge(*parts.model, line.substr(0, sp), line.substr(sp + 1), "", where);
    }

    parts.pre_tokenizer = make_byte_level_pre_tokenizer(false, true);
    parts.decoder = make_byte_level_decoder();
    // GPT-2 uses <|endoftext|> as both BOS and EOS, but Hugging Face's GPT-2 tokenizer adds
    // neither when encoding, so add_special adds nothing here either.
    if (auto eot = parts.model->find("<|endoftext|>")) {
        parts.added.push_back(AddedToken{"<|endoftext|>", *eot, true, false});
        parts.bos = parts.eos = *eot;
    }
    return make_bpe_tokenizer(std::move(parts));
}

}  // namespace hs::detail
