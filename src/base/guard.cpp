#include "guard.h"

#include "errors.h"
#include "util.h"

#include <fmt/format.h>
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace hs {

// Length of the well-formed UTF-8 sequence at s[i] (Unicode 15, table 3-7), or 0 when malformed.
static size_t utf8_sequence(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    } else {
        return 0;
    }
    if (i + n > s.size()) return 0;
    if (b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (size_t k = 2; k < n; ++k)
        if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
    return n;
}

void check_utf8(std::string_view text, const std::string& path) {
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < text.size();) {
        if (text[i] == '\n') {
            ++line;
            line_start = ++i;
            continue;
        }
        const size_t n = utf8_sequence(text, i);
        if (n == 0)
            throw DataError(fmt::format("{}:{}: not valid UTF-8 (byte {} of the line is 0x{:02x})", path, line,
                                        i - line_start + 1, static_cast<unsigned char>(text[i])));
        i += n;
    }
}

std::string read_utf8_text_file(const std::string& path) {
    std::string text = read_text_file(path);
    check_utf8(text, path);
    return text;
}

uint64_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

void check_fits_in_memory(double bytes, const std::string& what) {
    const double have = static_cast<double>(physical_memory_bytes());
    if (have > 0 && bytes > have)
        throw UsageError(fmt::format("{}: needs at least {:.3g} GiB, more than this machine's {:.3g} GiB of memory",
                                     what, bytes / (1u << 30), have / (1u << 30)));
}

double size_product(std::initializer_list<double> factors) {
    double p = 1;
    for (double f : factors) p *= f;
    return p;
}

}  // namespace hs
