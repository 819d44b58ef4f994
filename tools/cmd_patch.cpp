// headscope patch: activation, attribution and path patching of attention heads (probes/ablation/patching.h;
// methods: docs/methods.md "Patching"; names: docs/hdf5-schema.md "Patching").
#include "commands.h"
#include "common.h"
#include "score_records.h"
#include "errors.h"
#include "heads.h"
#include "patching.h"
#include "progress.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>

namespace hs::cli {

struct PatchCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string pairs, metric = "logit-diff", what = "z", positions = "all", method = "exact", name;
    std::vector<std::string> paths;
    int64_t batch_rows = 64;
    int top = 5;
};

static std::string default_name(const PatchCliOptions& o) {
    if (!o.paths.empty()) return "path";
    return fmt::format("{}-{}{}", o.what, o.method, o.positions == "each" ? "-each" : "");
}

static void print_top(const PatchResult& r, bool kv, int k) {
    // Heads (or (head, position) cells) by score, highest first; NaN last.
    const auto s = r.scores.to(torch::kDouble).contiguous();
    const int64_t U = s.size(1), T = s.dim() == 3 ? s.size(2) : 1;
    auto flat = s.view(-1);
    auto order = std::get<1>(torch::sort(torch::nan_to_num(flat, -1e300), /*stable=*/true, 0, /*descending=*/true));
    std::printf("%-5s %-10s %s\n", "rank", kv ? "kv head" : "head", "score");
    for (int64_t i = 0; i < std::min<int64_t>(k, flat.size(0)); ++i) {
        const int64_t j = order[i].item<int64_t>(), l = j / (U * T), u = (j / T) % U, t = j % T;
        std::string name = kv ? fmt::format("L{}K{}", l, u) : format_head(static_cast<int>(l), static_cast<int>(u));
        if (s.dim() == 3) name += fmt::format("@{}", t);
        std::printf("%-5lld %-10s %.4f\n", static_cast<long long>(i + 1), name.c_str(), flat[j].item<double>());
    }
}

void run_patch(const PatchCliOptions& o) {
    const MetricKind metric = with_flag("--metric", [&] { return parse_name(patch_metric_names(), o.metric, ""); });
    const Point site = with_flag("--what", [&] { return parse_name(patch_site_names(), o.what, ""); });
    if (o.positions != "all" && o.positions != "each")
        throw UsageError(fmt::format("--positions '{}': expected all or each", o.positions));
    if (o.method != "exact" && o.method != "attribution")
        throw UsageError(fmt::format("--method '{}': expected exact or attribution", o.method));
    const std::string name = o.name.empty() ? default_name(o) : o.name;
    if (name.find_first_of("/ ") != std::string::npos || name.empty())
        throw UsageError(fmt::format("--name '{}': expected a name without '/' or spaces", name));
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    std::vector<PathSpec> specs;
    for (const auto& s : o.paths) specs.push_back(with_flag("--path", [&] { return parse_path_spec(s, L, H); }));
    const auto pairs = read_patch_pairs(o.pairs, m, l.tokenizer.get(), metric);
    const auto t0 = std::chrono::steady_clock::now();
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    schema::PatchingRecord rec;
    rec.name = name;
    schema::PatchingRun run;
    run.metric = name_of(metric), run.pairs = o.pairs, run.n_pairs = pairs.rows();
    if (specs.empty()) {
        PatchOptions po;
        po.metric = metric, po.site = site, po.each_position = o.positions == "each", po.max_rows = o.batch_rows;
        const auto r = with_flag({{"--positions", "each_position"}}, [&] {
            return o.method == "exact" ? exact_patching(m, pairs, po) : attribution_patching(m, pairs, po);
        });
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("metric %s: clean %.6f, corrupted %.6f (%lld pairs)\n", name_of(metric), r.metric_clean, r.metric_corrupt,
                    static_cast<long long>(pairs.rows()));
        print_top(r, site == Point::kAttnK || site == Point::kAttnV, o.top);
        rec.shape = r.scores.sizes().vec();
        rec.scores = host_floats(r.scores), rec.patched = host_floats(r.patched);
        rec.metric_clean = static_cast<float>(r.metric_clean), rec.metric_corrupt = static_cast<float>(r.metric_corrupt);
        run.method = o.method, run.what = o.what, run.positions = o.positions;
        run.kv_units = site == Point::kAttnK || site == Point::kAttnV;
        run.forwards = r.forwards, run.seconds = secs;
    } else {
        std::vector<float> scores, patched;
        std::vector<std::string> labels;
        double clean = 0, corrupt = 0;
        int64_t forwards = 0;
        std::printf("%-40s %s\n", "path", "score");
        for (const auto& ps : specs) {
            const auto r = path_patching(m, pairs, ps, metric);
            scores.push_back(static_cast<float>(r.score));
            patched.push_back(static_cast<float>(r.metric_patched));
            labels.push_back(ps.label());
            clean = r.metric_clean, corrupt = r.metric_corrupt, forwards += r.forwards;
            std::printf("%-40s %.4f\n", ps.label().c_str(), r.score);
        }
        std::printf("metric %s: clean %.6f, corrupted %.6f (%lld pairs)\n", name_of(metric), clean, corrupt,
                    static_cast<long long>(pairs.rows()));
        rec.shape = {static_cast<int64_t>(specs.size())};
        rec.scores = scores, rec.patched = patched, rec.paths = labels;
        rec.metric_clean = static_cast<float>(clean), rec.metric_corrupt = static_cast<float>(corrupt);
        run.path = true, run.forwards = forwards;
    }
    write_meta(w, m, 0);
    schema::write_patching_run(w, rec, run);
    w.commit();
    log_info("wrote {} ({})", o.out.out, schema::patching(name));
}

