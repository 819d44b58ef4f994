// headscope report: the AttentionInfluence section (/influence).
#include "report_sections.h"

#include "report_draw.h"
#include "schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace hs::report_detail {

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

}  // namespace hs::report_detail
