// headscope report (src/report/report.cpp): the page shows the file's values, one cell per head, stays small,
// uses no network, and refuses bad input with the documented errors.
#include <doctest/doctest.h>

#include "errors.h"
#include "report.h"
#include "store.h"
#include "tmpdir.h"

#include <cmath>
#include <fstream>
#include <map>
#include <random>

using namespace hs;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f, float shift = 0.f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0, 1);
    std::vector<float> v(n);
    for (auto& x : v) x = shift + scale * d(g);
    return v;
}

struct Cell {
    std::string title_label, head;
    double title_value, data_value;
};

// The cells of the heatmap whose data-dataset is `ds`, in document order.
std::vector<Cell> cells_of(const std::string& html, const std::string& ds) {
    std::vector<Cell> out;
    const size_t a = html.find("data-dataset=\"" + ds + "\"");
    if (a == std::string::npos) return out;
    const size_t end = html.find("</svg>", a);
    const std::string open = "<rect class=\"cell\"", dv = "data-value=\"", t0 = "<title>", t1 = "</title>";
    for (size_t p = html.find(open, a); p < end; p = html.find(open, p + 1)) {
        const size_t v = html.find(dv, p) + dv.size();
        const double value = std::stod(html.substr(v, html.find('"', v) - v));
        const size_t ts = html.find(t0, p) + t0.size();
        const std::string title = html.substr(ts, html.find(t1, ts) - ts);
        const size_t s1 = title.find(' '), s2 = title.rfind(' ');
        out.push_back({title.substr(0, s1), title.substr(s1 + 1, s2 - s1 - 1), std::stod(title.substr(s2 + 1)), value});
    }
    return out;
}

// Writes a file with detect-like scores for every probe of a L x H model, plus copy suppression's
// extra maps, LOCOS with its interval and a DLA group.
void write_scores(const std::string& path, int64_t L, int64_t H, uint32_t seed) {
    ResultWriter w(path, WriteMode::kForce);
    w.set_attrs("/meta", {{"tool", std::string("headscope")}, {"model_path", std::string("models/x")},
                          {"n_layers", L}, {"n_heads", H}, {"weights_sha256", std::string("abc123")},
                          {"command_line", std::string("headscope detect models/x --out x.h5")}});
    const size_t n = static_cast<size_t>(L * H);
    for (const char* p : {"induction", "previous-token", "duplicate-token", "attention-sink"}) {
        w.write(std::string("/scores/") + p + "/score", randn(n, seed++, 0.2f, 0.3f), {L, H});
        w.set_attrs(std::string("/scores/") + p, {{"probe", std::string(p)}, {"convention", std::string("stripe")},
                                                  {"description", std::string("test scores")}});
    }
    w.write("/scores/locos/score", randn(n, seed++), {L, H});
    w.write("/scores/locos/ci_low", randn(n, seed++), {L, H});
    w.write("/scores/locos/ci_high", randn(n, seed++), {L, H});
    w.write("/scores/dla/score", randn(n, seed++), {L, H});
    for (const char* c : {"ov_median_rank", "ov_frac_rank0", "qk_median_rank", "qk_frac_rank0"})
        w.write(std::string("/scores/copy-suppression/") + c, randn(n, seed++), {L, H});
    w.write("/scores/copy-suppression/score", randn(n, seed++), {L, H});
    w.commit();
}

}  // namespace

TEST_CASE("report: colour scales (viridis ends, luminance monotonic for greyscale; diverging white at 0)") {
    CHECK(viridis(0) == "#440154");
    CHECK(viridis(1) == "#fde725");
    auto lum = [](const std::string& c) {
        auto ch = [&](int i) { return std::stoi(c.substr(1 + 2 * i, 2), nullptr, 16) / 255.0; };
        return 0.2126 * ch(0) + 0.7152 * ch(1) + 0.0722 * ch(2);
    };
    double prev = -1;
    for (int i = 0; i <= 50; ++i) {
        const double l = lum(viridis(i / 50.0));
        CHECK(l > prev);  // strictly brighter: readable in greyscale
        prev = l;
    }
    CHECK(lum(diverging(0)) > 0.95);
    // Darkness grows with |t| on both sides, so magnitude reads in greyscale.
    CHECK(lum(diverging(0.5)) > lum(diverging(1.0)));
    CHECK(lum(diverging(-0.5)) > lum(diverging(-1.0)));
    CHECK(diverging(-1) != diverging(1));
}

TEST_CASE("report: one cell per head with the file's values; 32 x 32 report under 2 MB; no remote reference") {
    TempDir t;
    const int64_t L = 32, H = 32;
    const std::string f = t.file("big.h5");
    write_scores(f, L, H, 7);
    const std::string html = render_report({f});
    CHECK(html.size() < 2u * 1024 * 1024);
    MESSAGE("32 x 32 report with 7 score groups (and 4 extra maps in the tables): " << html.size() / 1024 << " KiB");
    ResultReader r(f);
    for (const char* p : {"induction", "previous-token", "locos", "dla", "copy-suppression"}) {
        const std::string ds = std::string("/scores/") + p + "/score";
        auto d = r.read(ds);
        auto cells = cells_of(html, ds);
        REQUIRE(cells.size() == static_cast<size_t>(L * H));
        for (int64_t i = 0; i < L * H; ++i) {
            CHECK(cells[i].title_label == p);
            CHECK(cells[i].head == "L" + std::to_string(i / H) + "H" + std::to_string(i % H));
            // data-value: 9 significant digits of the stored float32; title: 4 decimals.
            CHECK(std::fabs(cells[i].data_value - d.values[i]) <= 1e-6 * std::max(1.0, std::fabs(d.values[i])));
            CHECK(std::fabs(cells[i].title_value - d.values[i]) <= 5.01e-5);
        }
    }
    // Top table: the first row is the argmax.
    auto d = r.read("/scores/induction/score");
    const auto best = std::max_element(d.values.begin(), d.values.end()) - d.values.begin();
    const std::string head = "L" + std::to_string(best / H) + "H" + std::to_string(best % H);
    const auto tp = html.find("<table class=\"top\" data-probe=\"induction\">");
    REQUIRE(tp != std::string::npos);
    CHECK(html.find("<td>1</td><td>" + head + "</td>", tp) < html.find("</table>", tp));
    // Self-contained: no URL scheme, no protocol-relative or external reference.
    CHECK(html.find("http:") == std::string::npos);
    CHECK(html.find("https:") == std::string::npos);
    CHECK(html.find("//") == std::string::npos);
    CHECK(html.find("src=") == std::string::npos);
    CHECK(html.find("<script") == std::string::npos);
}

