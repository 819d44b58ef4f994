// headscope successor: the succession score of every head from weights (Gould et al. 2023).
// Method: probes/weights/successor.h, docs/methods-weights.md ("Successor heads").
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "heads.h"
#include "progress.h"
#include "score_records.h"
#include "successor.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

namespace hs::cli {

struct SuccessorCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string tasks;  // empty: the reference's tasks
    std::string embedding = "reference";
    std::string ties = "success";
    double threshold = kSuccessorThreshold;
    bool print_tasks = false;
    int top = 5;
};

template <class T>
static std::vector<int32_t> ints(const std::vector<T>& v) { return {v.begin(), v.end()}; }

static std::vector<int64_t> longs(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kLong).contiguous();
    return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Tokenizes every task, says what each keeps (the pairs dropped for a multi-token word), and returns
// them (skipped ones with no ids).
static std::vector<TokenizedTask> tokenize_tasks(const std::vector<SuccessorTask>& tasks, const Tokenizer& tok,
                                                 const std::string& source) {
    std::vector<TokenizedTask> out;
    for (const auto& t : tasks) {
        out.push_back(tokenize_task(t, tok));
        const auto& k = out.back();
        const int64_t n = static_cast<int64_t>(t.words.size()), scored = k.scored_pairs(), pairs = k.pairs();
        if (k.ids.empty())
            log_warn(fmt::format("task '{}': {} of {} words are single tokens, no pair of two: skipped", t.name,
                                 k.n_single, n));
        else if (scored < pairs)
            log_warn(fmt::format("task '{}': {} of {} words are single tokens ({} form): {} of {} pairs skipped", t.name,
                                 k.n_single, n, k.form, pairs - scored, pairs));
        else
            log_info("task '{}': {} words, one token each ({} form)", t.name, n, k.form);
    }
    if (std::none_of(out.begin(), out.end(), [](const TokenizedTask& k) { return !k.ids.empty(); }))
        throw DataError(fmt::format("{}: no task has a pair of single-token words in this model's vocabulary; nothing "
                                    "to score", source));
    return out;
}

// The scores as the record /scores/successor stores (tasks_file "": the default tasks).
static schema::SuccessorRecord successor_record(const Model& m, const std::vector<TokenizedTask>& tasks,
                                                const SuccessorScores& s, SuccessorEmbedding e, SuccessorTies ties,
                                                double threshold, const std::string& tasks_file) {
    schema::SuccessorRecord r;
    r.L = m.config.n_layers, r.H = m.config.n_heads, r.N = static_cast<int64_t>(s.source.size());
    r.tasks_file = tasks_file;
    for (const auto& t : tasks)
        r.tasks.push_back({t.task.name, t.ids.empty() ? std::string() : t.form, static_cast<int64_t>(t.task.words.size()),
                           t.n_single, t.pairs(), t.pairs() - t.scored_pairs()});
    r.embedding = successor_embedding_name(e), r.source_representation = successor_embedding_description(e);
    r.ties = successor_ties_name(ties), r.threshold = threshold;
    r.successor_head.assign(static_cast<size_t>(r.L * r.H), 0);
    for (const auto& [l, h] : successor_heads(s.score, threshold)) {
        r.successor_heads.push_back(format_head(l, h));
        r.successor_head[static_cast<size_t>(l * r.H + h)] = 1;
    }
    r.score = host_floats(s.score), r.task_score = host_floats(s.task_score);
    r.successor_rank = longs(s.rank), r.predicted = ints(longs(s.predicted));
    r.source_tokens = ints(s.source), r.target_tokens = ints(s.target), r.task_index = ints(s.task);
    return r;
}

