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
    // --needle: the needle scan's scores on a short grid
    bool needle = false;
    std::string needle_lengths = "auto", needle_depths = "0,50,100", needles, haystack, tmpl = kDefaultTemplate;
    int64_t needle_steps = 0;  // 0: the headscope protocol's
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

// --needle's grid: the headscope protocol (token space, exact spans) on the shipped needles and
// haystack unless given; lengths auto: a quarter, a half and all of min(2048, the context less the
// decode steps and 64 tokens of template and question).
static NeedleStudySpec needle_spec_of(const AtlasOptions& o, const Model& m) {
    NeedleStudySpec p;
    p.scores_text = "retrieval,qrhead";
    p.scores = parse_needle_scores(p.scores_text);
    p.proto = protocol_defaults(Protocol::kHeadscope);
    if (o.needle_steps > 0) p.proto.max_new_tokens = p.proto.ablation_max_new_tokens = o.needle_steps;
    p.needles = o.needles, p.haystack = o.haystack, p.tmpl = o.tmpl;
    NeedleConfig& c = p.cfg;
    c.tmpl = c.ablation_tmpl = with_flag("--template", [&] { return parse_template(o.tmpl); });
    c.depths = with_flag({{"--needle-depths", "depths"}}, [&] { return parse_needle_depths(o.needle_depths); });
    if (o.needle_lengths == "auto") {
        const int64_t ctx = m.config.max_seq_len > 0 ? m.config.max_seq_len : 2048;
        const int64_t top = std::min<int64_t>(2048, ctx - p.proto.max_new_tokens - 64);
        if (top < 32)
            throw UsageError(fmt::format("--needle-lengths auto: the model's context of {} leaves {} tokens after {} decode "
                                         "steps and 64 of template; give --needle-lengths (and --needle-max-new-tokens)",
                                         ctx, std::max<int64_t>(0, top), p.proto.max_new_tokens));
        c.lengths = {top / 4, top / 2, top};
    } else {
        c.lengths = with_flag({{"--needle-lengths", "lengths"}}, [&] {
            auto v = parse_needle_int_list(o.needle_lengths, "lengths");
            check_needle_lengths(v);
            return v;
        });
    }
    c.decode.max_new_tokens = p.proto.max_new_tokens, c.ablation_max_new_tokens = p.proto.ablation_max_new_tokens;
    c.decode.keep_stop = p.proto.stop_order == StopOrder::kAfter;
    c.decode.scope = p.proto.scope;
    c.batch = std::min<int64_t>(8, static_cast<int64_t>(c.depths.size()));  // a length's depths as rows (per needle)
    return p;
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
    if (r.needle_trials > 0) std::printf("needle trials:     %lld, %lld passed\n", static_cast<long long>(r.needle_trials), static_cast<long long>(r.needle_passed));
    for (const auto& s : r.skipped) std::printf("skipped:           %s\n", s.c_str());
    for (const auto& c : r.columns)
        if (const auto p = c.source.find("only through ties"); p != std::string::npos)
            std::printf("note:              %s: %s\n", c.name.c_str(), c.source.substr(c.source.rfind("; ", p) + 2).c_str());
}

void run_atlas_cmd(const AtlasOptions& o) {
    const WriteMode mode = write_mode(o.out);
    AtlasSpec spec = spec_of(o);
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    if (o.needle) spec.needle = needle_spec_of(o, m);
    ResultWriter w = open_result(o.out.out, mode);
    auto r = with_flag({{"--seq-len", "seq_len"}, {"--batch", "batch"}, {"--threshold", "thresholds"}, {"--needle-lengths", "lengths"}},
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
        "--threshold NAME=VALUE). --needle adds the needle scan's retrieval (Wu et al.) and QRHead scores on a\n"
        "short grid (lengths auto: 1/4, 1/2 and all of min(2048, the context); depths 0,50,100).\n"
        "Writes /atlas (scores [S, L, H], roles, n_roles, Spearman correlations); `headscope report` draws the page.\n"
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
    sub->add_flag("--needle", o->needle,
                  "also the needle scan's retrieval and qrhead scores (one scored pass of a short grid, the headscope protocol)");
    sub->add_option("--needle-lengths", o->needle_lengths, "--needle: context lengths, or auto")->capture_default_str();
    sub->add_option("--needle-depths", o->needle_depths, "--needle: depths in percent")->capture_default_str();
    sub->add_option("--needle-max-new-tokens", o->needle_steps, "--needle: greedy steps at most (0: the protocol's 50)")
        ->check(at_least(0))
        ->capture_default_str();
    sub->add_option("--needles", o->needles, "--needle: JSON lines as `retrieval --needles` (default the shipped needles)");
    sub->add_option("--haystack", o->haystack, "--needle: plain text (default the shipped haystack)");
    sub->add_option("--template", o->tmpl, "--needle: the prompt, with {context} and {question}")->capture_default_str();
    sub->add_option("--max-rows", o->max_rows, "batch rows per forward pass (memory)")->check(at_least(1))->capture_default_str();
    sub->callback([o] { run_atlas_cmd(*o); });
}

}  // namespace hs::cli
