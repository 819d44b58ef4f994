// headscope dla: direct logit attribution of every head (and the embedding, MLPs and biases) to
// logit(correct) - logit(incorrect) at the last position of each prompt.
// Method: probes/weights/dla.h, docs/methods-weights.md.
#include "commands.h"
#include "common.h"
#include "score_records.h"
#include "dla.h"
#include "errors.h"
#include "progress.h"

#include <torch/torch.h>

namespace hs::cli {

struct DlaCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string prompts;
    bool per_position = false;
};

// The prompts' results as the record /scores/dla stores.
static schema::DlaRecord dla_record(const Model& m, const std::vector<DlaResult>& rs, const DlaCliOptions& o) {
    schema::DlaRecord r;
    r.L = m.config.n_layers, r.H = m.config.n_heads, r.P = static_cast<int64_t>(rs.size());
    r.prompts_file = o.prompts;
    std::vector<at::Tensor> heads, mlp, bias;
    for (const auto& x : rs) {
        heads.push_back(x.heads);
        mlp.push_back(x.mlp);
        bias.push_back(x.attn_bias);
        r.embed.push_back(static_cast<float>(x.embed));
        r.final_bias.push_back(static_cast<float>(x.final_bias));
        r.logit_diff.push_back(static_cast<float>(x.logit_diff));
    }
    auto per_prompt = torch::stack(heads);  // [P, L, H]
    r.score = host_floats(per_prompt.mean(0));
    r.per_prompt = host_floats(per_prompt);
    r.mlp = host_floats(torch::stack(mlp));
    r.attn_bias = host_floats(torch::stack(bias));
    for (int64_t i = 0; i < r.P && rs[i].per_position.defined(); ++i)
        r.per_position.push_back({rs[i].per_position.size(2), host_floats(rs[i].per_position)});
    return r;
}

void run_dla(const DlaCliOptions& o) {
    const WriteMode mode = write_mode(o.out);
    auto prompts = read_dla_prompts(o.prompts);
    auto l = open_model(o.model, true);
    auto items = tokenize_dla_prompts(prompts, *l.tokenizer, o.prompts);
    std::vector<DlaResult> rs;
    Progress bar("dla", static_cast<int64_t>(items.size()));
    for (const auto& it : items) {
        rs.push_back(dla_one(*l.model, it, o.per_position));
        bar.tick();
    }
    bar.finish();
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, *l.model);
    write_meta(w, *l.model, 0);
    schema::write_dla(w, dla_record(*l.model, rs, o));
    w.commit();
    log_info("wrote {} ({} prompts)", o.out.out, rs.size());
}

void setup_dla(CLI::App& app) {
    auto o = std::make_shared<DlaCliOptions>();
    auto* sub = app.add_subcommand(
        "dla", "direct logit attribution of each head to logit(correct) - logit(incorrect) at the last position\n"
               "Example: headscope dla ../shared/testdata/stories260K/stories260K.bin "
               "--prompts datasets/examples/dla-prompts.json --out dla.h5 --per-position");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--prompts", o->prompts, "JSON list of {\"prompt\", \"correct\", \"incorrect\"}")->required();
    sub->add_flag("--per-position", o->per_position, "also split each head's effect by key position");
    sub->callback([o] { run_dla(*o); });
}

}  // namespace hs::cli
