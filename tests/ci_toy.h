// The CI toy models, trained once per build tree by tests/ci_toy.sh and reused by every test
// that needs one (C++ suites and command-line suites alike call that one script).
#pragma once

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>

// Folder of the CI model for task "induction" (1500 steps), "recall" (3000 steps) or "icl" (600), seed 1,
// one thread: trained on first use, reused afterwards.
inline std::string ci_toy_model(const std::string& task) {
    const std::string cmd = std::string("bash '") + HS_SOURCE_DIR + "/tests/ci_toy.sh' " + task + " '" + HS_BINARY + "'";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run " + cmd);
    std::string out;
    std::array<char, 512> buf{};
    while (std::fgets(buf.data(), static_cast<int>(buf.size()), p)) out += buf.data();
    const int rc = ::pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    if (rc != 0 || out.empty()) throw std::runtime_error("training the CI toy model failed: " + cmd);
    return out;
}
