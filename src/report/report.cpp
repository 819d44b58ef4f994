// headscope report: HTML building. Every section is drawn from what the file holds; nothing is
// recomputed except summaries (means, differences) that the page states in words.
#include "report.h"

#include "errors.h"
#include "heads.h"
#include "schema.h"
#include "store.h"
#include "util.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

namespace hs {
namespace {

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

struct Range {
    double lo = 0, hi = 0;
    bool any = false;
};
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

struct Heatmap {
    std::string dataset;  // data-dataset attribute (the HDF5 path, or a description)
    std::string label;    // first word of each cell title
    std::vector<double> v;
    int64_t rows = 0, cols = 0;
    std::string row_axis = "layer", col_axis = "head";
    std::vector<std::string> row_labels, col_labels;  // default: indices
    bool is_signed = false;
    double fixed_lo = NAN, fixed_hi = NAN;  // a fixed scale (accuracy, recall: 0..1) instead of the data's range
    // The cell's name in its title; default L{r}H{c}.
    std::function<std::string(int64_t, int64_t)> cell_name;
};

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
                         const std::vector<std::array<double, 3>>& bars = {}) {  // bars: x, lo, hi (control spread)
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
std::string attrs_table(const Attrs& a, const std::vector<std::string>& skip = {}) {
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

// ---- per-file rendering ----
struct FileView {
    std::string path;
    std::unique_ptr<ResultReader> r;
    int index = 0;
    std::vector<std::string> toc;  // section titles
    int known = 0;                 // groups rendered
};

std::string section(FileView& f, const std::string& title, const std::string& body) {
    f.toc.push_back(title);
    return fmt::format("<section id=\"f{}-{}\"><h2>{}</h2>{}</section>", f.index, slug(title), esc(title), body);
}

std::string provenance(FileView& f) {
    if (!f.r->exists(schema::meta())) return "<p class=\"note\">no /meta group: provenance unknown</p>";
    Attrs a = schema::read_meta(*f.r);
    auto get = [&](const char* k) { return a.count(k) ? attr_to_string(a.at(k)) : std::string("?"); };
    std::string sha = get("weights_sha256");
    std::string s = fmt::format("<p class=\"desc\"><b>{}</b> ({}, {}): {} layers x {} heads ({} key/value), d_model {}, vocabulary "
                                "{}; weights sha256 <code>{}</code>; {} {}; headscope {} ({}), {}.</p>"
                                "<p class=\"desc\"><code>{}</code></p>",
                                esc(get("model_path")), esc(get("architecture")), esc(get("family")), esc(get("n_layers")),
                                esc(get("n_heads")), esc(get("n_kv_heads")), esc(get("d_model")), esc(get("vocab_size")),
                                esc(sha.substr(0, 16)) + (sha.size() > 16 ? "…" : ""), esc(get("dtype")), esc(get("device")),
                                esc(get("tool_version")), esc(get("git_commit")), esc(get("utc_time")), esc(get("command_line")));
    s += "<details><summary>all /meta attributes</summary><table class=\"kv\">";
    const std::vector<std::string> first{"model_path", "architecture", "family", "n_layers", "n_heads", "n_kv_heads", "d_model",
                                         "d_head", "vocab_size", "weights_sha256", "command_line", "tool_version", "git_commit",
                                         "utc_time", "dtype", "device", "threads", "seed"};
    for (const auto& k : first)
        if (a.count(k)) s += fmt::format("<tr><th>{}</th><td><code>{}</code></td></tr>", esc(k), esc(attr_to_string(a.at(k))));
    for (const auto& [k, v] : a)
        if (std::find(first.begin(), first.end(), k) == first.end())
            s += fmt::format("<tr><th>{}</th><td><code>{}</code></td></tr>", esc(k), esc(attr_to_string(v)));
    return section(f, "Provenance", s + "</table></details>");
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

bool signed_probe(const std::string& p) { return p == "dla" || p == "locos"; }

// Successor heads: one row per task (its coverage, its best head, the overall best head's score
// on it), then the tasks skipped for words that are not single tokens.
std::string successor_tasks(const schema::StoredScores& st, int64_t L, int64_t H) {
    auto strings = [&](const char* k) {
        const auto it = st.attrs.find(k);
        return it != st.attrs.end() && std::holds_alternative<std::vector<std::string>>(it->second)
                   ? std::get<std::vector<std::string>>(it->second)
                   : std::vector<std::string>{};
    };
    auto longs = [&](const char* k) {
        const auto it = st.attrs.find(k);
        return it != st.attrs.end() && std::holds_alternative<std::vector<int64_t>>(it->second)
                   ? std::get<std::vector<int64_t>>(it->second)
                   : std::vector<int64_t>{};
    };
    const Dataset* ts = nullptr;
    for (const auto& [c, d] : st.others)
        if (c == "task_score") ts = &d;
    const auto tasks = strings("tasks"), all = strings("all_tasks"), form = strings("task_form");
    const auto words = longs("task_words"), single = longs("task_single_tokens");
    if (!ts || ts->shape != std::vector<int64_t>{static_cast<int64_t>(tasks.size()), L, H}) return "";
    const auto& sc = st.score.values;
    const int64_t best = std::max_element(sc.begin(), sc.end()) - sc.begin();
    std::string s = fmt::format("<table><caption>per task (the overall best head: {})</caption><tr><th>task</th>"
                                "<th>words</th><th>form</th><th>best head</th><th>its score</th><th>{}</th></tr>",
                                head_name(best, H), head_name(best, H));
    for (size_t t = 0; t < tasks.size(); ++t) {
        const double* v = ts->values.data() + t * L * H;
        const int64_t b = std::max_element(v, v + L * H) - v;
        const auto k = std::find(all.begin(), all.end(), tasks[t]) - all.begin();
        const bool known = k < static_cast<int64_t>(words.size()) && k < static_cast<int64_t>(form.size());
        s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(tasks[t]),
                         known ? std::to_string(words[k]) : "", known ? esc(form[k]) : "", head_name(b, H), num(v[b]),
                         num(v[best]));
    }
    s += "</table>";
    std::vector<std::string> skipped;
    for (size_t k = 0; k < all.size() && k < form.size() && k < words.size() && k < single.size(); ++k)
        if (form[k] == "skipped") skipped.push_back(fmt::format("{} ({} of {} words single tokens)", all[k], single[k], words[k]));
    if (!skipped.empty())
        s += "<p class=\"note\">skipped (words that are not single tokens): " + esc(fmt::format("{}", fmt::join(skipped, "; "))) + "</p>";
    return s;
}

// One /scores/<probe> group that holds a score [L, H] (and maybe other [L, H] datasets).
std::string score_group(FileView& f, const std::string& probe, int top_k) {
    const auto st = schema::read_scores(*f.r, probe);
    const Dataset& sc = st.score;
    const std::string g = schema::scores(probe);
    if (!is_lh(sc, -1, -1)) return fmt::format("<p class=\"note\">{}/score has shape {}: not drawn</p>", esc(g), shape_str(sc.shape));
    const int64_t L = sc.shape[0], H = sc.shape[1];
    const Attrs& ga = st.attrs;
    std::string s;
    const std::string conv = attr_str(ga, "convention"), desc = attr_str(ga, "description");
    if (!conv.empty() || !desc.empty())
        s += fmt::format("<p class=\"desc\">{}{}</p>", conv.empty() ? "" : "<b>convention " + esc(conv) + ".</b> ", esc(desc));
    Heatmap hm{schema::scores(probe, "score"), probe, sc.values, L, H};
    hm.is_signed = signed_probe(probe);
    s += "<div class=\"row\">" + render_heatmap(hm);
    std::vector<std::pair<std::string, Dataset>> cols{{"score", sc}};
    std::vector<std::string> extra;
    const Dataset* baseline = nullptr;
    const Dataset* samples = nullptr;
    for (const auto& [c, d] : st.others) {
        if (c == "baseline") baseline = &d;
        if (c == "samples") samples = &d;
        if (is_lh(d, L, H)) cols.emplace_back(c, d), extra.push_back(c);
    }
    s += top_table(probe, cols, H, top_k, fmt::format("top {} heads by score", std::min<int64_t>(top_k, L * H))) + "</div>";
    if (probe == "successor") s += successor_tasks(st, L, H);
    if (probe == "locos" && ga.count("ci_level") == 0 && f.r->exists(schema::scores(probe, "ci_low")))
        s += "<p class=\"note\">ci_low / ci_high: the bootstrap confidence interval of each head's LOCOS score.</p>";
    if (baseline && !baseline->values.empty())
        s += fmt::format("<p>baseline (no head ablated): <b>{}</b></p>", num(baseline->values[0]));
    // The other [L, H] maps of the group (copy suppression's rank summaries, LOCOS intervals, ...).
    if (!extra.empty() && L * H > 256) {
        s += "<p class=\"note\">other per-head maps of this group (" + esc(fmt::format("{}", fmt::join(extra, ", "))) +
             ") are columns of the table; their heatmaps are drawn for models of at most 256 heads to keep the page small "
             "(scripts/plot_scores.py draws any of them).</p>";
    } else if (!extra.empty()) {
        s += "<details><summary>other per-head maps in this group (" + esc(fmt::format("{}", fmt::join(extra, ", "))) +
             ")</summary><div class=\"row\">";
        for (size_t i = 1; i < cols.size(); ++i) {
            Heatmap e{schema::scores(probe, cols[i].first), probe + "/" + cols[i].first, cols[i].second.values, L, H};
            e.is_signed = hm.is_signed;
            s += "<div><h4>" + esc(cols[i].first) + "</h4>" + render_heatmap(e) + "</div>";
        }
        s += "</div></details>";
    }
    if (samples && samples->shape.size() == 3)
        s += fmt::format("<p class=\"note\">per-sequence samples stored: {} rows.</p>", samples->shape[0]);
    s += "<details><summary>attributes</summary>" + attrs_table(ga, {"description", "convention"}) + "</details>";
    return s;
}

std::string dla_extra(FileView& f, int64_t L, int64_t H) {
    auto& r = *f.r;
    auto ds = [](const std::string& name) { return schema::scores("dla", name); };
    Dataset sc = r.read_numbers(ds("score"));
    std::vector<int64_t> idx(sc.values.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return std::fabs(sc.values[a]) > std::fabs(sc.values[b]); });
    const size_t n = std::min<size_t>(idx.size(), 24);
    double m = 1e-30;
    for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(sc.values[idx[i]]));
    const int W = 480, row = 16, mid = 300, half = 170;
    std::string s = fmt::format("<h3>per-head direct effect (largest |score| first{})</h3><svg class=\"bars\" width=\"{}\" "
                                "height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\">",
                                n < idx.size() ? fmt::format(", {} of {} heads", n, idx.size()) : "", W, row * n + 8, W, row * n + 8);
    s += fmt::format("<line class=\"ax\" x1=\"{}\" y1=\"0\" x2=\"{}\" y2=\"{}\"/>", mid, mid, row * n + 8);
    for (size_t i = 0; i < n; ++i) {
        const double v = sc.values[idx[i]];
        const double w = std::fabs(v) / m * half;
        s += fmt::format("<text class=\"tick\" x=\"60\" y=\"{}\" text-anchor=\"end\">{}</text>", row * i + 12, head_name(idx[i], H));
        s += fmt::format("<rect class=\"bar\" x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" data-value=\"{}\">"
                         "<title>dla {} {}</title></rect>",
                         v < 0 ? mid - w : mid, row * i + 2, w, row - 4, diverging(v / m), exact(v), head_name(idx[i], H), num(v));
        s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\">{}</text>", 66, row * i + 12, num(v));
    }
    s += "</svg>";
    // The decomposition, averaged over prompts: the terms sum to the logit difference.
    auto mean_of = [&](const std::string& name) -> double {
        if (!r.exists(ds(name))) return NAN;
        Dataset d = r.read_numbers(ds(name));
        if (d.values.empty()) return NAN;
        const int64_t P = d.shape.empty() ? 1 : d.shape[0];
        return std::accumulate(d.values.begin(), d.values.end(), 0.0) / static_cast<double>(P);
    };
    double heads = std::accumulate(sc.values.begin(), sc.values.end(), 0.0);
    s += "<table class=\"kv\"><caption>mean over prompts of each term (sums over layers)</caption>";
    s += fmt::format("<tr><th>all heads</th><td>{}</td></tr>", num(heads));
    for (const char* t : {"mlp", "attn_bias", "embed", "final_bias", "logit_diff"})
        if (r.exists(ds(t))) s += fmt::format("<tr><th>{}</th><td>{}</td></tr>", t, num(mean_of(t)));
    (void)L;
    return s + "</table>";
}

