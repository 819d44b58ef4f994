// headscope report: the drawing primitives (report_draw.h) and the two colour scales (report.h).
#include "report_draw.h"

#include "heads.h"
#include "report.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>

namespace hs {
namespace {

std::string hex(double r, double g, double b) {
    auto c = [](double x) { return static_cast<int>(std::lround(std::clamp(x, 0.0, 1.0) * 255)); };
    return fmt::format("#{:02x}{:02x}{:02x}", c(r), c(g), c(b));
}

std::string interp(const std::vector<std::array<double, 3>>& stops, double t) {
    if (!std::isfinite(t)) return "#bdbdbd";
    t = std::clamp(t, 0.0, 1.0) * (stops.size() - 1);
    const size_t i = std::min(static_cast<size_t>(t), stops.size() - 2);
    const double f = t - i;
    const auto& a = stops[i];
    const auto& b = stops[i + 1];
    return hex(a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2]));
}

}  // namespace

namespace report_detail {

std::string esc(const std::string& s) {
    std::string o;
    o.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&': o += "&amp;"; break;
            case '<': o += "&lt;"; break;
            case '>': o += "&gt;"; break;
            case '"': o += "&quot;"; break;
            case '\'': o += "&#39;"; break;
            default: o += c;
        }
    }
    return o;
}

// A value as the page prints it: 4 decimals in the usual range, else 4 significant digits.
std::string num(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    const double a = std::fabs(v);
    if (a == 0 || (a >= 1e-3 && a < 1e5)) return fmt::format("{:.4f}", v);
    return fmt::format("{:.4g}", v);
}
// Exact enough to read back the stored float32/float64.
std::string exact(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : num(v); }

std::string head_name(int64_t idx, int64_t H) { return format_head(static_cast<int>(idx / H), static_cast<int>(idx % H)); }

Range finite_range(const std::vector<double>& v) {
    Range r;
    for (double x : v) {
        if (!std::isfinite(x)) continue;
        if (!r.any) r.lo = r.hi = x, r.any = true;
        r.lo = std::min(r.lo, x), r.hi = std::max(r.hi, x);
    }
    return r;
}

int g_uid = 0;  // gradient ids, unique within one page

std::string legend(double lo, double hi, bool is_signed, int width) {
    const int id = ++g_uid;
    std::string s = fmt::format("<svg class=\"legend\" width=\"{}\" height=\"34\" viewBox=\"0 0 {} 34\" role=\"img\">"
                                "<defs><linearGradient id=\"g{}\">", width, width, id);
    for (int i = 0; i <= 10; ++i) {
        const double t = i / 10.0;
        s += fmt::format("<stop offset=\"{}%\" stop-color=\"{}\"/>", i * 10, is_signed ? diverging(2 * t - 1) : viridis(t));
    }
    s += fmt::format("</linearGradient></defs><rect x=\"0\" y=\"0\" width=\"{}\" height=\"12\" fill=\"url(#g{})\"/>", width, id);
    s += fmt::format("<text x=\"0\" y=\"28\" class=\"tick\">{}</text>", esc(num(lo)));
    if (is_signed) s += fmt::format("<text x=\"{}\" y=\"28\" class=\"tick\" text-anchor=\"middle\">0</text>", width / 2);
    s += fmt::format("<text x=\"{}\" y=\"28\" class=\"tick\" text-anchor=\"end\">{}</text></svg>", width, esc(num(hi)));
    return s;
}

