#include "jobs.h"

#include "errors.h"
#include "schema.h"
#include "util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace hs::jobs {

std::string Shard::str() const { return fmt::format("{}/{}", index, count); }

// A Slurm array's variable as a non-negative integer; UsageError naming it when unset or not one.
static int64_t slurm_env(const char* name, const std::string& s) {
    const char* v = std::getenv(name);
    if (!v || !*v)
        throw UsageError(fmt::format("--shard '{}': {} is not set (not inside a Slurm job array; give I/N instead)", s, name));
    const auto x = parse_int64(v);
    if (!x || *x < 0) throw UsageError(fmt::format("--shard '{}': {}='{}' is not a non-negative integer", s, name, v));
    return *x;
}

Shard parse_shard(const std::string& s) {
    Shard sh;
    auto p = split(s, '/');
    if (!p.empty() && p[0] == "slurm") {
        // slurm: I = SLURM_ARRAY_TASK_ID, N = SLURM_ARRAY_TASK_COUNT (the array's indices must be
        // 0..N-1); slurm/N: N given, for a task resubmitted alone (--array=2: its count is 1).
        if (p.size() > 2) throw UsageError(fmt::format("--shard '{}': expected slurm or slurm/N", s));
        sh.index = slurm_env("SLURM_ARRAY_TASK_ID", s);
        if (p.size() == 2) {
            const auto n = parse_int64(p[1]);
            if (!n) throw UsageError(fmt::format("--shard '{}': expected slurm/N with N an integer", s));
            sh.count = *n;
        } else {
            sh.count = slurm_env("SLURM_ARRAY_TASK_COUNT", s);
        }
        if (sh.count < 1 || sh.index >= sh.count)
            throw UsageError(fmt::format("--shard '{}': array task {} of {} tasks: the array's indices must be 0..N-1 "
                                         "(sbatch --array=0-{})", s, sh.index, sh.count, std::max<int64_t>(sh.count - 1, 0)));
        return sh;
    }
    const auto i = p.size() == 2 ? parse_int64(p[0]) : std::nullopt, n = p.size() == 2 ? parse_int64(p[1]) : std::nullopt;
    if (!i || !n) throw UsageError(fmt::format("--shard '{}': expected I/N (e.g. 0/4), slurm or slurm/N", s));
    sh.index = *i, sh.count = *n;
    if (sh.count < 1 || sh.index < 0 || sh.index >= sh.count) throw UsageError(fmt::format("--shard '{}': need 0 <= I < N", s));
    return sh;
}

std::string shard_path(const std::string& out, const Shard& s) {
    const std::string suffix = fmt::format(".shard-{}-of-{}", s.index, s.count);
    auto dot = out.rfind(".h5");
    if (dot != std::string::npos && dot + 3 == out.size()) return out.substr(0, dot) + suffix + ".h5";
    return out + suffix;
}

Attrs shard_attrs(const Shard& s, bool complete) {
    return {{"shard", s.str()}, {"shard_index", s.index}, {"shard_count", s.count}, {"complete", int64_t(complete)}};
}

Attrs merged_attrs(const std::vector<std::string>& inputs, bool complete) {
    return {{"shard", std::string("merged")},
            {"merged_from", inputs},
            {"shard_index", int64_t(0)},
            {"shard_count", int64_t(1)},
            {"complete", int64_t(complete)}};
}

void Checkpoint::item_finished() {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count() < seconds_) return;
    write_now();
}

void Checkpoint::write_now() {
    const auto t0 = std::chrono::steady_clock::now();
    write_();
    last_ = std::chrono::steady_clock::now();
    writing_s_ += std::chrono::duration<double>(last_ - t0).count();
    if (pause_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms_));
}

std::vector<int64_t> pending_items(const Shard& shard, int64_t n, const std::function<bool(int64_t)>& done) {
    std::vector<int64_t> out;
    for (int64_t k = 0; k < n; ++k)
        if (shard.owns(k) && !done(k)) out.push_back(k);
    return out;
}

int64_t run_items(const Shard& shard, int64_t n, const std::function<bool(int64_t)>& done,
                  const std::function<void(int64_t)>& run, const std::function<void(int64_t)>& skipped, Checkpoint* checkpoint) {
    int64_t ran = 0;
    for (int64_t k = 0; k < n; ++k) {
        if (!shard.owns(k)) continue;
        if (done(k)) {
            if (skipped) skipped(k);
            continue;
        }
        run(k);
        ++ran;
        if (checkpoint) checkpoint->item_finished();
    }
    return ran;
}

std::string Difference::str(size_t cut) const {
    auto c = [cut](const std::string& s) { return s.size() > cut ? s.substr(0, cut - 3) + "..." : s; };
    switch (kind) {
        case Kind::kNone: return "";
        case Kind::kModel: return "the model's weights differ";
        case Kind::kParam: return fmt::format("{}: {} vs {}", key, c(was), c(now));
        case Kind::kShard: return fmt::format("shard: {} vs {}", was, now);
    }
    return "";
}

std::string value_text(const AttrValue& v) {
    std::string s = attr_to_string(v);
    const bool list = std::holds_alternative<std::vector<int64_t>>(v) || std::holds_alternative<std::vector<double>>(v) ||
                      std::holds_alternative<std::vector<std::string>>(v);
    if (list && s.size() >= 2 && s.front() == '[' && s.back() == ']' && s.find(',') == std::string::npos)
        s = s.substr(1, s.size() - 2);
    return s;
}

Differences compare_parts(const std::string& stored_sha256, const Attrs& stored, const std::string& stored_shard,
                          const Identity& now) {
    Differences d;
    if (stored_sha256 != now.weights_sha256)
        d.model.kind = Difference::Kind::kModel, d.model.was = stored_sha256, d.model.now = now.weights_sha256;
    std::vector<std::string> keys = now.keys;
    if (keys.empty())
        for (const auto& kv : now.params) keys.push_back(kv.first);
    for (const auto& k : keys) {
        if (now.ignore.count(k)) continue;
        const auto a = stored.find(k);
        const auto b = now.params.find(k);
        const std::string was = a == stored.end() ? "(absent)" : value_text(a->second);
        const std::string cur = b == now.params.end() ? "(absent)" : value_text(b->second);
        if (was != cur) {
            d.params.kind = Difference::Kind::kParam, d.params.key = k, d.params.was = was, d.params.now = cur;
            break;
        }
    }
    if (!now.shard.empty() && stored_shard != now.shard)
        d.shard.kind = Difference::Kind::kShard, d.shard.was = stored_shard, d.shard.now = now.shard;
    return d;
}

Difference compare(const std::string& stored_sha256, const Attrs& stored, const std::string& stored_shard, const Identity& now) {
    const Differences d = compare_parts(stored_sha256, stored, stored_shard, now);
    return d.model ? d.model : d.params ? d.params : d.shard;
}

Difference compare_file(const ResultReader& r, const std::string& group, const Identity& now) {
    const std::string sha = schema::attr_text(r, schema::meta(), "weights_sha256");
    const Attrs a = r.exists(group) ? r.attrs(group) : Attrs{};
    const auto s = a.find("shard");
    return compare(sha, a, s == a.end() ? std::string() : value_text(s->second), now);
}

}  // namespace hs::jobs
