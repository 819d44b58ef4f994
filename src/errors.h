// One small error hierarchy. Library code throws; only main() catches, prints one line and
// returns the exit code documented in README.md ("Exit codes").
#pragma once

#include <stdexcept>
#include <string>

namespace hs {

enum class ExitCode : int {
    kOk = 0,
    kFailure = 1,      // unexpected internal error (a bug: please report)
    kUsage = 2,        // bad command line (CLI11 also returns 2 here... see main.cpp)
    kConfig = 3,       // bad configuration: config.json, YAML experiment, unknown architecture
    kModelLoad = 4,    // checkpoint unreadable, truncated, inconsistent, missing tensors
    kData = 5,         // bad input data: tokenizer files, token ids, relation files, text files
    kStorage = 6,      // cannot write or read a result file
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

class Error : public std::runtime_error {
public:
    Error(ExitCode code, const std::string& msg) : std::runtime_error(one_line(msg)), code_(code) {}
    ExitCode code() const { return code_; }

private:
    ExitCode code_;
};

struct UsageError : Error {
    explicit UsageError(const std::string& m) : Error(ExitCode::kUsage, m) {}
};
struct ConfigError : Error {
    explicit ConfigError(const std::string& m) : Error(ExitCode::kConfig, m) {}
};
struct ModelLoadError : Error {
    explicit ModelLoadError(const std::string& m) : Error(ExitCode::kModelLoad, m) {}
};
struct DataError : Error {
    explicit DataError(const std::string& m) : Error(ExitCode::kData, m) {}
};
struct StorageError : Error {
    explicit StorageError(const std::string& m) : Error(ExitCode::kStorage, m) {}
};

}  // namespace hs
