// headscope fv-heads: function-vector heads (Todd et al. 2024), every head's average indirect effect
// (probes/ablation/function_vectors.h; methods: docs/methods.md "Function-vector heads"; names:
// docs/hdf5-schema.md "Patching").
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "function_vectors.h"
#include "heads.h"
#include "progress.h"
#include "score_records.h"

#include <torch/torch.h>

#include <cstdio>

namespace hs::cli {

struct FvCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::vector<std::string> tasks;
    std::string name;
    FvOptions fv;
    bool no_space = false;
    int top = 10;
};

static void print_top(const at::Tensor& aie, const at::Tensor& patched, int k) {
    const int64_t H = aie.size(1);
    auto flat = aie.to(torch::kDouble).contiguous().view(-1);
    auto order = std::get<1>(torch::sort(torch::nan_to_num(flat, -1e300), /*stable=*/true, 0, /*descending=*/true));
    auto pf = patched.to(torch::kDouble).contiguous().view(-1);
    std::printf("%-5s %-8s %-10s %s\n", "rank", "head", "AIE", "p(answer) patched");
    for (int64_t i = 0; i < std::min<int64_t>(k, flat.size(0)); ++i) {
        const int64_t j = order[i].item<int64_t>();
        std::printf("%-5lld %-8s %+.6f  %.6f\n", static_cast<long long>(i + 1),
                    format_head(static_cast<int>(j / H), static_cast<int>(j % H)).c_str(), flat[j].item<double>(),
                    pf[j].item<double>());
    }
}

// The group of task i of n: <name>, or <name>-<file stem> when several.
static std::string task_group(const std::string& name, const std::string& path, size_t n) {
    if (n == 1) return name;
    std::string stem = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) stem.resize(stem.size() - 5);
    for (auto& c : stem)
        if (c == ' ' || c == '/') c = '_';
    return name + "-" + stem;
}

void run_fv_heads(FvCliOptions o) {
    const std::string name = o.name.empty() ? "fv" : o.name;
    if (name.find_first_of("/ ") != std::string::npos)
        throw UsageError(fmt::format("--name '{}': expected a name without '/' or spaces", name));
    o.fv.tmpl.prepend_space = !o.no_space;
    const WriteMode mode = write_mode(o.out);
    // The task files are read before the model: a bad one fails at once.
    std::vector<FvTask> tasks;
    for (const auto& t : o.tasks) tasks.push_back(read_fv_task(t));
    auto l = open_model(o.model, true);
    const Model& m = *l.model;
    std::vector<FvPrompts> prompts;
    for (size_t i = 0; i < tasks.size(); ++i) prompts.push_back(fv_prompts(tasks[i], o.tasks[i], *l.tokenizer, m.config, o.fv));
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, 0);
    std::vector<FvResult> results;
    std::vector<std::string> groups;
    for (size_t i = 0; i < tasks.size(); ++i) {
        const auto& r = results.emplace_back(function_vector_heads(m, prompts[i], o.fv));
        std::printf("task %s: %zu pairs, %d shots, %d trials; clean p(answer) %.6f (top-1 %.3f), corrupted (shuffled labels) %.6f\n",
                    o.tasks[i].c_str(), tasks[i].size(), o.fv.n_shots, o.fv.n_trials, r.p_clean, r.top1_clean, r.p_corrupt);
        if (tasks.size() == 1) print_top(r.aie, r.patched, o.top);
        std::printf("%lld forwards: mean activations %.2f s, patching sweep %.2f s (%.3f s a head)\n",
                    static_cast<long long>(r.forwards), r.seconds_mean, r.seconds_sweep,
                    r.seconds_sweep / static_cast<double>(r.aie.numel()));
        groups.push_back(task_group(name, o.tasks[i], tasks.size()));
        write_fv_heads_result(w, groups.back(), o.tasks[i], o.fv, prompts[i], r);
    }
    if (tasks.size() > 1) {  // Todd et al. pick heads by the AIE averaged over tasks
        const auto mean = fv_heads_mean(results);
        std::printf("the AIE averaged over the %zu tasks (/patching/%s):\n", tasks.size(), name.c_str());
        print_top(mean.aie, mean.patched, o.top);
        write_fv_heads_mean_result(w, name, o.tasks, groups, mean);
    }
    w.commit();
    log_info("wrote {} ({})", o.out.out, schema::patching(name));
}

