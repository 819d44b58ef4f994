// One runner for long, resumable work (`retrieval`, `run`, `influence`, `--kv-compare`) and `merge`:
// the work items a shard owns, which are done, the checkpoint timer, and the one check that a file on
// disk is this job's (to resume it) or a sibling shard's (to merge it). Every job cuts its work into
// items numbered 0..n-1 the same way whatever the sharding, so an item is computed in the same batch,
// hence to the same bits, by a shard, a resumed run and the whole run (docs/architecture.md, "Jobs").
#pragma once

#include "store.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace hs::jobs {

// This run's share of the items: item k when k % count == index.
struct Shard {
    int64_t index = 0, count = 1;
    bool owns(int64_t item) const { return item % count == index; }
    bool sharded() const { return count > 1; }
    std::string str() const;  // "I/N"
};
// "I/N", "slurm" (SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT) or "slurm/N"; UsageError naming the text.
Shard parse_shard(const std::string& s);
// out/x.h5 -> out/x.shard-1-of-4.h5 (a sharded run's default output).
std::string shard_path(const std::string& out, const Shard& s);
// The attributes a job's file carries about its shard (on its root group: /experiment, /retrieval,
// /influence): shard "I/N", shard_index, shard_count, and complete (1 when every owned item is done).
Attrs shard_attrs(const Shard& s, bool complete);
// The same for a merge's file: shard "merged", merged_from (the inputs), index 0 of 1, and complete
// (1 when every item was found in some shard).
Attrs merged_attrs(const std::vector<std::string>& inputs, bool complete);

// Writes the job's file at most every `seconds` as items finish (0: after every item), and on demand.
// pause_ms > 0 sleeps after each checkpoint write (the kill-and-resume tests' window).
class Checkpoint {
public:
    Checkpoint(double seconds, std::function<void()> write, int pause_ms = 0)
        : seconds_(seconds), write_(std::move(write)), pause_ms_(pause_ms) {}
    void item_finished();  // writes when `seconds` have passed since the last write
    void write_now();
    double writing_seconds() const { return writing_s_; }  // time spent in writes

private:
    double seconds_;
    std::function<void()> write_;
    int pause_ms_;
    double writing_s_ = 0;
    std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// The items of [0, n) that `shard` owns and are not done(k), in order.
std::vector<int64_t> pending_items(const Shard& shard, int64_t n, const std::function<bool(int64_t)>& done);

// Runs every item of [0, n) the shard owns: run(k) for an item not done(k) (then a checkpoint),
// skipped(k) for one a resumed file already holds (a progress bar's tick). Returns the items run.
int64_t run_items(const Shard& shard, int64_t n, const std::function<bool(int64_t)>& done,
                  const std::function<void(int64_t)>& run, const std::function<void(int64_t)>& skipped = {},
                  Checkpoint* checkpoint = nullptr);

// ---- identity: is a stored file this job's (resume) or its sibling's (merge)?
// What makes two files one job: the model's weights, the job's parameters (attributes of its group:
// every key of `params`, or only `keys` when given, less `ignore`), and the shard.
struct Identity {
    std::string weights_sha256;
    Attrs params;
    std::vector<std::string> keys;    // empty: every key of params
    std::set<std::string> ignore;     // keys not compared (e.g. file names whose contents' hashes are)
    std::string shard;                // empty: not compared (merge compares shard counts itself)
};
// The first difference, in the order model, parameters, shard; kind kNone when the same.
struct Difference {
    enum class Kind { kNone, kModel, kParam, kShard } kind = Kind::kNone;
    std::string key, was, now;  // the parameter (kParam); the stored and this run's values as text
    explicit operator bool() const { return kind != Kind::kNone; }
    std::string str(size_t cut = 80) const;  // "NAME: WAS vs NOW" (values cut to `cut` characters)
};
// An attribute as compared: attr_to_string's text, a one-element list as its element (HDF5 reads a
// one-element list back as a scalar).
std::string value_text(const AttrValue& v);
// Compares `now` against the stored /meta weights_sha256 and the attributes `stored` (of the job's
// group) and `stored_shard` (its "shard" attribute, "" when absent). A value missing from the file
// reads "(absent)".
Difference compare(const std::string& stored_sha256, const Attrs& stored, const std::string& stored_shard,
                   const Identity& now);
// Each part compared alone (the model; the parameters; the shard, when now.shard is set), for a
// command whose messages report the parts in an order of its own (`run`: the experiment first;
// `influence`: the parameters and the shard before the model). compare() is the first of them.
struct Differences {
    Difference model, params, shard;
};
Differences compare_parts(const std::string& stored_sha256, const Attrs& stored, const std::string& stored_shard,
                          const Identity& now);
// The same against a file: /meta's weights_sha256 and `group`'s attributes.
Difference compare_file(const ResultReader& r, const std::string& group, const Identity& now);

}  // namespace hs::jobs
