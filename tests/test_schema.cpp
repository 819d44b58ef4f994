// The HDF5 layout (src/store/schema.{h,cpp}): docs/hdf5-schema.md and layout() name the same paths,
// both ways; each result type's write and read functions round-trip; a path outside the layout is
// refused.
#include <doctest/doctest.h>

#include "schema.h"
#include "store.h"
#include "tmpdir.h"

#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

using namespace hs;

namespace {

std::string read_doc() {
    std::ifstream f(std::string(HS_SOURCE_DIR) + "/docs/hdf5-schema.md");
    REQUIRE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string strip(std::string s) {
    for (const char* c : {"`", "\\"})
        for (size_t p; (p = s.find(c)) != std::string::npos;) s.erase(p, 1);
    const auto a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Every path the doc names: any token that starts with one of the layout's roots (in prose, headings,
// tables), plus, in the tables of objects (first column "object", "path" or "name"), each comma-
// separated sibling of a row's first path, and names relative to the section heading's path.
std::set<std::string> documented_paths(const std::string& doc) {
    const std::regex token(R"((^|[^A-Za-z0-9_.:/])(/(meta|scores|inputs|logits|tokens|experiment|data|ablation|patching|retrieval|influence|atlas)(/[A-Za-z0-9_<>\-]+)*)/?)");
    const std::regex name(R"(^[A-Za-z_][A-Za-z0-9_<>/\-]*$)");
    std::set<std::string> out;
    std::istringstream in(doc);
    std::string line, section;
    bool code = false, object_table = false;
    auto first_path = [&](const std::string& text) -> std::string {
        std::smatch m;
        return std::regex_search(text, m, token) ? m[2].str() : std::string();
    };
    while (std::getline(in, line)) {
        if (line.rfind("```", 0) == 0) code = !code;
        if (code) continue;
        std::string clean = line;
        for (size_t p; (p = clean.find('\\')) != std::string::npos;) clean.erase(p, 1);
        for (auto it = std::sregex_iterator(clean.begin(), clean.end(), token); it != std::sregex_iterator(); ++it)
            out.insert((*it)[2].str());
        if (clean.rfind("#", 0) == 0) section = first_path(clean), object_table = false;
        if (clean.rfind("|", 0) != 0) {
            object_table = false;
            continue;
        }
        const auto cell = strip(clean.substr(1, clean.find('|', 1) - 1));
        if (cell == "object" || cell == "path" || cell == "name") {
            object_table = true;
            continue;
        }
        if (!object_table || cell.empty() || cell[0] == '-') continue;
        std::vector<std::string> parts;
        std::stringstream ps(cell.substr(0, cell.find(" (")));
        for (std::string p; std::getline(ps, p, ',');) parts.push_back(strip(p));
        std::string base;
        if (!parts[0].empty() && parts[0][0] == '/') {
            base = parts[0].substr(0, parts[0].rfind('/'));
        } else if (!section.empty() && std::regex_match(parts[0], name)) {
            base = section;
            out.insert(base + "/" + parts[0]);
        }
        for (size_t i = 1; i < parts.size(); ++i)
            if (!base.empty() && std::regex_match(parts[i], name)) out.insert(base + "/" + parts[i]);
    }
    return out;
}

}  // namespace

TEST_CASE("docs/hdf5-schema.md and the schema's layout name the same paths") {
    const auto doc = documented_paths(read_doc());
    REQUIRE(doc.size() > 100);
    for (const auto& p : doc) {
        CAPTURE(p);
        CHECK(schema::in_layout(p));  // every documented path exists in the schema
    }
    for (const auto& e : schema::layout()) {
        const std::string pattern = e.pattern;  // a std::string, so a failure prints the path, not a pointer
        CAPTURE(pattern);
        CHECK(doc.count(pattern) == 1);  // and every path of the schema is documented
    }
    // The parser sees what it should: siblings, relative names, headings, prose.
    for (const char* p : {"/ablation/<study>/gates/g_minus", "/scores/<probe>/samples", "/inputs/<probe>/tokens",
                          "/retrieval/trials/needle", "/retrieval"})
        CHECK(doc.count(p) == 1);
}

TEST_CASE("schema: path builders, and a path outside the layout is refused") {
    CHECK(schema::study("single", "masks") == "/ablation/single/masks");
    CHECK(schema::scores("maps/capital", "score") == "/scores/maps/capital/score");
    CHECK(schema::retrieval_streaming("kv_budget") == "/retrieval/streaming/kv_budget");
    CHECK(schema::retrieval_trials() == "/retrieval/trials");
    CHECK(schema::in_layout("/scores/maps/capital/score"));
    CHECK(schema::in_layout("/scores/dla/per_position/prompt_3"));
    CHECK_FALSE(schema::in_layout("/scores/a/b/c"));
    CHECK_FALSE(schema::in_layout("/ablation/single/nope"));
    TempDir dir;
    ResultWriter w(dir.file("x.h5"), WriteMode::kCreate);
    CHECK_THROWS_AS(schema::write_array(w, "/ablation/single/nope", {{1}, std::vector<float>{1.f}, {}}), std::logic_error);
    CHECK_THROWS_AS(schema::write_scores(w, {"induction", {}, {{"bogus", {{1}, std::vector<float>{1.f}, {}}}}}), std::logic_error);
}

TEST_CASE("schema: each result type's write and read round-trip") {
    TempDir dir;
    const std::string path = dir.file("r.h5");
    {
        ResultWriter w(path, WriteMode::kCreate);
        schema::write_meta(w, {{"weights_sha256", std::string("abc")}});
        schema::write_scores(w, {"induction", {{"probe", std::string("induction")}},
                                 {{"score", {{1, 2}, std::vector<float>{0.5f, -1.f}, {{"unit", std::string("x")}}}},
                                  {"baseline", {{1}, std::vector<float>{3.f}, {}}}}});
        schema::write_scores(w, {"maps/capital", {}, {{"score", {{1, 2}, std::vector<float>{1.f, 2.f}, {}}}}});
        schema::write_experiment(w, {{"sha256", std::string("s")}});
        schema::StudyRecord s;
        s.name = "single", s.S = 2, s.N = 1, s.L = 1, s.H = 2;
        s.masks = {0, 0, 1, 0}, s.metric = {1.f, 2.f}, s.metric_rows = {1.f, 2.f}, s.kind = {"baseline", "single"};
        s.label = {"", "L0H0"}, s.k = {0, 1}, s.control_seed = {-1, -1}, s.done = {1, 0}, s.batch = {0, 0};
        s.attrs = {{"metric", std::string("loss")}};
        schema::write_study(w, s);
        w.set_attrs(schema::study("single"), s.attrs);
        schema::DuoRecord d;
        d.L = 1, d.H = 2, d.K = 1, d.steps = 1, d.alpha = {0.25f, 0.75f}, d.alpha_kv = {0.5f}, d.history = {1.f, 2.f};
        schema::write_duo(w, "single", d);
        schema::GatesRecord g;
        g.starts = 1, g.L = 1, g.H = 2, g.g0 = {0.5f, 1.f}, g.g_plus = {1.f, 0.f}, g.g_minus = {0.f, 1.f};
        g.roles = {1, 2}, g.role = {1, 2}, g.role_counts = {0, 0, 1, 0, 0, 1, 0, 0}, g.objective = {1.f, 2.f, 3.f};
        g.attrs = {{"starts", int64_t{1}}};
        schema::write_gates(w, "single", g);
        schema::PatchingRecord p;
        p.name = "path", p.shape = {1}, p.scores = {0.75f}, p.patched = {2.f}, p.paths = {"L0H0->L1H0:k"};
        p.metric_clean = 1.f, p.metric_corrupt = 3.f, p.attrs = {{"method", std::string("path")}};
        schema::write_patching(w, p);
        schema::InfluenceRecord inf;
        inf.N = 2, inf.S = 1, inf.L = 1, inf.H = 2;
        inf.loss = {2.f, 3.f}, inf.masked_loss = {2.5f, 3.f}, inf.score = {0.25f, 0.f}, inf.n_tokens = {4, 9};
        inf.line = {1, 3}, inf.rank = {0, 1}, inf.selected = {1, 0}, inf.truncated = {0, 1}, inf.masks = {1, 0};
        inf.done = {1, 1}, inf.length = {5, 12};
        inf.preview = {"Once", "Tom"}, inf.attrs = {{"corpus", std::string("c.jsonl")}};
        inf.detect_score = {0.5f, 1.f};
        schema::write_influence(w, inf);
        w.commit();
    }
    ResultReader r(path);
    CHECK(attr_to_string(schema::read_meta(r).at("weights_sha256")) == "abc");
    CHECK(schema::attr_text(r, schema::experiment(), "sha256") == "s");
    CHECK(schema::score_probes(r) == std::vector<std::string>{"induction", "maps/capital"});
    const auto sc = schema::read_scores(r, "induction");
    CHECK(sc.score.shape == std::vector<int64_t>{1, 2});
    CHECK(sc.score.values == std::vector<double>{0.5, -1.0});
    CHECK(attr_to_string(sc.attrs.at("unit")) == "x");
    REQUIRE(sc.others.size() == 1);
    CHECK(sc.others[0].first == "baseline");
    CHECK(schema::study_names(r) == std::vector<std::string>{"single"});
    const auto st = schema::read_study(r, "single");
    CHECK(st.masks.shape == std::vector<int64_t>{2, 1, 2});
    CHECK(st.done.values == std::vector<double>{1, 0});
    CHECK(st.kind.strings == std::vector<std::string>{"baseline", "single"});
    CHECK(st.factor.shape.empty());
    CHECK(schema::read_duo_alpha(r, "single").values == std::vector<double>{0.25, 0.75});
    const auto duo = schema::read_duo(r, "single");
    CHECK((duo.L == 1 && duo.H == 2 && duo.K == 1 && duo.steps == 1));
    CHECK(duo.alpha_kv == std::vector<float>{0.5f});
    CHECK(duo.history == std::vector<float>{1.f, 2.f});
    const auto gates = schema::read_gates(r, "single");
    CHECK((gates.starts == 1 && gates.L == 1 && gates.H == 2));
    CHECK(gates.g_minus == std::vector<float>{0.f, 1.f});
    CHECK(gates.role_counts == std::vector<int64_t>{0, 0, 1, 0, 0, 1, 0, 0});
    CHECK(gates.objective == std::vector<float>{1.f, 2.f, 3.f});
    CHECK(attr_to_string(gates.attrs.at("starts")) == "1");
    CHECK(schema::patching_names(r) == std::vector<std::string>{"path"});
    const auto pr = schema::read_patching(r, "path");
    CHECK(pr.scores.values == std::vector<double>{0.75});
    CHECK(pr.path.strings == std::vector<std::string>{"L0H0->L1H0:k"});
    CHECK(pr.metric_clean == 1.0);
    CHECK(pr.metric_corrupt == 3.0);
    const auto inf = schema::read_influence(r);
    CHECK((inf.N == 2 && inf.S == 1 && inf.L == 1 && inf.H == 2));
    CHECK(inf.masked_loss == std::vector<float>{2.5f, 3.f});
    CHECK(inf.truncated == std::vector<uint8_t>{0, 1});
    CHECK(inf.length == std::vector<int64_t>{5, 12});
    CHECK(inf.preview == std::vector<std::string>{"Once", "Tom"});
    CHECK(inf.detect_score == std::vector<float>{0.5f, 1.f});
    CHECK(attr_to_string(inf.attrs.at("corpus")) == "c.jsonl");
}

TEST_CASE("schema: the needle scan's per-trial record round-trips (what --resume and merge read)") {
    TempDir dir;
    const std::string path = dir.file("n.h5");
    schema::NeedleRecord nr;
    // The arrays as the needle score registry names them (probes/needle/scores.cpp; src/ does not see it).
    const schema::NeedleArrayNames names{{{"retrieval", true}, {"locos", true}, {"lplus", false}, {"lminus", false}, {"r2", false}},
                                         {{"credit", true}, {"lplus", true}, {"lminus", true}, {"r2", false}}};
    nr.init(2, 1, 2, 3, 2, true, names);
    auto& ret = nr.trial_arrays[0].values;
    auto& r2 = nr.trial_arrays[4].values;
    nr.done = {1, 0}, nr.generated = {5, 6, -1, -1, -1, -1}, nr.response = {"a b", ""}, nr.passed = {1, 0};
    nr.answer_steps = {2, 0}, ret = {0.5f, 0.f, NAN, NAN}, nr.step_arrays[0].values[0] = 0.25f;
    r2 = {0.125f, 0.f, NAN, NAN}, nr.step_arrays[3].values[1] = 0.375f;
    nr.init_sets(1, {1, 0});
    nr.abl_done = {1, 1}, nr.abl_passed = {0, 1}, nr.abl_generated = {7, -1, 8, 9};
    schema::NeedleScoresRecord sc;
    sc.n_done = 1, sc.n_pass = 1, sc.accuracy = 1.0, sc.abl_accuracy = {0.5f};
    sc.scores = {{"retrieval", {0.5f, 0.f}, {}, 1, true},
                 {"locos", {0.f, 0.f}, {{"ci_low", {NAN, NAN}}, {"ci_high", {NAN, NAN}}}, 0, false},
                 {"r2", {0.125f, 0.f}, {}, 1, false}};
    {
        ResultWriter w(path, WriteMode::kCreate);
        schema::write_meta(w, {{"n_layers", int64_t{1}}, {"n_heads", int64_t{2}}});
        schema::write_needle_results(w, nr, sc);
        schema::write_needle_results(w, nr, sc);  // a checkpoint rewrites every dataset
        w.commit();
    }
    ResultReader r(path);
    const auto back = schema::read_needle_results(r, names);
    CHECK((back.N == 2 && back.L == 1 && back.H == 2 && back.steps == 3 && back.abl_steps == 2 && back.with_steps));
    CHECK(back.generated == nr.generated);
    CHECK(back.response == nr.response);
    CHECK(back.answer_steps == nr.answer_steps);
    REQUIRE((back.trial_arrays.size() == 5 && back.step_arrays.size() == 4));
    const auto &bret = back.trial_arrays[0].values, &br2 = back.trial_arrays[4].values;
    const auto &bcredit = back.step_arrays[0].values, &bsr2 = back.step_arrays[3].values;
    CHECK(bret[0] == 0.5f);
    CHECK(std::isnan(bret[2]));
    CHECK(bcredit[0] == 0.25f);
    CHECK((br2[0] == 0.125f && std::isnan(br2[3]) && bsr2[1] == 0.375f && std::isnan(bsr2[0])));
    CHECK(r.read_numbers(schema::scores("r2", "score")).values == std::vector<double>{0.125, 0.0});
    CHECK((back.S == 1 && back.masks == std::vector<int32_t>{1, 0}));
    CHECK(back.abl_generated == nr.abl_generated);
    CHECK(back.abl_passed == nr.abl_passed);
    CHECK(r.read_numbers(schema::retrieval_ablation("accuracy")).values == std::vector<double>{0.5});
    CHECK(attr_to_string(r.attrs(schema::scores("retrieval")).at("n_trials_scored")) == "1");
}
