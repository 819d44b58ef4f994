// The merge of a needle scan's shards (see needle_store.h).
#include "needle_store.h"

#include "jobs.h"
#include "needle_records.h"
#include "schema.h"

#include "common.h"
#include "errors.h"
#include "progress.h"
#include "util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

namespace hs::cli {

MergeStage::MergeStage(const std::string& first, const std::string& out) : tmp_(temp_path_for(out) + "-merge") {
    try {
        std::filesystem::copy_file(first, tmp_, std::filesystem::copy_options::overwrite_existing);
    } catch (const std::exception&) {
        std::remove(tmp_.c_str());
        throw StorageError(fmt::format("{}: cannot create (is the folder writable?)", out));
    }
}

MergeStage::~MergeStage() { std::remove(tmp_.c_str()); }

std::string needle_config_difference(const ResultReader& a, const ResultReader& b) {
    static const std::set<std::string> kNotConfig = {"n_passed", "accuracy", "n_trials_done", "haystack_file",
                                                     "needles_file", "shard", "shard_index", "shard_count",
                                                     "complete", "merged_from"};
    // Each group's attributes through the job runner's identity check (jobs::compare: a's as stored,
    // b's as this run's; the model's weights are one of /meta's parameters here).
    auto compare = [&](const std::string& obj, const std::set<std::string>& only) -> std::string {
        const bool ea = a.exists(obj), eb = b.exists(obj);
        if (ea != eb) return fmt::format("{}: {} vs {}", obj, ea ? "present" : "absent", eb ? "present" : "absent");
        if (!ea) return "";
        jobs::Identity id;
        id.params = b.attrs(obj);
        const Attrs x = a.attrs(obj);
        std::set<std::string> keys;
        for (const auto& kv : x) keys.insert(kv.first);
        for (const auto& kv : id.params) keys.insert(kv.first);
        for (const auto& k : keys)
            if (!kNotConfig.count(k) && (only.empty() || only.count(k))) id.keys.push_back(k);
        if (id.keys.empty()) return "";  // (an empty key list compares every parameter)
        const jobs::Difference d = jobs::compare("", x, "", id);
        if (!d) return "";
        auto cut = [](std::string v) { return v.size() > 80 ? v.substr(0, 77) + "..." : v; };
        return fmt::format("{} {} vs {}", d.key, cut(d.was), cut(d.now));
    };
    for (auto d : {compare(schema::meta(), {"weights_sha256", "dtype", "n_layers", "n_heads"}), compare(schema::retrieval(), {}),
                   compare(schema::retrieval_ablation(), {})})
        if (!d.empty()) return d;
    return "";
}

static std::string attr_of(const ResultReader& r, const std::string& obj, const std::string& k) {
    if (!r.exists(obj)) return "";
    const auto a = r.attrs(obj);
    return a.count(k) ? jobs::value_text(a.at(k)) : "";
}

void merge_retrieval(const MergeArgs& o, const std::vector<std::unique_ptr<ResultReader>>& rs) {
    const ResultReader& first = *rs.front();
    std::vector<NeedleResults> parts;
    int64_t count = -1;
    std::map<int64_t, std::string> by_index;
    for (const auto& r : rs) {
        parts.push_back(read_needle_results(*r));
        if (r.get() != &first) {
            const std::string d = needle_config_difference(first, *r);
            if (!d.empty())
                throw StorageError(fmt::format("{}: a shard of another needle scan than {} ({}); refusing to merge",
                                               r->path(), first.path(), d));
        }
        int64_t idx = -1, n = -1;
        try {
            idx = std::stoll(attr_of(*r, schema::retrieval(), "shard_index")), n = std::stoll(attr_of(*r, schema::retrieval(), "shard_count"));
        } catch (const std::exception&) {
            throw StorageError(fmt::format("{}: /retrieval has no shard_index / shard_count (merged already, or not a "
                                           "shard); refusing to merge", r->path()));
        }
        if (attr_of(*r, schema::retrieval(), "shard") == "merged")
            throw StorageError(fmt::format("{}: is a merged file, not a shard; refusing to merge", r->path()));
        if (count < 0) count = n;
        if (n != count)
            throw StorageError(fmt::format("{}: shard {}/{}, but {} is a shard of {}; refusing to merge", r->path(), idx, n,
                                           first.path(), count));
        if (by_index.count(idx))
            throw StorageError(fmt::format("{}: shard {}/{} given twice (also {}); refusing to merge", r->path(), idx, n,
                                           by_index[idx]));
        by_index[idx] = r->path();
        if (!o.partial && attr_of(*r, schema::retrieval(), "complete") != "1")
            throw StorageError(fmt::format("{}: shard {}/{} is incomplete (the task stopped early); rerun it with --resume, "
                                           "or merge with --partial", r->path(), idx, n));
    }
    std::vector<std::string> missing;
    for (int64_t i = 0; i < count; ++i)
        if (!by_index.count(i)) missing.push_back(std::to_string(i));
    if (!missing.empty() && !o.partial)
        throw StorageError(fmt::format("{}: shard{} {} of {} missing (give all {} shard files, or --partial); refusing to merge",
                                       first.path(), missing.size() > 1 ? "s" : "", fmt::join(missing, ", "), count, count));
    // Each trial (and each ablated trial) from the first shard that ran it.
    NeedleResults all;
    const NeedleResults& p0 = parts.front();
    all.init(p0.N, p0.L, p0.H, p0.steps, p0.abl_steps, p0.with_steps);
    if (p0.S > 0) all.init_sets(p0.S, p0.masks);
    for (size_t k = 0; k < parts.size(); ++k) {
        const auto& p = parts[k];
        if (p.N != all.N || p.steps != all.steps || p.S != all.S)
            throw StorageError(fmt::format("{}: {} trials x {} steps, {} ablation sets; {} has {} x {}, {}; refusing to merge",
                                           rs[k]->path(), p.N, p.steps, p.S, first.path(), all.N, all.steps, all.S));
        for (int64_t i = 0; i < all.N; ++i)
            if (p.done[i] && !all.done[i]) all.copy_trial(p, i);
        for (int64_t s = 0; s < all.S; ++s) {
            if (!all.same_set(p, s, s))
                throw StorageError(fmt::format("{}: ablation set {} differs from {}'s; refusing to merge", rs[k]->path(), s,
                                               first.path()));
            for (int64_t i = 0; i < all.N; ++i)
                if (p.abl_done[s * all.N + i] && !all.abl_done[s * all.N + i]) all.copy_ablated(p, s, s, i);
        }
    }
    int64_t left = 0;
    for (auto d : all.done) left += !d;
    for (auto d : all.abl_done) left += !d;
    if (left && !o.partial)
        throw StorageError(fmt::format("{}: {} trial decodes are in none of the shards; refusing to merge", first.path(), left));
    int64_t bootstrap = 0, seed = 0;
    double flag = 0;
    try {
        bootstrap = std::stoll(attr_of(first, schema::retrieval(), "bootstrap_resamples"));
        seed = std::stoll(attr_of(first, schema::retrieval(), "seed"));
        flag = std::stod(attr_of(first, schema::retrieval(), "flag_threshold"));
    } catch (const std::exception&) {
        throw StorageError(fmt::format("{}: /retrieval lacks bootstrap_resamples, seed or flag_threshold", first.path()));
    }
    const RngKind rng = find_in(rng_kind_names(), attr_of(first, schema::retrieval(), "rng")).value_or(RngKind::kHeadscope);
    const NeedleSummary sum = summarize(all, bootstrap, static_cast<uint64_t>(seed), flag, rng);

    const MergeStage stage(first.path(), o.out);
    const std::string& tmp = stage.path();
    {
        ResultWriter w(tmp, WriteMode::kAppend);
        write_needle_results(w, all, sum, needle_scores_in(first));
        schema::write_needle_job(w, jobs::merged_attrs(o.inputs, left == 0));
        w.commit();
    }
    rename_into_place(tmp, o.out);
    if (left) log_warn(fmt::format("{} trial decodes are in none of the shards (done = 0, NaN)", left));
    log_info(fmt::format("wrote {} (merged {} shards: {} trials, accuracy {:.3f})", o.out, rs.size(), sum.n_done, sum.accuracy));
}

}  // namespace hs::cli
