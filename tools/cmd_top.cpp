// headscope top: the k highest (or lowest) scoring heads of one probe (or any [L, H] dataset) in a
// result file.
#include "commands.h"
#include "common.h"
#include "schema.h"
#include "errors.h"
#include "heads.h"
#include "store.h"
#include "util.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace hs::cli {

struct TopOptions {
    std::string file;
    std::string probe, dataset;
    int k = 10;
    bool ascending = false;
};

void run_top(const TopOptions& o) {
    ResultReader r(o.file);
    if (o.probe.empty() == o.dataset.empty()) throw UsageError("give one of --probe NAME or --dataset PATH");
    const std::string ds = o.dataset.empty() ? schema::scores(o.probe, "score")
                                             : (o.dataset.front() == '/' ? o.dataset : "/" + o.dataset);
    if (!o.dataset.empty() && !r.exists(ds)) throw UsageError(fmt::format("{}: no dataset {}", o.file, ds));
    if (!r.exists(ds)) {
        std::vector<std::string> have = r.is_group(schema::scores_root()) ? r.children(schema::scores_root()) : std::vector<std::string>{};
        throw UsageError(fmt::format("{}: no probe '{}' (the file has: {})", o.file, o.probe,
                                     have.empty() ? std::string("none") : fmt::format("{}", fmt::join(have, ", "))));
    }
    auto d = r.read_numbers(ds);
    if (d.shape.size() != 2 || d.is_string)
        throw StorageError(fmt::format("{}: {} is {}, expected numeric [layers, heads]", o.file, ds, shape_str(d.shape)));
    const int64_t H = d.shape[1];
    // Ties keep (layer, head) order; NaN last.
    const auto idx = rank_heads(torch::tensor(d.values, torch::kDouble).view({d.shape[0], H}), !o.ascending);
    size_t scored = 0;  // NaN ranks last: heads without a score (e.g. not selected) are not listed
    for (double v : d.values) scored += !std::isnan(v);
    const size_t n = std::min<size_t>({static_cast<size_t>(o.k), idx.size(), scored});
    std::printf("%-5s %-8s %s\n", "rank", "head", "score");
    for (size_t i = 0; i < n; ++i) {
        const auto head = format_head(static_cast<int>(idx[i] / H), static_cast<int>(idx[i] % H));
        std::printf("%-5zu %-8s %.6f\n", i + 1, head.c_str(), d.values[idx[i]]);
    }
    if (scored < d.values.size() && n < static_cast<size_t>(o.k))
        std::printf("(%zu of %zu heads have a score; the other %zu are NaN)\n", scored, d.values.size(), d.values.size() - scored);
}

void setup_top(CLI::App& app) {
    auto o = std::make_shared<TopOptions>();
    auto* sub = app.add_subcommand("top", "print the top-k heads of one probe, or of any [layers, heads] dataset (L5H1 = layer 5,\n"
                                          "head 1; 0-based; NaN scores, e.g. heads JUICE did not select, rank last)\n"
                                          "Example: headscope top scores.h5 --probe induction -k 10\n"
                                          "Example: headscope top scores.h5 --dataset /scores/induction/score -k 3");
    sub->add_option("file", o->file, "HDF5 result file")->required();
    auto* probe = sub->add_option("--probe", o->probe, "score group under /scores, e.g. induction");
    sub->add_option("--dataset", o->dataset, "a numeric [layers, heads] dataset, e.g. /ablation/juice/juice/enhance")->excludes(probe);
    sub->add_option("-k", o->k, "how many heads")->check(at_least(1))->capture_default_str();
    sub->add_flag("--ascending", o->ascending, "lowest scores first");
    sub->callback([o] { run_top(*o); });
}

}  // namespace hs::cli
