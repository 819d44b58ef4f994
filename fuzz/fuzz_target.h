// One fuzz target per parser (docs/reliability.md, "Fuzzing"). A target is written once with
// HS_FUZZ_TARGET(name) { ... } and compiled two ways:
//   - with clang and libFuzzer (HEADSCOPE_FUZZ=ON, build-fuzz/): LLVMFuzzerTestOneInput, one
//     binary fuzz_<name> per target, under ASan + UBSan;
//   - in the normal build: registered by name in headscope_fuzz_replay, which runs every input of
//     fuzz/corpus/<name>/ and fuzz/regressions/<name>/ through it (ctest fuzz_replay).
// The contract a target checks: the parser either succeeds or throws hs::Error with one of the
// exit codes the target allows and a one-line message. Anything else (another exception type, a
// wrong exit code, an empty or multi-line message) is reported and aborts, so the fuzzer keeps it
// as a crash and the replay fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"

namespace hs_fuzz {

using TargetFn = int (*)(const uint8_t*, size_t);

struct Registration {
    Registration(const char* name, TargetFn fn);
};
// Targets registered in this binary, in registration order.
std::vector<std::pair<std::string, TargetFn>>& targets();

// Runs body. hs::Error with an allowed code and a one-line message: fine. Anything else: a
// report on stderr naming the target, then abort().
void run_guarded(const char* target, std::initializer_list<hs::ExitCode> allowed, const std::function<void()>& body);
// Aborts with a report when cond is false (an invariant of the parsed result).
void check(bool cond, const char* target, const std::string& what);

// A per-process scratch folder (in /dev/shm when it exists), removed at exit.
const std::string& temp_dir();
// Writes bytes to temp_dir()/name and returns the path.
std::string write_temp(const std::string& name, const std::string& bytes);
// Removes temp_dir()/name if present.
void remove_temp(const std::string& name);

// Splits an input into at most max_parts parts at the separator line kSeparator (so one input
// can hold several files, e.g. vocab.json and merges.txt). Missing parts are empty.
extern const char* const kSeparator;
std::vector<std::string> split_parts(const uint8_t* data, size_t size, size_t max_parts);

// The source tree (fixed files some targets load once, e.g. fuzz/data/).
std::string source_dir();

}  // namespace hs_fuzz

#define HS_FUZZ_CAT_(a, b) a##b
#define HS_FUZZ_CAT(a, b) HS_FUZZ_CAT_(a, b)

#ifdef HS_FUZZ_LIBFUZZER
#define HS_FUZZ_TARGET(name)                                                          \
    static void HS_FUZZ_CAT(hs_fuzz_body_, name)(const uint8_t* data, size_t size);   \
    extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {         \
        HS_FUZZ_CAT(hs_fuzz_body_, name)(data, size);                                 \
        return 0;                                                                     \
    }                                                                                 \
    static void HS_FUZZ_CAT(hs_fuzz_body_, name)(const uint8_t* data, size_t size)
#else
#define HS_FUZZ_TARGET(name)                                                          \
    static void HS_FUZZ_CAT(hs_fuzz_body_, name)(const uint8_t* data, size_t size);   \
    static int HS_FUZZ_CAT(hs_fuzz_entry_, name)(const uint8_t* data, size_t size) {  \
        HS_FUZZ_CAT(hs_fuzz_body_, name)(data, size);                                 \
        return 0;                                                                     \
    }                                                                                 \
    static hs_fuzz::Registration HS_FUZZ_CAT(hs_fuzz_reg_, name)(#name, HS_FUZZ_CAT(hs_fuzz_entry_, name)); \
    static void HS_FUZZ_CAT(hs_fuzz_body_, name)(const uint8_t* data, size_t size)
#endif