std::string maps_group(FileView& f, int top_k) {
    const std::string g = schema::maps_root();
    auto& r = *f.r;
    std::string table = "<table class=\"top\"><tr><th>relation</th><th>category</th><th>pairs</th><th>top heads (score)</th></tr>";
    std::string maps = "<div class=\"row\">";
    for (const auto& rel : r.children(g)) {
        const std::string rg = schema::scores("maps/" + rel);
        if (!r.is_group(rg) || !r.exists(schema::scores("maps/" + rel, "score"))) continue;
        Dataset d = r.read_numbers(schema::scores("maps/" + rel, "score"));
        if (!is_lh(d, -1, -1)) continue;
        Attrs a = r.attrs(rg);
        auto idx = order_desc(d.values);
        std::string tops;
        for (size_t i = 0; i < std::min<size_t>(5, idx.size()); ++i)
            tops += fmt::format("{}{} ({})", i ? ", " : "", head_name(idx[i], d.shape[1]), num(d.values[idx[i]]));
        table += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(rel), esc(attr_str(a, "category")),
                             esc(attr_str(a, "n_pairs_kept")), tops);
        Heatmap hm{schema::scores("maps/" + rel, "score"), "maps/" + rel, d.values, d.shape[0], d.shape[1]};
        maps += "<div><h4>" + esc(rel) + "</h4>" + render_heatmap(hm) + "</div>";
    }
    (void)top_k;
    return "<p class=\"desc\">MAPS: per relation, the fraction of (source, target) pairs whose target is in the top-k of the "
           "head's OV map.</p>" + table + "</table>" + maps + "</div><details><summary>attributes</summary>" +
           attrs_table(r.attrs(g)) + "</details>";
}

