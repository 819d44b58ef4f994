// headscope logits: one forward pass, the output logits written to HDF5 (/logits [T, V]).
#include "commands.h"
#include "common.h"
#include "schema.h"
#include "errors.h"
#include "progress.h"

#include <torch/torch.h>

namespace hs::cli {

struct LogitsOptions {
    ModelArgs model;
    OutputArgs out;
    std::string text;
    std::string tokens;
    bool no_special = false;
};

void run_logits(const LogitsOptions& o) {
    if (o.text.empty() == o.tokens.empty()) throw UsageError("give exactly one of --text and --tokens");
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, !o.text.empty());
    std::vector<int64_t> ids;
    if (!o.tokens.empty())
        ids = with_flag({{"--tokens", "token_list"}}, [&] { return parse_token_list(o.tokens); });
    else
        for (auto id : l.tokenizer->encode(o.text, !o.no_special)) ids.push_back(id);
    torch::NoGradGuard ng;
    c10::InferenceMode im;
    auto logits = l.model->forward(torch::tensor(ids, torch::kLong).unsqueeze(0))[0].to(torch::kFloat).cpu().contiguous();
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, *l.model);
    write_meta(w, *l.model, 0);
    schema::write_logits(w, {std::vector<float>(logits.data_ptr<float>(), logits.data_ptr<float>() + logits.numel()),
                             std::vector<int32_t>(ids.begin(), ids.end()), logits.size(1)});
    w.commit();
    log_info("wrote {} ([{}, {}] logits)", o.out.out, logits.size(0), logits.size(1));
}

void setup_logits(CLI::App& app) {
    auto o = std::make_shared<LogitsOptions>();
    auto* sub = app.add_subcommand("logits", "run one forward pass and write the logits to HDF5\n"
                                             "Example: headscope logits ../shared/testdata/stories260K/stories260K.bin "
                                             "--text 'Tom and Sue went to the park' --out park.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--text", o->text, "input text (BOS added as the tokenizer says)");
    sub->add_option("--tokens", o->tokens, "input as comma-separated token ids");
    sub->add_flag("--no-special", o->no_special, "add no BOS/EOS to --text");
    sub->callback([o] { run_logits(*o); });
}

}  // namespace hs::cli
