// headscope ablate: one ablation without a YAML file; prints the metric with and without it.
#include "ablation.h"
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "guard.h"
#include "experiment.h"
#include "util.h"

#include <torch/torch.h>

namespace hs::cli {

struct AblateOptions {
    ModelArgs model;
    std::string heads, mode = "zero", metric = "loss", positions, data, data_kind = "auto", token_range;
    double factor = 0.0;
    int64_t seq_len = 128, count = 0, repeated = 0, seed = 0, max_rows = 64;
    StreamWindow window;  // --mode stream: --sink, --recent, --compensate
};

static std::string guess_kind(const std::string& file) {
    if (file.size() > 6 && file.substr(file.size() - 6) == ".jsonl") return "prompts";
    for (const auto& line : split(read_utf8_text_file(file), '\n')) {
        const auto t = trim(line);
        if (t.empty()) continue;
        return t.find_first_not_of("0123456789, ") == std::string::npos ? "tokens" : "text";
    }
    return "tokens";
}

void run_ablate(const AblateOptions& o) {
    if (o.data.empty() == (o.repeated == 0))
        throw UsageError("give one of --data FILE and --repeated N (rows [BOS, R, R] with |R| = N)");
    const auto mode = with_flag("--mode", [&] { return parse_intervention(o.mode, "mode", study_interventions()); });
    if (o.window.sink < 0) throw UsageError(fmt::format("--sink: {} is negative", o.window.sink));
    if (o.window.recent < 1) throw UsageError(fmt::format("--recent: {} must be at least 1 (the query sees itself)", o.window.recent));
    const auto metric = with_flag("--metric", [&] { return parse_name(metric_names(), o.metric, "metric"); });
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    auto mask = torch::zeros({L, H}, torch::kUInt8);
    for (auto [layer, head] : with_flag("--heads", [&] { return parse_head_list(o.heads, L, H); })) mask[layer][head] = 1;
    Experiment e;
    e.file = o.repeated > 0 ? "--repeated" : "--data";  // where make_data's errors point
    e.seed = o.seed;
    DataSpec d;
    d.name = "data";
    if (o.repeated > 0) {
        d.kind = DataKind::kRepeated, d.length = o.repeated, d.count = o.count > 0 ? o.count : 16;
        if (!o.token_range.empty()) {
            auto r = with_flag({{"--token-range", "token_list"}}, [&] { return parse_token_list(o.token_range); });
            if (r.size() != 2) throw UsageError(fmt::format("--token-range '{}': expected lo,hi", o.token_range));
            d.token_lo = r[0], d.token_hi = r[1];
        }
    } else {
        const auto kind = find_in(data_kind_names(), o.data_kind == "auto" ? guess_kind(o.data) : o.data_kind);
        if (!kind || *kind == DataKind::kRepeated)
            throw UsageError(fmt::format("--data-kind '{}': expected auto, tokens, text or prompts", o.data_kind));
        d.kind = *kind, d.file = o.data, d.count = o.count, d.seq_len = o.seq_len;
    }
    const AblationData data = make_data(e, d, m, l.tokenizer.get());
    AblationSetup s;
    s.window = o.window;
    s.mode = mode, s.factor = o.factor, s.metric = metric, s.max_rows = o.max_rows, s.resample_seed = o.seed;
    s.positions = !o.positions.empty() ? with_flag("--positions", [&] { return parse_name(positions_names(), o.positions, "positions"); })
                  : (metric == MetricKind::kAccuracy || metric == MetricKind::kLogitDiff) ? Positions::kAnswer
                  : d.kind == DataKind::kRepeated                                           ? Positions::kRepeatedHalf
                                                                                            : Positions::kAll;
    Ablator ab(m, data, s);
    auto rows = ab.evaluate(torch::stack({torch::zeros({L, H}, torch::kUInt8), mask}));
    const double clean = rows[0].mean().item<double>(), abl = rows[1].mean().item<double>();
    std::printf("metric   %s (positions %s, %ld rows of %s)\n", o.metric.c_str(), name_of(s.positions),
                static_cast<long>(data.rows()), o.repeated > 0 ? "[BOS, R, R]" : o.data.c_str());
    std::printf("ablated  %s (mode %s)\n", o.heads.c_str(), o.mode.c_str());
    std::printf("clean    %.6f\n", clean);
    std::printf("with     %.6f\n", abl);
    std::printf("change   %+.6f\n", abl - clean);
}

void setup_ablate(CLI::App& app) {
    auto o = std::make_shared<AblateOptions>();
    auto* sub = app.add_subcommand(
        "ablate",
        "ablate a few heads once and print the metric with and without the ablation (no YAML, no file).\n"
        "Modes: zero, scale (--factor), zero-query, mean / mean-query / resample (over the same data).\n"
        "Metrics: loss, kl (to the clean model), accuracy and logit-diff (prompts JSONL).\n"
        "Example: headscope ablate models/toy-induction --heads L1H0,L1H3 --mode zero --metric loss --repeated 20 --token-range 6,68");
    add_model_args(sub, o->model);
    sub->add_option("--heads", o->heads, "heads to ablate, e.g. L1H0,L1H3")->required();
    sub->add_option("--mode", o->mode, or_list(intervention_name_list(study_interventions())))->capture_default_str();
    sub->add_option("--factor", o->factor, "mode scale: z *= factor");
    sub->add_option("--sink", o->window.sink, "mode stream: the first keys every query of the head sees")->capture_default_str();
    sub->add_option("--recent", o->window.recent, "mode stream: the last keys up to and including the query")->capture_default_str();
    sub->add_flag("--compensate", o->window.compensate,
                  "mode stream: one more key/value, the means of those the window hides (RazorAttention)");
    sub->add_option("--metric", o->metric, "loss, kl, accuracy, logit-diff")->capture_default_str();
    sub->add_option("--positions", o->positions, "loss/kl: all, repeated-half or answer (default by data)");
    sub->add_option("--data", o->data, "token-id lines, a text file, or prompts JSONL "
                                       "({\"prompt\", \"answer\", \"counterfactual\"})");
    sub->add_option("--data-kind", o->data_kind, "auto, tokens, text, prompts")->capture_default_str();
    sub->add_option("--seq-len", o->seq_len, "text: tokens per sequence")->capture_default_str();
    sub->add_option("--count", o->count, "at most this many rows (repeated: rows, default 16)");
    sub->add_option("--repeated", o->repeated, "instead of --data: rows [BOS, R, R] with |R| = N (seeded by --seed)");
    sub->add_option("--token-range", o->token_range, "--repeated: ids lo,hi to draw R from, [lo, hi)");
    sub->add_option("--seed", o->seed, "seed of --repeated and resample")->capture_default_str();
    sub->add_option("--max-rows", o->max_rows, "rows per forward pass")->capture_default_str();
    sub->callback([o] { run_ablate(*o); });
}

}  // namespace hs::cli
