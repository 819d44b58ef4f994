// Progress on stderr for long work: a bar with rate and ETA, drawn only when stderr is a
// terminal (logs and CI stay clean); results never go to stderr.
#pragma once

#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace hs {

class Progress {
public:
    Progress(std::string label, int64_t total);
    ~Progress();
    void update(int64_t done);
    // The same with a short note after the ETA (a fit's current loss, say).
    void update(int64_t done, const std::string& note);
    void tick() { update(done_ + 1); }
    void finish();

private:
    std::string label_;
    int64_t total_, done_ = 0;
    std::string note_;
    bool tty_, finished_ = false;
    std::chrono::steady_clock::time_point start_, last_draw_;
};

// Verbosity for log lines on stderr: 0 quiet, 1 normal, 2 verbose.
void set_verbosity(int v);
int verbosity();
void log_info(const std::string& line);     // printed when verbosity >= 1
void log_verbose(const std::string& line);  // printed when verbosity >= 2
void log_warn(const std::string& line);     // always printed, prefixed "warning: "

// The same from a format string and its arguments, formatted only when the line prints:
// log_verbose("threads {}, BLAS {}", n, blas) costs a comparison at the default verbosity.
template <class... A>
void log_info(fmt::format_string<A...> f, A&&... a) {
    if (verbosity() >= 1) log_info(fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void log_verbose(fmt::format_string<A...> f, A&&... a) {
    if (verbosity() >= 2) log_verbose(fmt::format(f, std::forward<A>(a)...));
}

}  // namespace hs
