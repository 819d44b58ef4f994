// headscope dla: direct logit attribution of every head (and the embedding, MLPs and biases) to
// logit(correct) - logit(incorrect) at the last position of each prompt.
// Method: probes/weights/dla.h, docs/methods-weights.md.
#include "commands.h"
#include "common.h"
#include "schema.h"
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

static void write_dla(ResultWriter& w, const Model& m, const std::vector<DlaResult>& rs, const DlaCliOptions& o) {
    const int64_t L = m.config.n_layers, H = m.config.n_heads, P = static_cast<int64_t>(rs.size());
    std::vector<at::Tensor> heads, mlp, bias;
    std::vector<float> embed, fbias, diff;
    for (const auto& r : rs) {
        heads.push_back(r.heads);
        mlp.push_back(r.mlp);
        bias.push_back(r.attn_bias);
        embed.push_back(static_cast<float>(r.embed));
        fbias.push_back(static_cast<float>(r.final_bias));
        diff.push_back(static_cast<float>(r.logit_diff));
    }
    auto per_prompt = torch::stack(heads);  // [P, L, H]
    Attrs a{{"probe", std::string("dla")},
            {"prompts_file", o.prompts},
            {"n_prompts", P},
            {"weight_processing", std::string("final norm weight folded into W_U; clean-run final-norm scale")},
            {"position", std::string("last")}};
    schema::ScoreGroup g{"dla", a, {}};
    auto put = [&](const std::string& name, const std::vector<float>& v, const std::vector<int64_t>& shape,
                   const std::string& desc) {
        Attrs x = a;
        x["description"] = desc;
        g.datasets.push_back({name, {shape, v, x}});
    };
    put("score", host_floats(per_prompt.mean(0)), {L, H}, "mean over prompts of the head's direct effect on "
                                                     "logit(correct) - logit(incorrect)");
    put("per_prompt", host_floats(per_prompt), {P, L, H}, "per prompt head direct effects");
    put("mlp", host_floats(torch::stack(mlp)), {P, L}, "per prompt MLP direct effects");
    put("attn_bias", host_floats(torch::stack(bias)), {P, L}, "per prompt attention-output bias direct effects");
    put("embed", embed, {P}, "per prompt embedding direct effect");
    put("final_bias", fbias, {P}, "per prompt final-norm and unembedding bias terms");
    put("logit_diff", diff, {P}, "the model's logit(correct) - logit(incorrect); the terms above sum to it");
    for (int64_t i = 0; i < P && rs[i].per_position.defined(); ++i) {
        const int64_t T = rs[i].per_position.size(2);
        put(fmt::format("per_position/prompt_{}", i), host_floats(rs[i].per_position), {L, H, T},
            "A[last, k] (v_k W_O^h) . direction per key position k; sums over k to the head's score");
    }
    schema::write_scores(w, g);
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
    write_dla(w, *l.model, rs, o);
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
