// headscope report: the head atlas (/atlas, `headscope atlas`): every head's scores and roles in one
// table, the heads with several roles, the columns' correlations as a heatmap, and where each
// column and threshold comes from.
#include "report_sections.h"

#include "atlas_records.h"
#include "report_draw.h"

#include <fmt/format.h>

#include <cmath>

namespace hs::report_detail {

std::string atlas_section(FileView& f) {
    const schema::AtlasRecord a = schema::read_atlas(*f.r);
    const int64_t S = a.S, LH = a.L * a.H;
    std::string s = "<p class=\"desc\">Every cheap per-head score of the model as a column; a head takes a column's role "
                    "when its score is above the column's threshold.</p>";
    // Heads with two roles or more.
    std::vector<std::string> multi;
    for (int64_t i = 0; i < LH; ++i)
        if (a.n_roles[i] >= 2) {
            std::vector<std::string> rs;
            for (int64_t k = 0; k < S; ++k)
                if (a.role[k * LH + i]) rs.push_back(a.roles[k]);
            multi.push_back(fmt::format("{} ({})", head_name(i, a.H), fmt::join(rs, ", ")));
        }
    s += fmt::format("<p><b>heads with several roles:</b> {}</p>", multi.empty() ? "none" : esc(fmt::format("{}", fmt::join(multi, "; "))));
    if (!std::isnan(a.model_sink_rate))
        s += fmt::format("<p>model sink rate (Gu et al., epsilon {}): <b>{}%</b></p>", num(a.sink_epsilon), num(100 * a.model_sink_rate));
    // The table of every head.
    std::string t = "<table class=\"top\"><caption>every head: its scores (a role's cell in bold) and roles</caption><tr><th>head</th>";
    for (int64_t k = 0; k < S; ++k) t += "<th>" + esc(a.columns[k]) + "</th>";
    t += "<th>roles</th></tr>";
    for (int64_t i = 0; i < LH; ++i) {
        t += "<tr><td>" + head_name(i, a.H) + "</td>";
        std::vector<std::string> rs;
        for (int64_t k = 0; k < S; ++k) {
            const bool role = a.role[k * LH + i] != 0;
            if (role) rs.push_back(a.roles[k]);
            const std::string v = num(a.scores[k * LH + i]);
            t += role ? "<td><b>" + v + "</b></td>" : "<td>" + v + "</td>";
        }
        t += "<td>" + esc(fmt::format("{}", fmt::join(rs, ", "))) + "</td></tr>";
    }
    s += "<details open><summary>every head (" + std::to_string(LH) + ")</summary>" + t + "</table></details>";
    // Correlations.
    Heatmap hm{"/atlas/correlation", "rho", {}, S, S};
    for (float v : a.correlation) hm.v.push_back(v);
    hm.row_axis = "score", hm.col_axis = "score", hm.row_labels = a.columns, hm.col_labels = a.columns;
    hm.is_signed = true, hm.fixed_lo = -1, hm.fixed_hi = 1;
    hm.cell_name = [&](int64_t r, int64_t c) { return a.columns[r] + " ~ " + a.columns[c]; };
    s += "<h3>Spearman correlations between the scores, over heads</h3>" + render_heatmap(hm);
    // Where each column comes from.
    std::string c = "<table><caption>the columns</caption><tr><th>score</th><th>source</th><th>role</th><th>threshold</th>"
                    "<th>threshold from</th><th>heads with the role</th></tr>";
    for (int64_t k = 0; k < S; ++k) {
        int64_t n = 0;
        for (int64_t i = 0; i < LH; ++i) n += a.role[k * LH + i];
        c += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(a.columns[k]),
                         esc(a.sources[k]), esc(a.roles[k]), std::isnan(a.thresholds[k]) ? "none" : num(a.thresholds[k]),
                         esc(a.threshold_sources[k]), std::isnan(a.thresholds[k]) ? "" : std::to_string(n));
    }
    s += c + "</table>";
    if (!a.skipped.empty()) s += "<p class=\"note\">skipped: " + esc(fmt::format("{}", fmt::join(a.skipped, "; "))) + "</p>";
    return s;
}

}  // namespace hs::report_detail
