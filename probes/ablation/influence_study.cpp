#include "influence_study.h"

#include "errors.h"
#include "heads.h"
#include "progress.h"
#include "schema.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hs {

namespace {

std::vector<float> host_floats(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kFloat).contiguous();
    return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

void set_attrs(schema::InfluenceRecord& x, const Attrs& a) {
    for (const auto& [k, v] : a) x.attrs[k] = v;
}

// The file's record with nothing done: NaN losses, the static parts (lines, previews, masks, attributes).
schema::InfluenceRecord empty_record(const InfluenceStudySpec& o, const Model& m) {
    schema::InfluenceRecord x;
    x.N = static_cast<int64_t>(o.corpus.size()), x.S = static_cast<int64_t>(o.sets.size());
    x.L = m.config.n_layers, x.H = m.config.n_heads;
    const float nan = std::nanf("");
    x.loss.assign(static_cast<size_t>(x.N), nan);
    x.masked_loss.assign(static_cast<size_t>(x.S * x.N), nan), x.score.assign(static_cast<size_t>(x.S * x.N), nan);
    x.n_tokens.assign(static_cast<size_t>(x.N), 0), x.done.assign(static_cast<size_t>(x.N), 0);
    schema::InfluenceParams p;
    for (const auto& c : o.corpus) {
        x.line.push_back(c.line);
        x.length.push_back(c.length);
        x.truncated.push_back(c.truncated ? 1 : 0);
        x.preview.push_back(c.preview);
        p.n_truncated += c.truncated;
    }
    x.masks.assign(static_cast<size_t>(x.S * x.L * x.H), 0);
    for (int64_t s = 0; s < x.S; ++s) {
        p.heads.push_back(format_heads(o.sets[static_cast<size_t>(s)]));
        for (auto [l, h] : o.sets[static_cast<size_t>(s)]) x.masks[static_cast<size_t>((s * x.L + l) * x.H + h)] = 1;
    }
    p.corpus = o.corpus_path, p.corpus_sha256 = sha256_file(o.corpus_path);
    p.heads_source = o.heads_source, p.distinct_controls_possible = o.distinct_controls_possible;
    p.control_seed = o.control_seed, p.max_tokens = o.max_tokens, p.max_rows = o.max_rows, p.chunk = o.chunk;
    p.last_only = o.last_only, p.select_fraction = o.select_fraction;
    p.masking = intervention_name(o.masking), p.select_by = name_in(select_by_names(), o.select_by);
    if (o.detection) {
        const auto& d = *o.detection;
        p.detect = true, p.top_share = o.top_share;
        p.detect_format = key_value_format_name(d.format), p.detect_values = d.values;
        p.detect_trials = d.trials, p.detect_length = o.detect_task.length, p.detect_shots = o.detect_task.shots;
        p.detect_seed = static_cast<int64_t>(o.detect_task.seed), p.detect_passed = d.passed, p.detect_max_prompt = d.max_prompt;
        p.detect_min_pairs = d.min_pairs, p.detect_max_pairs = d.max_pairs, p.detect_max_new_tokens = d.max_new_tokens;
        x.detect_score = host_floats(d.score);
    }
    x.attrs = schema::influence_attrs(p);
    return x;
}

// The ranking by set 0's score over the done samples (highest first; NaN, then samples not done,
// last; ties keep corpus order) and the selected top share of the done samples (select_top_share).
void rank_and_select(schema::InfluenceRecord& x, double fraction, SelectBy by) {
    x.rank.resize(static_cast<size_t>(x.N));
    std::iota(x.rank.begin(), x.rank.end(), 0);
    auto key = [&](int64_t i) {  // 0: a score, 1: NaN, 2: not done
        return !x.done[static_cast<size_t>(i)] ? 2 : std::isnan(x.score[static_cast<size_t>(i)]) ? 1 : 0;
    };
    std::stable_sort(x.rank.begin(), x.rank.end(), [&](int64_t a, int64_t b) {
        const int ka = key(a), kb = key(b);
        if (ka != kb) return ka < kb;
        return ka == 0 && x.score[static_cast<size_t>(a)] > x.score[static_cast<size_t>(b)];
    });
    auto sel = select_top_share(x.rank, x.done, x.length, fraction, by);
    x.selected = std::move(sel.selected);
    set_attrs(x, schema::influence_ranking_attrs(sel.n_selected, sel.n_done, sel.tokens_selected, sel.tokens_done));
}

// Sample i's values from another record of the same corpus and sets.
void copy_sample(schema::InfluenceRecord& x, const schema::InfluenceRecord& from, int64_t i) {
    const auto k = static_cast<size_t>(i);
    x.loss[k] = from.loss[k], x.n_tokens[k] = from.n_tokens[k], x.done[k] = 1;
    for (int64_t s = 0; s < x.S; ++s) {
        const auto j = static_cast<size_t>(s * x.N + i);
        x.masked_loss[j] = from.masked_loss[j], x.score[j] = from.score[j];
    }
}

// What makes two files one run's (a shard and its resume, the shards of a merge): the model, the
// attributes that define the work and, on resume, the shard. "" when they agree, else what differs
// ("NAME: A vs B", values cut to 60 characters), the work before the shard before the model; then
// the shapes (a's N and S first).
std::string run_difference(const std::string& stored_sha256, const Attrs& stored, const std::string& stored_shard,
                           const std::string& sha256, const Attrs& now, const std::string& shard,
                           const schema::InfluenceRecord& a, const schema::InfluenceRecord& b) {
    const jobs::Identity id{sha256, now, schema::influence_identity_keys(), {}, shard};
    const auto d = jobs::compare_parts(stored_sha256, stored, stored_shard, id);
    if (d.params) return fmt::format("{}: {} vs {}", d.params.key, d.params.was.substr(0, 60), d.params.now.substr(0, 60));
    if (d.shard) return d.shard.str();
    if (d.model) return d.model.str();
    if (a.N != b.N || a.S != b.S) return fmt::format("{} samples x {} sets vs {} x {}", a.N, a.S, b.N, b.S);
    return "";
}

std::string stored_sha256(const ResultReader& r) { return schema::attr_text(r, schema::meta(), "weights_sha256"); }

// Work item k: samples [k * chunk, k * chunk + its size) of n.
int64_t chunk_size(int64_t n, int64_t k, int64_t chunk) { return std::min(n, (k + 1) * chunk) - k * chunk; }

}  // namespace

