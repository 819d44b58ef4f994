// Hugging Face tokenizer.json pipeline stages: normalizers, pre-tokenizers and decoders, built
// from their JSON. Each stage follows the semantics of the Rust `tokenizers` crate on plain
// strings (no offset tracking: headscope never needs character offsets).
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "errors.h"
#include "tokenizer_internal.h"

namespace hs::detail {

using nlohmann::json;

namespace {

const char* const kSpiece = "\xE2\x96\x81";  // U+2581 '▁'

std::string type_of(const json& j, const std::string& where) {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
        throw DataError(fmt::format("{}: expected an object with a string \"type\"", where));
    return j["type"].get<std::string>();
}

std::string get_str(const json& j, const char* key, const std::string& where,
                    std::optional<std::string> dflt = std::nullopt) {
    if (!j.contains(key) || j[key].is_null()) {
        if (dflt) return *dflt;
        throw DataError(fmt::format("{}: missing \"{}\"", where, key));
    }
    if (!j[key].is_string()) throw DataError(fmt::format("{}.{}: expected a string", where, key));
    return j[key].get<std::string>();
}

bool get_bool(const json& j, const char* key, const std::string& where, bool dflt) {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    if (!j[key].is_boolean()) throw DataError(fmt::format("{}.{}: expected true or false", where, key));
    return j[key].get<bool>();
}

const json& get_array(const json& j, const char* key, const std::string& where) {
    if (!j.contains(key) || !j[key].is_array())
        throw DataError(fmt::format("{}: missing array \"{}\"", where, key));
    return j[key];
}

// A {"String": s} or {"Regex": r} pattern from tokenizer.json.
class Pattern {
public:
    Pattern(const json& j, const std::string& where) {
        if (j.is_object() && j.contains("String") && j["String"].is_string()) {
            literal_ = j["String"].get<std::string>();
            if (literal_.empty()) throw DataError(fmt::format("{}: empty pattern", where));
        } else if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
            regex_.emplace(j["Regex"].get<std::string>(), where);
        } else {
            throw DataError(fmt::format("{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where));
        }
    }
    explicit Pattern(Regex re) : regex_(std::move(re)) {}

    void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
        if (regex_) return regex_->find_all(text, out);
        out.clear();
        for (size_t p = text.find(literal_); p != std::string_view::npos;
             p = text.find(literal_, p + literal_.size()))
            out.emplace_back(p, p + literal_.size());
    }

