// headscope report: HTML building. Every section is drawn from what the file holds; nothing is
// recomputed except summaries (means, differences) that the page states in words. This file puts
// the page together (the file columns, their sections in order, the differences between files, the
// CSS); each section is drawn in its own report_<section>.cpp, the primitives in report_draw.cpp.
#include "report.h"

#include "errors.h"
#include "report_draw.h"
#include "report_sections.h"
#include "schema.h"
#include "store.h"
#include "util.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace hs {
namespace report_detail {

std::string section(FileView& f, const std::string& title, const std::string& body) {
    f.toc.push_back(title);
    return fmt::format("<section id=\"f{}-{}\"><h2>{}</h2>{}</section>", f.index, slug(title), esc(title), body);
}

}  // namespace report_detail

// The page below is assembled from the primitives and the sections by their names.
using namespace report_detail;

namespace {

std::string render_file(FileView& f, const ReportOptions& o) {
    auto& r = *f.r;
    std::string s = provenance(f);
    if (r.is_group("/atlas")) {
        s += section(f, "Head atlas", atlas_section(f));
        ++f.known;
    }
    if (r.is_group(schema::scores_root())) {
        // The head-role probes first, in the order people read them; the rest alphabetically.
        std::vector<std::string> probes = r.children(schema::scores_root());
        const std::vector<std::string> order{"induction", "previous-token", "duplicate-token", "induction-loss", "attention-sink", "sink-rate",
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
                if (p == "sink-rate") body += sink_rates(f);
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
