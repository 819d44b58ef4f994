// headscope report: the /scores sections: a probe's [L, H] score (heatmap, top heads, its other
// per-head maps), successor heads' tasks, DLA's per-head bars and decomposition, the MAPS relations.
#include "report_sections.h"

#include "report.h"
#include "report_draw.h"
#include "schema.h"
#include "util.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace hs::report_detail {
namespace {

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

}  // namespace

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

}  // namespace hs::report_detail
