// headscope influence: AttentionInfluence (Hua et al. 2025) - rank a corpus by how much the model's
// loss on each sample rises when its retrieval heads are masked, with random head sets as controls.
// Method: probes/ablation/influence.h, docs/methods.md ("AttentionInfluence"); the job (chunks,
// shards, resume, merge): probes/ablation/influence_study.h. This file turns the flags into its
// spec, words the refusals that name a flag, writes the file and prints the summary.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "heads.h"
#include "influence_study.h"
#include "needle_store.h"
#include "progress.h"
#include "run_state.h"
#include "schema.h"
#include "tokenizer.h"
#include "util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

namespace hs::cli {

struct InfluenceCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string corpus, heads, from;
    bool detect = false;         // set 0 from the key -> value task (influence_detect.h)
    int64_t detect_trials = 800, detect_length = 0, detect_seed = 0;
    double top_share = kInfluenceTopShare;
    int64_t top = 0, random_controls = 5, seed = 0, max_tokens = 0, max_rows = 8, show = 3;
    double select_fraction = 0.2;       // the paper's top 20% of samples (section 5.1)
    std::string select_by = "samples";  // select_by_names(): the paper's share of samples by default
    std::string masking = "zero-query"; // influence_masking_names(): the retrieval-head lineage's by default
    std::string loss_tokens = "all";
    int64_t chunk = 64;          // samples a work item (the unit a shard owns and a checkpoint completes)
    std::string shard;           // "I/N" or slurm forms (jobs.h parse_shard)
    bool resume = false;
    double checkpoint_seconds = 60;
};

// --detect: the retrieval score on the key -> value task and its top share (influence_detect.h).
static RetrievalDetection detect_heads(const InfluenceCliOptions& o, const Loaded& l, KeyValueTask& task) {
    const Model& m = *l.model;
    if (!l.tokenizer) throw ConfigError(fmt::format("{}: --detect needs the model's tokenizer to write its key -> value trials", o.model.model));
    task.samples = o.detect_trials, task.seed = static_cast<uint64_t>(o.detect_seed);
    task.length = o.detect_length ? o.detect_length : std::min<int64_t>(4096, m.config.max_seq_len);
    if (task.length > m.config.max_seq_len)
        throw UsageError(fmt::format("--detect-length: {} is over the model's context of {}", task.length, m.config.max_seq_len));
    return with_flag("--detect", [&] { return detect_retrieval_heads(m, *l.tokenizer, task, o.top_share); });
}

static void print_detection(const RetrievalDetection& d, double share, int L, int H) {
    std::printf("detected %s: the top %g of %d heads (%lld) by the retrieval score on %lld key -> value trials (%s, prompts of "
                "up to %lld tokens, %lld-%lld pairs; %lld passed)\n",
                format_heads(d.heads).c_str(), share, L * H, static_cast<long long>(d.heads.size()), static_cast<long long>(d.trials),
                key_value_format_name(d.format), static_cast<long long>(d.max_prompt), static_cast<long long>(d.min_pairs),
                static_cast<long long>(d.max_pairs), static_cast<long long>(d.passed));
    const auto order = rank_heads(d.score);
    std::printf("retrieval score:");
    for (size_t k = 0; k < std::min<size_t>(order.size(), std::max<size_t>(d.heads.size() + 3, 5)); ++k) {
        const int l = static_cast<int>(order[k] / H), h = static_cast<int>(order[k] % H);
        std::printf(" %s %.3f", format_head(l, h).c_str(), d.score[l][h].item<double>());
    }
    std::printf("\n");
}

// Set 0 (the named heads) and where it came from.
static std::pair<std::vector<Head>, std::string> chosen_heads(const InfluenceCliOptions& o, int L, int H) {
    if (!o.heads.empty()) return {with_flag("--heads", [&] { return parse_head_list(o.heads, L, H); }), "--heads " + o.heads};
    if (o.from.empty() || o.top < 1) throw UsageError("give --detect, --heads, or --from FILE.h5:DATASET with --top K");
    if (o.top > static_cast<int64_t>(L) * H) throw UsageError(fmt::format("--top: {} is more than the model's {} heads", o.top, L * H));
    auto score = with_flag("--from", [&] { return read_head_score(split_head_score_ref(o.from), L, H); });
    return {top_heads(score, o.top), fmt::format("top {} of {}", o.top, o.from)};
}

static void print_influence(const schema::InfluenceRecord& x, const std::vector<std::string>& names, int64_t show,
                            const InfluenceStudySpec& spec) {
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
    std::printf("%lld samples, mean loss %.4f; heads masked by %s\n", static_cast<long long>(x.N), loss / static_cast<double>(x.N),
                intervention_name(spec.masking));
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
    int64_t n_sel = 0, tok_sel = 0, tok_done = 0, n_done = 0;
    for (int64_t i = 0; i < x.N; ++i) {
        const auto k = static_cast<size_t>(i);
        if (x.done[k]) ++n_done, tok_done += x.length[k];
        if (x.selected[k]) ++n_sel, tok_sel += x.length[k];
    }
    std::printf("selected %lld of %lld samples, %lld of %lld tokens (the top %g by %s)\n", static_cast<long long>(n_sel),
                static_cast<long long>(n_done), static_cast<long long>(tok_sel), static_cast<long long>(tok_done), spec.select_fraction,
                name_in(select_by_names(), spec.select_by));
}

