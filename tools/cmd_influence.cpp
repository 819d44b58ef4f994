// headscope influence: AttentionInfluence (Hua et al. 2025) - rank a corpus by how much the model's
// loss on each sample rises when its retrieval heads are masked, with random head sets as controls.
// Method: probes/ablation/influence.h, docs/methods.md ("AttentionInfluence").
#include "ablation_records.h"
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "heads.h"
#include "influence.h"
#include "needle_store.h"
#include "progress.h"
#include "run_state.h"
#include "schema.h"
#include "tokenizer.h"
#include "util.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <numeric>

namespace hs::cli {

struct InfluenceCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string corpus, heads, from;
    int64_t top = 0, random_controls = 5, seed = 0, max_tokens = 0, max_rows = 8, show = 3;
    double select_fraction = 0.3;
    std::string loss_tokens = "all";
    int64_t chunk = 64;          // samples a work item (the unit a shard owns and a checkpoint completes)
    std::string shard;           // "I/N" or slurm forms (jobs.h parse_shard)
    bool resume = false;
    double checkpoint_seconds = 60;
};

// Set 0 (the named heads) and where it came from.
static std::pair<std::vector<Head>, std::string> chosen_heads(const InfluenceCliOptions& o, int L, int H) {
    if (!o.heads.empty()) return {with_flag("--heads", [&] { return parse_head_list(o.heads, L, H); }), "--heads " + o.heads};
    if (o.from.empty() || o.top < 1) throw UsageError("give --heads, or --from FILE.h5:DATASET with --top K");
    if (o.top > static_cast<int64_t>(L) * H) throw UsageError(fmt::format("--top: {} is more than the model's {} heads", o.top, L * H));
    auto score = with_flag("--from", [&] { return read_head_score(split_head_score_ref(o.from), L, H); });
    return {top_heads(score, o.top), fmt::format("top {} of {}", o.top, o.from)};
}

// The file's record with nothing done: NaN losses, the static parts (lines, previews, masks, attributes).
static schema::InfluenceRecord empty_record(const InfluenceCliOptions& o, const Model& m, const std::vector<CorpusSample>& corpus,
                                            const std::vector<std::vector<Head>>& sets) {
    schema::InfluenceRecord x;
    x.N = static_cast<int64_t>(corpus.size()), x.S = static_cast<int64_t>(sets.size());
    x.L = m.config.n_layers, x.H = m.config.n_heads;
    const float nan = std::nanf("");
    x.loss.assign(static_cast<size_t>(x.N), nan);
    x.masked_loss.assign(static_cast<size_t>(x.S * x.N), nan), x.score.assign(static_cast<size_t>(x.S * x.N), nan);
    x.n_tokens.assign(static_cast<size_t>(x.N), 0), x.done.assign(static_cast<size_t>(x.N), 0);
    int64_t n_trunc = 0;
    for (const auto& c : corpus) {
        x.line.push_back(c.line);
        x.truncated.push_back(c.truncated ? 1 : 0);
        x.preview.push_back(c.preview);
        n_trunc += c.truncated;
    }
    x.masks.assign(static_cast<size_t>(x.S * x.L * x.H), 0);
    std::vector<std::string> names;
    for (int64_t s = 0; s < x.S; ++s) {
        names.push_back(format_heads(sets[static_cast<size_t>(s)]));
        for (auto [l, h] : sets[static_cast<size_t>(s)]) x.masks[static_cast<size_t>((s * x.L + l) * x.H + h)] = 1;
    }
    x.attrs = {{"corpus", o.corpus},
               {"corpus_sha256", sha256_file(o.corpus)},
               {"heads", names},
               {"random_controls", static_cast<int64_t>(x.S - 1)},
               {"control_seed", o.seed},
               {"loss_tokens", o.loss_tokens},
               {"max_tokens", o.max_tokens},
               {"n_truncated", n_trunc},
               {"select_fraction", o.select_fraction},
               {"max_rows", o.max_rows},
               {"chunk", o.chunk}};
    for (const auto& [k, v] : schema::influence_descriptions(o.loss_tokens == "last")) x.attrs[k] = v;
    return x;
}

