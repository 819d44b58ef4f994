// headscope report: the KV-cache policies section (/retrieval/kv_compare).
#include "report_sections.h"

#include "report_draw.h"
#include "errors.h"
#include "schema.h"

#include <fmt/format.h>

namespace hs::report_detail {

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
    // A column's name: its budget, or its capacity in tokens per query head (--kv-capacity).
    auto column = [&](int64_t b) {
        return k.capacities[b] > 0 ? fmt::format("capacity {}", k.capacities[b]) : fmt::format("budget {}", num(k.budgets[b]));
    };
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
                             fmt::format("{} {} kept {} ({} KiB) {} {}", k.policies[p], column(b), num(k.kv_fraction[i]),
                                         num(static_cast<double>(k.kv_bytes[i]) / 1024.0), what, num(main[i]))});
            double acc = 0, kv = 0;
            int64_t n = 0;
            for (int64_t r = 0; r < R; ++r)
                if (std::isfinite(rnd[i * R + r])) acc += rnd[i * R + r], kv += rkv[i * R + r], ++n;
            if (n > 0) rs.pts.push_back({kv / n, acc / n, fmt::format("{} random orders' mean at {}: {}", k.policies[p], column(b), num(acc / n))});
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
                                  attr_str(a, "compress_at") == "question" ? "question (the context alone)"
                                  : attr_str(a, "compress_at") == "tail"
                                      ? fmt::format("prompt's last {} tokens, which decode through the compressed cache",
                                                    esc(attr_str(a, "tail_tokens")))
                                      : std::string("prompt's end"),
                                  esc(attr_str(a, "baseline_accuracy")));
    out += chart(k.accuracy, k.random_accuracy, k.random_kv_fraction, "accuracy");
    if (!k.same_as_full.empty()) out += chart(k.same_as_full, k.random_same_as_full, k.random_kv_fraction, "output as the full cache's");
    std::string t = "<table class=\"top\"><tr><th>policy</th><th>budget</th><th>capacity (tokens a head)</th><th>kept</th>"
                    "<th>kept KiB</th><th>accuracy</th><th>ROUGE-L F</th><th>same output as full</th><th>groups whole</th>"
                    "<th>peak cache KiB (measured)</th><th>ms a decode step (measured)</th>"
                    "<th>random orders' accuracy</th></tr>";
    const bool timed = !k.peak_cache_bytes.empty();  // a file before the packed cache: none
    for (int64_t p = 0; p < P; ++p)
        for (int64_t b = 0; b < B; ++b) {
            const int64_t i = p * B + b;
            std::string rnd;
            for (int64_t r = 0; r < R; ++r)
                if (std::isfinite(k.random_accuracy[i * R + r])) rnd += (rnd.empty() ? "" : " ") + num(k.random_accuracy[i * R + r]);
            t += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td data-value=\"{}\">{}</td><td>{}</td><td>{}</td>"
                             "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                             esc(k.policies[p]), num(k.budgets[b]), k.capacities[b] > 0 ? std::to_string(k.capacities[b]) : "",
                             num(k.kv_fraction[i]), num(static_cast<double>(k.kv_bytes[i]) / 1024.0), exact(k.accuracy[i]), num(k.accuracy[i]),
                             num(k.rougeL_f[i]), k.same_as_full.empty() ? "" : num(k.same_as_full[i]),
                             k.full_groups[i] < 0 ? "" : std::to_string(k.full_groups[i]),
                             timed ? num(static_cast<double>(k.peak_cache_bytes[i]) / 1024.0) : "", timed ? num(k.decode_ms[i]) : "", rnd);
        }
    return out + t + "</table><details><summary>attributes</summary>" + attrs_table(a) + "</details>";
}

}  // namespace hs::report_detail
