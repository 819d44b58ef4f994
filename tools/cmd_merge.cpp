// headscope merge: joins the shards of one experiment (`headscope run --shard I/N`), of one needle
// scan (`headscope retrieval --shard I/N`, needle_store.cpp) or of one AttentionInfluence ranking
// (`headscope influence --shard I/N`, cmd_influence.cpp) into one file. Refuses files of
// different experiments (naming the first YAML line that differs) or scans (naming the parameter),
// models (weights sha256) or shard counts, a shard given twice, missing or unfinished.
#include "ablation_records.h"
#include "ablation_study.h"
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "needle_store.h"
#include "progress.h"
#include "run_state.h"
#include "schema.h"
#include "store.h"
#include "util.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace hs::cli {

using MergeOptions = MergeArgs;

// An attribute of /experiment or /meta as text ("" when absent).
static std::string exp_attr(const ResultReader& r, const std::string& name) { return schema::attr_text(r, schema::experiment(), name); }
static std::string meta_attr(const ResultReader& r, const std::string& name) { return schema::attr_text(r, schema::meta(), name); }

// The first line where two experiment files differ: "line 12: 'count: 32' vs 'count: 16'".
static std::string first_yaml_difference(const std::string& a, const std::string& b) {
    const auto x = split(a, '\n'), y = split(b, '\n');
    for (size_t i = 0; i < std::max(x.size(), y.size()); ++i) {
        const std::string u = i < x.size() ? x[i] : "(end of file)", v = i < y.size() ? y[i] : "(end of file)";
        if (u != v) {
            auto cut = [](const std::string& t) { return t.size() > 60 ? t.substr(0, 57) + "..." : t; };
            return fmt::format("line {}: '{}' vs '{}'", i + 1, cut(trim(u)), cut(trim(v)));
        }
    }
    return "the same text";
}

// One study of the shards merged into w (a copy of the first shard): each configuration's rows from
// the first shard that did it. Returns the configurations no shard did.
static int64_t merge_study(ResultWriter& w, const ResultReader& first, const std::vector<std::unique_ptr<ResultReader>>& rs,
                           const std::string& study) {
    const std::string g = schema::study(study);
    const auto masks0 = schema::read_study(first, study).masks;
    if (masks0.shape.size() != 3)
        throw StorageError(fmt::format("{}: {}/masks has shape {}, expected [S, L, H]", first.path(), g, shape_str(masks0.shape)));
    schema::StudyRecord m;
    m.name = study, m.S = masks0.shape[0];
    const int64_t S = m.S;
    m.done.assign(S, 0);
    for (const auto& r : rs) {
        const auto st = schema::read_study(*r, study);
        if (st.done.shape.empty()) throw StorageError(fmt::format("{}: has no study '{}'; refusing to merge", r->path(), study));
        const auto &d = st.done, &mr = st.metric_rows, &mk = st.masks;
        if (mk.shape != masks0.shape || mk.values != masks0.values)
            throw StorageError(fmt::format("{}: study '{}' has other configurations than {}; refusing to merge",
                                           r->path(), study, first.path()));
        // Shapes are checked before any index: a damaged shard must not read past its arrays.
        if (d.shape != std::vector<int64_t>{S} || mr.shape.size() != 2 || mr.shape[0] != S ||
            (!m.metric_rows.empty() && mr.shape[1] != m.N))
            throw StorageError(fmt::format("{}: study '{}': done {} and metric_rows {} do not fit {} configurations"
                                           "{}; refusing to merge", r->path(), study, shape_str(d.shape),
                                           shape_str(mr.shape), S, m.metric_rows.empty() ? "" : fmt::format(" of {} rows", m.N)));
        m.N = mr.shape[1];
        if (m.metric_rows.empty()) m.metric_rows.assign(S * m.N, std::nanf(""));
        for (int64_t i = 0; i < S; ++i)
            if (d.values[i] != 0 && !m.done[i]) {
                m.done[i] = 1;
                for (int64_t n = 0; n < m.N; ++n) m.metric_rows[i * m.N + n] = static_cast<float>(mr.values[i * m.N + n]);
            }
    }
    const int64_t N = m.N;
    // The metric as `run` computes it (a float32 mean over the rows), so that the merged file
    // equals the unsharded one bit for bit.
    auto mean = torch::from_blob(m.metric_rows.data(), {S, N}, torch::kFloat).mean(1).contiguous();
    m.metric.assign(mean.data_ptr<float>(), mean.data_ptr<float>() + S);
    int64_t missing = 0;
    for (int64_t i = 0; i < S; ++i) {
        if (!m.done[i]) m.metric[i] = std::nanf("");
        missing += !m.done[i];
    }
    schema::write_study_results(w, m);
    const auto factor = schema::read_study(first, study).factor;
    if (!factor.shape.empty()) {  // a scale-grid study: its JUICE selection from the merged rows
        const auto variants = schema::read_data_variants(first, schema::attr_text(first, g, "dataset"));
        auto mk = torch::tensor(masks0.values, torch::kDouble).view({S, masks0.shape[1], masks0.shape[2]});
        schema::write_juice(w, study, juice_record(torch::from_blob(m.metric_rows.data(), {S, N}, torch::kFloat).clone(), mk,
                                                   factor.values, variants));
    }
    schema::mark_study_merged(w, study);
    return missing;
}

