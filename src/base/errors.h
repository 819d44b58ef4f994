// One small error hierarchy. Library code throws; only main() catches, prints one line and
// returns the exit code documented in README.md ("Exit codes").
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace hs {

enum class ExitCode : int {
    kOk = 0,
    kFailure = 1,      // unexpected internal error (a bug: please report)
    kUsage = 2,        // bad command line (CLI11 also returns 2 here... see main.cpp)
    kConfig = 3,       // bad configuration: config.json, YAML experiment, unknown architecture
    kModelLoad = 4,    // checkpoint unreadable, truncated, inconsistent, missing tensors
    kData = 5,         // bad input data: tokenizer files, token ids, relation files, text files
    kStorage = 6,      // cannot write or read a result file
    kOutOfMemory = 7,  // the work does not fit in the host's or the device's memory
};

// Messages quote what they found in a file (a token, a key, a line); one_line() escapes the
// control characters such a quote may hold (newline -> \n, others -> \xNN), so that every error
// stays the one line README promises whatever the input was.
inline std::string one_line(const std::string& msg) {
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(msg.size());
    for (unsigned char c : msg) {
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
            out += "\\x";
            out += kHex[c >> 4];
            out += kHex[c & 15];
        } else {
            out += static_cast<char>(c);
        }
    }
    return out;
}

// `param` (optional) names the parameter the message is about in the library's words ("seq_len",
// "token_range", "out"): the tool that knows which flag or YAML key carried it puts that in front
// (tools/common.h with_flag). The message itself never names a flag.
class Error : public std::runtime_error {
public:
    Error(ExitCode code, const std::string& msg, std::string param = {})
        : std::runtime_error(one_line(msg)), code_(code), param_(std::move(param)) {}
    ExitCode code() const { return code_; }
    const std::string& param() const { return param_; }

private:
    ExitCode code_;
    std::string param_;
};

struct UsageError : Error {
    explicit UsageError(const std::string& m, std::string param = {}) : Error(ExitCode::kUsage, m, std::move(param)) {}
};
struct ConfigError : Error {
    explicit ConfigError(const std::string& m, std::string param = {}) : Error(ExitCode::kConfig, m, std::move(param)) {}
};
struct ModelLoadError : Error {
    explicit ModelLoadError(const std::string& m, std::string param = {}) : Error(ExitCode::kModelLoad, m, std::move(param)) {}
};
struct DataError : Error {
    explicit DataError(const std::string& m, std::string param = {}) : Error(ExitCode::kData, m, std::move(param)) {}
};
struct StorageError : Error {
    explicit StorageError(const std::string& m, std::string param = {}) : Error(ExitCode::kStorage, m, std::move(param)) {}
};

// The same error (class and exit code) with "prefix: " in front of its message.
[[noreturn]] inline void rethrow_prefixed(const Error& e, const std::string& prefix) {
    const std::string m = prefix + ": " + e.what();
    switch (e.code()) {
        case ExitCode::kUsage: throw UsageError(m, e.param());
        case ExitCode::kConfig: throw ConfigError(m, e.param());
        case ExitCode::kModelLoad: throw ModelLoadError(m, e.param());
        case ExitCode::kData: throw DataError(m, e.param());
        case ExitCode::kStorage: throw StorageError(m, e.param());
        default: throw Error(e.code(), m, e.param());
    }
}

// A caller's mistake (a bug in headscope, not bad input): std::logic_error naming the file and line,
// which main() reports as an internal error (exit 1).
#define HS_REQUIRE(cond, msg)                                                                              \
    do {                                                                                                   \
        if (!(cond))                                                                                       \
            throw std::logic_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + (msg)); \
    } while (0)

}  // namespace hs