// ---- patching (/patching/<name>) ----

std::string patching_group(FileView& f, const std::string& name, int top_k) {
    const auto p = schema::read_patching(*f.r, name);
    const std::string g = schema::patching(name);
    const Attrs& a = p.attrs;
    std::string s;
    s += fmt::format("<p class=\"desc\"><b>{}</b> patching of {} ({}), metric {}: clean {}, corrupted {}. Score = (M_patched - "
                     "M_corrupt) / (M_clean - M_corrupt): 1 = the clean behaviour restored.</p>",
                     esc(attr_str(a, "method")), esc(attr_str(a, "what")), esc(attr_str(a, "positions")), esc(attr_str(a, "metric")),
                     num(p.metric_clean), num(p.metric_corrupt));
    const Dataset& sc = p.scores;
    if (sc.shape.size() == 1 && !p.path.shape.empty()) {  // path patching: one score per sender set
        const Dataset& lab = p.path;
        std::string t = "<table><tr><th>path</th><th>score</th></tr>";
        for (size_t i = 0; i < sc.values.size() && i < lab.strings.size(); ++i)
            t += fmt::format("<tr><td>{}</td><td data-value=\"{}\">{}</td></tr>", esc(lab.strings[i]), exact(sc.values[i]),
                             num(sc.values[i]));
        return s + t + "</table><details><summary>attributes</summary>" + attrs_table(a) + "</details>";
    }
    if (sc.shape.size() != 2 && sc.shape.size() != 3)
        return s + fmt::format("<p class=\"note\">{}/scores has shape {}: not drawn</p>", esc(g), shape_str(sc.shape));
    const int64_t L = sc.shape[0], U = sc.shape[1], T = sc.shape.size() == 3 ? sc.shape[2] : 1;
    Dataset per_head = sc;
    if (T > 1) {  // per position: each head's largest-magnitude position, signed
        per_head.shape = {L, U};
        per_head.values.assign(L * U, NAN);
        for (int64_t i = 0; i < L * U; ++i)
            for (int64_t t = 0; t < T; ++t) {
                const double v = sc.values[i * T + t];
                if (std::isnan(per_head.values[i]) || std::abs(v) > std::abs(per_head.values[i])) per_head.values[i] = v;
            }
        s += "<p class=\"note\">per position: each cell is the head's score at its position of largest |score|.</p>";
    }
    Heatmap hm{schema::patching(name, "scores"), "patch", per_head.values, L, U};
    hm.is_signed = true;
    if (attr_str(a, "what") == "k" || attr_str(a, "what") == "v") hm.col_axis = "kv head";
    s += "<div class=\"row\">" + render_heatmap(hm);
    s += top_table("patch/" + name, {{"score", per_head}}, U, top_k, fmt::format("top {} by score", std::min<int64_t>(top_k, L * U))) + "</div>";
    return s + "<details><summary>attributes</summary>" + attrs_table(a) + "</details>";
}

// ---- ablation (/ablation/<study>) ----
std::string ablation_study(FileView& f, const std::string& name) {
    auto& r = *f.r;
    const std::string g = schema::study(name);
    for (const char* need : {"masks", "metric", "kind"})
        if (!r.exists(schema::study(name, need))) return fmt::format("<p class=\"note\">{}: no {} dataset; not drawn</p>", esc(g), need);
    const auto st = schema::read_study(r, name);
    if (st.masks.is_string || st.metric.is_string)
        throw StorageError(fmt::format("{}: {}/masks and metric must hold numbers", r.path(), g));
    const Dataset &masks = st.masks, &metric = st.metric, &kind = st.kind;
    if (masks.shape.size() != 3 || metric.values.size() != static_cast<size_t>(masks.shape[0]) ||
        kind.strings.size() != metric.values.size())
        return fmt::format("<p class=\"note\">{}: masks {}, metric {}, kind {} disagree; not drawn</p>", esc(g),
                           shape_str(masks.shape), shape_str(metric.shape), shape_str(kind.shape));
    const int64_t S = masks.shape[0], L = masks.shape[1], H = masks.shape[2];
    std::vector<double> kk(S, NAN), seed(S, -1);
    if (!st.k.shape.empty() && !st.k.is_string) kk = st.k.values;
    if (!st.control_seed.shape.empty() && !st.control_seed.is_string) seed = st.control_seed.values;
    const Attrs& a = st.attrs;
    const std::string metric_name = attr_str(a, "metric").empty() ? "metric" : attr_str(a, "metric");
    auto heads_of = [&](int64_t s) {
        std::vector<int64_t> h;
        for (int64_t i = 0; i < L * H; ++i)
            if (masks.values[s * L * H + i] != 0) h.push_back(i);
        return h;
    };
    double base = NAN;
    for (int64_t s = 0; s < S; ++s)
        if (kind.strings[s] == "baseline") { base = metric.values[s]; break; }
    std::string out = fmt::format("<p class=\"desc\">{} configurations; mode <b>{}</b>, metric <b>{}</b>{}. Baseline (nothing "
                                  "ablated): <b>{}</b>.</p>",
                                  S, esc(attr_str(a, "mode")), esc(metric_name),
                                  attr_str(a, "dataset").empty() ? "" : ", data " + esc(attr_str(a, "dataset")), num(base));
    std::set<std::string> kinds(kind.strings.begin(), kind.strings.end());
    // single: heatmap of metric change.
    if (kinds.count("single")) {
        std::vector<double> d(L * H, NAN);
        for (int64_t s = 0; s < S; ++s)
            if (kind.strings[s] == "single") {
                auto h = heads_of(s);
                if (h.size() == 1) d[h[0]] = metric.values[s] - base;
            }
        Heatmap hm{schema::study(name, "metric"), name + ":Δ" + metric_name, d, L, H};
        hm.is_signed = true;
        out += "<h3>single-head ablation: change of " + esc(metric_name) + " from the baseline</h3>" + render_heatmap(hm);
    }
    if (kinds.count("cumulative")) {
        Series main{"top-k heads ablated", "main", {}}, ctl{"random controls (same size, excluding the heads under test)", "control", {}, false};
        if (std::isfinite(base)) main.pts.push_back({0, base, fmt::format("baseline k=0 {}", num(base))});
        std::map<double, std::vector<double>> by_k;
        for (int64_t s = 0; s < S; ++s) {
            const double k = std::isfinite(kk[s]) ? kk[s] : static_cast<double>(heads_of(s).size());
            if (kind.strings[s] == "cumulative") main.pts.push_back({k, metric.values[s], fmt::format("top-{} {}", k, num(metric.values[s]))});
            if (kind.strings[s] == "control") {
                ctl.pts.push_back({k, metric.values[s], fmt::format("control k={} seed={} {}", k, seed[s], num(metric.values[s]))});
                by_k[k].push_back(metric.values[s]);
            }
        }
        std::sort(main.pts.begin(), main.pts.end(), [](const ChartPoint& a, const ChartPoint& b) { return a.x < b.x; });
        std::vector<std::array<double, 3>> bars;
        Series mean{"control mean", "cmean", {}};
        for (auto& [k, v] : by_k) {
            bars.push_back({k, *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())});
            const double m = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
            mean.pts.push_back({k, m, fmt::format("control mean k={} {} (n={})", k, num(m), v.size())});
        }
        std::vector<Series> ser{main};
        if (!ctl.pts.empty()) ser.push_back(ctl), ser.push_back(mean);
        out += "<h3>cumulative ablation: " + esc(metric_name) + " against k (controls: points, min..max bars)</h3>" +
               render_chart(ser, "k (heads ablated)", metric_name, bars);
    }
    if (kinds.count("prune")) {
        Series p{"pruned (lowest importance first)", "main", {}};
        if (std::isfinite(base)) p.pts.push_back({0, base, "baseline 0% " + num(base)});
        for (int64_t s = 0; s < S; ++s)
            if (kind.strings[s] == "prune") {
                const double fr = static_cast<double>(heads_of(s).size()) / (L * H);
                p.pts.push_back({fr, metric.values[s], fmt::format("pruned {:.1f}% {}", 100 * fr, num(metric.values[s]))});
            }
        std::sort(p.pts.begin(), p.pts.end(), [](const ChartPoint& a, const ChartPoint& b) { return a.x < b.x; });
        out += "<h3>pruning curve</h3>" + render_chart({p}, "fraction of heads pruned", metric_name);
    }
    const Dataset al = schema::read_duo_alpha(r, name);
    if (!al.shape.empty()) {  // duo-gates: the learned gates
        if (al.shape == std::vector<int64_t>{L, H} && !al.is_string) {
            Heatmap hm{schema::study(name, "duo/alpha"), name + ":alpha", al.values, L, H};
            hm.fixed_lo = 0, hm.fixed_hi = 1;
            out += "<h3>DuoAttention's gates: alpha (1 = needs full attention, 0 = streams)</h3>" + render_heatmap(hm);
        }
    }
    // Every configuration that is not a single-head one, as a table.
    std::string t = "<table class=\"top\"><tr><th>#</th><th>kind</th><th>k</th><th>heads</th><th>" + esc(metric_name) +
                    "</th><th>change</th></tr>";
    int rows = 0;
    for (int64_t s = 0; s < S && rows < 200; ++s) {
        if (kind.strings[s] == "single") continue;
        auto h = heads_of(s);
        std::string hs;
        for (size_t i = 0; i < std::min<size_t>(h.size(), 12); ++i) hs += (i ? "," : "") + head_name(h[i], H);
        if (h.size() > 12) hs += fmt::format(", … ({} heads)", h.size());
        t += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td data-value=\"{}\">{}</td><td>{}</td></tr>", s,
                         esc(kind.strings[s]), std::isfinite(kk[s]) ? fmt::format("{}", kk[s]) : "", hs, exact(metric.values[s]),
                         num(metric.values[s]), num(metric.values[s] - base));
        ++rows;
    }
    out += "<details><summary>configurations</summary>" + t + "</table></details>";
    out += "<details><summary>attributes</summary>" + attrs_table(a) + "</details>";
    return out;
}