void run_merge(const MergeOptions& o) {
    if (o.inputs.size() < 2) throw UsageError("merge: give at least two shard files");
    if (file_exists(o.out) && !o.force) throw StorageError(fmt::format("{}: exists (use --force to replace it)", o.out));
    std::vector<std::unique_ptr<ResultReader>> rs;
    for (const auto& f : o.inputs) rs.push_back(std::make_unique<ResultReader>(f));
    const auto& first = *rs.front();
    if (first.exists(schema::retrieval()) && !first.exists(schema::ablation_root())) return merge_retrieval(o, rs);
    if (first.exists(schema::influence())) return merge_influence(o, rs);
    if (!first.exists(schema::experiment()) || !first.exists(schema::ablation_root()))
        throw StorageError(fmt::format("{}: not a `headscope run` result (no /experiment or /ablation)", first.path()));
    const std::string wsha = meta_attr(first, "weights_sha256");
    const std::string count = exp_attr(first, "shard_count");
    std::vector<bool> seen_shard(std::max(1, std::atoi(count.c_str())), false);
    const Attrs first_experiment = schema::read_experiment(first);
    for (const auto& r : rs) {
        // The same job as the first shard: its experiment, then its model, then its shard count.
        const jobs::Identity id{meta_attr(*r, "weights_sha256"), schema::read_experiment(*r), {"sha256", "shard_count"}, {}, {}};
        const auto d = compare_parts(wsha, first_experiment, "", id);
        if (d.params && d.params.key == "sha256")
            throw StorageError(fmt::format("{}: from another experiment than {} (the YAML differs, {}); refusing to merge",
                                           r->path(), first.path(),
                                           first_yaml_difference(exp_attr(first, "yaml"), exp_attr(*r, "yaml"))));
        if (d.model) throw StorageError(fmt::format("{}: from another model than {}; refusing to merge", r->path(), first.path()));
        if (d.params)
            throw StorageError(fmt::format("{}: split into {} shards, {} into {}; refusing to merge", r->path(),
                                           exp_attr(*r, "shard_count"), first.path(), count));
        if (exp_attr(*r, "shard") == "merged")
            throw StorageError(fmt::format("{}: is a merged file, not a shard; refusing to merge", r->path()));
        const int idx = std::atoi(exp_attr(*r, "shard_index").c_str());
        if (idx >= 0 && idx < static_cast<int>(seen_shard.size())) {
            if (seen_shard[idx]) throw StorageError(fmt::format("{}: shard {} given twice", r->path(), idx));
            seen_shard[idx] = true;
        }
        if (!o.partial && exp_attr(*r, "complete") != "1")
            throw StorageError(fmt::format("{}: shard {}/{} is incomplete (the task stopped early); rerun it with --resume, "
                                           "or merge with --partial", r->path(), idx, count));
    }
    std::vector<std::string> absent;
    for (size_t i = 0; i < seen_shard.size(); ++i)
        if (!seen_shard[i]) absent.push_back(std::to_string(i));
    if (!absent.empty() && !o.partial)
        throw StorageError(fmt::format("{}: shard{} {} of {} missing (give all {} shard files, or --partial); refusing to merge",
                                       first.path(), absent.size() > 1 ? "s" : "", fmt::join(absent, ", "), seen_shard.size(),
                                       seen_shard.size()));
    // Start from a copy of the first shard, then overwrite the per-configuration results.
    const MergeStage stage(first.path(), o.out);
    const std::string& tmp = stage.path();
    int64_t missing = 0;
    {
        ResultWriter w(tmp, WriteMode::kAppend);
        for (const auto& study : schema::study_names(first)) missing += merge_study(w, first, rs, study);
        schema::write_experiment(w, jobs::merged_attrs(o.inputs, missing == 0));
        w.commit();
    }
    rename_into_place(tmp, o.out);
    if (missing) log_warn(fmt::format("{} configurations are in none of the shards (done = 0, metric NaN)", missing));
    log_info("wrote {} (merged {} shards)", o.out, o.inputs.size());
}

void setup_merge(CLI::App& app) {
    auto o = std::make_shared<MergeOptions>();
    auto* sub = app.add_subcommand("merge",
                                   "join the shards of one `headscope run --shard I/N` experiment, of one\n"
                                   "`headscope retrieval --shard I/N` needle scan, or of one `headscope influence --shard I/N`\n"
                                   "ranking, into one file: what one unsharded run\n"
                                   "writes (needle scores and intervals are computed from the merged per-trial results).\n"
                                   "Refuses files of different experiments or scans (naming what differs), models or\n"
                                   "shard counts, and a shard given twice, missing or unfinished (--partial allows the last two).\n"
                                   "Example: headscope run datasets/experiments/toy-induction.yaml --shard 0/2\n"
                                   "Example: headscope run datasets/experiments/toy-induction.yaml --shard 1/2\n"
                                   "Example: headscope merge out/toy-induction-ablation.shard-0-of-2.h5 "
                                   "out/toy-induction-ablation.shard-1-of-2.h5 --out out/toy-induction-merged.h5\n"
                                   "Example: headscope merge needle.shard-0-of-2.h5 needle.shard-1-of-2.h5 --out needle-merged.h5");
    sub->add_option("inputs", o->inputs, "shard files")->required();
    sub->add_option("-o,--out", o->out, "merged HDF5 file")->required();
    sub->add_flag("--force", o->force, "replace an existing output file");
    sub->add_flag("--partial", o->partial, "merge what the files hold even when shards are missing or unfinished "
                                           "(the missing work stays NaN, done = 0, attribute complete = 0)");
    sub->callback([o] { run_merge(*o); });
}

}  // namespace hs::cli
