// The head atlas's file: /atlas written and read, every name and text beside its path.
#include "atlas_records.h"

#include "errors.h"
#include "schema.h"

#include <fmt/format.h>

#include <variant>

namespace hs::schema {

namespace {
const std::string kAtlas = "/atlas";
std::string at(const std::string& ds) { return kAtlas + "/" + ds; }

template <class T>
T attr_or(const Attrs& a, const std::string& k, const std::string& file) {
    const auto it = a.find(k);
    if (it == a.end() || !std::holds_alternative<T>(it->second))
        throw DataError(fmt::format("{}: /atlas lacks the attribute {} (or it has another type)", file, k));
    return std::get<T>(it->second);
}
}  // namespace

void write_atlas(ResultWriter& w, const AtlasRecord& r) {
    if (w.exists(kAtlas)) w.remove(kAtlas);
    write_array(w, at("scores"), {{r.S, r.L, r.H}, r.scores,
                                  {{"description", std::string("column s's score of each head (the attribute columns names s)")}}});
    write_array(w, at("roles"), {{r.S, r.L, r.H}, r.role,
                                 {{"description", std::string("1 where the head's score is above the column's threshold "
                                                              "(strictly, in float32); 0 for a column with no threshold")}}});
    write_array(w, at("n_roles"), {{r.L, r.H}, r.n_roles, {{"description", std::string("the head's roles: roles summed over columns")}}});
    write_array(w, at("correlation"), {{r.S, r.S}, r.correlation,
                                       {{"description", std::string("Spearman's rho of two columns over the L*H heads (average "
                                                                    "ranks for ties; NaN where a column is constant or holds NaN)")}}});
    Attrs a{{"columns", r.columns},
            {"sources", r.sources},
            {"roles", r.roles},
            {"thresholds", r.thresholds},
            {"threshold_sources", r.threshold_sources},
            {"skipped", r.skipped},
            {"seq_len", r.seq_len},
            {"batch", r.batch},
            {"seed", r.seed},
            {"copy_suppression_tokens", r.cs_tokens},
            {"sink_epsilon", r.sink_epsilon},
            {"model_sink_rate", r.model_sink_rate},
            {"description", std::string("every cheap per-head score of the model as a column; a head takes a column's role "
                                        "when its score is above the column's threshold (NaN: the column gives none)")}};
    w.set_attrs(kAtlas, a);
}

AtlasRecord read_atlas(const ResultReader& rd) {
    AtlasRecord r;
    const std::string file = rd.path();
    const Attrs a = rd.attrs(kAtlas);
    r.columns = attr_or<std::vector<std::string>>(a, "columns", file);
    r.sources = attr_or<std::vector<std::string>>(a, "sources", file);
    r.roles = attr_or<std::vector<std::string>>(a, "roles", file);
    r.threshold_sources = attr_or<std::vector<std::string>>(a, "threshold_sources", file);
    r.thresholds = attr_or<std::vector<double>>(a, "thresholds", file);
    if (a.count("skipped")) r.skipped = attr_or<std::vector<std::string>>(a, "skipped", file);
    r.sink_epsilon = attr_or<double>(a, "sink_epsilon", file);
    r.model_sink_rate = attr_or<double>(a, "model_sink_rate", file);
    const Dataset s = rd.read_numbers(at("scores")), ro = rd.read_numbers(at("roles")), c = rd.read_numbers(at("correlation"));
    r.S = static_cast<int64_t>(r.columns.size());
    if (s.shape.size() != 3 || s.shape[0] != r.S || ro.shape != s.shape || c.shape != std::vector<int64_t>{r.S, r.S} ||
        static_cast<int64_t>(r.sources.size()) != r.S || static_cast<int64_t>(r.roles.size()) != r.S ||
        static_cast<int64_t>(r.thresholds.size()) != r.S || static_cast<int64_t>(r.threshold_sources.size()) != r.S)
        throw DataError(fmt::format("{}: /atlas's arrays and its {} columns disagree", file, r.S));
    r.L = s.shape[1], r.H = s.shape[2];
    for (double v : s.values) r.scores.push_back(static_cast<float>(v));
    for (double v : ro.values) r.role.push_back(static_cast<uint8_t>(v));
    for (double v : c.values) r.correlation.push_back(static_cast<float>(v));
    for (int64_t i = 0; i < r.L * r.H; ++i) {
        int64_t n = 0;
        for (int64_t k = 0; k < r.S; ++k) n += r.role[k * r.L * r.H + i];
        r.n_roles.push_back(n);
    }
    return r;
}

}  // namespace hs::schema