// ---- retrieval (/retrieval) ----
std::string retrieval_trials(FileView& f) {
    auto& r = *f.r;
    const std::string g = schema::retrieval_trials();
    for (const char* need : {"length", "depth", "rouge1_recall"})
        if (!r.exists(schema::retrieval_trials(need))) return fmt::format("<p class=\"note\">{}: no {} dataset; not drawn</p>", esc(g), need);
    auto len = r.read_numbers(schema::retrieval_trials("length")).values, dep = r.read_numbers(schema::retrieval_trials("depth")).values, rec = r.read_numbers(schema::retrieval_trials("rouge1_recall")).values;
    std::vector<double> passed(rec.size(), NAN), needle(rec.size(), -1);
    if (r.exists(schema::retrieval_trials("passed"))) passed = r.read_numbers(schema::retrieval_trials("passed")).values;
    if (r.exists(schema::retrieval_trials("needle"))) needle = r.read_numbers(schema::retrieval_trials("needle")).values;
    std::vector<std::string> resp;
    if (r.exists(schema::retrieval_trials("response"))) resp = r.read(schema::retrieval_trials("response")).strings;
    const size_t N = rec.size();
    if (len.size() != N || dep.size() != N)
        return fmt::format("<p class=\"note\">{}: length/depth/rouge1_recall sizes disagree; not drawn</p>", esc(g));
    std::set<double> ls(len.begin(), len.end()), ds(dep.begin(), dep.end());
    std::vector<double> lv(ls.begin(), ls.end()), dv(ds.begin(), ds.end());
    std::vector<double> sum(lv.size() * dv.size(), 0), acc(sum.size(), 0), cnt(sum.size(), 0);
    for (size_t i = 0; i < N; ++i) {
        const size_t a = std::lower_bound(dv.begin(), dv.end(), dep[i]) - dv.begin();
        const size_t b = std::lower_bound(lv.begin(), lv.end(), len[i]) - lv.begin();
        sum[a * lv.size() + b] += rec[i], acc[a * lv.size() + b] += passed[i], cnt[a * lv.size() + b] += 1;
    }
    std::vector<double> mean(sum.size(), NAN), accm(sum.size(), NAN);
    for (size_t i = 0; i < sum.size(); ++i)
        if (cnt[i] > 0) mean[i] = sum[i] / cnt[i], accm[i] = acc[i] / cnt[i];
    auto lab = [](const std::vector<double>& v, const char* suf) {
        std::vector<std::string> o;
        for (double x : v) o.push_back(fmt::format("{}{}", x, suf));
        return o;
    };
    double total_pass = 0;
    for (double p : passed) total_pass += std::isfinite(p) ? p : 0;
    std::string s = fmt::format("<p class=\"desc\">{} trials; {} passed ({:.1f}%). Rows: needle depth (% of the context); columns: "
                                "context length (tokens). Mean ROUGE-1 recall of the answer per cell.</p>",
                                N, total_pass, N ? 100.0 * total_pass / N : 0.0);
    Heatmap hm{schema::retrieval_trials("rouge1_recall"), "recall", mean, static_cast<int64_t>(dv.size()), static_cast<int64_t>(lv.size())};
    hm.row_axis = "depth %", hm.col_axis = "context length";
    hm.row_labels = lab(dv, ""), hm.col_labels = lab(lv, "");
    hm.fixed_lo = 0, hm.fixed_hi = 1;
    hm.cell_name = [lv, dv](int64_t i, int64_t j) { return fmt::format("length={} depth={}%", lv[j], dv[i]); };
    s += "<div class=\"row\"><div><h4>mean ROUGE-1 recall</h4>" + render_heatmap(hm) + "</div>";
    if (r.exists(schema::retrieval_trials("passed"))) {
        Heatmap ha = hm;
        ha.v = accm, ha.dataset = schema::retrieval_trials("passed"), ha.label = "accuracy";
        s += "<div><h4>accuracy (fraction passing)</h4>" + render_heatmap(ha) + "</div>";
    }
    s += "</div>";
    // Per needle.
    std::map<int64_t, std::array<double, 3>> pn;  // trials, passed, recall sum
    for (size_t i = 0; i < N; ++i) {
        auto& e = pn[static_cast<int64_t>(needle[i])];
        e[0] += 1, e[1] += std::isfinite(passed[i]) ? passed[i] : 0, e[2] += rec[i];
    }
    Attrs a = r.attrs(g);
    s += "<table class=\"top\"><caption>per needle</caption><tr><th>needle</th><th>trials</th><th>accuracy</th><th>mean "
         "ROUGE-1 recall</th></tr>";
    for (const auto& [k, e] : pn)
        s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", k, e[0], num(e[1] / e[0]), num(e[2] / e[0]));
    s += "</table>";
    if (!resp.empty()) {
        s += "<table class=\"top\"><caption>example responses (first 8 trials)</caption><tr><th>#</th><th>length</th><th>depth</th>"
             "<th>needle</th><th>recall</th><th>response</th></tr>";
        for (size_t i = 0; i < std::min<size_t>(8, std::min(N, resp.size())); ++i)
            s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>", i, len[i],
                             dep[i], needle[i], num(rec[i]), esc(resp[i]));
        s += "</table>";
    }
    s += "<details><summary>parameters</summary>" + attrs_table(a) + "</details>";
    return s;
}