static void print_successor(const Model& m, const std::vector<TokenizedTask>& tasks, const SuccessorScores& s, int top,
                            double threshold) {
    const int64_t H = m.config.n_heads;
    auto flat = s.score.reshape(-1);
    const auto order = rank_heads(s.score);  // best first, ties in (layer, head) order
    std::vector<std::string> used;
    int64_t skipped = 0;
    for (const auto& t : tasks) {
        if (!t.ids.empty()) used.push_back(t.task.name);
        skipped += t.pairs() - t.scored_pairs();
    }
    std::printf("successor score (%lld pairs in %zu tasks; %lld pairs skipped for a multi-token word); top heads:\n",
                static_cast<long long>(s.source.size()), used.size(), static_cast<long long>(skipped));
    std::printf("  head    score");
    for (const auto& n : used) std::printf("  %s", n.c_str());
    std::printf("\n");
    for (int i = 0; i < std::min<int64_t>(top, flat.numel()); ++i) {
        const int64_t k = order[static_cast<size_t>(i)], l = k / H, h = k % H;
        std::printf("  %-6s  %.3f", format_head(static_cast<int>(l), static_cast<int>(h)).c_str(), flat[k].item<float>());
        for (size_t t = 0; t < used.size(); ++t)
            std::printf("  %*.3f", static_cast<int>(std::max<size_t>(5, used[t].size())), s.task_score[static_cast<int64_t>(t)][l][h].item<float>());
        std::printf("\n");
    }
    std::vector<std::string> heads;
    for (const auto& [l, h] : successor_heads(s.score, threshold))
        heads.push_back(fmt::format("{} {:.3f}", format_head(l, h), s.score[l][h].item<float>()));
    std::printf("successor heads (score > %g): %s\n", threshold,
                heads.empty() ? "none" : fmt::format("{}", fmt::join(heads, ", ")).c_str());
}

void run_successor(const SuccessorCliOptions& o) {
    const auto e = parse_successor_embedding(o.embedding);
    if (!e) throw UsageError(fmt::format("--embedding: '{}' is not reference, headscope, effective or raw", o.embedding));
    const auto ties = parse_successor_ties(o.ties);
    if (!ties) throw UsageError(fmt::format("--ties: '{}' is not success or fail", o.ties));
    const auto tasks = o.tasks.empty() ? default_successor_tasks() : read_successor_tasks(o.tasks);
    if (o.print_tasks) {
        std::fputs(successor_tasks_json(tasks).c_str(), stdout);
        return;
    }
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, true);
    const Model& m = *l.model;
    const auto tok_tasks = tokenize_tasks(tasks, *l.tokenizer, o.tasks.empty() ? "the default tasks" : o.tasks);
    const auto s = successor_scores(m, tok_tasks, *e, *ties);
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, 0);
    schema::write_successor(w, successor_record(m, tok_tasks, s, *e, *ties, o.threshold, o.tasks));
    w.commit();
    print_successor(m, tok_tasks, s, o.top, o.threshold);
    log_info("wrote {}", o.out.out);
}

void setup_successor(CLI::App& app) {
    auto o = std::make_shared<SuccessorCliOptions>();
    auto* sub = app.add_subcommand(
        "successor", "successor heads (Gould et al. 2023): how often each head's OV circuit maps a token of an ordinal\n"
                     "sequence (numbers, days, months, letters, ...) to its successor, from weights, as the public\n"
                     "reimplementation (curt-tigges/circuits-over-time test_successor_head.py) scores it: MLP0 on the\n"
                     "raw embedding for every layer, days and months wrapping, ties counted as successes, a successor\n"
                     "head above 0.4; pairs with a multi-token word are skipped and counted\n"
                     "Example: headscope successor ../shared/testdata/tinystories-656k --out successor.h5\n"
                     "headscope's former default (MLP0(norm(W_E)), raw W_E at layer 0, ties failing, no wrap: a task file):\n"
                     "Example: headscope successor ../shared/testdata/tinystories-656k --embedding headscope --ties fail --out successor-former.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, false);
    sub->add_option("--tasks", o->tasks, "JSON file of tasks {\"name\": [\"word\", ...], ...}; a last word equal to the "
                                         "first wraps around (default: the reference's eight)");
    sub->add_flag("--print-tasks", o->print_tasks, "print the tasks (default or --tasks) as that JSON and exit");
    sub->add_option("--embedding", o->embedding,
                    "source representation: reference (MLP0(W_E), no norm, every layer), headscope (MLP0(norm(W_E)), "
                    "raw W_E for layer 0), effective (W_EE), raw")
        ->capture_default_str();
    sub->add_option("--ties", o->ties, "a successor tied with the largest logit: success (the reference) or fail")
        ->capture_default_str();
    sub->add_option("--threshold", o->threshold, "a successor head scores above this (the reference's 0.4)")
        ->check(in_range(0, 1))
        ->capture_default_str();
    sub->add_option("--top", o->top, "heads printed")->check(at_least(0))->capture_default_str();
    sub->callback([o] {
        if (!o->print_tasks && o->out.out.empty()) throw UsageError("--out is required (unless --print-tasks)");
        run_successor(*o);
    });
}

}  // namespace hs::cli