std::string render_heatmap(const Heatmap& h) {
    const Range r = finite_range(h.v);
    double lo = r.any ? r.lo : 0, hi = r.any ? r.hi : 1;
    if (std::isfinite(h.fixed_lo)) lo = std::min(lo, h.fixed_lo), hi = std::max(hi, h.fixed_hi);
    bool sgn = h.is_signed || lo < 0;
    if (sgn) {
        const double m = std::max({std::fabs(lo), std::fabs(hi), 1e-30});
        lo = -m, hi = m;
    }
    if (hi == lo) hi = lo + 1;
    const int cell = static_cast<int>(std::clamp<int64_t>(560 / std::max<int64_t>(h.cols, 1), 8, 48));
    const int cell_h = static_cast<int>(std::clamp<int64_t>(cell, 8, 32));
    const int left = 56, top = 8, bottom = 34;
    const int W = left + cell * static_cast<int>(h.cols) + 8, Ht = top + cell_h * static_cast<int>(h.rows) + bottom;
    std::string s = fmt::format("<figure class=\"heatmap-wrap\"><svg class=\"heatmap\" data-dataset=\"{}\" data-rows=\"{}\" "
                                "data-cols=\"{}\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\">",
                                esc(h.dataset), h.rows, h.cols, W, Ht, W, Ht);
    const bool text = cell >= 40 && cell_h >= 24;
    const int64_t every_c = std::max<int64_t>(1, (h.cols + 15) / 16), every_r = std::max<int64_t>(1, (h.rows + 23) / 24);
    for (int64_t i = 0; i < h.rows; ++i) {
        if (i % every_r == 0)
            s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>",
                             left - 4, top + cell_h * i + cell_h / 2.0,
                             esc(h.row_labels.empty() ? std::to_string(i) : h.row_labels[i]));
        for (int64_t j = 0; j < h.cols; ++j) {
            const double v = h.v[i * h.cols + j];
            const std::string fill = sgn ? diverging(v / hi) : viridis((v - lo) / (hi - lo));
            const std::string name = h.cell_name ? h.cell_name(i, j) : format_head(static_cast<int>(i), static_cast<int>(j));
            s += fmt::format("<rect class=\"cell\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" data-value=\"{}\">"
                             "<title>{} {} {}</title></rect>",
                             left + cell * j, top + cell_h * i, cell, cell_h, fill, exact(v), esc(h.label), esc(name), num(v));
            if (text) {
                const double t = sgn ? std::fabs(v / hi) : (v - lo) / (hi - lo);
                const bool dark = sgn ? t > 0.6 : t < 0.55;
                s += fmt::format("<text class=\"cv {}\" x=\"{}\" y=\"{}\">{}</text>", dark ? "l" : "d", left + cell * j + cell / 2.0,
                                 top + cell_h * i + cell_h / 2.0, fmt::format("{:.2f}", v));
            }
        }
    }
    for (int64_t j = 0; j < h.cols; j += every_c)
        s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", left + cell * j + cell / 2.0,
                         top + cell_h * h.rows + 12, esc(h.col_labels.empty() ? std::to_string(j) : h.col_labels[j]));
    s += fmt::format("<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", left + cell * h.cols / 2.0,
                     top + cell_h * h.rows + 28, esc(h.col_axis));
    s += fmt::format("<text class=\"axis\" x=\"12\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 12 {})\">{}</text>",
                     top + cell_h * h.rows / 2.0, top + cell_h * h.rows / 2.0, esc(h.row_axis));
    s += "</svg><figcaption>" + legend(lo, hi, sgn, 200) + (sgn ? " <span class=\"note\">diverging, centred at 0</span>" : "") +
         "</figcaption></figure>";
    return s;
}

std::string render_chart(const std::vector<Series>& ser, const std::string& xlabel, const std::string& ylabel,
                         const std::vector<std::array<double, 3>>& bars) {  // bars: x, lo, hi (control spread)
    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const auto& s : ser)
        for (const auto& p : s.pts) {
            if (!std::isfinite(p.y)) continue;
            x0 = std::min(x0, p.x), x1 = std::max(x1, p.x), y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
        }
    for (const auto& b : bars) y0 = std::min(y0, b[1]), y1 = std::max(y1, b[2]);
    if (!std::isfinite(x0)) return "<p class=\"note\">no finite values to plot</p>";
    if (x1 == x0) x0 -= 0.5, x1 += 0.5;
    if (y1 == y0) y0 -= 0.5, y1 += 0.5;
    const double pad = 0.06 * (y1 - y0);
    y0 -= pad, y1 += pad;
    const int W = 480, Hh = 260, l = 64, r = 12, t = 10, b = 40;
    auto X = [&](double x) { return l + (x - x0) / (x1 - x0) * (W - l - r); };
    auto Y = [&](double y) { return t + (y1 - y) / (y1 - y0) * (Hh - t - b); };
    std::string s = fmt::format("<svg class=\"chart\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\">", W, Hh, W, Hh);
    s += fmt::format("<line class=\"ax\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", l, Hh - b, W - r, Hh - b);
    s += fmt::format("<line class=\"ax\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>", l, t, l, Hh - b);
    for (int i = 0; i <= 4; ++i) {
        const double yv = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
        s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>",
                         l - 4, Y(yv), fmt::format("{:.3g}", yv));
        s += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\"/>", l, Y(yv), W - r, Y(yv));
        s += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>", X(xv), Hh - b + 14,
                         fmt::format("{:.3g}", xv));
    }
    s += fmt::format("<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", (l + W - r) / 2, Hh - 6, esc(xlabel));
    s += fmt::format("<text class=\"axis\" x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">{}</text>",
                     (t + Hh - b) / 2, (t + Hh - b) / 2, esc(ylabel));
    for (const auto& bar : bars)
        s += fmt::format("<line class=\"spread\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"><title>controls at {}: "
                         "{} .. {}</title></line>",
                         X(bar[0]), Y(bar[1]), X(bar[0]), Y(bar[2]), fmt::format("{:.3g}", bar[0]), num(bar[1]), num(bar[2]));
    for (const auto& se : ser) {
        if (se.line && se.pts.size() > 1) {
            std::string pts;
            for (const auto& p : se.pts)
                if (std::isfinite(p.y)) pts += fmt::format("{:.1f},{:.1f} ", X(p.x), Y(p.y));
            s += fmt::format("<polyline class=\"{}\" points=\"{}\"/>", se.css, pts);
        }
        for (const auto& p : se.pts)
            if (std::isfinite(p.y))
                s += fmt::format("<circle class=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" data-value=\"{}\"><title>{}</title></circle>",
                                 se.css, X(p.x), Y(p.y), se.css == "control" ? 3 : 4, exact(p.y), esc(p.title));
    }
    s += "</svg><div class=\"keys\">";
    for (const auto& se : ser) s += fmt::format("<span class=\"key {}\">{}</span> ", se.css, esc(se.name));
    return s + "</div>";
}

