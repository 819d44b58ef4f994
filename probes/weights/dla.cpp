#include "dla.h"

#include "errors.h"
#include "weight_circuits.h"
#include "tokenizer.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace hs {

using namespace torch::indexing;

std::vector<DlaPrompt> read_dla_prompts(const std::string& path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_text_file(path));
    } catch (const nlohmann::json::exception& e) {
        throw DataError(fmt::format("{}: not valid JSON ({})", path, e.what()));
    }
    if (!j.is_array() || j.empty())
        throw DataError(fmt::format("{}: expected a non-empty list of {{\"prompt\", \"correct\", \"incorrect\"}}", path));
    std::vector<DlaPrompt> out;
    for (size_t i = 0; i < j.size(); ++i) {
        const auto& e = j[i];
        for (const char* key : {"prompt", "correct", "incorrect"})
            if (!e.is_object() || !e.contains(key) || !e[key].is_string())
                throw DataError(fmt::format("{}: entry {} has no string \"{}\"", path, i, key));
        out.push_back({e["prompt"].get<std::string>(), e["correct"].get<std::string>(),
                       e["incorrect"].get<std::string>()});
    }
    return out;
}

std::vector<DlaItem> tokenize_dla_prompts(const std::vector<DlaPrompt>& prompts, const Tokenizer& tok,
                                          const std::string& path) {
    std::vector<DlaItem> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
        DlaItem it;
        for (auto id : tok.encode(prompts[i].prompt, true, false)) it.tokens.push_back(id);
        if (!it.tokens.empty() && tok.eos_id() && it.tokens.back() == *tok.eos_id()) it.tokens.pop_back();
        if (it.tokens.empty()) throw DataError(fmt::format("{}: prompt {} is empty", path, i));
        for (auto [word, dst] : {std::pair{&prompts[i].correct, &it.correct}, {&prompts[i].incorrect, &it.incorrect}}) {
            const int32_t id = word_token(tok, trim(*word));
            if (id < 0)
                throw DataError(fmt::format("{}: prompt {}: answer '{}' is not a single token", path, i, *word));
            *dst = id;
        }
        out.push_back(std::move(it));
    }
    return out;
}

namespace {

// Raw dot products with the folded direction, before the final norm's scale is known.
struct Dots {
    at::Tensor heads, mlp, attn_bias, per_pos;  // [L, H], [L], [L], [L, H, T]
    double embed = 0;
    at::Tensor final_resid;                     // [D] at the last position
};

Hooks dla_hooks(const Model& m, const at::Tensor& u, bool per_position, Dots& d, at::Tensor& v) {
    const int L = m.config.n_layers;
    Hooks hk;
    auto last = [](const at::Tensor& x) { return x[0][-1].to(torch::kFloat); };
    hk.capture(Point::kResidPre, [&, last](int, const at::Tensor& x) { d.embed = last(x).dot(u).item<double>(); }, 0);
    hk.capture(Point::kAttnHeadOut, [&, last](int l, const at::Tensor& x) {
        d.heads[l] = torch::matmul(last(x), u);                   // [H]
        d.attn_bias[l] = -d.heads[l].sum();                       // completed by attn_out below
    });
    hk.capture(Point::kAttnOut, [&, last](int l, const at::Tensor& x) { d.attn_bias[l] += last(x).dot(u); });
    hk.capture(Point::kMlpOut, [&, last](int l, const at::Tensor& x) { d.mlp[l] = last(x).dot(u); });
    hk.capture(Point::kResidPost, [&, last](int, const at::Tensor& x) { d.final_resid = last(x); }, L - 1);
    if (per_position) {
        hk.capture(Point::kAttnV, [&](int, const at::Tensor& x) { v = x[0].to(torch::kFloat); });  // [S, K, d]
        hk.capture(Point::kAttnPattern, [&](int l, const at::Tensor& p) {
            auto a = p[0].index({Slice(), -1}).to(torch::kFloat);  // [H, S] the last query's row
            for (int64_t h = 0; h < m.config.n_heads; ++h) {
                auto o_u = torch::matmul(head_o_out(m, l, h), u);  // [d]: W_O^h then the direction
                auto vk = v.index({Slice(), h / m.config.kv_group()});  // [S, d]
                d.per_pos[l][h] = a[h] * torch::matmul(vk, o_u);
            }
        });
    }
    return hk;
}

}  // namespace

DlaResult dla_one(const Model& m, const DlaItem& item, bool per_position) {
    const auto& c = m.config;
    if (c.sandwich_norm || c.post_norm_only)
        throw ConfigError(fmt::format("{}: dla needs a residual stream that is a plain sum of component outputs; "
                                      "this family normalises attention/MLP outputs", m.path));
    torch::NoGradGuard ng;
    const int L = c.n_layers, H = c.n_heads;
    const int64_t T = static_cast<int64_t>(item.tokens.size());
    const auto& U = m.weights.unembed;
    auto u = fold_final_norm(m, U[item.correct] - U[item.incorrect]).to(torch::kFloat);  // [D]
    Dots d{torch::zeros({L, H}), torch::zeros({L}), torch::zeros({L}), torch::zeros({L, H, T}), 0.0, {}};
    at::Tensor v;
    Hooks hk = dla_hooks(m, u, per_position, d, v);
    auto logits = m.forward(torch::tensor(item.tokens, torch::kLong).unsqueeze(0), &hk)[0][-1].to(torch::kFloat);
    const double inv = final_norm_inv_scale(m, d.final_resid).item<double>();
    DlaResult r;
    r.heads = d.heads * inv;
    r.mlp = d.mlp * inv;
    r.attn_bias = d.attn_bias * inv;
    r.embed = d.embed * inv;
    if (per_position) r.per_position = d.per_pos * inv;
    const auto& fb = m.weights.final_norm_b;
    if (fb.defined()) r.final_bias += fb.to(torch::kFloat).dot((U[item.correct] - U[item.incorrect]).to(torch::kFloat)).item<double>();
    const auto& ub = m.weights.unembed_b;
    if (ub.defined()) r.final_bias += (ub[item.correct] - ub[item.incorrect]).item<double>();
    r.logit_diff = (logits[item.correct] - logits[item.incorrect]).item<double>();
    return r;
}

}  // namespace hs