void setup_patch(CLI::App& app) {
    auto o = std::make_shared<PatchCliOptions>();
    auto* sub = app.add_subcommand(
        "patch",
        "activation patching of every head (clean into corrupted), attribution patching (every head from one\n"
        "clean forward, one corrupted forward and one backward), or path patching (senders -> receivers' q, k\n"
        "or v). Pairs: JSONL {\"clean\", \"corrupt\", \"answer\", \"wrong\"} of equal token lengths; the metric is\n"
        "read at the last position. Scores: (M_patched - M_corrupt) / (M_clean - M_corrupt), 1 = restored.\n"
        "Writes /patching/<name>/{scores, patched, metric_clean, metric_corrupt}.\n"
        "Example: headscope patch models/toy-induction --pairs datasets/patching/toy-induction-fresh-half.jsonl --metric loss --what z --out patch.h5\n"
        "Example: headscope patch models/toy-induction --pairs datasets/patching/toy-induction-fresh-half.jsonl --metric loss --method attribution "
        "--positions each --out patch.h5 --append\n"
        "Example: headscope patch models/toy-induction --pairs datasets/patching/toy-induction-pairs.jsonl --metric loss --path 'L0H2->L1H0,L1H1,L1H3:k' "
        "--path 'L0H2->L1H0,L1H1,L1H3:q' --out path.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--pairs", o->pairs, "JSONL clean/corrupted pairs")->required();
    sub->add_option("--metric", o->metric, "logit-diff (answer - wrong), loss (-log p(answer)) or prob (p(answer))")
        ->capture_default_str();
    sub->add_option("--what", o->what, "the site patched: z, q, k, v (per key/value head), pattern or head-out")
        ->capture_default_str();
    sub->add_option("--positions", o->positions, "all (one patch per head) or each (per head and position; pairs of one "
                                                 "length)")->capture_default_str();
    sub->add_option("--method", o->method, "exact or attribution")->capture_default_str();
    sub->add_option("--path", o->paths, "SENDERS->RECEIVERS:q|k|v path patching (repeat for several sender sets); "
                                        "replaces the head table");
    sub->add_option("--name", o->name, "the group /patching/<name> (default: WHAT-METHOD[-each], or path)");
    sub->add_option("--batch-rows", o->batch_rows, "rows per forward (patches x pairs)")->check(at_least(1))->capture_default_str();
    sub->add_option("--top", o->top, "print this many best heads")->check(at_least(0))->capture_default_str();
    sub->callback([o] { run_patch(*o); });
}

}  // namespace hs::cli
