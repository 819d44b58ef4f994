// headscope successor: the succession score of every head from weights (Gould et al. 2023).
// Method: probes/weights/successor.h, docs/methods-weights.md ("Successor heads").
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "heads.h"
#include "progress.h"
#include "schema.h"
#include "successor.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

namespace hs::cli {

struct SuccessorCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string tasks;  // empty: the paper's tasks
    std::string embedding = "mlp0";
    bool print_tasks = false;
    int top = 5;
};

template <class T>
static std::vector<int32_t> ints(const std::vector<T>& v) { return {v.begin(), v.end()}; }

static std::vector<int64_t> longs(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kLong).contiguous();
    return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Tokenizes every task, says what each keeps, and returns them (skipped ones with no ids).
static std::vector<TokenizedTask> tokenize_tasks(const std::vector<SuccessorTask>& tasks, const Tokenizer& tok,
                                                 const std::string& source) {
    std::vector<TokenizedTask> out;
    for (const auto& t : tasks) {
        out.push_back(tokenize_task(t, tok));
        const auto& k = out.back();
        if (k.ids.empty())
            log_warn(fmt::format("task '{}': {} of {} words are single tokens: skipped", t.name, k.n_single, t.words.size()));
        else
            log_info("task '{}': {} words, one token each ({} form)", t.name, t.words.size(), k.form);
    }
    if (std::none_of(out.begin(), out.end(), [](const TokenizedTask& k) { return !k.ids.empty(); }))
        throw DataError(fmt::format("{}: no task's words are all single tokens in this model's vocabulary; nothing to "
                                    "score", source));
    return out;
}

static void write_successor(ResultWriter& w, const Model& m, const std::vector<TokenizedTask>& tasks,
                            const SuccessorScores& s, SuccessorEmbedding e, const std::string& source) {
    const int64_t L = m.config.n_layers, H = m.config.n_heads, N = static_cast<int64_t>(s.source.size());
    std::vector<std::string> used, skipped, names, forms;
    std::vector<int64_t> n_words, n_single;
    for (const auto& t : tasks) {
        (t.ids.empty() ? skipped : used).push_back(t.task.name);
        names.push_back(t.task.name);
        forms.push_back(t.ids.empty() ? "skipped" : t.form);
        n_words.push_back(static_cast<int64_t>(t.task.words.size()));
        n_single.push_back(t.n_single);
    }
    const auto T = static_cast<int64_t>(used.size());
    Attrs a{{"probe", std::string("successor")},
            {"tasks_source", source},
            {"tasks", used},
            {"skipped_tasks", skipped},
            {"all_tasks", names},
            {"task_form", forms},
            {"task_words", n_words},
            {"task_single_tokens", n_single},
            {"embedding", std::string(successor_embedding_name(e))},
            {"source_representation", successor_embedding_description(e)},
            {"n_scored", N}};
    Attrs sa = a;
    sa["description"] = std::string("fraction of scored tokens (every task word but the last) whose successor has the "
                                    "largest logit of e(t) W_V W_O W_U^T among its task's tokens (ties count against)");
    schema::ScoreGroup g{"successor", a, {}};
    g.datasets.push_back({"score", {{L, H}, host_floats(s.score), sa}});
    sa["description"] = std::string("the same fraction per task (the tasks attribute's order)");
    g.datasets.push_back({"task_score", {{T, L, H}, host_floats(s.task_score), sa}});
    g.datasets.push_back({"successor_rank", {{L, H, N}, longs(s.rank), {}}});
    g.datasets.push_back({"predicted", {{L, H, N}, ints(longs(s.predicted)), {}}});
    g.datasets.push_back({"source_tokens", {{N}, ints(s.source), {}}});
    g.datasets.push_back({"target_tokens", {{N}, ints(s.target), {}}});
    g.datasets.push_back({"task_index", {{N}, ints(s.task), {}}});
    schema::write_scores(w, g);
}

static void print_successor(const Model& m, const std::vector<TokenizedTask>& tasks, const SuccessorScores& s, int top) {
    const int64_t H = m.config.n_heads;
    auto flat = s.score.reshape(-1);
    const auto order = rank_heads(s.score);  // best first, ties in (layer, head) order
    std::vector<std::string> used;
    for (const auto& t : tasks)
        if (!t.ids.empty()) used.push_back(t.task.name);
    std::printf("successor score (%lld tokens in %zu tasks); top heads:\n", static_cast<long long>(s.source.size()), used.size());
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
}

void run_successor(const SuccessorCliOptions& o) {
    const auto e = parse_successor_embedding(o.embedding);
    if (!e) throw UsageError(fmt::format("--embedding: '{}' is not mlp0, effective or raw", o.embedding));
    const auto tasks = o.tasks.empty() ? default_successor_tasks() : read_successor_tasks(o.tasks);
    if (o.print_tasks) {
        std::fputs(successor_tasks_json(tasks).c_str(), stdout);
        return;
    }
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, true);
    const Model& m = *l.model;
    const std::string source = o.tasks.empty() ? "the paper's tasks (datasets/successor_tasks.cpp)" : o.tasks;
    const auto tok_tasks = tokenize_tasks(tasks, *l.tokenizer, o.tasks.empty() ? "the default tasks" : o.tasks);
    const auto s = successor_scores(m, tok_tasks, *e);
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, 0);
    write_successor(w, m, tok_tasks, s, *e, source);
    w.commit();
    print_successor(m, tok_tasks, s, o.top);
    log_info("wrote {}", o.out.out);
}

void setup_successor(CLI::App& app) {
    auto o = std::make_shared<SuccessorCliOptions>();
    auto* sub = app.add_subcommand(
        "successor", "successor heads (Gould et al. 2023): how often each head's OV circuit maps a token of an ordinal\n"
                     "sequence (numbers, days, months, letters, ...) to its successor, from weights\n"
                     "Example: headscope successor ../shared/testdata/tinystories-656k --out successor.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, false);
    sub->add_option("--tasks", o->tasks, "JSON file of tasks {\"name\": [\"word\", ...], ...} (default: the paper's eight)");
    sub->add_flag("--print-tasks", o->print_tasks, "print the tasks (default or --tasks) as that JSON and exit");
    sub->add_option("--embedding", o->embedding, "source representation: mlp0 (the paper's), effective (W_EE), raw")
        ->capture_default_str();
    sub->add_option("--top", o->top, "heads printed")->check(at_least(0))->capture_default_str();
    sub->callback([o] {
        if (!o->print_tasks && o->out.out.empty()) throw UsageError("--out is required (unless --print-tasks)");
        run_successor(*o);
    });
}

}  // namespace hs::cli