std::string retrieval_ablation(FileView& f) {
    auto& r = *f.r;
    const std::string g = schema::retrieval_ablation();
    if (!r.exists(schema::retrieval_ablation("masks")) || !r.exists(schema::retrieval_ablation("accuracy"))) return "<p class=\"note\">" + esc(g) + ": no masks/accuracy; not drawn</p>";
    Dataset masks = r.read_numbers(schema::retrieval_ablation("masks"));
    auto acc = r.read_numbers(schema::retrieval_ablation("accuracy")).values;
    std::vector<double> rec, rl;
    int64_t N = 0;
    if (r.exists(schema::retrieval_ablation("rouge1_recall"))) {
        Dataset d = r.read_numbers(schema::retrieval_ablation("rouge1_recall"));
        if (d.shape.size() == 2) N = d.shape[1], rec = d.values;
    }
    if (N && r.exists(schema::retrieval_ablation("rougeL_f"))) {
        Dataset d = r.read_numbers(schema::retrieval_ablation("rougeL_f"));
        if (d.shape.size() == 2 && d.shape[1] == N && d.values.size() == rec.size()) rl = d.values;
    }
    if (masks.shape.size() != 3 || static_cast<size_t>(masks.shape[0]) != acc.size())
        return "<p class=\"note\">" + esc(g) + ": masks and accuracy disagree; not drawn</p>";
    const int64_t S = masks.shape[0], LH = masks.shape[1] * masks.shape[2], H = masks.shape[2];
    Attrs a = r.attrs(g);
    double base = NAN;
    for (const char* k : {"baseline_accuracy", "baseline"})
        if (a.count(k) && std::holds_alternative<double>(a.at(k))) base = std::get<double>(a.at(k));
    for (const char* k : {"baseline_accuracy", "baseline"})
        if (!std::isfinite(base) && r.exists(schema::retrieval_ablation(k)) && !r.is_group(schema::retrieval_ablation(k))) {
            auto d = r.read_numbers(schema::retrieval_ablation(k));
            if (!d.values.empty()) base = d.values[0];
        }
    Series named{"heads under test (set 0)", "main", {}, false}, ctl{"random controls", "control", {}, false}, bl{"baseline", "base", {}};
    std::string t = "<table class=\"top\"><tr><th>set</th><th>heads</th><th>accuracy</th><th>mean ROUGE-1 recall</th><th>mean ROUGE-L F</th></tr>";
    for (int64_t s = 0; s < S; ++s) {
        std::string hs;
        int n = 0;
        for (int64_t i = 0; i < LH; ++i)
            if (masks.values[s * LH + i] != 0) hs += (n++ ? "," : "") + head_name(i, H);
        double m = NAN, ml = NAN;
        if (N) m = std::accumulate(rec.begin() + s * N, rec.begin() + (s + 1) * N, 0.0) / N;
        if (!rl.empty()) ml = std::accumulate(rl.begin() + s * N, rl.begin() + (s + 1) * N, 0.0) / N;
        t += fmt::format("<tr><td>{}</td><td>{}</td><td data-value=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
                         s == 0 ? "tested" : fmt::format("control {}", s), hs, exact(acc[s]), num(acc[s]), num(m), num(ml));
        (s == 0 ? named : ctl).pts.push_back({s == 0 ? 0.0 : 1.0, acc[s], fmt::format("set {} accuracy {}", s, num(acc[s]))});
    }
    std::string out = fmt::format("<p class=\"desc\">query ablation ({}): accuracy with the heads under test ablated against "
                                  "random head sets of the same size. Baseline accuracy: <b>{}</b>.</p>",
                                  esc(attr_str(a, "ablation")), num(base));
    std::vector<Series> ser{named, ctl};
    if (std::isfinite(base)) {
        bl.pts = {{-0.2, base, "baseline " + num(base)}, {1.2, base, "baseline " + num(base)}};
        ser.push_back(bl);
    }
    out += render_chart(ser, "0 = heads under test, 1 = controls", "accuracy");
    return out + t + "</table><details><summary>attributes</summary>" + attrs_table(a) + "</details>";
}

