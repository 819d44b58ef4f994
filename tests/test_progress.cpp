// Logging (src/base/progress.h): a log line formats its arguments only when it prints.
#include <doctest/doctest.h>

#include "progress.h"

#include <fmt/format.h>

namespace {
struct Counted {
    int* formatted;
};
}  // namespace

template <>
struct fmt::formatter<Counted> : fmt::formatter<int> {
    template <class Ctx>
    auto format(const Counted& c, Ctx& ctx) const {
        ++*c.formatted;
        return fmt::formatter<int>::format(*c.formatted, ctx);
    }
};

TEST_CASE("log_info / log_verbose format only the lines that print") {
    const int before = hs::verbosity();
    int n = 0;
    hs::set_verbosity(1);
    hs::log_verbose("not shown: {}", Counted{&n});
    CHECK(n == 0);
    hs::log_info("shown: {}", Counted{&n});
    CHECK(n == 1);
    hs::set_verbosity(0);
    hs::log_info("quiet: {}", Counted{&n});
    CHECK(n == 1);
    hs::set_verbosity(2);
    hs::log_verbose("verbose: {}", Counted{&n});
    CHECK(n == 2);
    hs::set_verbosity(before);
}