    std::string replace_all(const std::string& text, const std::string& content) const {
        std::vector<std::pair<size_t, size_t>> m;
        find_all(text, m);
        if (m.empty()) return text;
        std::string out;
        size_t last = 0;
        for (auto [b, e] : m) {
            out.append(text, last, b - last);
            out += content;
            last = e;
        }
        out.append(text, last, std::string::npos);
        return out;
    }

private:
    std::string literal_;
    std::optional<Regex> regex_;
};

// ---- normalizers ----

class SequenceNormalizer : public Normalizer {
public:
    std::vector<std::unique_ptr<Normalizer>> parts;
    void normalize(std::string& s) const override {
        for (const auto& p : parts) p->normalize(s);
    }
};

class PrependNormalizer : public Normalizer {
public:
    explicit PrependNormalizer(std::string p) : prefix_(std::move(p)) {}
    void normalize(std::string& s) const override {
        if (!s.empty()) s.insert(0, prefix_);  // the crate leaves empty strings alone
    }

private:
    std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
public:
    ReplaceNormalizer(Pattern p, std::string c) : pattern_(std::move(p)), content_(std::move(c)) {}
    void normalize(std::string& s) const override { s = pattern_.replace_all(s, content_); }

private:
    Pattern pattern_;
    std::string content_;
};

// NFC is accepted as a no-op: it is exact for ASCII and for text already in NFC (what nearly
// all real input is); decomposed input may tokenize differently from the crate.
class NoopNormalizer : public Normalizer {
public:
    void normalize(std::string&) const override {}
};

// ---- pre-tokenizers ----

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `piece` around the matches as the crate's NormalizedString::split does.
void split_piece(const std::string& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<std::string>& out) {
    struct Seg {
        size_t b, e;
        bool is_match;
    };
    std::vector<Seg> segs;
    size_t last = 0;
    for (auto [b, e] : matches) {
        if (b > last) segs.push_back({last, b, invert});
        segs.push_back({b, e, !invert});
        last = e;
    }
    if (last < piece.size()) segs.push_back({last, piece.size(), invert});

    std::vector<std::pair<size_t, size_t>> parts;
    bool prev_match = false;
    switch (behavior) {
        case SplitBehavior::kRemoved:
            for (const auto& s : segs)
                if (!s.is_match) parts.emplace_back(s.b, s.e);
            break;
        case SplitBehavior::kIsolated:
            for (const auto& s : segs) parts.emplace_back(s.b, s.e);
            break;
        case SplitBehavior::kMergedWithPrevious:
            for (const auto& s : segs) {
                if (s.is_match && !prev_match && !parts.empty()) parts.back().second = s.e;
                else parts.emplace_back(s.b, s.e);
                prev_match = s.is_match;
            }
            break;
        case SplitBehavior::kMergedWithNext:
            for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
                if (it->is_match && !prev_match && !parts.empty()) parts.back().first = it->b;
                else parts.emplace_back(it->b, it->e);
                prev_match = it->is_match;
            }
            std::reverse(parts.begin(), parts.end());
            break;
        case SplitBehavior::kContiguous:
            for (size_t i = 0; i < segs.size(); ++i) {
                if (i > 0 && segs[i].is_match == prev_match) parts.back().second = segs[i].e;
                else parts.emplace_back(segs[i].b, segs[i].e);
                prev_match = segs[i].is_match;
            }
            break;
    }
    for (auto [b, e] : parts)
        if (e > b) out.push_back(piece.substr(b, e - b));
}

class SplitPreTokenizer : public PreTokenizer {
public:
    SplitPreTokenizer(Pattern p, SplitBehavior b, bool invert)
        : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
    void split(std::vector<std::string>& pieces, bool) const override {
        std::vector<std::string> out;
        std::vector<std::pair<size_t, size_t>> m;
        for (const auto& piece : pieces) {
            pattern_.find_all(piece, m);
            split_piece(piece, m, behavior_, invert_, out);
        }
        pieces.swap(out);
    }

private:
    Pattern pattern_;
    SplitBehavior behavior_;
    bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
public:
    ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
        : add_prefix_space_(add_prefix_space) {
        if (use_regex) regex_.emplace(kGpt2Pattern, "GPT-2 pre-tokenizer");
    }
    bool byte_level() const override { return true; }
    void split(std::vector<std::string>& pieces, bool) const override {
        std::vector<std::string> out;
        std::vector<std::pair<size_t, size_t>> m;
        for (auto& piece : pieces) {
            if (add_prefix_space_ && piece.rfind(' ', 0) != 0) piece.insert(0, " ");
            if (regex_) {
                regex_->find_all(piece, m);
                split_piece(piece, m, SplitBehavior::kIsolated, false, out);
            } else if (!piece.empty()) {
                out.push_back(std::move(piece));
            }
        }
        const auto& map = byte_to_unicode();
        for (auto& s : out) {
            std::string mapped;
            mapped.reserve(s.size() * 2);
            for (char c : s) mapped += map[static_cast<unsigned char>(c)];
            s.swap(mapped);
        }
        pieces.swap(out);
    }

private:
    bool add_prefix_space_;
    std::optional<Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

PrependScheme read_prepend_scheme(const json& j, const std::string& where) {
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
        std::string s = get_str(j, "prepend_scheme", where);
        if (s == "always") return PrependScheme::kAlways;
        if (s == "first") return PrependScheme::kFirst;
        if (s == "never") return PrependScheme::kNever;
        throw DataError(fmt::format("{}.prepend_scheme: unknown value '{}'", where, s));
    }
    // Files written before prepend_scheme existed use add_prefix_space (default true).
    return get_bool(j, "add_prefix_space", where, true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

class MetaspacePreTokenizer : public PreTokenizer {
public:
    MetaspacePreTokenizer(std::string rep, PrependScheme scheme, bool split)
        : rep_(std::move(rep)),
          scheme_(scheme),
          split_(split),
          space_pat_(json{{"String", " "}}, "Metaspace"),
          rep_pat_(json{{"String", rep_}}, "Metaspace.replacement") {}
    void split(std::vector<std::string>& pieces, bool at_start) const override {
        std::vector<std::string> out;
        std::vector<std::pair<size_t, size_t>> m;
        for (size_t k = 0; k < pieces.size(); ++k) {
            if (pieces[k].empty()) continue;
            std::string s = space_pat_.replace_all(pieces[k], rep_);
            bool prepend = scheme_ == PrependScheme::kAlways ||
                           (scheme_ == PrependScheme::kFirst && k == 0 && at_start);
            if (prepend && s.rfind(rep_, 0) != 0) s.insert(0, rep_);
            if (split_) {
                rep_pat_.find_all(s, m);
                split_piece(s, m, SplitBehavior::kMergedWithNext, false, out);
            } else {
                out.push_back(std::move(s));
            }
        }
        pieces.swap(out);
    }

private:
    std::string rep_;
    PrependScheme scheme_;
    bool split_;
    Pattern space_pat_, rep_pat_;
};

class SequencePreTokenizer : public PreTokenizer {
public:
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    void split(std::vector<std::string>& pieces, bool at_start) const override {
        for (const auto& p : parts) p->split(pieces, at_start);
    }
    bool byte_level() const override {
        return std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p->byte_level(); });
    }
};

// ---- decoders ----

class SequenceDecoder : public Decoder {
public:
    std::vector<std::unique_ptr<Decoder>> parts;
    void decode(std::vector<std::string>& t, const DecodeMode& mode) const override {
        for (const auto& p : parts) p->decode(t, mode);
    }
    bool byte_level() const override {
        return std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p->byte_level(); });
    }
};

