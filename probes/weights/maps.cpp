#include "maps.h"

#include "blocks.h"
#include "errors.h"
#include "tokenizer.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace hs {

using namespace torch::indexing;

static at::Tensor f32(const at::Tensor& t) { return t.to(torch::kFloat); }

// ---- Relations ----

static std::vector<std::pair<std::string, std::string>> parse_pairs(const nlohmann::json& j, const std::string& path) {
    if (!j.is_array()) throw DataError(fmt::format("{}: expected a list of [source, target] string pairs", path));
    std::vector<std::pair<std::string, std::string>> out;
    for (size_t i = 0; i < j.size(); ++i) {
        const auto& e = j[i];
        if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
            throw DataError(fmt::format("{}: entry {} is not a [source, target] string pair: {}", path, i,
                                        e.dump().substr(0, 60)));
        out.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
    return out;
}

Relation read_relation(const std::string& path) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_text_file(path));
    } catch (const nlohmann::json::exception& e) {
        throw DataError(fmt::format("{}: not valid JSON ({})", path, e.what()));
    }
    Relation r;
    r.source = path;
    r.name = std::filesystem::path(path).stem().string();
    r.category = "unknown";
    if (j.is_object()) {
        if (!j.contains("pairs")) throw DataError(fmt::format("{}: object form needs a \"pairs\" list", path));
        if (j.contains("name") && j["name"].is_string()) r.name = j["name"].get<std::string>();
        if (j.contains("category") && j["category"].is_string()) r.category = j["category"].get<std::string>();
        if (j.contains("k")) {
            if (!j["k"].is_number_integer() || j["k"].get<int>() < 1)
                throw DataError(fmt::format("{}: \"k\" must be a positive integer", path));
            r.k = j["k"].get<int>();
        }
        r.pairs = parse_pairs(j["pairs"], path);
    } else {
        r.pairs = parse_pairs(j, path);
    }
    if (r.pairs.empty()) throw DataError(fmt::format("{}: no pairs", path));
    return r;
}

std::vector<Relation> read_relations(const std::string& spec) {
    std::vector<std::string> files;
    if (is_directory(spec)) {
        for (const auto& e : std::filesystem::directory_iterator(spec))
            if (e.path().extension() == ".json") files.push_back(e.path().string());
        std::sort(files.begin(), files.end());
        if (files.empty()) throw DataError(fmt::format("{}: no *.json relation files in this folder", spec));
    } else {
        for (const auto& f : split(spec, ','))
            if (!trim(f).empty()) files.push_back(trim(f));
    }
    std::vector<Relation> out;
    for (const auto& f : files) out.push_back(read_relation(f));
    return out;
}

int default_k(const Relation& r) {
    if (r.k > 0) return r.k;
    return (r.name == "copying" || r.name == "name_copying") ? 1 : 10;
}

TokenizedRelation tokenize_relation(const Relation& r, const Tokenizer& tok) {
    TokenizedRelation t;
    t.rel = r;
    t.n_total = static_cast<int64_t>(r.pairs.size());
    for (const auto& [s, d] : r.pairs) {
        const int32_t a = word_token(tok, s), b = word_token(tok, d);
        if (a < 0 || b < 0) continue;
        t.src.push_back(a);
        t.dst.push_back(b);
    }
    return t;
}

// ---- MAPS scores ----