// ---- tables ----
std::string attrs_table(const Attrs& a, const std::vector<std::string>& skip) {
    std::string s = "<table class=\"kv\">";
    for (const auto& [k, v] : a) {
        if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
        s += fmt::format("<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(attr_to_string(v)));
    }
    return s + "</table>";
}

std::string attr_str(const Attrs& a, const std::string& k) {
    auto it = a.find(k);
    return it == a.end() ? std::string() : attr_to_string(it->second);
}

bool is_lh(const Dataset& d, int64_t L, int64_t H) {
    return !d.is_string && d.shape.size() == 2 && (L < 0 || (d.shape[0] == L && d.shape[1] == H));
}

std::vector<int64_t> order_desc(const std::vector<double>& v) {
    std::vector<int64_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
        const double x = std::isnan(v[a]) ? -INFINITY : v[a], y = std::isnan(v[b]) ? -INFINITY : v[b];
        return x > y;
    });
    return idx;
}

std::string slug(const std::string& s) {
    std::string o;
    for (char c : s) o += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    return o;
}

std::string top_table(const std::string& probe, const std::vector<std::pair<std::string, Dataset>>& cols, int64_t H, int k,
                      const std::string& what) {
    const auto& score = cols.front().second.values;
    auto idx = order_desc(score);
    const size_t n = std::min<size_t>(k, idx.size());
    std::string s = fmt::format("<table class=\"top\" data-probe=\"{}\"><caption>{}</caption><tr><th>rank</th><th>head</th>",
                                esc(probe), esc(what));
    for (const auto& c : cols) s += "<th>" + esc(c.first) + "</th>";
    s += "</tr>";
    for (size_t i = 0; i < n; ++i) {
        s += fmt::format("<tr><td>{}</td><td>{}</td>", i + 1, head_name(idx[i], H));
        for (const auto& c : cols) s += fmt::format("<td data-value=\"{}\">{}</td>", exact(c.second.values[idx[i]]), num(c.second.values[idx[i]]));
        s += "</tr>";
    }
    return s + "</table>";
}

}  // namespace report_detail

std::string viridis(double t) {
    static const std::vector<std::array<double, 3>> v{
        {0.267, 0.005, 0.329}, {0.283, 0.141, 0.458}, {0.254, 0.265, 0.530}, {0.207, 0.372, 0.553}, {0.164, 0.471, 0.558},
        {0.128, 0.567, 0.551}, {0.135, 0.659, 0.518}, {0.267, 0.749, 0.441}, {0.478, 0.821, 0.318}, {0.741, 0.873, 0.150},
        {0.993, 0.906, 0.144}};
    return interp(v, t);
}

std::string diverging(double t) {
    // Blue (negative) - near-white (0) - red (positive): ColorBrewer RdBu, safe for common colour blindness,
    // and in greyscale the magnitude still reads as darkness.
    static const std::vector<std::array<double, 3>> d{{0.020, 0.188, 0.380}, {0.129, 0.400, 0.675}, {0.404, 0.663, 0.812},
                                                      {0.820, 0.898, 0.941}, {0.969, 0.969, 0.969}, {0.992, 0.859, 0.780},
                                                      {0.937, 0.541, 0.384}, {0.698, 0.094, 0.169}, {0.404, 0.000, 0.122}};
    if (!std::isfinite(t)) return "#bdbdbd";
    return interp(d, (std::clamp(t, -1.0, 1.0) + 1) / 2);
}

}  // namespace hs
