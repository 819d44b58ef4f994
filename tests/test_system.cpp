// Process settings made before main() (src/base/preinit.h): the environment slots lent to libgomp and
// OpenBLAS are given back, so main() sees exactly the environment the process was started with.
#define HS_PREINIT_STATE_ONLY
#include "preinit.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

TEST_CASE("preinit: environment handed back byte for byte") {
    // The kernel's copy of the initial environment, as the process was started.
    std::ifstream in("/proc/self/environ", std::ios::binary);
    REQUIRE(in.good());
    std::string blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::multiset<std::string> initial, now;
    for (size_t at = 0; at < blob.size();) {
        size_t end = blob.find('\0', at);
        if (end == std::string::npos) end = blob.size();
        initial.insert(blob.substr(at, end - at));
        at = end + 1;
    }
    for (char** e = environ; *e; ++e) now.insert(*e);
    CHECK(now == initial);

    // And the lending happened whenever it could: a spare slot existed and the user set nothing.
    auto has = [&](const std::string& prefix) {
        return std::any_of(initial.begin(), initial.end(), [&](const std::string& v) { return v.rfind(prefix, 0) == 0; });
    };
    const bool spare = has("_=") || has("SHLVL=") || has("OLDPWD=");
    if (spare && !has("OMP_WAIT_POLICY=")) CHECK(hs::detail::g_env_lent[0] != nullptr);
    if (has("OMP_WAIT_POLICY=")) CHECK(hs::detail::g_env_lent[0] == nullptr);
}
