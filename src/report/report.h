// The HTML report: one self-contained page (inline SVG and CSS, no script, no network) showing
// everything a result file holds that headscope knows how to draw. Reads through ResultReader only
// (no torch). Layout and colour choices are shared with scripts/plot_scores.py; docs/hdf5-schema.md, "What headscope report draws".
#pragma once

#include <string>
#include <vector>

namespace hs {

struct ReportOptions {
    std::string title = "headscope report";
    int top_k = 10;  // rows of each probe's top table
};

// Renders the report of one or more result files (several: side by side, plus difference heatmaps
// for probes present in every file with the same shape). Throws StorageError when a file is not a
// readable HDF5 file and DataError when a file holds no group the report knows.
std::string render_report(const std::vector<std::string>& files, const ReportOptions& o = {});

// Colour scales (exposed for tests): viridis for t in [0, 1]; a blue-white-red scale for t in
// [-1, 1] centred (white) at 0. "#rrggbb".
std::string viridis(double t);
std::string diverging(double t);

}  // namespace hs