// The ranking by set 0's score over the done samples (highest first; NaN, then samples not done,
// last; ties keep corpus order) and the selected top fraction of the done samples.
static void rank_and_select(schema::InfluenceRecord& x, double fraction) {
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
    int64_t n_done = 0;
    for (auto d : x.done) n_done += d;
    const auto n_sel = static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n_done) - 1e-9));
    x.selected.assign(static_cast<size_t>(x.N), 0);
    for (int64_t k = 0; k < n_sel; ++k) x.selected[static_cast<size_t>(x.rank[static_cast<size_t>(k)])] = 1;
    x.attrs["n_selected"] = n_sel;
    x.attrs["n_done"] = n_done;
}

// Sample i's values from another record of the same corpus and sets.
static void copy_sample(schema::InfluenceRecord& x, const schema::InfluenceRecord& from, int64_t i) {
    const auto k = static_cast<size_t>(i);
    x.loss[k] = from.loss[k], x.n_tokens[k] = from.n_tokens[k], x.done[k] = 1;
    for (int64_t s = 0; s < x.S; ++s) {
        const auto j = static_cast<size_t>(s * x.N + i);
        x.masked_loss[j] = from.masked_loss[j], x.score[j] = from.score[j];
    }
}

// What makes two files one run's (a shard and its resume, the shards of a merge): the model, the
// attributes that define the work and, on resume, the shard. "" when they agree, else what differs
// ("NAME: A vs B", values cut to 60 characters), the work before the shard before the model.
static std::string run_difference(const std::string& stored_sha256, const Attrs& stored, const std::string& stored_shard,
                                  const std::string& sha256, const Attrs& now, const std::string& shard) {
    const jobs::Identity id{sha256, now, {"corpus_sha256", "heads", "control_seed", "loss_tokens", "max_tokens", "chunk", "max_rows"},
                            {}, shard};
    const auto d = compare_parts(stored_sha256, stored, stored_shard, id);
    if (d.params) return fmt::format("{}: {} vs {}", d.params.key, d.params.was.substr(0, 60), d.params.now.substr(0, 60));
    if (d.shard) return d.shard.str();
    if (d.model) return d.model.str();
    return "";
}

static void print_influence(const schema::InfluenceRecord& x, const std::vector<std::string>& names, int64_t show) {
    auto mean = [&](int64_t s) {
        double a = 0;
        int64_t n = 0;
        for (int64_t i = 0; i < x.N; ++i) {
            const float v = x.score[static_cast<size_t>(s * x.N + i)];
            if (!std::isnan(v)) a += v, ++n;
        }
        return n ? a / static_cast<double>(n) : std::nan("");
    };
    double loss = 0;
    for (float v : x.loss) loss += v;
    std::printf("%lld samples, mean loss %.4f\n", static_cast<long long>(x.N), loss / static_cast<double>(x.N));
    std::printf("heads    %-24s mean score %+.4f\n", names[0].c_str(), mean(0));
    for (int64_t s = 1; s < x.S; ++s) std::printf("control  %-24s mean score %+.4f\n", names[static_cast<size_t>(s)].c_str(), mean(s));
    auto row = [&](const char* what, int64_t k) {
        const int64_t i = x.rank[static_cast<size_t>(k)];
        std::printf("%s %4lld  line %-5lld score %+.4f  \"%s\"\n", what, static_cast<long long>(k + 1),
                    static_cast<long long>(x.line[static_cast<size_t>(i)]), x.score[static_cast<size_t>(i)],
                    x.preview[static_cast<size_t>(i)].substr(0, 48).c_str());
    };
    for (int64_t k = 0; k < std::min(show, x.N); ++k) row("top   ", k);
    for (int64_t k = std::max<int64_t>(std::min(show, x.N), x.N - show); k < x.N; ++k) row("bottom", k);
}

