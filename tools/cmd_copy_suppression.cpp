// headscope copy-suppression: per-head OV and QK copy-suppression ranks from weights (folded and
// centred, effective embedding), and on request the dynamic score on a text file.
// Method: probes/weights/copy_suppression.h, docs/methods-weights.md.
#include "commands.h"
#include "common.h"
#include "score_records.h"
#include "copy_suppression.h"
#include "errors.h"
#include "guard.h"
#include "progress.h"
#include "util.h"

#include <torch/torch.h>

namespace hs::cli {

struct CopySuppressionCliOptions {
    ModelArgs model;
    OutputArgs out;
    int64_t block_size = 2048;
    int64_t n_tokens = 0;
    int64_t seed = 0;
    std::string text_file;
    int64_t window = 256;
    int64_t max_tokens = 4096;
    double threshold = 0.1;
};

// The text as windows of at most `window` tokens (BOS first when the tokenizer has one).
static std::vector<std::vector<int64_t>> text_windows(const CopySuppressionCliOptions& o, const Tokenizer& tok,
                                                      int64_t context) {
    auto ids = tok.encode(read_utf8_text_file(o.text_file), false, false);
    if (ids.size() < 2) throw DataError(fmt::format("{}: fewer than 2 tokens of text", o.text_file));
    if (static_cast<int64_t>(ids.size()) > o.max_tokens) ids.resize(o.max_tokens);
    const auto bos = tok.bos_id();
    const int64_t body = std::min(o.window, context) - (bos ? 1 : 0);
    if (body < 2) throw UsageError(fmt::format("--window {} is too short", o.window));
    std::vector<std::vector<int64_t>> out;
    for (size_t a = 0; a < ids.size(); a += body) {
        std::vector<int64_t> w;
        if (bos) w.push_back(*bos);
        for (size_t i = a; i < std::min(ids.size(), a + body); ++i) w.push_back(ids[i]);
        out.push_back(std::move(w));
    }
    return out;
}

static schema::RankStatsRecord rank_stats(const RankStats& s) {
    return {host_floats(s.median), host_floats(s.frac_rank0), host_floats(s.frac_lt10), host_floats(s.summary)};
}

void run_copy_suppression(const CopySuppressionCliOptions& o) {
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, !o.text_file.empty());
    const Model& m = *l.model;
    std::vector<std::vector<int64_t>> windows;
    if (!o.text_file.empty()) windows = text_windows(o, *l.tokenizer, m.config.max_seq_len);
    auto s = with_flag({{"--n-tokens", "n_tokens"}}, [&] { return copy_suppression_weights(m, {o.block_size, o.n_tokens, o.seed}); });
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, o.seed);
    schema::CopySuppressionRecord r;
    r.L = m.config.n_layers, r.H = m.config.n_heads;
    r.block_size = o.block_size, r.n_tokens = s.tokens.size(0), r.seed = o.seed;
    r.ov = rank_stats(s.ov), r.qk = rank_stats(s.qk);
    auto tk = s.tokens.to(torch::kInt).contiguous();
    r.scored_tokens.assign(tk.data_ptr<int32_t>(), tk.data_ptr<int32_t>() + tk.numel());
    if (!windows.empty()) {
        auto d = copy_suppression_dynamic(m, windows, o.threshold);
        r.text_file = o.text_file, r.threshold = o.threshold, r.n_windows = static_cast<int64_t>(windows.size());
        r.dynamic_frac_rank0 = host_floats(d.frac_rank0), r.dynamic_n_pairs = host_floats(d.n_pairs);
        r.dynamic_mean_effect = host_floats(d.mean_effect);
    }
    schema::write_copy_suppression(w, r);
    w.commit();
    log_info("wrote {} (copy suppression over {} tokens)", o.out.out, s.tokens.size(0));
}

void setup_copy_suppression(CLI::App& app) {
    auto o = std::make_shared<CopySuppressionCliOptions>();
    auto* sub = app.add_subcommand(
        "copy-suppression", "copy suppression per head: OV/QK ranks of each token from weights, optionally on text\n"
                            "Example: headscope copy-suppression ../shared/testdata/stories260K/stories260K.bin "
                            "--out cs.h5 --text-file datasets/examples/story.txt");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--block-size", o->block_size, "rows of the [V, V] circuit formed at once")->capture_default_str();
    sub->add_option("--n-tokens", o->n_tokens, "score this many random source tokens (0 = every token)")
        ->capture_default_str();
    sub->add_option("--seed", o->seed, "seed for the random tokens")->capture_default_str();
    sub->add_option("--text-file", o->text_file, "also compute the dynamic score on this text");
    sub->add_option("--window", o->window, "tokens per forward pass for --text-file")->capture_default_str();
    sub->add_option("--max-tokens", o->max_tokens, "text tokens used at most")->capture_default_str();
    sub->add_option("--threshold", o->threshold, "attention weight a (q,k) pair needs")->capture_default_str();
    sub->callback([o] { run_copy_suppression(*o); });
}

}  // namespace hs::cli