MapsScores maps_static(const Model& m, const TokenizedRelation& r, const MapsOptions& o) {
    torch::NoGradGuard ng;
    const int L = m.config.n_layers, H = m.config.n_heads;
    const int64_t N = static_cast<int64_t>(r.src.size());
    MapsScores out;
    out.k = o.k > 0 ? o.k : default_k(r.rel);
    auto src = torch::tensor(r.src, torch::kLong), dst = torch::tensor(r.dst, torch::kLong);
    auto e_raw = embed_rows(m, src);          // [N, D]
    auto e_mlp = mlp_output(m, 0, e_raw);     // [N, D] MLP0 output only, as published
    auto unembed = f32(m.weights.unembed);    // [V, D] raw: MAPS uses no final norm
    out.score = torch::zeros({L, H});
    out.suppression = torch::zeros({L, H});
    out.target_rank = torch::zeros({L, H, N}, torch::kLong);
    for (int l = 0; l < L; ++l) {
        const auto& e = l == 0 ? e_raw : e_mlp;
        for (int h = 0; h < H; ++h) {
            auto p_rows = torch::matmul(torch::matmul(e, head_v_in(m, l, h)), head_o_out(m, l, h));  // [N, D]
            auto [desc, asc] = blocked_target_ranks(p_rows, unembed, dst, o.block_size,
                                                    o.suppression ? RankSide::kBoth : RankSide::kDescending);
            out.target_rank[l][h] = desc;
            out.score[l][h] = (desc < out.k).to(torch::kFloat).mean();
            if (o.suppression) out.suppression[l][h] = (asc < out.k).to(torch::kFloat).mean();
        }
    }
    if (!o.suppression) out.suppression = at::Tensor();
    return out;
}

const std::vector<std::string>& maps_templates() {
    static const std::vector<std::string> t = {"This is a document about <X>", "No tags: <X>",
                                               "Let me tell you about <X>", "<X>"};
    return t;
}

// z at the last position of every source's template: [N, H, d] per layer.
static std::vector<at::Tensor> last_z(const Model& m, const at::Tensor& tokens) {
    std::vector<at::Tensor> z(m.config.n_layers);
    Hooks hooks;
    hooks.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { z[l] = f32(x.index({Slice(), -1})); });
    ForwardOptions fo;
    fo.compute_logits = false;
    m.forward(tokens, &hooks, nullptr, fo);
    return z;
}

at::Tensor maps_dynamic(const Model& m, const Tokenizer& tok, const TokenizedRelation& r, int k) {
    torch::NoGradGuard ng;
    const int L = m.config.n_layers, H = m.config.n_heads;
    const int64_t N = static_cast<int64_t>(r.src.size());
    auto src = torch::tensor(r.src, torch::kLong), dst = torch::tensor(r.dst, torch::kLong);
    auto unembed = f32(m.weights.unembed);
    auto score = torch::zeros({L, H});
    for (const auto& tpl : maps_templates()) {
        std::string prefix = trim(tpl.substr(0, tpl.find("<X>")));
        std::vector<int64_t> ids;
        for (auto id : tok.encode(prefix, true, false)) ids.push_back(id);
        // The tokenizer may append EOS with add_special: the source must be the last token.
        if (!ids.empty() && tok.eos_id() && ids.back() == *tok.eos_id()) ids.pop_back();
        auto pre = torch::tensor(ids, torch::kLong).view({1, -1}).expand({N, -1});
        auto tokens = torch::cat({pre, src.view({N, 1})}, 1);  // [N, T]
        auto z = last_z(m, tokens);
        for (int l = 0; l < L; ++l)
            for (int h = 0; h < H; ++h) {
                auto p_rows = torch::matmul(z[l].index({Slice(), h}), head_o_out(m, l, h));  // [N, D]
                auto desc = blocked_target_ranks(p_rows, unembed, dst, N, RankSide::kDescending).first;
                score[l][h] += (desc < k).to(torch::kFloat).mean();
            }
    }
    return score / static_cast<double>(maps_templates().size());
}

double pearson(const at::Tensor& a, const at::Tensor& b) {
    auto x = a.reshape(-1).to(torch::kDouble), y = b.reshape(-1).to(torch::kDouble);
    x = x - x.mean();
    y = y - y.mean();
    const double den = std::sqrt((x * x).sum().item<double>() * (y * y).sum().item<double>());
    return den > 0 ? (x * y).sum().item<double>() / den : std::nan("");
}

}  // namespace hs