// Streaming heads (retrieval --stream-sweep): accuracy against the fraction of heads kept full.
std::string retrieval_streaming(FileView& f) {
    auto& r = *f.r;
    const std::string g = schema::retrieval_streaming();
    for (const char* need : {"fractions", "accuracy"})
        if (!r.exists(schema::retrieval_streaming(need))) return fmt::format("<p class=\"note\">{}: no {} dataset; not drawn</p>", esc(g), need);
    const auto fr = r.read_numbers(schema::retrieval_streaming("fractions")).values;
    Dataset acc = r.read_numbers(schema::retrieval_streaming("accuracy"));
    const int64_t F = static_cast<int64_t>(fr.size());
    if (acc.shape.size() != 2 || acc.shape[1] != F || acc.shape[0] < 1)
        return fmt::format("<p class=\"note\">{}: accuracy {} does not match {} fractions; not drawn</p>", esc(g),
                           shape_str(acc.shape), F);
    const int64_t O = acc.shape[0];
    std::vector<double> kv(F, NAN), rl;
    if (r.exists(schema::retrieval_streaming("kv_budget"))) {
        auto d = r.read_numbers(schema::retrieval_streaming("kv_budget")).values;
        if (static_cast<int64_t>(d.size()) == F) kv = d;
    }
    if (r.exists(schema::retrieval_streaming("rougeL_f"))) {
        auto d = r.read_numbers(schema::retrieval_streaming("rougeL_f")).values;
        if (d.size() == acc.values.size()) rl = d;
    }
    Attrs a = r.attrs(g);
    double base = NAN;
    if (a.count("baseline_accuracy") && std::holds_alternative<double>(a.at("baseline_accuracy")))
        base = std::get<double>(a.at("baseline_accuracy"));
    Series main{"heads kept full by " + attr_str(a, "order_source"), "main", {}},
        ctl{"random orders", "control", {}, false}, mean{"random orders' mean", "cmean", {}}, bl{"baseline (every head full)", "base", {}};
    std::vector<std::array<double, 3>> bars;
    for (int64_t i = 0; i < F; ++i) {
        main.pts.push_back({fr[i], acc.values[i], fmt::format("order full={} accuracy {} kv_budget {}", fr[i], num(acc.values[i]), num(kv[i]))});
        if (O > 1) {
            double lo = INFINITY, hi = -INFINITY, sum = 0;
            for (int64_t o = 1; o < O; ++o) {
                const double v = acc.values[o * F + i];
                ctl.pts.push_back({fr[i], v, fmt::format("random order {} full={} accuracy {}", o, fr[i], num(v))});
                lo = std::min(lo, v), hi = std::max(hi, v), sum += v;
            }
            bars.push_back({fr[i], lo, hi});
            mean.pts.push_back({fr[i], sum / (O - 1), fmt::format("random mean full={} {}", fr[i], num(sum / (O - 1)))});
        }
    }
    std::vector<Series> ser{main};
    if (O > 1) ser.push_back(ctl), ser.push_back(mean);
    if (std::isfinite(base) && F > 0) {
        const double x0 = *std::min_element(fr.begin(), fr.end()), x1 = *std::max_element(fr.begin(), fr.end());
        bl.pts = {{x0, base, "baseline " + num(base)}, {x1, base, "baseline " + num(base)}};
        ser.push_back(bl);
    }
    std::string out = fmt::format("<p class=\"desc\">streaming heads: the heads outside the kept fraction see only {} sink and "
                                  "{} recent keys{}. Baseline accuracy: <b>{}</b>.</p>",
                                  esc(attr_str(a, "sink")), esc(attr_str(a, "recent")),
                                  attr_str(a, "compensate") == "true" ? " plus a compensation key" : "", num(base));
    out += render_chart(ser, "fraction of heads kept at full attention", "accuracy", bars);
    std::string t = "<table class=\"top\"><tr><th>full fraction</th><th>kv_budget</th><th>accuracy</th><th>ROUGE-L F</th>"
                    "<th>random orders' accuracy</th></tr>";
    for (int64_t i = 0; i < F; ++i) {
        std::string rnd;
        for (int64_t o = 1; o < O; ++o) rnd += (o > 1 ? " " : "") + num(acc.values[o * F + i]);
        t += fmt::format("<tr><td>{}</td><td>{}</td><td data-value=\"{}\">{}</td><td>{}</td><td>{}</td></tr>", num(fr[i]), num(kv[i]),
                         exact(acc.values[i]), num(acc.values[i]), rl.empty() ? "" : num(rl[i]), rnd);
    }
    return out + t + "</table><details><summary>attributes</summary>" + attrs_table(a) + "</details>";
}

// KV-cache policies (retrieval --kv-compare): accuracy against the prompt cache kept (measured), one
// line per policy, and each order policy's random orders' mean dashed in its colour.
std::string retrieval_kv_compare(FileView& f) {
    const std::string g = schema::retrieval_kv_compare();
    schema::KvCompareRecord k;
    try {
        k = schema::read_kv_compare(*f.r);
    } catch (const Error& e) {
        return fmt::format("<p class=\"note\">{}: {}; not drawn</p>", esc(g), esc(e.what()));
    }
    const int64_t P = k.P, B = k.B, R = k.R;
    // One chart per measure: accuracy, and the output kept (same tokens as the full cache).
    auto chart = [&](const std::vector<float>& main, const std::vector<float>& rnd, const std::vector<float>& rkv,
                     const std::string& what) {
    std::vector<Series> ser;
    for (int64_t p = 0; p < P; ++p) {
        const std::string css = fmt::format("p{}", p % 8), rcss = fmt::format("r{}", p % 8);
        Series s{k.policies[p], css, {}}, rs{k.policies[p] + ": random orders' mean", rcss, {}};
        for (int64_t b = 0; b < B; ++b) {
            const int64_t i = p * B + b;
            s.pts.push_back({k.kv_fraction[i], main[i],
                             fmt::format("{} budget {} kept {} {} {}", k.policies[p], num(k.budgets[b]), num(k.kv_fraction[i]), what, num(main[i]))});
            double acc = 0, kv = 0;
            int64_t n = 0;
            for (int64_t r = 0; r < R; ++r)
                if (std::isfinite(rnd[i * R + r])) acc += rnd[i * R + r], kv += rkv[i * R + r], ++n;
            if (n > 0) rs.pts.push_back({kv / n, acc / n, fmt::format("{} random orders' mean at budget {}: {}", k.policies[p], num(k.budgets[b]), num(acc / n))});
        }
        ser.push_back(std::move(s));
        if (!rs.pts.empty()) ser.push_back(std::move(rs));
    }
    return render_chart(ser, "fraction of the prompt KV cache kept", what);
    };
    const Attrs& a = k.attrs;
    std::string out = fmt::format("<p class=\"desc\">accuracy of the needle test when each head keeps only what its policy keeps "
                                  "of the prompt cache (x: the fraction kept, measured; compressed at the {}); dashed: random "
                                  "KV-group orders at the same count. Baseline accuracy: <b>{}</b>.</p>",
                                  attr_str(a, "compress_at") == "question" ? "question (the context alone)" : "prompt's end",
                                  esc(attr_str(a, "baseline_accuracy")));
    out += chart(k.accuracy, k.random_accuracy, k.random_kv_fraction, "accuracy");
    if (!k.same_as_full.empty()) out += chart(k.same_as_full, k.random_same_as_full, k.random_kv_fraction, "output as the full cache's");
    std::string t = "<table class=\"top\"><tr><th>policy</th><th>budget</th><th>kept</th><th>accuracy</th><th>ROUGE-L F</th>"
                    "<th>same output as full</th><th>groups whole</th><th>random orders' accuracy</th></tr>";
    for (int64_t p = 0; p < P; ++p)
        for (int64_t b = 0; b < B; ++b) {
            const int64_t i = p * B + b;
            std::string rnd;
            for (int64_t r = 0; r < R; ++r)
                if (std::isfinite(k.random_accuracy[i * R + r])) rnd += (rnd.empty() ? "" : " ") + num(k.random_accuracy[i * R + r]);
            t += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td data-value=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                             esc(k.policies[p]), num(k.budgets[b]), num(k.kv_fraction[i]), exact(k.accuracy[i]), num(k.accuracy[i]),
                             num(k.rougeL_f[i]), k.same_as_full.empty() ? "" : num(k.same_as_full[i]),
                             k.full_groups[i] < 0 ? "" : std::to_string(k.full_groups[i]), rnd);
        }
    return out + t + "</table><details><summary>attributes</summary>" + attrs_table(a) + "</details>";
}

