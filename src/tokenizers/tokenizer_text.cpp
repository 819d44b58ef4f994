// Text helpers for the tokenizers: UTF-8, GPT-2's byte map, PCRE2 regexes, and the
// added-token matcher.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "errors.h"
#include "tokenizer_internal.h"

namespace hs::detail {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// Expected length of a sequence from its lead byte and the valid range of its second byte
// (the ranges exclude overlong forms and surrogates); 0 for a byte that cannot lead.
int lead_info(unsigned char b, unsigned char& lo, unsigned char& hi) {
    lo = 0x80;
    hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
        return 4;
    }
    return 0;
}

// Number of bytes of the (possibly truncated) sequence at s[i] that are well formed so far.
size_t valid_prefix(std::string_view s, size_t i, int& need) {
    unsigned char lo, hi;
    need = lead_info(static_cast<unsigned char>(s[i]), lo, hi);
    if (need <= 1) return 1;
    size_t k = 1;
    while (static_cast<int>(k) < need && i + k < s.size()) {
        auto b = static_cast<unsigned char>(s[i + k]);
        bool ok = k == 1 ? (b >= lo && b <= hi) : is_cont(b);
        if (!ok) break;
        ++k;
    }
    return k;
}

}  // namespace

size_t utf8_char_len(std::string_view s, size_t i) {
    int need = 0;
    size_t k = valid_prefix(s, i, need);
    return (need > 1 && static_cast<int>(k) == need) ? k : 1;
}

uint32_t utf8_decode_at(std::string_view s, size_t i, size_t len) {
    auto b = static_cast<unsigned char>(s[i]);
    if (len == 1) return b < 0x80 ? b : 0xFFFFFFFFu;
    uint32_t cp = b & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    return cp;
}

std::string utf8_encode(uint32_t cp) {
    std::string out;
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return out;
}

std::string utf8_lossy(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    size_t i = 0;
    while (i < bytes.size()) {
        int need = 0;
        size_t k = valid_prefix(bytes, i, need);
        if (need == 1 || (need > 1 && static_cast<int>(k) == need)) {
            out.append(bytes.substr(i, k));
        } else {
            out += "\xEF\xBF\xBD";  // one U+FFFD per maximal ill-formed subpart
        }
        i += k;
    }
    return out;
}

bool utf8_valid(std::string_view bytes) {
    size_t i = 0;
    while (i < bytes.size()) {
        int need = 0;
        size_t k = valid_prefix(bytes, i, need);
        if (need == 0 || (need > 1 && static_cast<int>(k) != need)) return false;
        i += k;
    }
    return true;
}

const std::array<std::string, 256>& byte_to_unicode() {
    static const std::array<std::string, 256> table = [] {
        std::array<std::string, 256> t;
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            t[b] = utf8_encode(printable ? static_cast<uint32_t>(b) : 256u + extra++);
        }
        return t;
    }();
    return table;
}

int unicode_to_byte(uint32_t cp) {
    static const std::array<int16_t, 512> inverse = [] {
        std::array<int16_t, 512> inv;
        inv.fill(-1);
        const auto& fwd = byte_to_unicode();
        for (int b = 0; b < 256; ++b) {
            const std::string& s = fwd[b];
            inv[utf8_decode_at(s, 0, s.size())] = static_cast<int16_t>(b);
        }
        return inv;
    }();
    return cp < inverse.size() ? inverse[cp] : -1;
}

std::string read_file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw DataError(fmt::format("{}: cannot open file", path));
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw DataError(fmt::format("{}: read error", path));
    return ss.str();
}

int parse_byte_token(std::string_view tok) {
    if (tok.size() != 6 || tok.substr(0, 3) != "<0x" || tok[5] != '>') return -1;
    int v = 0;
    for (size_t i = 3; i < 5; ++i) {
        char c = tok[i];
        int d = (c >= '0' && c <= '9') ? c - '0'
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                         : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

// ---- Regex ----

struct Regex::Impl {
    pcre2_code* code = nullptr;
    ~Impl() {
        if (code) pcre2_code_free(code);
    }
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(std::make_shared<Impl>()) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // MATCH_INVALID_UTF: user text is not guaranteed to be valid UTF-8, and matching must not fail.
    impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off,
                                nullptr);
    if (!impl_->code) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof(buf));
        throw DataError(fmt::format("{}: cannot compile regex /{}/ at offset {}: {}", where,
                                    pattern, static_cast<size_t>(err_off),
                                    reinterpret_cast<const char*>(buf)));
    }
    // JIT is an optimisation only: a failure (e.g. unsupported platform) leaves the interpreter.
    pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
    out.clear();
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos <= text.size()) {
        int rc = pcre2_match(impl_->code, subject, text.size(), pos, 0, md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(rc, buf, sizeof(buf));
            throw DataError(fmt::format("tokenizer regex match failed: {}",
                                        reinterpret_cast<const char*>(buf)));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        size_t b = ov[0], e = ov[1];
        if (e > b) {
            out.emplace_back(b, e);
            pos = e;
        } else {
            if (b >= text.size()) break;
            pos = b + utf8_char_len(text, b);
        }
    }
}

// ---- TokenMatcher ----

void TokenMatcher::add(const std::string& content, int32_t id) {
    if (content.empty()) return;
    int32_t node = 0;
    for (char ch : content) {
        auto c = static_cast<unsigned char>(ch);
        int32_t child = -1;
        for (const auto& [b, n] : nodes_[node].next)
            if (b == c) child = n;
        if (child < 0) {
            child = static_cast<int32_t>(nodes_.size());
            nodes_[node].next.emplace_back(c, child);
            nodes_.emplace_back();
        }
        node = child;
    }
    nodes_[node].id = id;
    first_[static_cast<unsigned char>(content[0])] = true;
}

std::vector<std::pair<std::string, int32_t>> TokenMatcher::split(const std::string& text) const {
    std::vector<std::pair<std::string, int32_t>> out;
    size_t seg = 0, i = 0;
    while (i < text.size()) {
        if (!first_[static_cast<unsigned char>(text[i])]) {
            ++i;
            continue;
        }
        int32_t node = 0, best_id = -1;
        size_t best_end = i;
        for (size_t k = i; k < text.size(); ++k) {
            auto c = static_cast<unsigned char>(text[k]);
            int32_t child = -1;
            for (const auto& [b, n] : nodes_[node].next)
                if (b == c) child = n;
            if (child < 0) break;
            node = child;
            if (nodes_[node].id >= 0) {
                best_id = nodes_[node].id;
                best_end = k + 1;
            }
        }
        if (best_id < 0) {
            ++i;
            continue;
        }
        if (i > seg) out.emplace_back(text.substr(seg, i - seg), -1);
        out.emplace_back(text.substr(i, best_end - i), best_id);
        i = seg = best_end;
    }
    if (seg < text.size()) out.emplace_back(text.substr(seg), -1);
    return out;
}

}  // namespace hs::detail
