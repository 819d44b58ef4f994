// headscope atlas: every cheap per-head score of a model in one file and one report page (the
// detectors with the sink rate, successor heads, copy suppression, the QK rank, MAPS on request),
// each head's roles and the scores' correlations. The study: probes/atlas/atlas.h.
#include "atlas.h"
#include "atlas_records.h"
#include "commands.h"
#include "common.h"
#include "heads.h"
#include "progress.h"

#include <torch/torch.h>

namespace hs::cli {

struct AtlasOptions {
    ModelArgs model;
    OutputArgs out;
    int64_t seq_len = 50, batch = 10, seed = 0;
    double sink_epsilon = 0.3;
    int64_t cs_tokens = 2048;
    std::string maps_relations;
    std::vector<std::string> thresholds;  // NAME=VALUE
    int64_t max_rows = 64;
};

static std::map<std::string, double> parse_thresholds(const std::vector<std::string>& items) {
    std::map<std::string, double> out;
    for (const auto& it : items) {
        const auto eq = it.rfind('=');
        double v = NAN;
        try {
            if (eq == std::string::npos || eq == 0) throw std::invalid_argument("");
            size_t used = 0;
            v = std::stod(it.substr(eq + 1), &used);
            if (used != it.size() - eq - 1 || !std::isfinite(v)) throw std::invalid_argument("");
        } catch (const std::exception&) {
            throw UsageError(fmt::format("--threshold '{}': expected NAME=NUMBER (e.g. copy-suppression=0.5)", it));
        }
        out[it.substr(0, eq)] = v;
    }
    return out;
}

static AtlasSpec spec_of(const AtlasOptions& o) {
    AtlasSpec s;
    s.stripe.seq_len = o.seq_len, s.stripe.batch = o.batch, s.stripe.seed = o.seed;
    s.sink_epsilon = o.sink_epsilon, s.max_rows = o.max_rows;
    s.copy_suppression.n_tokens = o.cs_tokens, s.copy_suppression.seed = o.seed;
    s.maps_relations = o.maps_relations;
    s.thresholds = parse_thresholds(o.thresholds);
    return s;
}

static void print_atlas(const AtlasResult& r) {
    const int64_t L = r.roles.size(1), H = r.roles.size(2);
    for (size_t k = 0; k < r.columns.size(); ++k) {
        const auto& c = r.columns[k];
        std::vector<std::string> heads;
        if (!std::isnan(c.threshold))
            for (int64_t i = 0; i < L * H; ++i)
                if (r.roles[k].flatten()[i].item<int64_t>()) heads.push_back(format_head(static_cast<int>(i / H), static_cast<int>(i % H)));
        const auto top = rank_heads(c.score, true).front();
        std::printf("%-18s best %s %.4f  %s\n", c.name.c_str(), format_head(static_cast<int>(top / H), static_cast<int>(top % H)).c_str(),
                    c.score.flatten()[top].item<double>(),
                    std::isnan(c.threshold) ? "(no threshold)"
                                            : fmt::format("> {}: {}", c.threshold, heads.empty() ? "none" : fmt::format("{}", fmt::join(heads, " "))).c_str());
    }
    std::string multi;
    for (int64_t i = 0; i < L * H; ++i)
        if (r.n_roles.flatten()[i].item<int64_t>() >= 2) {
            std::vector<std::string> rs;
            for (size_t k = 0; k < r.columns.size(); ++k)
                if (r.roles[k].flatten()[i].item<int64_t>()) rs.push_back(r.columns[k].role);
            multi += fmt::format(" {} ({})", format_head(static_cast<int>(i / H), static_cast<int>(i % H)), fmt::join(rs, ", "));
        }
    std::printf("several roles:    %s\n", multi.empty() ? " none" : multi.c_str());
    if (!std::isnan(r.model_sink_rate)) std::printf("model sink rate:   %.2f%%\n", 100 * r.model_sink_rate);
    for (const auto& s : r.skipped) std::printf("skipped:           %s\n", s.c_str());
    for (const auto& c : r.columns)
        if (const auto p = c.source.find("only through ties"); p != std::string::npos)
            std::printf("note:              %s: %s\n", c.name.c_str(), c.source.substr(c.source.rfind("; ", p) + 2).c_str());
}

void run_atlas_cmd(const AtlasOptions& o) {
    const WriteMode mode = write_mode(o.out);
    const AtlasSpec spec = spec_of(o);
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    ResultWriter w = open_result(o.out.out, mode);
    auto r = with_flag({{"--seq-len", "seq_len"}, {"--batch", "batch"}, {"--threshold", "thresholds"}},
                       [&] { return run_atlas(m, l.tokenizer.get(), spec); });
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, o.seed);
    schema::write_atlas(w, atlas_record(r, spec));
    w.commit();
    print_atlas(r);
    log_info("wrote {} (atlas: {} scores of {} heads)", o.out.out, r.columns.size(), r.roles.size(1) * r.roles.size(2));
}

void setup_atlas(CLI::App& app) {
    auto o = std::make_shared<AtlasOptions>();
    auto* sub = app.add_subcommand(
        "atlas",
        "every cheap per-head score of a model in one file: the detectors (induction, previous-token,\n"
        "duplicate-token on [BOS, R, R] rows; Gu et al.'s sink rate), successor heads (with a tokenizer),\n"
        "copy suppression's OV rank-0 share, the effective QK rank, MAPS with --maps-relations. A head takes\n"
        "a score's role when it is above the method's threshold (induction, previous-token, duplicate-token\n"
        "0.4 as ARENA's detectors; sink alpha_0 > --sink-epsilon; successor 0.4; the others none unless\n"
        "--threshold NAME=VALUE). Writes /atlas (scores [S, L, H], roles, n_roles, Spearman correlations);\n"
        "`headscope report` draws the page.\n"
        "Example: headscope atlas ../shared/testdata/stories260K/stories260K.bin --out atlas.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--seq-len", o->seq_len, "detectors: |R| of [BOS, R, R] (cut to the longest the context holds)")
        ->check(at_least(2))
        ->capture_default_str();
    sub->add_option("--batch", o->batch, "detectors: rows of [BOS, R, R]")->check(at_least(1))->capture_default_str();
    sub->add_option("--seed", o->seed, "seed of the detectors' rows and copy suppression's tokens")->capture_default_str();
    sub->add_option("--sink-epsilon", o->sink_epsilon, "sink-rate's epsilon (Gu et al.)")->check(in_range(0, 1))->capture_default_str();
    sub->add_option("--cs-tokens", o->cs_tokens, "copy suppression: source tokens scored (0: the whole vocabulary)")
        ->check(at_least(0))
        ->capture_default_str();
    sub->add_option("--maps-relations", o->maps_relations, "MAPS: relation files (a.json,b.json or a folder), as `maps --relations`");
    sub->add_option("--threshold", o->thresholds, "NAME=VALUE: a score's role threshold (repeatable), e.g. copy-suppression=0.5");
    sub->add_option("--max-rows", o->max_rows, "batch rows per forward pass (memory)")->check(at_least(1))->capture_default_str();
    sub->callback([o] { run_atlas_cmd(*o); });
}

}  // namespace hs::cli
