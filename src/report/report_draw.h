// The report's drawing primitives, shared by the section files (internal to src/report/, not part of
// the public API): HTML escaping, numbers as the page prints them, heatmaps with their legends, line
// charts, tables. Each returns a piece of HTML; none reads a file.
#pragma once

#include "store.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hs::report_detail {

std::string esc(const std::string& s);
// A value as the page prints it: 4 decimals in the usual range, else 4 significant digits.
std::string num(double v);
// Exact enough to read back the stored float32/float64.
std::string exact(double v);
std::string head_name(int64_t idx, int64_t H);

struct Range {
    double lo = 0, hi = 0;
    bool any = false;
};
Range finite_range(const std::vector<double>& v);

// Gradient ids, unique within one page (render_report resets it, legend counts it up).
extern int g_uid;

struct Heatmap {
    std::string dataset;  // data-dataset attribute (the HDF5 path, or a description)
    std::string label;    // first word of each cell title
    std::vector<double> v;
    int64_t rows = 0, cols = 0;
    std::string row_axis = "layer", col_axis = "head";
    std::vector<std::string> row_labels{}, col_labels{};  // default: indices
    bool is_signed = false;
    double fixed_lo = NAN, fixed_hi = NAN;  // a fixed scale (accuracy, recall: 0..1) instead of the data's range
    // The cell's name in its title; default L{r}H{c}.
    std::function<std::string(int64_t, int64_t)> cell_name{};
};

std::string legend(double lo, double hi, bool is_signed, int width);
std::string render_heatmap(const Heatmap& h);

// ---- line charts (ablation curves) ----
struct ChartPoint {
    double x, y;
    std::string title;
};
struct Series {
    std::string name, css;  // css class: main, control, base
    std::vector<ChartPoint> pts;
    bool line = true;
};

std::string render_chart(const std::vector<Series>& ser, const std::string& xlabel, const std::string& ylabel,
                         const std::vector<std::array<double, 3>>& bars = {});  // bars: x, lo, hi (control spread)

// ---- tables ----
std::string attrs_table(const Attrs& a, const std::vector<std::string>& skip = {});
std::string attr_str(const Attrs& a, const std::string& k);  // "" when absent
bool is_lh(const Dataset& d, int64_t L, int64_t H);  // a numeric [L, H] (L < 0: any 2-D shape)
std::vector<int64_t> order_desc(const std::vector<double>& v);  // indices, largest first, NaN last
std::string slug(const std::string& s);  // a section title as an id
// The top k heads by the first column, with every column's value.
std::string top_table(const std::string& probe, const std::vector<std::pair<std::string, Dataset>>& cols, int64_t H, int k,
                      const std::string& what);

}  // namespace hs::report_detail