InfluenceStudy::InfluenceStudy(InfluenceStudySpec spec, const Model& m)
    : spec_(std::move(spec)), m_(m), x_(empty_record(spec_, m)) {}

int64_t InfluenceStudy::n_chunks() const { return (x_.N + spec_.chunk - 1) / spec_.chunk; }

int64_t InfluenceStudy::owned_samples() const {
    int64_t owned = 0;
    for (int64_t k = 0; k < n_chunks(); ++k) owned += spec_.shard.owns(k) ? chunk_size(x_.N, k, spec_.chunk) : 0;
    return owned;
}

std::string InfluenceStudy::difference(const ResultReader& r) const {
    const auto prev = schema::read_influence(r);
    const auto stored_shard = schema::influence_shard_info(prev.attrs).shard;
    return run_difference(stored_sha256(r), prev.attrs, stored_shard, m_.weights_sha256(), x_.attrs, spec_.shard.str(), prev, x_);
}

void InfluenceStudy::resume(const ResultReader& r) { prev_ = schema::read_influence(r); }

// Work item k is chunk k; one the resumed file holds whole is copied, not run. The checkpoint's timer
// is consulted after every owned chunk, copied or run.
int64_t InfluenceStudy::run(jobs::Checkpoint& checkpoint) {
    const int64_t chunk = spec_.chunk, N = x_.N, S = x_.S;
    Progress bar("influence (samples)", owned_samples());
    int64_t ticked = 0;
    auto done = [&](int64_t k) {
        const int64_t a = k * chunk, n = chunk_size(N, k, chunk);
        bool all = prev_.has_value();
        for (int64_t i = a; all && i < a + n; ++i) all = prev_->done[static_cast<size_t>(i)] != 0;
        return all;
    };
    auto copied = [&](int64_t k) {
        const int64_t a = k * chunk, n = chunk_size(N, k, chunk);
        for (int64_t i = a; i < a + n; ++i) copy_sample(x_, *prev_, i);
        bar.update(ticked += n);
        checkpoint.item_finished();
    };
    const int64_t f0 = forwards_;
    jobs::run_items(spec_.shard, n_chunks(), done, [&](int64_t k) {
        const int64_t a = k * chunk, n = chunk_size(N, k, chunk);
        const std::vector<CorpusSample> samples(spec_.corpus.begin() + a, spec_.corpus.begin() + a + n);
        const auto r = attention_influence(m_, samples, spec_.sets, {spec_.max_rows, spec_.last_only, spec_.masking});
        forwards_ += r.forwards;
        const auto loss = host_floats(r.loss), masked = host_floats(r.masked_loss), score = host_floats(r.score);
        for (int64_t j = 0; j < n; ++j) {
            const auto i = static_cast<size_t>(a + j);
            x_.loss[i] = loss[static_cast<size_t>(j)], x_.n_tokens[i] = r.n_tokens[static_cast<size_t>(j)], x_.done[i] = 1;
            for (int64_t s = 0; s < S; ++s) {
                x_.masked_loss[static_cast<size_t>(s * N) + i] = masked[static_cast<size_t>(s * n + j)];
                x_.score[static_cast<size_t>(s * N) + i] = score[static_cast<size_t>(s * n + j)];
            }
        }
        bar.update(ticked += n);
    }, copied, &checkpoint);
    bar.finish();
    finished_ = true;
    return forwards_ - f0;
}