// The spec from the flags (the heads and their controls chosen, the corpus read).
static InfluenceStudySpec influence_spec(InfluenceCliOptions& o, const Loaded& l, const Shard& sh) {
    const Model& m = *l.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    if (o.max_tokens == 0) o.max_tokens = m.config.max_seq_len;
    if (o.max_tokens > m.config.max_seq_len)
        throw UsageError(fmt::format("--max-tokens: {} is over the model's context of {}", o.max_tokens, m.config.max_seq_len));
    InfluenceStudySpec s;
    s.masking = with_flag("--masking", [&] { return parse_name(influence_masking_names(), o.masking, ""); });
    s.select_by = with_flag("--select-by", [&] { return parse_name(select_by_names(), o.select_by, ""); });
    if (!(o.top_share > 0 && o.top_share <= 1)) throw UsageError(fmt::format("--top-share: {} is not in (0, 1]", o.top_share));
    // The corpus first: a bad corpus is refused before --detect decodes its trials (800 of up to 4096
    // tokens: hours on a CPU), not after.
    s.corpus_path = o.corpus;
    s.corpus = read_corpus(o.corpus, l.tokenizer.get(), m.config.vocab_size, o.max_tokens);
    std::vector<Head> heads;
    std::string source;
    if (o.detect) {
        s.top_share = o.top_share;
        s.detection = detect_heads(o, l, s.detect_task);
        heads = s.detection->heads;
        source = fmt::format("--detect: the top {} of the heads by the retrieval score on {} key -> value trials", o.top_share,
                             s.detection->trials);
        print_detection(*s.detection, o.top_share, L, H);
    } else {
        std::tie(heads, source) = chosen_heads(o, L, H);
    }
    s.sets = {heads};
    if (o.random_controls > 0)
        for (auto& set : with_flag("--random-controls", [&] {
                 return random_head_sets(L, H, heads, o.random_controls, static_cast<uint64_t>(o.seed), &s.distinct_controls_possible);
             }))
            s.sets.push_back(set);
    s.heads_source = source;
    s.control_seed = o.seed, s.max_tokens = o.max_tokens, s.max_rows = o.max_rows, s.last_only = o.loss_tokens == "last";
    s.chunk = o.chunk, s.select_fraction = o.select_fraction, s.shard = sh;
    return s;
}

void run_influence(InfluenceCliOptions o) {
    const WriteMode mode = write_mode(o.out);
    const Shard sh = o.shard.empty() ? Shard{} : parse_shard(o.shard);
    auto l = open_model(o.model, false);
    const Model& m = *l.model;
    InfluenceStudy study(influence_spec(o, l, sh), m);
    const auto& spec = study.spec();
    // A resumed file is refused when it is another run's (corpus, heads, settings, shard, model).
    const bool resumed = o.resume && file_exists(o.out.out);
    if (resumed) {
        ResultReader r(o.out.out);
        const std::string d = study.difference(r);
        if (!d.empty()) throw StorageError(fmt::format("{}: --resume: another run's file ({}); give another --out or leave out --resume", o.out.out, d));
        study.resume(r);
    }
    log_info("{} samples from {} ({} in {} chunk(s) of {} for shard {}); heads {} ({}) and {} random control set(s)", spec.corpus.size(),
             o.corpus, study.owned_samples(), study.n_chunks(), o.chunk, sh.str(), format_heads(spec.sets[0]), spec.heads_source,
             spec.sets.size() - 1);
    bool first_write = true;
    auto write = [&] {
        const auto& x = study.record();
        ResultWriter w(o.out.out, first_write && !resumed ? mode : WriteMode::kAppend);
        if (w.exists(schema::meta())) check_same_model(w, m);
        write_meta(w, m, o.seed);
        schema::write_influence(w, x);
        w.commit();
        first_write = false;
    };
    jobs::Checkpoint checkpoint(o.checkpoint_seconds, write);
    const int64_t forwards = study.run(checkpoint);
    write();
    std::vector<std::string> names;
    for (const auto& s : spec.sets) names.push_back(format_heads(s));
    print_influence(study.record(), names, o.show, spec);
    log_info("wrote {} ({} forwards)", o.out.out, forwards);
}

