// headscope report: the /ablation/<study> sections (single-head heatmap, cumulative and pruning
// curves against random controls, DuoAttention's gates, the configurations).
#include "report_sections.h"

#include "report_draw.h"
#include "errors.h"
#include "schema.h"
#include "util.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

namespace hs::report_detail {

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

}  // namespace hs::report_detail
