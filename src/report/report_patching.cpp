// headscope report: the /patching/<name> sections (activation, attribution and path patching).
#include "report_sections.h"

#include "report_draw.h"
#include "schema.h"
#include "util.h"

#include <fmt/format.h>

namespace hs::report_detail {

std::string patching_group(FileView& f, const std::string& name, int top_k) {
    const auto p = schema::read_patching(*f.r, name);
    const std::string g = schema::patching(name);
    const Attrs& a = p.attrs;
    std::string s;
    // fv-heads writes its AIE unnormalised (score_records.cpp write_fv_heads).
    const bool fv = attr_str(a, "method") == "function-vector";
    s += fmt::format("<p class=\"desc\"><b>{}</b> patching of {} ({}), metric {}: clean {}, corrupted {}. {}</p>",
                     esc(attr_str(a, "method")), esc(attr_str(a, "what")), esc(attr_str(a, "positions")), esc(attr_str(a, "metric")),
                     num(p.metric_clean), num(p.metric_corrupt),
                     fv ? "Score = the average indirect effect (Todd et al. 2024): p(answer) with the head's mean clean z at the "
                          "last token minus p(answer) without, over the shuffled-label prompts."
                        : "Score = (M_patched - M_corrupt) / (M_clean - M_corrupt): 1 = the clean behaviour restored.");
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

}  // namespace hs::report_detail
