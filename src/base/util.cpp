#include "util.h"

#include <cmath>

#include "errors.h"
#include "temp_files.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

namespace hs {

std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string read_text_file(const std::string& path) {
    if (is_directory(path)) throw DataError(fmt::format("{}: is a directory, expected a file", path));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw DataError(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
    return ss.str();
}

bool file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string path_join(const std::string& a, const std::string& b) {
    if (a.empty()) return b;
    return a.back() == '/' ? a + b : a + "/" + b;
}

std::string parent_dir(const std::string& path) {
    auto p = path.find_last_of('/');
    if (p == std::string::npos) return ".";
    if (p == 0) return "/";
    return path.substr(0, p);
}

static std::string hex(const unsigned char* d, unsigned n) {
    static const char* k = "0123456789abcdef";
    std::string s;
    for (unsigned i = 0; i < n; ++i) {
        s.push_back(k[d[i] >> 4]);
        s.push_back(k[d[i] & 15]);
    }
    return s;
}

std::string sha256_bytes(const void* data, size_t n) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr);
    return hex(md, len);
}

std::string sha256_file(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw StorageError(fmt::format("{}: cannot open for hashing: {}", path, std::strerror(errno)));
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    std::vector<char> buf(1 << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) EVP_DigestUpdate(ctx, buf.data(), n);
    std::fclose(f);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    return hex(md, len);
}

std::string utc_now_iso8601() {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (c == sep) {
            out.push_back(cur);
            cur.clear();
        } else {
            cur.push_back(c);
        }
    }
    out.push_back(cur);
    return out;
}

std::string trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t\r\n");
    if (a == std::string::npos) return "";
    size_t b = s.find_last_not_of(" \t\r\n");
    return s.substr(a, b - a + 1);
}

std::string temp_path_for(const std::string& path) {
    return fmt::format("{}.tmp-{}", path, static_cast<long>(::getpid()));
}

void rename_into_place(const std::string& tmp, const std::string& path) {
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        int e = errno;
        std::remove(tmp.c_str());
        throw StorageError(fmt::format("{}: cannot move result into place: {}", path, std::strerror(e)));
    }
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(temp_path_for(path)) {
    remove_stale_temps(path);
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw StorageError(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
}

AtomicFile::~AtomicFile() {
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const char* data, size_t n) {
    if (n && std::fwrite(data, 1, n, f_) != n)
        throw StorageError(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
}

void AtomicFile::commit() {
    if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) throw StorageError(fmt::format("{}: flush failed", path_));
    std::fclose(f_);
    f_ = nullptr;
    rename_into_place(tmp_, path_);
    committed_ = true;
}

std::optional<double> parse_double(const std::string& s) {
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(s, &used);
    } catch (const std::exception&) {
        return std::nullopt;
    }
    if (used != s.size() || !std::isfinite(v)) return std::nullopt;
    return v;
}

std::optional<int64_t> parse_int64(const std::string& s) {
    size_t used = 0;
    long long v = 0;
    try {
        v = std::stoll(s, &used);
    } catch (const std::exception&) {
        return std::nullopt;
    }
    if (used != s.size()) return std::nullopt;
    return static_cast<int64_t>(v);
}

std::optional<std::vector<int64_t>> split_ints(const std::string& s, std::string* bad) {
    std::vector<int64_t> out;
    for (const auto& part : split(s, ',')) {
        const auto t = trim(part);
        if (t.empty()) continue;
        const auto v = parse_int64(t);
        if (!v) {
            if (bad) *bad = t;
            return std::nullopt;
        }
        out.push_back(*v);
    }
    return out;
}

std::vector<int64_t> parse_token_list(const std::string& s, const std::string& where) {
    std::string bad;
    auto ids = split_ints(s, &bad);
    const std::string at = where.empty() ? "" : where + ": ";
    if (!ids) throw DataError(fmt::format("{}'{}' is not a token id", at, bad), "token_list");
    if (ids->empty()) throw DataError(fmt::format("{}no token ids", at), "token_list");
    return *ids;
}

}  // namespace hs
