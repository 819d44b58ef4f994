// The headscope binary run quietly from a doctest suite (several suites share it).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>

// `headscope -q ARGS` with its output discarded; the exit code.
inline int run_cli(const std::string& args) {
    const std::string cmd = std::string("'") + HS_BINARY + "' -q " + args + " >/dev/null 2>&1";
    return WEXITSTATUS(std::system(cmd.c_str()));
}