// A template part as the shell gives it: "\n" written as backslash-n becomes a newline.
static std::string unescape(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == 'n' || s[i + 1] == 't' || s[i + 1] == '\\')) {
            out += s[i + 1] == 'n' ? '\n' : s[i + 1] == 't' ? '\t' : '\\';
            ++i;
        } else {
            out += s[i];
        }
    }
    return out;
}

void setup_fv_heads(CLI::App& app) {
    auto o = std::make_shared<FvCliOptions>();
    auto* sub = app.add_subcommand(
        "fv-heads",
        "function-vector heads (Todd et al. 2024): each head's mean z at the last token over clean few-shot\n"
        "prompts of a word-pair task, put at the last token of prompts with shuffled labels; the average\n"
        "indirect effect (AIE) is the rise of p(answer) (its first token), averaged over those prompts.\n"
        "Prompts: \"Q: x\\nA: y\\n\\n\" per shot, then \"Q: x\\nA:\" (the reference's template). Task: a JSON\n"
        "list of {\"input\", \"output\"} (datasets/fv/). Writes /patching/<name>/{scores (AIE [L, H]), patched,\n"
        "metric_clean, metric_corrupt} and the prompts' tokens.\n"
        "Example: headscope fv-heads ../shared/testdata/tinystories-656k --task datasets/fv/lowercase-uppercase.json "
        "--shots 5 --trials 8 --out fv.h5\n"
        "The toy (train-toy --task icl) asks with its own template: --shots 6 --trials 16 --input-prefix '' "
        "--output-prefix '' --input-sep '' --output-sep '' --no-space.");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--task", o->tasks, "JSON word-pair task: [{\"input\": ..., \"output\": ...}, ...]; several: each in "
                                        "/patching/<name>-<file stem>, their mean AIE in /patching/<name>")->required();
    sub->add_option("--shots", o->fv.n_shots, "demonstrations a prompt (the reference's n_shots)")
        ->check(at_least(1))->capture_default_str();
    sub->add_option("--trials", o->fv.n_trials, "clean prompts for the mean and corrupted prompts for the AIE (n_trials)")
        ->check(at_least(1))->capture_default_str();
    sub->add_option("--seed", o->fv.seed, "the prompts' draw")->capture_default_str();
    sub->add_option("--test-split", o->fv.test_split, "the share of pairs kept for queries")
        ->check(in_range(0.01, 0.99))->capture_default_str();
    auto esc = [](std::string& target) { return [&target](const std::string& v) { target = unescape(v); }; };
    sub->add_option_function<std::string>("--input-prefix", esc(o->fv.tmpl.input_prefix), "before each input (default Q:)");
    sub->add_option_function<std::string>("--output-prefix", esc(o->fv.tmpl.output_prefix), "before each output (default A:)");
    sub->add_option_function<std::string>("--input-sep", esc(o->fv.tmpl.input_sep), "after each input (default \\n)");
    sub->add_option_function<std::string>("--output-sep", esc(o->fv.tmpl.output_sep), "after each output (default \\n\\n)");
    sub->add_flag("--no-space", o->no_space, "no space before inputs and outputs (the reference's prepend_space=False)");
    sub->add_option("--name", o->name, "the group /patching/<name> (default fv; several tasks: the mean's)");
    sub->add_option("--batch-rows", o->fv.max_rows, "rows per forward (heads x prompts)")->check(at_least(1))->capture_default_str();
    sub->add_option("--top", o->top, "print this many best heads")->check(at_least(0))->capture_default_str();
    sub->callback([o] { run_fv_heads(*o); });
}

}  // namespace hs::cli
