// headscope report: one self-contained HTML page (inline SVG + CSS, no script, no network) for one or
// more result files. The HTML is built in src/report/report.cpp; this file parses options and writes the
// page atomically (temporary file renamed into place), so a failed run leaves nothing behind.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "progress.h"
#include "report.h"
#include "util.h"

#include <fmt/format.h>

namespace hs::cli {

struct ReportCliOptions {
    std::vector<std::string> files;
    std::string out;
    std::string title = "headscope report";
    int top_k = 10;
    bool force = false;
};

void run_report(const ReportCliOptions& o) {
    if (file_exists(o.out) && !o.force) throw StorageError(fmt::format("{}: exists (use --force to replace it)", o.out));
    for (const auto& f : o.files)
        if (f == o.out) throw UsageError(fmt::format("{}: the output would replace an input file", o.out));
    ReportOptions ro;
    ro.title = o.title;
    ro.top_k = o.top_k;
    const std::string html = render_report(o.files, ro);
    AtomicFile out(o.out);
    out.write(html);
    out.commit();
    log_info("wrote {} ({:.1f} KiB); open it in a browser (it needs no network)", o.out, html.size() / 1024.0);
}

void setup_report(CLI::App& app) {
    auto o = std::make_shared<ReportCliOptions>();
    auto* sub = app.add_subcommand(
        "report", "one self-contained HTML page (heatmaps, top heads, ablation curves, needle grids) for result files\n"
                  "Several files are shown side by side, with difference heatmaps for probes they share.\n"
                  "Example: headscope report scores.h5 --out report.html");
    sub->add_option("files", o->files, "HDF5 result files (RESULTS.h5 [MORE.h5 ...])")->required();
    sub->add_option("--out,-o", o->out, "HTML file to write")->required();
    sub->add_option("--title", o->title, "page title")->capture_default_str();
    sub->add_option("--top", o->top_k, "rows of each probe's top-heads table")->check(at_least(1))->capture_default_str();
    sub->add_flag("--force", o->force, "replace an existing output file");
    sub->callback([o] { run_report(*o); });
}

}  // namespace hs::cli