// AttentionInfluence: each set's scores sorted (a quantile plot: the named heads against the
// controls), the mean score per set, and the top and bottom samples of the ranking.
std::string influence_section(FileView& f, int top_k) {
    const auto x = schema::read_influence(*f.r);
    const auto names = [&] {
        const auto it = x.attrs.find("heads");
        return it != x.attrs.end() && std::holds_alternative<std::vector<std::string>>(it->second)
                   ? std::get<std::vector<std::string>>(it->second)
                   : std::vector<std::string>(static_cast<size_t>(x.S));
    }();
    std::vector<Series> ser;
    std::string means = "<table class=\"top\"><tr><th>set</th><th>heads</th><th>mean score</th><th>median</th></tr>";
    for (int64_t s = 0; s < x.S; ++s) {
        std::vector<double> v;
        for (int64_t i = 0; i < x.N; ++i)
            if (std::isfinite(x.score[static_cast<size_t>(s * x.N + i)])) v.push_back(x.score[static_cast<size_t>(s * x.N + i)]);
        std::sort(v.begin(), v.end(), std::greater<double>());
        Series se{s == 0 ? "heads " + names[0] : "random controls", s == 0 ? "main" : "control", {}, s == 0};
        for (size_t k = 0; k < v.size(); ++k)
            se.pts.push_back({v.size() > 1 ? static_cast<double>(k) / static_cast<double>(v.size() - 1) : 0.0, v[k],
                              fmt::format("{} rank {} score {}", s == 0 ? "heads" : "control " + std::to_string(s), k + 1, num(v[k]))});
        double mean = 0;
        for (double y : v) mean += y;
        means += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", s == 0 ? "heads" : "control " + std::to_string(s),
                             esc(names[static_cast<size_t>(s)]), num(v.empty() ? NAN : mean / static_cast<double>(v.size())),
                             num(v.empty() ? NAN : v[v.size() / 2]));
        if (s == 0 || ser.size() < 2) ser.push_back(std::move(se));
        else ser[1].pts.insert(ser[1].pts.end(), se.pts.begin(), se.pts.end());
    }
    std::string out = fmt::format("<p class=\"desc\">{} samples of <code>{}</code>; score = (loss with the heads masked - loss) / "
                                  "loss ({}). The top {} of the ranking are marked selected.</p>",
                                  x.N, esc(attr_str(x.attrs, "corpus")), esc(attr_str(x.attrs, "loss_tokens")),
                                  esc(attr_str(x.attrs, "n_selected")));
    out += "<div class=\"row\">" + render_chart(ser, "rank / (N - 1), highest score first", "score") + means + "</table></div>";
    const int64_t k = std::min<int64_t>(top_k, x.N);
    std::string t = "<table class=\"top\"><tr><th>rank</th><th>line</th><th>score</th><th>loss</th><th>masked loss</th><th>first words</th></tr>";
    auto row = [&](int64_t r) {
        const auto i = static_cast<size_t>(x.rank[static_cast<size_t>(r)]);
        t += fmt::format("<tr><td>{}</td><td>{}</td><td data-value=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", r + 1,
                         x.line[i], exact(x.score[i]), num(x.score[i]), num(x.loss[i]), num(x.masked_loss[i]), esc(x.preview[i]));
    };
    for (int64_t r = 0; r < k; ++r) row(r);
    if (x.N > 2 * k) t += "<tr><td colspan=\"6\">...</td></tr>";
    for (int64_t r = std::max(k, x.N - k); r < x.N; ++r) row(r);
    out += t + "</table><details><summary>attributes</summary>" + attrs_table(x.attrs) + "</details>";
    return out;
}

std::string render_file(FileView& f, const ReportOptions& o) {
    auto& r = *f.r;
    std::string s = provenance(f);
    if (r.is_group(schema::scores_root())) {
        // The head-role probes first, in the order people read them; the rest alphabetically.
        std::vector<std::string> probes = r.children(schema::scores_root());
        const std::vector<std::string> order{"induction", "previous-token", "duplicate-token", "induction-loss", "attention-sink",
                                             "retrieval", "locos"};
        auto rank = [&](const std::string& p) { return std::find(order.begin(), order.end(), p) - order.begin(); };
        std::stable_sort(probes.begin(), probes.end(), [&](const std::string& x, const std::string& y) { return rank(x) < rank(y); });
        for (const auto& p : probes) {
            if (!r.is_group(schema::scores(p))) continue;
            if (p == "maps" && !r.exists(schema::scores(p, "score"))) {
                s += section(f, "MAPS", maps_group(f, o.top_k));
                ++f.known;
            } else if (r.exists(schema::scores(p, "score"))) {
                std::string body = score_group(f, p, o.top_k);
                Dataset sc = r.read_numbers(schema::scores(p, "score"));
                if (p == "dla" && is_lh(sc, -1, -1)) body += dla_extra(f, sc.shape[0], sc.shape[1]);
                s += section(f, "Score: " + p, body);
                ++f.known;
            }
        }
    }
    for (const auto& st : schema::study_names(r)) {
        s += section(f, "Ablation: " + st, ablation_study(f, st));
        ++f.known;
    }
    for (const auto& p : schema::patching_names(r)) {
        s += section(f, "Patching: " + p, patching_group(f, p, o.top_k));
        ++f.known;
    }
    if (r.is_group(schema::retrieval_trials())) {
        s += section(f, "Retrieval trials", retrieval_trials(f));
        ++f.known;
    }
    if (r.is_group(schema::retrieval_ablation())) {
        s += section(f, "Retrieval: query ablation", retrieval_ablation(f));
        ++f.known;
    }
    if (r.is_group(schema::retrieval_streaming())) {
        s += section(f, "Retrieval: streaming heads", retrieval_streaming(f));
        ++f.known;
    }
    if (r.is_group(schema::retrieval_kv_compare())) {
        s += section(f, "Retrieval: KV-cache policies at equal memory", retrieval_kv_compare(f));
        ++f.known;
    }
    if (r.is_group(schema::influence())) {
        s += section(f, "AttentionInfluence", influence_section(f, o.top_k));
        ++f.known;
    }
    return s;
}

// Probes with a score [L, H] in the file (maps relations as maps/<relation>).
std::map<std::string, Dataset> scores_of(ResultReader& r) {
    std::map<std::string, Dataset> out;
    for (const auto& p : schema::score_probes(r)) {
        Dataset d = r.read_numbers(schema::scores(p, "score"));
        if (is_lh(d, -1, -1)) out.emplace(p, std::move(d));
    }
    return out;
}

