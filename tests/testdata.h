// Locates the shared test data (../shared/testdata relative to the repository root, see
// shared/testdata/README.md). Tests that need it skip with a message when it is absent.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

// HEADSCOPE_TESTDATA if set, else the first shared/testdata or ../shared/testdata found walking up
// from the current directory; "" when none exists.
inline std::string hs_testdata_dir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (const char* env = std::getenv("HEADSCOPE_TESTDATA"); env && *env)
        return fs::is_directory(env, ec) ? std::string(env) : std::string();
    fs::path dir = fs::current_path(ec);
    if (ec) return "";
    for (int depth = 0; depth < 64; ++depth) {
        for (const fs::path& cand : {dir / "shared" / "testdata", dir.parent_path() / "shared" / "testdata"})
            if (fs::is_directory(cand, ec)) return fs::weakly_canonical(cand, ec).string();
        if (!dir.has_parent_path() || dir.parent_path() == dir) break;
        dir = dir.parent_path();
    }
    return "";
}

// Binds `dir` to the test-data folder, or skips the enclosing test case with a message.
#define HS_REQUIRE_TESTDATA(dir)                                                   \
    const std::string dir = hs_testdata_dir();                                     \
    if (dir.empty()) {                                                             \
        MESSAGE("skipped: ../shared/testdata not found (set HEADSCOPE_TESTDATA)"); \
        return;                                                                    \
    }