// Work item k: samples [k * chunk, k * chunk + its size) of n.
static int64_t chunk_size(int64_t n, int64_t k, int64_t chunk) { return std::min(n, (k + 1) * chunk) - k * chunk; }

// A resumed file's record, refused when it is another run's (corpus, heads, settings, shard, model).
static std::optional<schema::InfluenceRecord> resumable(const InfluenceCliOptions& o, const schema::InfluenceRecord& fresh,
                                                        const Shard& sh, const Model& m) {
    if (!o.resume || !file_exists(o.out.out)) return std::nullopt;
    ResultReader r(o.out.out);
    auto prev = schema::read_influence(r);
    std::string d = run_difference(schema::attr_text(r, schema::meta(), "weights_sha256"), prev.attrs,
                                   schema::attr_text(r, schema::influence(), "shard"), m.weights_sha256(), fresh.attrs, sh.str());
    if (d.empty() && (prev.N != fresh.N || prev.S != fresh.S)) d = fmt::format("{} samples x {} sets vs {} x {}", prev.N, prev.S, fresh.N, fresh.S);
    if (!d.empty()) throw StorageError(fmt::format("{}: --resume: another run's file ({}); give another --out or leave out --resume", o.out.out, d));
    return prev;
}

void run_influence(InfluenceCliOptions o) {
    const WriteMode mode = write_mode(o.out);
    const Shard sh = o.shard.empty() ? Shard{} : parse_shard(o.shard);
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    if (o.max_tokens == 0) o.max_tokens = m.config.max_seq_len;
    if (o.max_tokens > m.config.max_seq_len)
        throw UsageError(fmt::format("--max-tokens: {} is over the model's context of {}", o.max_tokens, m.config.max_seq_len));
    auto [heads, source] = chosen_heads(o, L, H);
    const auto corpus = read_corpus(o.corpus, l.tokenizer.get(), m.config.vocab_size, o.max_tokens);
    std::vector<std::vector<Head>> sets{heads};
    int64_t possible = 0;
    if (o.random_controls > 0)
        for (auto& s : with_flag("--random-controls", [&] {
                 return random_head_sets(L, H, heads, o.random_controls, static_cast<uint64_t>(o.seed), &possible);
             }))
            sets.push_back(s);
    auto x = empty_record(o, m, corpus, sets);
    x.attrs["heads_source"] = source;
    x.attrs["distinct_controls_possible"] = possible;
    x.attrs["shard"] = sh.str(), x.attrs["shard_index"] = sh.index, x.attrs["shard_count"] = sh.count;
    const auto prev = resumable(o, x, sh, m);
    const int64_t n_chunks = (x.N + o.chunk - 1) / o.chunk;
    int64_t owned = 0, forwards = 0;
    for (int64_t k = 0; k < n_chunks; ++k) owned += sh.owns(k) ? chunk_size(x.N, k, o.chunk) : 0;
    log_info("{} samples from {} ({} in {} chunk(s) of {} for shard {}); heads {} ({}) and {} random control set(s)", corpus.size(),
             o.corpus, owned, n_chunks, o.chunk, sh.str(), format_heads(heads), source, sets.size() - 1);
    bool first_write = true;
    auto write = [&](bool complete) {
        rank_and_select(x, o.select_fraction);
        x.attrs["complete"] = int64_t(complete);
        x.attrs["forwards"] = forwards;
        ResultWriter w(o.out.out, first_write && !prev ? mode : WriteMode::kAppend);
        if (w.exists(schema::meta())) check_same_model(w, m);
        write_meta(w, m, o.seed);
        schema::write_influence(w, x);
        w.commit();
        first_write = false;
    };
    Progress bar("influence (samples)", owned);
    int64_t ticked = 0;
    // Work item k is chunk k; one the resumed file holds whole is copied, not run. The checkpoint's
    // timer is consulted after every owned chunk, copied or run, as it always was.
    jobs::Checkpoint checkpoint(o.checkpoint_seconds, [&] { write(false); });
    auto done = [&](int64_t k) {
        const int64_t a = k * o.chunk, n = chunk_size(x.N, k, o.chunk);
        bool all = prev.has_value();
        for (int64_t i = a; all && i < a + n; ++i) all = prev->done[static_cast<size_t>(i)] != 0;
        return all;
    };
    auto copied = [&](int64_t k) {
        const int64_t a = k * o.chunk, n = chunk_size(x.N, k, o.chunk);
        for (int64_t i = a; i < a + n; ++i) copy_sample(x, *prev, i);
        bar.update(ticked += n);
        checkpoint.item_finished();
    };
    jobs::run_items(sh, n_chunks, done, [&](int64_t k) {
        const int64_t a = k * o.chunk, n = chunk_size(x.N, k, o.chunk);
        const std::vector<CorpusSample> samples(corpus.begin() + a, corpus.begin() + a + n);
        const auto r = attention_influence(m, samples, sets, {o.max_rows, o.loss_tokens == "last"});
        forwards += r.forwards;
        const auto loss = host_floats(r.loss), masked = host_floats(r.masked_loss), score = host_floats(r.score);
        for (int64_t j = 0; j < n; ++j) {
            const auto i = static_cast<size_t>(a + j);
            x.loss[i] = loss[static_cast<size_t>(j)], x.n_tokens[i] = r.n_tokens[static_cast<size_t>(j)], x.done[i] = 1;
            for (int64_t s = 0; s < x.S; ++s) {
                x.masked_loss[static_cast<size_t>(s * x.N) + i] = masked[static_cast<size_t>(s * n + j)];
                x.score[static_cast<size_t>(s * x.N) + i] = score[static_cast<size_t>(s * n + j)];
            }
        }
        bar.update(ticked += n);
    }, copied, &checkpoint);
    bar.finish();
    write(true);
    std::vector<std::string> names;
    for (const auto& s : sets) names.push_back(format_heads(s));
    print_influence(x, names, o.show);
    log_info("wrote {} ({} forwards)", o.out.out, forwards);
}