class ReplaceDecoder : public Decoder {
public:
    ReplaceDecoder(Pattern p, std::string c) : pattern_(std::move(p)), content_(std::move(c)) {}
    void decode(std::vector<std::string>& t, const DecodeMode&) const override {
        for (auto& s : t) s = pattern_.replace_all(s, content_);
    }

private:
    Pattern pattern_;
    std::string content_;
};

class ByteFallbackDecoder : public Decoder {
public:
    void decode(std::vector<std::string>& t, const DecodeMode& mode) const override {
        std::vector<std::string> out;
        std::string bytes;
        size_t n_bytes = 0;
        auto flush = [&] {
            if (n_bytes == 0) return;
            if (mode.piece || utf8_valid(bytes)) {
                out.push_back(bytes);
            } else {
                for (size_t i = 0; i < n_bytes; ++i) out.emplace_back("\xEF\xBF\xBD");
            }
            bytes.clear();
            n_bytes = 0;
        };
        for (auto& s : t) {
            int b = parse_byte_token(s);
            if (b >= 0) {
                bytes += static_cast<char>(b);
                ++n_bytes;
            } else {
                flush();
                out.push_back(std::move(s));
            }
        }
        flush();
        t.swap(out);
    }
};

class FuseDecoder : public Decoder {
public:
    void decode(std::vector<std::string>& t, const DecodeMode&) const override {
        std::string all;
        for (const auto& s : t) all += s;
        t.assign(1, std::move(all));
    }
};

