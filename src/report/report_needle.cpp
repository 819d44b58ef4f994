// headscope report: the needle test's sections (/retrieval): the trials by context length and
// depth, the query ablation against random head sets, the streaming-heads sweep.
#include "report_sections.h"

#include "report_draw.h"
#include "schema.h"
#include "util.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

namespace hs::report_detail {

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

}  // namespace hs::report_detail
