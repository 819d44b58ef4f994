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

class Error : public std::runtime_error {
public:
    Error(ExitCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
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