class StripDecoder : public Decoder {
public:
    StripDecoder(std::string content, size_t start, size_t stop)
        : content_(std::move(content)), start_(start), stop_(stop) {}
    void decode(std::vector<std::string>& t, const DecodeMode& mode) const override {
        const size_t n = content_.size();
        for (auto& s : t) {
            // A streamed piece is neither the start (unless it follows BOS) nor the end of the text.
            size_t start = (mode.piece && !mode.at_start) ? 0 : start_;
            size_t stop = mode.piece ? 0 : stop_;
            size_t b = 0, e = s.size();
            for (size_t i = 0; i < start && e - b >= n && s.compare(b, n, content_) == 0; ++i) b += n;
            for (size_t i = 0; i < stop && e - b >= n && s.compare(e - n, n, content_) == 0; ++i) e -= n;
            s = s.substr(b, e - b);
        }
    }

private:
    std::string content_;
    size_t start_, stop_;
};

class ByteLevelDecoder : public Decoder {
public:
    bool byte_level() const override { return true; }
    void decode(std::vector<std::string>& t, const DecodeMode& mode) const override {
        std::string bytes;
        for (const auto& s : t) {
            for (size_t i = 0; i < s.size();) {
                size_t len = utf8_char_len(s, i);
                int b = unicode_to_byte(utf8_decode_at(s, i, len));
                // Characters outside the byte map (e.g. in added tokens) pass through unchanged.
                if (b >= 0) bytes += static_cast<char>(b);
                else bytes.append(s, i, len);
                i += len;
            }
        }
        t.assign(1, mode.piece ? bytes : utf8_lossy(bytes));
    }
};

class MetaspaceDecoder : public Decoder {
public:
    MetaspaceDecoder(const std::string& rep, bool strip_first)
        : rep_(json{{"String", rep}}, "Metaspace.replacement"), strip_first_(strip_first) {}
    void decode(std::vector<std::string>& t, const DecodeMode& mode) const override {
        for (size_t i = 0; i < t.size(); ++i) {
            // As in the crate: the first token loses every replacement char, not just a leading one.
            bool first = i == 0 && mode.at_start && strip_first_;
            t[i] = rep_.replace_all(t[i], first ? "" : " ");
        }
    }

private:
    Pattern rep_;
    bool strip_first_;
};

SplitBehavior read_behavior(const json& j, const std::string& where) {
    std::string b = get_str(j, "behavior", where, std::string("Isolated"));
    if (b == "Removed") return SplitBehavior::kRemoved;
    if (b == "Isolated") return SplitBehavior::kIsolated;
    if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
    if (b == "Contiguous") return SplitBehavior::kContiguous;
    throw DataError(fmt::format("{}.behavior: unknown split behavior '{}'", where, b));
}

size_t get_count(const json& j, const char* key, const std::string& where) {
    if (!j.contains(key) || j[key].is_null()) return 0;
    if (!j[key].is_number_unsigned()) throw DataError(fmt::format("{}.{}: expected a count", where, key));
    return j[key].get<size_t>();
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
    if (j.is_null()) return nullptr;
    std::string type = type_of(j, where);
    if (type == "Sequence") {
        auto seq = std::make_unique<SequenceNormalizer>();
        const json& arr = get_array(j, "normalizers", where);
        for (size_t i = 0; i < arr.size(); ++i) {
            auto n = make_normalizer(arr[i], fmt::format("{}.normalizers[{}]", where, i));
            if (n) seq->parts.push_back(std::move(n));
        }
        return seq;
    }
    if (type == "Prepend") return std::make_unique<PrependNormalizer>(get_str(j, "prepend", where));
    if (type == "Replace") {
        if (!j.contains("pattern")) throw DataError(fmt::format("{}: missing \"pattern\"", where));
        return std::make_unique<ReplaceNormalizer>(Pattern(j["pattern"], where + ".pattern"),
                                                   get_str(j, "content", where));
    }
    if (type == "NFC") return std::make_unique<NoopNormalizer>();
    throw DataError(fmt::format("{}: unsupported normalizer '{}'", where, type));
}

