// headscope report: Gu et al.'s attention-sink rates (/scores/sink-rate, `detect --probe sink-rate`):
// the model's rate, the rate of each layer as bars, and the heads that sink in every sequence. The
// heatmaps of alpha_0 (score) and of each head's rate are score_group's.
#include "report_sections.h"

#include "report.h"
#include "report_draw.h"
#include "schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <variant>

namespace hs::report_detail {

std::string sink_rates(FileView& f) {
    auto& r = *f.r;
    const std::string g = schema::scores("sink-rate");
    if (!r.exists(schema::scores("sink-rate", "layer_rate"))) return "";
    const Attrs a = r.attrs(g);
    auto number = [&](const char* k) {
        const auto it = a.find(k);
        return it != a.end() && std::holds_alternative<double>(it->second) ? std::get<double>(it->second) : NAN;
    };
    const double eps = number("epsilon"), model = number("model_rate");
    const Dataset lr = r.read_numbers(schema::scores("sink-rate", "layer_rate"));
    std::string s = fmt::format("<h3>sink rates (epsilon = {})</h3><p>model sink rate: <b>{}%</b> of (sequence, layer, head) "
                                "triples have alpha_0 &gt; epsilon (Gu et al.'s Sink<sub>1</sub><sup>&epsilon;</sup>)</p>",
                                num(eps), num(100 * model));
    const int64_t L = static_cast<int64_t>(lr.values.size());
    const int W = 480, row = 16, x0 = 60, bw = 360;
    s += fmt::format("<svg class=\"bars\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\">", W, row * L + 8, W,
                     row * L + 8);
    s += fmt::format("<line class=\"ax\" x1=\"{}\" y1=\"0\" x2=\"{}\" y2=\"{}\"/>", x0, x0, row * L + 8);
    for (int64_t l = 0; l < L; ++l) {
        const double v = lr.values[l];
        const double w = std::isfinite(v) ? std::max(0.0, std::min(1.0, v)) * bw : 0;
        s += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">layer {}</text>", x0 - 4, row * l + 12, l);
        s += fmt::format("<rect class=\"bar\" x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" data-value=\"{}\">"
                         "<title>layer {} sink rate {}%</title></rect>",
                         x0, row * l + 2, w, row - 4, viridis(std::isfinite(v) ? v : 0), exact(v), l, num(100 * v));
        s += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{}\">{}%</text>", x0 + w + 4, row * l + 12, num(100 * v));
    }
    s += "</svg>";
    // The heads above epsilon in every sequence.
    if (r.exists(schema::scores("sink-rate", "rate"))) {
        const Dataset hr = r.read_numbers(schema::scores("sink-rate", "rate"));
        if (is_lh(hr, -1, -1)) {
            std::vector<std::string> all;
            for (size_t i = 0; i < hr.values.size(); ++i)
                if (hr.values[i] >= 1) all.push_back(head_name(static_cast<int64_t>(i), hr.shape[1]));
            s += fmt::format("<p class=\"note\">{} of {} heads sink in every sequence{}{}</p>", all.size(), hr.values.size(),
                             all.empty() ? "" : ": ", esc(fmt::format("{}", fmt::join(all, ", "))));
        }
    }
    return s;
}

}  // namespace hs::report_detail