const schema::InfluenceRecord& InfluenceStudy::record() {
    rank_and_select(x_, spec_.select_fraction, spec_.select_by);
    set_attrs(x_, jobs::shard_attrs(spec_.shard, finished_));
    set_attrs(x_, schema::influence_run_attrs(forwards_));
    return x_;
}

// ---- merge

InfluenceMerge::InfluenceMerge(const ResultReader& first) : first_(first), all_(schema::read_influence(first)) {
    std::fill(all_.done.begin(), all_.done.end(), 0);
}

schema::InfluenceShardInfo InfluenceMerge::add(const ResultReader& r) {
    const auto x = schema::read_influence(r);
    const std::string d = run_difference(stored_sha256(first_), all_.attrs, "", stored_sha256(r), x.attrs, "", x, all_);
    if (!d.empty())
        throw StorageError(fmt::format("{}: a shard of another influence run than {} ({}); refusing to merge", r.path(), first_.path(), d));
    const auto sh = schema::influence_shard_info(x.attrs);
    if (!sh.index || !sh.count || sh.shard == "merged")
        throw StorageError(fmt::format("{}: not a shard (merged already, or no shard_index); refusing to merge", r.path()));
    const int64_t idx = *sh.index, cnt = *sh.count;
    if (seen_.empty()) seen_.assign(static_cast<size_t>(cnt), false);
    if (static_cast<int64_t>(seen_.size()) != cnt)
        throw StorageError(fmt::format("{}: a shard of {}, {} of {}; refusing to merge", r.path(), cnt, first_.path(), seen_.size()));
    if (seen_[static_cast<size_t>(idx)]) throw StorageError(fmt::format("{}: shard {}/{} given twice; refusing to merge", r.path(), idx, cnt));
    seen_[static_cast<size_t>(idx)] = true;
    for (int64_t i = 0; i < all_.N; ++i)
        if (x.done[static_cast<size_t>(i)] && !all_.done[static_cast<size_t>(i)]) copy_sample(all_, x, i);
    return sh;
}

int64_t InfluenceMerge::missing() const {
    int64_t left = 0;
    for (auto d : all_.done) left += !d;
    return left;
}

schema::InfluenceRecord InfluenceMerge::record(const std::vector<std::string>& inputs) {
    const auto fraction = schema::influence_select_fraction(all_.attrs);
    if (!fraction) throw StorageError(fmt::format("{}: /influence has no select_fraction; damaged file", first_.path()));
    const std::string by = schema::influence_select_by(all_.attrs);
    const auto select_by = find_in(select_by_names(), by);
    if (!select_by) throw StorageError(fmt::format("{}: /influence's select_by '{}' is not tokens or samples; damaged file", first_.path(), by));
    rank_and_select(all_, *fraction, *select_by);
    set_attrs(all_, jobs::merged_attrs(inputs, missing() == 0));
    return all_;
}

}  // namespace hs