std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(bool add_prefix_space, bool use_regex) {
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, use_regex);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
    if (j.is_null()) return nullptr;
    std::string type = type_of(j, where);
    if (type == "Sequence") {
        auto seq = std::make_unique<SequencePreTokenizer>();
        const json& arr = get_array(j, "pretokenizers", where);
        for (size_t i = 0; i < arr.size(); ++i) {
            auto p = make_pre_tokenizer(arr[i], fmt::format("{}.pretokenizers[{}]", where, i));
            if (p) seq->parts.push_back(std::move(p));
        }
        return seq;
    }
    if (type == "ByteLevel")
        return make_byte_level_pre_tokenizer(get_bool(j, "add_prefix_space", where, true),
                                             get_bool(j, "use_regex", where, true));
    if (type == "Split") {
        if (!j.contains("pattern")) throw DataError(fmt::format("{}: missing \"pattern\"", where));
        return std::make_unique<SplitPreTokenizer>(Pattern(j["pattern"], where + ".pattern"),
                                                   read_behavior(j, where),
                                                   get_bool(j, "invert", where, false));
    }
    if (type == "Metaspace")
        return std::make_unique<MetaspacePreTokenizer>(
            get_str(j, "replacement", where, std::string(kSpiece)), read_prepend_scheme(j, where),
            get_bool(j, "split", where, true));
    if (type == "Digits") {
        bool single = get_bool(j, "individual_digits", where, false);
        return std::make_unique<SplitPreTokenizer>(
            Pattern(Regex(single ? R"(\p{N})" : R"(\p{N}+)", where)), SplitBehavior::kIsolated, false);
    }
    if (type == "WhitespaceSplit")
        return std::make_unique<SplitPreTokenizer>(Pattern(Regex(R"(\s+)", where)),
                                                   SplitBehavior::kRemoved, false);
    if (type == "Whitespace")
        return std::make_unique<SplitPreTokenizer>(Pattern(Regex(R"(\w+|[^\w\s]+)", where)),
                                                   SplitBehavior::kRemoved, true);
    throw DataError(fmt::format("{}: unsupported pre_tokenizer '{}'", where, type));
}

std::unique_ptr<Decoder> make_byte_level_decoder() { return std::make_unique<ByteLevelDecoder>(); }

std::unique_ptr<Decoder> make_metaspace_like_decoder(bool strip_leading_space) {
    auto seq = std::make_unique<SequenceDecoder>();
    seq->parts.push_back(std::make_unique<ReplaceDecoder>(Pattern(json{{"String", kSpiece}}, "decoder"), " "));
    seq->parts.push_back(std::make_unique<ByteFallbackDecoder>());
    seq->parts.push_back(std::make_unique<FuseDecoder>());
    if (strip_leading_space) seq->parts.push_back(std::make_unique<StripDecoder>(" ", 1, 0));
    return seq;
}

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
    if (j.is_null()) return nullptr;
    std::string type = type_of(j, where);
    if (type == "Sequence") {
        auto seq = std::make_unique<SequenceDecoder>();
        const json& arr = get_array(j, "decoders", where);
        for (size_t i = 0; i < arr.size(); ++i) {
            auto d = make_decoder(arr[i], fmt::format("{}.decoders[{}]", where, i));
            if (d) seq->parts.push_back(std::move(d));
        }
        return seq;
    }
    if (type == "Replace") {
        if (!j.contains("pattern")) throw DataError(fmt::format("{}: missing \"pattern\"", where));
        return std::make_unique<ReplaceDecoder>(Pattern(j["pattern"], where + ".pattern"),
                                                get_str(j, "content", where));
    }
    if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
    if (type == "Fuse") return std::make_unique<FuseDecoder>();
    if (type == "Strip") {
        std::string content = get_str(j, "content", where, std::string(" "));
        return std::make_unique<StripDecoder>(content, get_count(j, "start", where),
                                              get_count(j, "stop", where));
    }
    if (type == "ByteLevel") return make_byte_level_decoder();
    if (type == "Metaspace")
        return std::make_unique<MetaspaceDecoder>(get_str(j, "replacement", where, std::string(kSpiece)),
                                                  read_prepend_scheme(j, where) != PrependScheme::kNever);
    throw DataError(fmt::format("{}: unsupported decoder '{}'", where, type));
}

}  // namespace hs::detail
