// headscope_fuzz_replay FUZZ_DIR [TARGET...]: runs every file of FUZZ_DIR/corpus/<target>/ and
// FUZZ_DIR/regressions/<target>/ through its fuzz target once (the targets compiled into this
// binary without libFuzzer). A target that aborts on an input ends the run with that input named;
// a target with no corpus at all is an error too, so a renamed folder cannot silently test nothing.
#include "fuzz_target.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;

static char g_current[4096] = "";

extern "C" void on_abort(int) {
    const char* pre = "\nfuzz_replay: FAILED on input ";
    ssize_t r = ::write(2, pre, std::strlen(pre));
    r = ::write(2, g_current, std::strlen(g_current));
    r = ::write(2, "\n", 1);
    (void)r;
    std::signal(SIGABRT, SIG_DFL);
    std::raise(SIGABRT);
}

static std::vector<fs::path> files_in(const fs::path& dir) {
    std::vector<fs::path> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file() && e.path().filename().string()[0] != '.') out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s FUZZ_DIR [TARGET...]\n", argv[0]);
        return 2;
    }
    std::signal(SIGABRT, on_abort);
    std::signal(SIGSEGV, on_abort);
    const fs::path root = argv[1];
    std::vector<std::string> only(argv + 2, argv + argc);
    int failures = 0;
    size_t total = 0;
    for (const auto& [name, fn] : hs_fuzz::targets()) {
        if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
        auto corpus = files_in(root / "corpus" / name);
        auto regressions = files_in(root / "regressions" / name);
        if (corpus.empty()) {
            std::fprintf(stderr, "fuzz_replay: target '%s' has no corpus in %s\n", name.c_str(),
                         (root / "corpus" / name).c_str());
            ++failures;
            continue;
        }
        for (const auto* list : {&corpus, &regressions})
            for (const auto& p : *list) {
                std::snprintf(g_current, sizeof g_current, "%s (target %s)", p.c_str(), name.c_str());
                std::ifstream in(p, std::ios::binary);
                std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
                fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
            }
        std::printf("%-16s %4zu corpus + %3zu regression inputs: ok\n", name.c_str(), corpus.size(), regressions.size());
        total += corpus.size() + regressions.size();
    }
    std::printf("fuzz_replay: %zu inputs, %d targets without a corpus\n", total, failures);
    return failures == 0 ? 0 : 1;
}
