// headscope merge: joins the shards of one experiment (`headscope run --shard I/N`) into one file.
// Refuses files of different experiments (YAML sha256), models (weights sha256) or shard counts.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "progress.h"
#include "run_state.h"
#include "store.h"
#include "util.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace hs::cli {

struct MergeOptions {
    std::vector<std::string> inputs;
    std::string out;
    bool force = false;
};

static std::string attr(const ResultReader& r, const std::string& obj, const std::string& name) {
    if (!r.exists(obj)) return "";
    auto a = r.attrs(obj);
    return a.count(name) ? attr_to_string(a.at(name)) : "";
}

int run_merge(const MergeOptions& o) {
    if (o.inputs.size() < 2) throw UsageError("merge: give at least two shard files");
    if (file_exists(o.out) && !o.force) throw StorageError(fmt::format("{}: exists (use --force to replace it)", o.out));
    std::vector<std::unique_ptr<ResultReader>> rs;
    for (const auto& f : o.inputs) rs.push_back(std::make_unique<ResultReader>(f));
    const auto& first = *rs.front();
    if (!first.exists("/experiment") || !first.exists("/ablation"))
        throw StorageError(fmt::format("{}: not a `headscope run` result (no /experiment or /ablation)", first.path()));
    const std::string sha = attr(first, "/experiment", "sha256"), wsha = attr(first, "/meta", "weights_sha256");
    const std::string count = attr(first, "/experiment", "shard_count");
    std::vector<bool> seen_shard(std::max(1, std::atoi(count.c_str())), false);
    for (const auto& r : rs) {
        if (attr(*r, "/experiment", "sha256") != sha)
            throw StorageError(fmt::format("{}: from another experiment than {} (the YAML differs); refusing to merge",
                                           r->path(), first.path()));
        if (attr(*r, "/meta", "weights_sha256") != wsha)
            throw StorageError(fmt::format("{}: from another model than {}; refusing to merge", r->path(), first.path()));
        if (attr(*r, "/experiment", "shard_count") != count)
            throw StorageError(fmt::format("{}: split into {} shards, {} into {}; refusing to merge", r->path(),
                                           attr(*r, "/experiment", "shard_count"), first.path(), count));
        const int idx = std::atoi(attr(*r, "/experiment", "shard_index").c_str());
        if (idx >= 0 && idx < static_cast<int>(seen_shard.size())) {
            if (seen_shard[idx]) throw StorageError(fmt::format("{}: shard {} given twice", r->path(), idx));
            seen_shard[idx] = true;
        }
    }
    // Start from a copy of the first shard, then overwrite the per-configuration results.
    const std::string tmp = temp_path_for(o.out) + "-merge";
    struct Cleanup {
        std::string p;
        ~Cleanup() { std::remove(p.c_str()); }
    } cleanup{tmp};
    try {
        std::filesystem::copy_file(first.path(), tmp, std::filesystem::copy_options::overwrite_existing);
    } catch (const std::exception&) {
        throw StorageError(fmt::format("{}: cannot create (is the folder writable?)", o.out));
    }
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
            std::vector<float> metric(S);
            for (int64_t i = 0; i < S; ++i) {
                double s = 0;
                for (int64_t n = 0; n < N; ++n) s += rows[i * N + n];
                metric[i] = done[i] ? static_cast<float>(s / N) : std::nanf("");
                missing += !done[i];
            }
            for (const char* name : {"/metric", "/metric_rows", "/done"}) w.remove(g + name);
            w.write(g + "/metric", metric, {S});
            w.write(g + "/metric_rows", rows, {S, N});
            w.write(g + "/done", done, {S});
            w.set_attrs(g, {{"shard", std::string("merged")}});
        }
        w.set_attrs("/experiment", {{"shard", std::string("merged")},
                                    {"merged_from", o.inputs},
                                    {"shard_index", int64_t(0)},
                                    {"shard_count", int64_t(1)},
                                    {"complete", int64_t(missing == 0)}});
        w.commit();
    }
    rename_into_place(tmp, o.out);
    if (missing) log_warn(fmt::format("{} configurations are in none of the shards (done = 0, metric NaN)", missing));
    log_info(fmt::format("wrote {} (merged {} shards)", o.out, o.inputs.size()));
    return 0;
}

void setup_merge(CLI::App& app) {
    auto o = std::make_shared<MergeOptions>();
    auto* sub = app.add_subcommand("merge",
                                   "join the shards of one `headscope run --shard I/N` experiment into one file\n"
                                   "(refuses files of different experiments, models or shard counts).\n"
                                   "Example: headscope run datasets/experiments/toy-induction.yaml --shard 0/2\n"
                                   "Example: headscope run datasets/experiments/toy-induction.yaml --shard 1/2\n"
                                   "Example: headscope merge out/toy-induction-ablation.shard-0-of-2.h5 "
                                   "out/toy-induction-ablation.shard-1-of-2.h5 --out out/toy-induction-merged.h5");
    sub->add_option("inputs", o->inputs, "shard files")->required();
    sub->add_option("-o,--out", o->out, "merged HDF5 file")->required();
    sub->add_flag("--force", o->force, "replace an existing output file");
    sub->callback([o] { set_exit_code(run_merge(*o)); });
}

}  // namespace hs::cli
