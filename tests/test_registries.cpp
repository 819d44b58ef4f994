// The two registries a new method lands through (docs/architecture.md, "Where a new thing goes"): the
// needle scores (probes/needle/scores.h) and the KV-cache policies (probes/needle/kv/kv_policy.h).
// Each registry, the HDF5 layout (src/store/schema.cpp layout(), which tests/test_schema.cpp ties to
// docs/hdf5-schema.md) and docs/architecture.md's tables of them name the same things, both ways: a
// score or a policy added to one and not the others fails here, naming what is missing where.
#include <doctest/doctest.h>

#include "kv_policy.h"
#include "schema.h"
#include "scores.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace hs;

namespace {

std::string read_source(const std::string& rel) {
    std::ifstream f(std::string(HS_SOURCE_DIR) + "/" + rel);
    REQUIRE_MESSAGE(f.good(), rel);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string strip(std::string s) {
    for (size_t p; (p = s.find('`')) != std::string::npos;) s.erase(p, 1);
    const auto a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The rows of the first Markdown table after the heading that starts with `heading` (each row's cells, stripped of
// backticks; the header and separator rows left out).
std::vector<std::vector<std::string>> doc_table(const std::string& doc, const std::string& heading) {
    std::istringstream in(doc);
    std::string line;
    bool found = false, in_table = false;
    std::vector<std::vector<std::string>> rows;
    while (std::getline(in, line)) {
        if (!found) {
            found = line.rfind(heading, 0) == 0;  // the heading, or the heading followed by more words
            continue;
        }
        if (line.rfind("|", 0) != 0) {
            if (in_table) break;
            continue;
        }
        std::vector<std::string> cells;
        std::stringstream cs(line.substr(1));
        for (std::string c; std::getline(cs, c, '|');) cells.push_back(strip(c));
        if (!in_table) {  // the header row
            in_table = true;
            continue;
        }
        if (!cells.empty() && !cells[0].empty() && cells[0][0] == '-') continue;  // the separator
        rows.push_back(cells);
    }
    REQUIRE_MESSAGE(found, "docs/architecture.md has no heading '" << heading << "'");
    return rows;
}

bool layout_has(const std::string& path) {
    for (const auto& e : schema::layout())
        if (std::string(e.pattern) == path) return true;
    return false;
}

std::string join(const std::vector<NeedleArrayName>& v) {
    std::string s;
    for (const auto& a : v) s += (s.empty() ? "" : ", ") + std::string(a.name);
    return s;
}

}  // namespace

TEST_CASE("needle scores: the registry, the layout and docs/architecture.md agree") {
    const auto rows = doc_table(read_source("docs/architecture.md"), "### The needle scores");
    std::map<std::string, std::vector<std::string>> doc;
    for (const auto& r : rows) {
        REQUIRE(r.size() >= 4);
        doc[r[0]] = r;
    }
    std::set<std::string> names;
    for (const auto& row : needle_scores()) {
        const std::string name = row.name;
        names.insert(name);
        CAPTURE(name);
        // the layout: its score, each array it keeps per trial and per step
        CHECK_MESSAGE(layout_has("/scores/<probe>/score"), "layout() lacks /scores/<probe>/score");
        for (const auto& a : row.trial_arrays)
            CHECK_MESSAGE(layout_has("/retrieval/trials/" + std::string(a.name)), "layout() lacks /retrieval/trials/" << a.name);
        for (const auto& a : row.step_arrays)
            CHECK_MESSAGE(layout_has("/retrieval/steps/" + std::string(a.name)), "layout() lacks /retrieval/steps/" << a.name);
        const bool has_functions = row.step != nullptr && row.trial != nullptr;
        CHECK(has_functions);
        CHECK(std::string(row.description).size() > 20);
        // the doc's row: its per-trial and per-step arrays as the registry lists them
        REQUIRE_MESSAGE(doc.count(name), "docs/architecture.md's needle score table has no row " << name);
        CHECK(doc[name][2] == join(row.trial_arrays));
        CHECK(doc[name][3] == join(row.step_arrays));
        CHECK(parse_needle_score(name) == row.id);
    }
    for (const auto& [name, r] : doc) CHECK_MESSAGE(names.count(name), "docs/architecture.md names a needle score the registry lacks: " << name);
    CHECK(static_cast<int>(needle_scores().size()) == kNeedleScoreCount);
}

TEST_CASE("KV policies: the registry, its files and docs/architecture.md agree") {
    const auto rows = doc_table(read_source("docs/architecture.md"), "### The KV-cache policies");
    std::map<std::string, std::vector<std::string>> doc;
    for (const auto& r : rows) {
        REQUIRE(r.size() >= 3);
        doc[r[0]] = r;
    }
    std::set<std::string> names;
    for (const KvPolicy* p : kv_policies()) {
        const bool arg = p->score_from() == KvScoreFrom::kArgument;
        const std::string name = std::string(p->name()) + (arg ? ":SCORE" : "");
        names.insert(name);
        CAPTURE(name);
        REQUIRE_MESSAGE(doc.count(name), "docs/architecture.md's KV policy table has no row " << name);
        // its file, named in the doc's second column, exists
        const std::string file = doc[name][1];
        CHECK(file == "kv_" + std::string(p->name()) + ".cpp");
        CHECK_MESSAGE(std::filesystem::exists(std::string(HS_SOURCE_DIR) + "/probes/needle/kv/" + file), file << " does not exist");
        std::string parsed_arg;
        CHECK(find_kv_policy(arg ? std::string(p->name()) + ":locos" : name, &parsed_arg) == p);
    }
    for (const auto& [name, r] : doc) CHECK_MESSAGE(names.count(name), "docs/architecture.md names a KV policy the registry lacks: " << name);
}