void merge_influence(const MergeArgs& o, const std::vector<std::unique_ptr<ResultReader>>& rs) {
    const ResultReader& first = *rs.front();
    auto all = schema::read_influence(first);
    std::fill(all.done.begin(), all.done.end(), 0);
    std::vector<bool> seen;
    for (const auto& r : rs) {
        const auto x = schema::read_influence(*r);
        std::string d = run_difference(schema::attr_text(first, schema::meta(), "weights_sha256"), all.attrs, "",
                                       schema::attr_text(*r, schema::meta(), "weights_sha256"), x.attrs, "");
        if (d.empty() && (x.N != all.N || x.S != all.S)) d = fmt::format("{} samples x {} sets vs {} x {}", x.N, x.S, all.N, all.S);
        if (!d.empty()) throw StorageError(fmt::format("{}: a shard of another influence run than {} ({}); refusing to merge", r->path(), first.path(), d));
        const auto idx = parse_int64(schema::attr_text(*r, schema::influence(), "shard_index"));
        const auto cnt = parse_int64(schema::attr_text(*r, schema::influence(), "shard_count"));
        if (!idx || !cnt || schema::attr_text(*r, schema::influence(), "shard") == "merged")
            throw StorageError(fmt::format("{}: not a shard (merged already, or no shard_index); refusing to merge", r->path()));
        if (seen.empty()) seen.assign(static_cast<size_t>(*cnt), false);
        if (static_cast<int64_t>(seen.size()) != *cnt)
            throw StorageError(fmt::format("{}: a shard of {}, {} of {}; refusing to merge", r->path(), *cnt, first.path(), seen.size()));
        if (seen[static_cast<size_t>(*idx)]) throw StorageError(fmt::format("{}: shard {}/{} given twice; refusing to merge", r->path(), *idx, *cnt));
        seen[static_cast<size_t>(*idx)] = true;
        if (!o.partial && schema::attr_text(*r, schema::influence(), "complete") != "1")
            throw StorageError(fmt::format("{}: shard {}/{} is incomplete; rerun it with --resume, or merge with --partial", r->path(), *idx, *cnt));
        for (int64_t i = 0; i < all.N; ++i)
            if (x.done[static_cast<size_t>(i)] && !all.done[static_cast<size_t>(i)]) copy_sample(all, x, i);
    }
    int64_t left = 0;
    for (auto d : all.done) left += !d;
    if (left && !o.partial)
        throw StorageError(fmt::format("{}: {} samples are in none of the shards (give every shard, or --partial); refusing to merge", first.path(), left));
    const auto fraction = parse_double(schema::attr_text(first, schema::influence(), "select_fraction"));
    if (!fraction) throw StorageError(fmt::format("{}: /influence has no select_fraction; damaged file", first.path()));
    rank_and_select(all, *fraction);
    for (const auto& [k, v] : merged_attrs(o.inputs, left == 0)) all.attrs[k] = v;
    const MergeStage stage(first.path(), o.out);
    {
        ResultWriter w(stage.path(), WriteMode::kAppend);
        schema::write_influence(w, all);
        w.commit();
    }
    rename_into_place(stage.path(), o.out);
    log_info("wrote {} (merged {} shards: {} samples)", o.out, rs.size(), all.N - left);
}

