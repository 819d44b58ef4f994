// headscope merge: joins the shards of one experiment (`headscope run --shard I/N`) or of one needle
// scan (`headscope retrieval --shard I/N`, needle_store.cpp) into one file. Refuses files of
// different experiments (naming the first YAML line that differs) or scans (naming the parameter),
// models (weights sha256) or shard counts, a shard given twice, missing or unfinished.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "needle_store.h"
#include "progress.h"
#include "run_state.h"
#include "store.h"
#include "util.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace hs::cli {

using MergeOptions = MergeArgs;

static std::string attr(const ResultReader& r, const std::string& obj, const std::string& name) {
    if (!r.exists(obj)) return "";
    auto a = r.attrs(obj);
    return a.count(name) ? attr_to_string(a.at(name)) : "";
}

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

void run_merge(const MergeOptions& o) {
    if (o.inputs.size() < 2) throw UsageError("merge: give at least two shard files");
    if (file_exists(o.out) && !o.force) throw StorageError(fmt::format("{}: exists (use --force to replace it)", o.out));
    std::vector<std::unique_ptr<ResultReader>> rs;
    for (const auto& f : o.inputs) rs.push_back(std::make_unique<ResultReader>(f));
    const auto& first = *rs.front();
    if (first.exists("/retrieval") && !first.exists("/ablation")) return merge_retrieval(o, rs);
    if (!first.exists("/experiment") || !first.exists("/ablation"))
        throw StorageError(fmt::format("{}: not a `headscope run` result (no /experiment or /ablation)", first.path()));
    const std::string sha = attr(first, "/experiment", "sha256"), wsha = attr(first, "/meta", "weights_sha256");
    const std::string count = attr(first, "/experiment", "shard_count");
    std::vector<bool> seen_shard(std::max(1, std::atoi(count.c_str())), false);
    for (const auto& r : rs) {
        if (attr(*r, "/experiment", "sha256") != sha)
            throw StorageError(fmt::format("{}: from another experiment than {} (the YAML differs, {}); refusing to merge",
                                           r->path(), first.path(),
                                           first_yaml_difference(attr(first, "/experiment", "yaml"), attr(*r, "/experiment", "yaml"))));
        if (attr(*r, "/meta", "weights_sha256") != wsha)
            throw StorageError(fmt::format("{}: from another model than {}; refusing to merge", r->path(), first.path()));
        if (attr(*r, "/experiment", "shard_count") != count)
            throw StorageError(fmt::format("{}: split into {} shards, {} into {}; refusing to merge", r->path(),
                                           attr(*r, "/experiment", "shard_count"), first.path(), count));
        if (attr(*r, "/experiment", "shard") == "merged")
            throw StorageError(fmt::format("{}: is a merged file, not a shard; refusing to merge", r->path()));
        const int idx = std::atoi(attr(*r, "/experiment", "shard_index").c_str());
        if (idx >= 0 && idx < static_cast<int>(seen_shard.size())) {
            if (seen_shard[idx]) throw StorageError(fmt::format("{}: shard {} given twice", r->path(), idx));
            seen_shard[idx] = true;
        }
        if (!o.partial && attr(*r, "/experiment", "complete") != "1")
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
        for (const auto& study : first.children("/ablation")) {
            const std::string g = "/ablation/" + study;
            auto masks0 = first.read_numbers(g + "/masks");
            if (masks0.shape.size() != 3)
                throw StorageError(fmt::format("{}: {}/masks has shape {}, expected [S, L, H]", first.path(), g,
                                               shape_str(masks0.shape)));
            const int64_t S = masks0.shape[0];
            std::vector<float> rows;
            std::vector<uint8_t> done(S, 0);
            int64_t N = 0;
            for (const auto& r : rs) {
                if (!r->exists(g + "/done"))
                    throw StorageError(fmt::format("{}: has no study '{}'; refusing to merge", r->path(), study));
                auto d = r->read_numbers(g + "/done"), mr = r->read_numbers(g + "/metric_rows"), mk = r->read_numbers(g + "/masks");
                if (mk.shape != masks0.shape || mk.values != masks0.values)
                    throw StorageError(fmt::format("{}: study '{}' has other configurations than {}; refusing to merge",
                                                   r->path(), study, first.path()));
                // Shapes are checked before any index: a damaged shard must not read past its arrays.
                if (d.shape != std::vector<int64_t>{S} || mr.shape.size() != 2 || mr.shape[0] != S ||
                    (!rows.empty() && mr.shape[1] != N))
                    throw StorageError(fmt::format("{}: study '{}': done {} and metric_rows {} do not fit {} configurations"
                                                   "{}; refusing to merge", r->path(), study, shape_str(d.shape),
                                                   shape_str(mr.shape), S, rows.empty() ? "" : fmt::format(" of {} rows", N)));
                N = mr.shape[1];
                if (rows.empty()) rows.assign(S * N, std::nanf(""));
                for (int64_t i = 0; i < S; ++i)
                    if (d.values[i] != 0 && !done[i]) {
                        done[i] = 1;
                        for (int64_t n = 0; n < N; ++n) rows[i * N + n] = static_cast<float>(mr.values[i * N + n]);
                    }
            }
            // The metric as `run` computes it (a float32 mean over the rows), so that the merged file
            // equals the unsharded one bit for bit.
            auto mean = torch::from_blob(rows.data(), {S, N}, torch::kFloat).mean(1).contiguous();
            std::vector<float> metric(mean.data_ptr<float>(), mean.data_ptr<float>() + S);
            for (int64_t i = 0; i < S; ++i) {
                if (!done[i]) metric[i] = std::nanf("");
                missing += !done[i];
            }
            for (const char* name : {"/metric", "/metric_rows", "/done"}) w.remove(g + name);
            w.write(g + "/metric", metric, {S});
            w.write(g + "/metric_rows", rows, {S, N});
            w.write(g + "/done", done, {S});
            if (first.exists(g + "/factor")) {  // a scale-grid study: its JUICE selection from the merged rows
                auto f = first.read_numbers(g + "/factor");
                const std::string data = attr(first, g, "dataset");
                std::vector<int64_t> variants;
                if (first.exists("/data/" + data + "/variant"))
                    for (double v : first.read_numbers("/data/" + data + "/variant").values) variants.push_back(static_cast<int64_t>(v));
                auto mk = torch::tensor(masks0.values, torch::kDouble).view({S, masks0.shape[1], masks0.shape[2]});
                write_juice(w, g, torch::from_blob(rows.data(), {S, N}, torch::kFloat).clone(), mk, f.values, variants);
            }
            w.set_attrs(g, {{"shard", std::string("merged")}});
        }
        w.set_attrs("/experiment", merged_attrs(o.inputs, missing == 0));
        w.commit();
    }
    rename_into_place(tmp, o.out);
    if (missing) log_warn(fmt::format("{} configurations are in none of the shards (done = 0, metric NaN)", missing));
    log_info("wrote {} (merged {} shards)", o.out, o.inputs.size());
}

void setup_merge(CLI::App& app) {
    auto o = std::make_shared<MergeOptions>();
    auto* sub = app.add_subcommand("merge",
                                   "join the shards of one `headscope run --shard I/N` experiment, or of one\n"
                                   "`headscope retrieval --shard I/N` needle scan, into one file: what one unsharded run\n"
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