const char* kCss = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1a1a1a;margin:0;background:#fafafa}
header{background:#1f2d3d;color:#fff;padding:12px 20px}header h1{margin:0;font-size:20px}
header p{margin:2px 0 0;color:#c8d3df;font-size:12px}
main{padding:12px 20px}nav{font-size:12px;margin-bottom:8px}nav a{margin-right:10px;color:#24507a}
.files{display:grid;gap:16px}.file{min-width:0}.file>h2.fname{font-size:15px;word-break:break-all;border-bottom:2px solid #1f2d3d}
section{background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px 12px;margin:10px 0;overflow-x:auto}
section h2{font-size:16px;margin:2px 0 6px}h3{font-size:14px;margin:10px 0 4px}h4{font-size:13px;margin:6px 0 2px}
.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
table{border-collapse:collapse;font-size:12px;margin:4px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
th{background:#f0f2f5}table.kv th{width:11em}caption{text-align:left;font-size:12px;color:#555}
td code{font-size:11px;word-break:break-all}.desc{margin:2px 0 6px}.note{color:#666;font-size:12px}
figure{margin:0}figcaption{font-size:11px}svg text{font-size:10px;fill:#333}svg text.cv{font-size:10px;text-anchor:middle;dominant-baseline:middle;pointer-events:none}
svg text.cv.l{fill:#fff}svg text.cv.d{fill:#000}
svg text.axis{font-size:11px;fill:#111}rect.cell:hover{stroke:#000;stroke-width:2}rect.bar:hover{stroke:#000}
line.ax{stroke:#333}line.grid{stroke:#eee}line.spread{stroke:#c77c02;stroke-width:2}
polyline.main{fill:none;stroke:#3b528b;stroke-width:2}circle.main{fill:#3b528b}
polyline.cmean{fill:none;stroke:#c77c02;stroke-dasharray:4 3}circle.cmean{fill:#c77c02}
circle.control{fill:#e9a23b;fill-opacity:.6;stroke:#c77c02}polyline.base{fill:none;stroke:#777;stroke-dasharray:2 2}circle.base{fill:#777}
.keys{font-size:11px}.key::before{content:"";display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
.key.main::before{background:#3b528b}.key.control::before{background:#e9a23b}.key.cmean::before{background:#c77c02}.key.base::before{background:#777}
details{margin:4px 0}summary{cursor:pointer;font-size:12px;color:#24507a}
polyline.p0{fill:none;stroke:#3b528b;stroke-width:2}circle.p0{fill:#3b528b}.key.p0::before{background:#3b528b}polyline.p1{fill:none;stroke:#21918c;stroke-width:2}circle.p1{fill:#21918c}.key.p1::before{background:#21918c}polyline.p2{fill:none;stroke:#5ec962;stroke-width:2}circle.p2{fill:#5ec962}.key.p2::before{background:#5ec962}polyline.p3{fill:none;stroke:#b5367a;stroke-width:2}circle.p3{fill:#b5367a}.key.p3::before{background:#b5367a}polyline.p4{fill:none;stroke:#e16462;stroke-width:2}circle.p4{fill:#e16462}.key.p4::before{background:#e16462}polyline.p5{fill:none;stroke:#6a3d9a;stroke-width:2}circle.p5{fill:#6a3d9a}.key.p5::before{background:#6a3d9a}polyline.p6{fill:none;stroke:#1f78b4;stroke-width:2}circle.p6{fill:#1f78b4}.key.p6::before{background:#1f78b4}polyline.p7{fill:none;stroke:#444;stroke-width:2}circle.p7{fill:#444}.key.p7::before{background:#444}polyline.r0{fill:none;stroke:#3b528b;stroke-width:1;stroke-dasharray:4 3}circle.r0{fill:#fff;stroke:#3b528b}.key.r0::before{background:#fff;border:1px dashed #3b528b}polyline.r1{fill:none;stroke:#21918c;stroke-width:1;stroke-dasharray:4 3}circle.r1{fill:#fff;stroke:#21918c}.key.r1::before{background:#fff;border:1px dashed #21918c}polyline.r2{fill:none;stroke:#5ec962;stroke-width:1;stroke-dasharray:4 3}circle.r2{fill:#fff;stroke:#5ec962}.key.r2::before{background:#fff;border:1px dashed #5ec962}polyline.r3{fill:none;stroke:#b5367a;stroke-width:1;stroke-dasharray:4 3}circle.r3{fill:#fff;stroke:#b5367a}.key.r3::before{background:#fff;border:1px dashed #b5367a}polyline.r4{fill:none;stroke:#e16462;stroke-width:1;stroke-dasharray:4 3}circle.r4{fill:#fff;stroke:#e16462}.key.r4::before{background:#fff;border:1px dashed #e16462}polyline.r5{fill:none;stroke:#6a3d9a;stroke-width:1;stroke-dasharray:4 3}circle.r5{fill:#fff;stroke:#6a3d9a}.key.r5::before{background:#fff;border:1px dashed #6a3d9a}polyline.r6{fill:none;stroke:#1f78b4;stroke-width:1;stroke-dasharray:4 3}circle.r6{fill:#fff;stroke:#1f78b4}.key.r6::before{background:#fff;border:1px dashed #1f78b4}polyline.r7{fill:none;stroke:#444;stroke-width:1;stroke-dasharray:4 3}circle.r7{fill:#fff;stroke:#444}.key.r7::before{background:#fff;border:1px dashed #444}
@media print{details{display:block}section{break-inside:avoid}}
)";

}  // namespace

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

std::string render_report(const std::vector<std::string>& files, const ReportOptions& o) {
    if (files.empty()) throw UsageError("report: no result file given");
    g_uid = 0;
    std::vector<FileView> views;
    for (size_t i = 0; i < files.size(); ++i) {
        if (!file_exists(files[i])) throw StorageError(fmt::format("{}: no such file", files[i]));
        FileView f;
        f.path = files[i];
        f.index = static_cast<int>(i);
        f.r = std::make_unique<ResultReader>(files[i]);
        views.push_back(std::move(f));
    }
    std::vector<std::string> bodies;
    for (auto& f : views) {
        bodies.push_back(render_file(f, o));
        if (f.known == 0) {
            std::vector<std::string> top = f.r->children("/");
            throw DataError(fmt::format("{}: no group the report knows (/scores/<probe>/score, /ablation/<study>, /patching/<name>, /retrieval/...); "
                                        "the file has: {}",
                                        f.path, top.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(top, ", "))));
        }
    }
    std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">";
    h += "<title>" + esc(o.title) + "</title><style>" + kCss + "</style></head><body>";
    std::string names;
    for (const auto& f : views) names += (names.empty() ? "" : " · ") + esc(f.path);
    h += fmt::format("<header><h1>{}</h1><p>{} · hover a cell (or read its title) for the value · generated {}</p></header><main>",
                     esc(o.title), names, esc(utc_now_iso8601()));
    // Differences between files: same probe, same shape, relative to the first file.
    std::string diff;
    if (views.size() > 1) {
        auto first = scores_of(*views[0].r);
        for (size_t i = 1; i < views.size(); ++i) {
            auto other = scores_of(*views[i].r);
            for (const auto& [p, d0] : first) {
                auto it = other.find(p);
                if (it == other.end() || it->second.shape != d0.shape) continue;
                std::vector<double> d(d0.values.size());
                for (size_t j = 0; j < d.size(); ++j) d[j] = it->second.values[j] - d0.values[j];
                Heatmap hm{fmt::format("diff:{}:{}", i, p), "Δ" + p, d, d0.shape[0], d0.shape[1]};
                hm.is_signed = true;
                diff += fmt::format("<div><h4>{}: {} − {}</h4>", esc(p), esc(views[i].path), esc(views[0].path)) + render_heatmap(hm) +
                        "</div>";
            }
        }
        h += "<section id=\"differences\"><h2>Differences</h2>" +
             (diff.empty() ? std::string("<p class=\"note\">no probe is present with the same shape in these files</p>")
                           : "<p class=\"desc\">each later file minus the first, per probe present in both with the same "
                             "shape (diverging scale centred at 0).</p><div class=\"row\">" + diff + "</div>") +
             "</section>";
    }
    h += fmt::format("<div class=\"files\" style=\"grid-template-columns:repeat({},minmax(0,1fr))\">", views.size());
    for (size_t i = 0; i < views.size(); ++i) {
        std::string nav = "<nav>";
        for (const auto& t : views[i].toc) nav += fmt::format("<a href=\"#f{}-{}\">{}</a>", i, slug(t), esc(t));
        h += fmt::format("<div class=\"file\" data-file=\"{}\"><h2 class=\"fname\">{}</h2>{}</nav>{}</div>", esc(views[i].path),
                         esc(views[i].path), nav, bodies[i]);
    }
    h += "</div></main></body></html>\n";
    return h;
}

}  // namespace hs