void setup_influence(CLI::App& app) {
    auto o = std::make_shared<InfluenceCliOptions>();
    auto* sub = app.add_subcommand(
        "influence", "AttentionInfluence (Hua et al. 2025): rank a JSONL corpus by the relative rise of each sample's loss\n"
                     "when the given (retrieval) heads are masked, with random head sets of the same size as controls\n"
                     "Example: headscope influence ../shared/testdata/tinystories-656k --corpus "
                     "datasets/examples/influence-corpus.jsonl --heads L1H1,L1H6 --out influence.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--corpus", o->corpus, "JSONL: {\"text\": ...} or {\"tokens\": [ids]} a line")->required();
    sub->add_option("--heads", o->heads, "the heads to mask, e.g. L1H0,L1H3")->excludes(
        sub->add_option("--from", o->from, "a score to take the heads from, FILE.h5:DATASET (with --top)"));
    sub->add_option("--top", o->top, "with --from: mask the K best-scoring heads")->check(at_least(1));
    sub->add_option("--random-controls", o->random_controls, "random head sets of the same size (distinct, other heads)")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--seed", o->seed, "seed of the control sets")->capture_default_str();
    sub->add_option("--max-tokens", o->max_tokens, "cut each sample to this many tokens (0: the model's context)")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--max-rows", o->max_rows, "rows a forward (samples x head sets)")->check(at_least(1))->capture_default_str();
    sub->add_option("--select-fraction", o->select_fraction, "the top fraction of the ranking marked selected")
        ->check(in_range(0, 1))->capture_default_str();
    sub->add_option("--loss-tokens", o->loss_tokens, "all (the paper's: every token after the first) or last (the last token alone)")
        ->check(CLI::IsMember({"all", "last"}))->capture_default_str();
    sub->add_option("--chunk", o->chunk, "samples a work item: what a shard owns and a checkpoint completes")
        ->check(at_least(1))->capture_default_str();
    sub->add_option("--shard", o->shard, "I/N: run work items k with k % N == I (or slurm, slurm/N); `headscope merge` joins them");
    sub->add_flag("--resume", o->resume, "keep the finished chunks of --out (the same run's file) and do the rest");
    sub->add_option("--checkpoint-seconds", o->checkpoint_seconds, "write --out at most this often while running")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--show", o->show, "top and bottom samples printed")->check(at_least(0))->capture_default_str();
    sub->callback([o] { run_influence(*o); });
}

}  // namespace hs::cli