// The shards joined by the library (InfluenceMerge); the refusals that name a flag are the command's.
void merge_influence(const MergeArgs& o, const std::vector<std::unique_ptr<ResultReader>>& rs) {
    const ResultReader& first = *rs.front();
    InfluenceMerge join(first);
    for (const auto& r : rs) {
        const auto sh = join.add(*r);
        if (!o.partial && !sh.complete)
            throw StorageError(fmt::format("{}: shard {}/{} is incomplete; rerun it with --resume, or merge with --partial", r->path(),
                                           *sh.index, *sh.count));
    }
    const int64_t left = join.missing();
    if (left && !o.partial)
        throw StorageError(fmt::format("{}: {} samples are in none of the shards (give every shard, or --partial); refusing to merge", first.path(), left));
    const auto all = join.record(o.inputs);
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
                     "when the given (retrieval) heads are masked, with random head sets of the same size as controls,\n"
                     "and select the top share of it (by default 0.2 of the samples, heads masked by a zeroed query)\n"
                     "Example: headscope influence ../shared/testdata/tinystories-656k --corpus "
                     "datasets/examples/influence-corpus.jsonl --heads L1H1,L1H6 --out influence.h5\n"
                     "Example: headscope influence models/toy-recall --corpus datasets/examples/toy-recall-influence.jsonl "
                     "--heads L1H0,L1H1,L1H2 --loss-tokens last --masking zero --select-by samples --select-fraction 0.5 "
                     "--out influence-zero.h5\n"
                     "Example: headscope influence models/toy-recall --corpus datasets/examples/toy-recall-influence.jsonl "
                     "--detect --detect-trials 200 --top-share 0.375 --loss-tokens last --select-fraction 0.5 --out influence-detect.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--corpus", o->corpus, "JSONL: {\"text\": ...} or {\"tokens\": [ids]} a line")->required();
    auto* detect = sub->add_flag("--detect", o->detect,
                                 "detect the heads as the paper does: Wu et al.'s retrieval score on a synthetic key -> value\n"
                                 "retrieval task (a JSON object of random 32-character keys, 3 demonstrations, the query key;\n"
                                 "the toy recall task on the toy vocabulary), then mask its top --top-share");
    auto* heads = sub->add_option("--heads", o->heads, "the heads to mask, e.g. L1H0,L1H3");
    auto* from = sub->add_option("--from", o->from, "a score to take the heads from, FILE.h5:DATASET (with --top), e.g. a retrieval\n"
                                                    "scan's scan.h5:scores/retrieval/score");
    heads->excludes(from);
    detect->excludes(heads)->excludes(from);
    sub->add_option("--top", o->top, "with --from: mask the K best-scoring heads")->check(at_least(1))->excludes(detect);
    auto* top_share = sub->add_option("--top-share", o->top_share, "with --detect: the share of the model's heads masked, in (0, 1]: ceil(share x\n"
                                                 "heads) (the paper's top 5%)")
        ->capture_default_str();
    auto* trials = sub->add_option("--detect-trials", o->detect_trials, "with --detect: key -> value trials (the paper's 800)")
        ->check(at_least(1))->capture_default_str();
    auto* length = sub->add_option("--detect-length", o->detect_length, "with --detect: tokens a trial's prompt and answer may take (0: the\n"
                                                         "paper's 4096, or the model's context when shorter)")
        ->check(at_least(0))->capture_default_str();
    auto* seed = sub->add_option("--detect-seed", o->detect_seed, "with --detect: seed of the trials' keys, values and order")->capture_default_str();
    sub->add_option("--random-controls", o->random_controls, "random head sets of the same size (distinct, other heads)")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--seed", o->seed, "seed of the control sets")->capture_default_str();
    sub->add_option("--max-tokens", o->max_tokens, "cut each sample to this many tokens (0: the model's context)")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--max-rows", o->max_rows, "rows a forward (samples x head sets)")->check(at_least(1))->capture_default_str();
    sub->add_option("--masking", o->masking,
                    "how a head is masked: zero-query (its query zeroed: pre-softmax scores 0, uniform attention over the\n"
                    "causal prefix, as the retrieval-head code (HeadKV's modeling_llama.py) masks) or zero (its output z = 0)")
        ->capture_default_str();
    sub->add_option("--select-fraction", o->select_fraction, "the top share of the ranking marked selected, counted as --select-by says")
        ->check(in_range(0, 1))->capture_default_str();
    sub->add_option("--select-by", o->select_by,
                    "what --select-fraction counts: samples (the paper's: \"the top 20% of samples\", section 5.1) or tokens "
                    "(each sample's\ncorpus length, whole samples in rank order until the share is reached)")
        ->capture_default_str();
    sub->add_option("--loss-tokens", o->loss_tokens, "all (the paper's: every token after the first) or last (the last token alone)")
        ->check(CLI::IsMember({"all", "last"}))->capture_default_str();
    sub->add_option("--chunk", o->chunk, "samples a work item: what a shard owns and a checkpoint completes")
        ->check(at_least(1))->capture_default_str();
    sub->add_option("--shard", o->shard, "I/N: run work items k with k % N == I (or slurm, slurm/N); `headscope merge` joins them");
    sub->add_flag("--resume", o->resume, "keep the finished chunks of --out (the same run's file) and do the rest");
    sub->add_option("--checkpoint-seconds", o->checkpoint_seconds, "write --out at most this often while running")
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--show", o->show, "top and bottom samples printed")->check(at_least(0))->capture_default_str();
    sub->callback([o, top_share, trials, length, seed] {
        // The detection's settings mean nothing without it: refused, not ignored.
        for (const auto* opt : {top_share, trials, length, seed})
            if (opt->count() && !o->detect) throw UsageError(fmt::format("{} needs --detect", opt->get_name()));
        run_influence(*o);
    });
}

}  // namespace hs::cli