TEST_CASE("report: two files side by side with a difference heatmap equal to B - A") {
    TempDir t;
    const std::string a = t.file("a.h5"), b = t.file("b.h5");
    write_scores(a, 2, 4, 1);
    write_scores(b, 2, 4, 100);
    const std::string html = render_report({a, b});
    ResultReader ra(a), rb(b);
    auto da = ra.read("/scores/induction/score"), db = rb.read("/scores/induction/score");
    auto cells = cells_of(html, "diff:1:induction");
    REQUIRE(cells.size() == 8u);
    for (size_t i = 0; i < 8; ++i) {
        CHECK(cells[i].title_label == "Δinduction");
        CHECK(std::fabs(cells[i].data_value - (db.values[i] - da.values[i])) < 1e-6);
    }
    // Both files' own heatmaps are there.
    CHECK(html.find("data-file=\"" + a + "\"") != std::string::npos);
    CHECK(html.find("data-file=\"" + b + "\"") != std::string::npos);
}

TEST_CASE("report: ablation, retrieval (docs/hdf5-schema.md names) and single-sweep deltas equal metric - baseline") {
    TempDir t;
    const std::string f = t.file("abl.h5");
    const int64_t L = 2, H = 3, S = 1 + L * H;
    {
        ResultWriter w(f, WriteMode::kForce);
        std::vector<int32_t> masks(S * L * H, 0);
        std::vector<float> metric(S);
        std::vector<std::string> kind(S, "single");
        kind[0] = "baseline";
        metric[0] = 2.0f;
        for (int64_t s = 1; s < S; ++s) masks[s * L * H + (s - 1)] = 1, metric[s] = 2.0f + 0.25f * s;
        w.write("/ablation/single/masks", masks, {S, L, H});
        w.write("/ablation/single/metric", metric, {S});
        w.write_strings("/ablation/single/kind", kind);
        w.set_attrs("/ablation/single", {{"mode", std::string("zero")}, {"metric", std::string("loss")}});
        std::vector<int64_t> len{40, 40, 80, 80}, dep{0, 100, 0, 100}, needle{0, 1, 0, 1}, passed{1, 0, 1, 1};
        w.write("/retrieval/trials/length", len, {4});
        w.write("/retrieval/trials/depth", dep, {4});
        w.write("/retrieval/trials/needle", needle, {4});
        w.write("/retrieval/trials/passed", passed, {4});
        w.write("/retrieval/trials/rouge1_recall", std::vector<float>{1.f, 0.25f, 1.f, 0.5f}, {4});
        w.write_strings("/retrieval/trials/response", {"qZ", "<b>x", "qZ", "q"});
        w.commit();
    }
    const std::string html = render_report({f});
    auto cells = cells_of(html, "/ablation/single/metric");
    REQUIRE(cells.size() == static_cast<size_t>(L * H));
    for (int64_t i = 0; i < L * H; ++i) CHECK(cells[i].data_value == doctest::Approx(0.25 * (i + 1)).epsilon(1e-6));
    auto grid = cells_of(html, "/retrieval/trials/rouge1_recall");
    REQUIRE(grid.size() == 4u);  // depth rows {0, 100} x length columns {40, 80}
    CHECK(grid[0].data_value == doctest::Approx(1.0));   // depth 0, length 40
    CHECK(grid[1].data_value == doctest::Approx(1.0));   // depth 0, length 80
    CHECK(grid[2].data_value == doctest::Approx(0.25));  // depth 100, length 40
    CHECK(grid[3].data_value == doctest::Approx(0.5));   // depth 100, length 80
    CHECK(grid[2].head == "length=40 depth=100%");
    CHECK(html.find("&lt;b&gt;x") != std::string::npos);  // responses are escaped
    CHECK(html.find("<b>x") == std::string::npos);
}

TEST_CASE("report: bad input: not HDF5 (StorageError), no known group (DataError), missing file") {
    TempDir t;
    {
        std::ofstream o(t.file("text.h5"));
        o << "not hdf5\n";
    }
    CHECK_THROWS_AS(render_report({t.file("text.h5")}), StorageError);
    CHECK_THROWS_AS(render_report({t.file("missing.h5")}), StorageError);
    {
        ResultWriter w(t.file("meta.h5"), WriteMode::kForce);
        w.set_attrs("/meta", {{"tool", std::string("headscope")}});
        w.write("/logits", std::vector<float>{1, 2}, {1, 2});
        w.commit();
    }
    try {
        render_report({t.file("meta.h5")});
        FAIL("no error");
    } catch (const DataError& e) {
        CHECK(std::string(e.what()).find("meta.h5: no group the report knows") != std::string::npos);
    }
}
