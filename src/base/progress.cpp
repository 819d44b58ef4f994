#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

namespace hs {

static int g_verbosity = 1;
void set_verbosity(int v) { g_verbosity = v; }
int verbosity() { return g_verbosity; }
void log_info(const std::string& line) {
    if (g_verbosity >= 1) std::fprintf(stderr, "%s\n", line.c_str());
}
void log_verbose(const std::string& line) {
    if (g_verbosity >= 2) std::fprintf(stderr, "%s\n", line.c_str());
}
void log_warn(const std::string& line) { std::fprintf(stderr, "warning: %s\n", line.c_str()); }

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), tty_(::isatty(2) && g_verbosity >= 1) {
    start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done, const std::string& note) {
    note_ = note;
    update(done);
}

void Progress::update(int64_t done) {
    done_ = done;
    if (!tty_) return;
    auto now = std::chrono::steady_clock::now();
    if (done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double el = std::chrono::duration<double>(now - start_).count();
    const double frac = total_ > 0 ? static_cast<double>(done_) / total_ : 0.0;
    const int width = 30, fill = static_cast<int>(frac * width);
    std::string eta = done_ > 0 && done_ < total_ ? fmt::format(" ETA {:.0f}s", el / done_ * (total_ - done_)) : "";
    std::fprintf(stderr, "\r%s [%s%s] %lld/%lld %.1fs%s%s%s   ", label_.c_str(), std::string(fill, '#').c_str(),
                 std::string(width - fill, '.').c_str(), static_cast<long long>(done_),
                 static_cast<long long>(total_), el, eta.c_str(), note_.empty() ? "" : " ", note_.c_str());
    std::fflush(stderr);
}

void Progress::finish() {
    if (finished_) return;
    finished_ = true;
    if (tty_) std::fprintf(stderr, "\r\033[K");
}

}  // namespace hs
