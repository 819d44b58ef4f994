// headscope export: /scores/<probe>/score tables of a result file in long format (one row per
// head: probe, layer, head, value, then the score group's scalar attributes) as CSV, TSV or JSON.
#include "commands.h"
#include "common.h"
#include "schema.h"
#include "errors.h"
#include "store.h"
#include "util.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <set>

namespace hs::cli {

struct ExportOptions {
    std::string file;
    std::string table;  // "scores/induction"; empty = every /scores/* group
    std::string format = "csv";
    std::string out;    // empty = stdout
};

struct Table {
    std::string probe;
    Dataset score;  // [L, H]
    Attrs attrs;    // scalar attributes only
};

static bool is_scalar(const AttrValue& v) {
    return std::holds_alternative<std::string>(v) || std::holds_alternative<int64_t>(v) ||
           std::holds_alternative<double>(v);
}

static Table read_table(const ResultReader& r, std::string group) {
    if (group.empty() || group[0] != '/') group = "/" + group;
    if (!r.is_group(group) || !r.exists(group + "/score"))
        throw UsageError(fmt::format("{}: no score table {} (expected a group holding 'score')", r.path(), group));
    Table t;
    t.probe = group.substr(group.find_last_of('/') + 1);
    t.score = r.read_numbers(group + "/score");
    if (t.score.shape.size() != 2 || t.score.is_string)
        throw StorageError(fmt::format("{}: {}/score is {}, expected numeric [layers, heads]", r.path(), group,
                                       shape_str(t.score.shape)));
    for (const auto& [k, v] : r.attrs(group))
        if (is_scalar(v) && k != "layer" && k != "head" && k != "value") t.attrs[k] = v;
    t.attrs.erase("probe");  // the probe column already says it
    return t;
}

// Shortest text that reads back as the same float32 (scores are stored as float32).
static std::string value_text(double v) { return fmt::format("{}", static_cast<float>(v)); }

static std::string quote(const std::string& s, char sep) {
    if (sep == '\t') {
        std::string o = s;
        for (auto& c : o)
            if (c == '\t' || c == '\n' || c == '\r') c = ' ';
        return o;
    }
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string o = "\"";
    for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
    return o + "\"";
}

static std::string delimited(const std::vector<Table>& tables, char sep) {
    std::set<std::string> cols;
    for (const auto& t : tables)
        for (const auto& kv : t.attrs) cols.insert(kv.first);
    std::string s = fmt::format("probe{0}layer{0}head{0}value", sep);
    for (const auto& c : cols) s += sep + quote(c, sep);
    s += "\n";
    for (const auto& t : tables) {
        std::string tail;
        for (const auto& c : cols) tail += sep + (t.attrs.count(c) ? quote(attr_to_string(t.attrs.at(c)), sep) : "");
        const int64_t L = t.score.shape[0], H = t.score.shape[1];
        for (int64_t l = 0; l < L; ++l)
            for (int64_t h = 0; h < H; ++h)
                s += fmt::format("{1}{0}{2}{0}{3}{0}{4}{5}\n", sep, quote(t.probe, sep), l, h,
                                 value_text(t.score.values[l * H + h]), tail);
    }
    return s;
}

static std::string json_rows(const std::vector<Table>& tables) {
    auto rows = nlohmann::json::array();
    for (const auto& t : tables) {
        const int64_t L = t.score.shape[0], H = t.score.shape[1];
        for (int64_t l = 0; l < L; ++l)
            for (int64_t h = 0; h < H; ++h) {
                nlohmann::json row = {{"probe", t.probe}, {"layer", l}, {"head", h},
                                      {"value", static_cast<float>(t.score.values[l * H + h])}};
                for (const auto& [k, v] : t.attrs) std::visit([&, &k = k](const auto& x) { row[k] = x; }, v);
                rows.push_back(row);
            }
    }
    return rows.dump(1) + "\n";
}

// The text to stdout (out empty) or into `out`, written atomically.
static void emit(const std::string& text, const std::string& out) {
    if (out.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        return;
    }
    AtomicFile f(out);
    f.write(text);
    f.commit();
}

// /influence as a ranked table: one row per sample, highest set-0 score first.
static std::string influence_table(const ResultReader& r, const std::string& format) {
    const auto x = schema::read_influence(r);
    const std::vector<std::string> cols = {"rank", "sample", "line", "score", "loss", "masked_loss", "control_score_mean",
                                           "n_tokens", "selected", "truncated", "preview"};
    auto rows = nlohmann::json::array();
    for (int64_t k = 0; k < x.N; ++k) {
        const auto i = static_cast<size_t>(x.rank[static_cast<size_t>(k)]);
        double c = 0;
        for (int64_t s = 1; s < x.S; ++s) c += x.score[static_cast<size_t>(s) * x.N + i];
        rows.push_back({{"rank", k + 1}, {"sample", i}, {"line", x.line[i]}, {"score", x.score[i]}, {"loss", x.loss[i]},
                        {"masked_loss", x.masked_loss[i]},
                        {"control_score_mean", x.S > 1 ? nlohmann::json(static_cast<float>(c / static_cast<double>(x.S - 1))) : nlohmann::json()},
                        {"n_tokens", x.n_tokens[i]}, {"selected", x.selected[i]}, {"truncated", x.truncated[i]},
                        {"preview", x.preview[i]}});
    }
    if (format == "json") return rows.dump(1) + "\n";
    const char sep = format == "csv" ? ',' : '\t';
    std::string s;
    for (size_t c = 0; c < cols.size(); ++c) s += (c ? std::string(1, sep) : "") + cols[c];
    s += "\n";
    for (const auto& row : rows) {
        for (size_t c = 0; c < cols.size(); ++c) {
            const auto& v = row[cols[c]];
            const std::string t = v.is_null() ? "" : v.is_string() ? v.get<std::string>() : v.is_number_float() ? value_text(v.get<double>()) : v.dump();
            s += (c ? std::string(1, sep) : "") + quote(t, sep);
        }
        s += "\n";
    }
    return s;
}

void run_export(const ExportOptions& o) {
    if (o.format != "csv" && o.format != "tsv" && o.format != "json")
        throw UsageError(fmt::format("--format '{}': expected csv, tsv or json", o.format));
    ResultReader r(o.file);
    std::vector<Table> tables;
    if (o.table == "influence" || o.table == "/influence") return emit(influence_table(r, o.format), o.out);
    if (!o.table.empty()) {
        tables.push_back(read_table(r, o.table));
    } else {
        if (!r.is_group(schema::scores_root())) throw UsageError(fmt::format("{}: no /scores group to export", o.file));
        for (const auto& c : r.children(schema::scores_root())) tables.push_back(read_table(r, schema::scores(c)));
    }
    emit(o.format == "json" ? json_rows(tables) : delimited(tables, o.format == "csv" ? ',' : '\t'), o.out);
}

void setup_export(CLI::App& app) {
    auto o = std::make_shared<ExportOptions>();
    auto* sub = app.add_subcommand("export",
                                   "write score tables of a result file in long format: probe, layer, head, value, then\n"
                                   "each scalar attribute of the score group as a column (all /scores/* without --table)\n"
                                   "Example: headscope export scores.h5 --table scores/induction --format csv --out induction.csv");
    sub->add_option("file", o->file, "HDF5 result file")->required();
    sub->add_option("--table", o->table, "one score group, e.g. scores/induction; or influence (the ranked samples)");
    sub->add_option("--format", o->format, "csv, tsv or json")->capture_default_str();
    sub->add_option("-o,--out", o->out, "output file (written atomically; default stdout)");
    sub->callback([o] { run_export(*o); });
}

}  // namespace hs::cli
