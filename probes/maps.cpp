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

// ---- Shared weight circuits ----

static at::Tensor f32(const at::Tensor& t) { return t.to(torch::kFloat); }

at::Tensor head_v_in(const Model& m, int layer, int head) {
    const int64_t d = m.config.d_head, kv = head / m.config.kv_group();
    return f32(m.weights.layers[layer].wv.index({Slice(kv * d, (kv + 1) * d)})).t();  // [D, d]
}

at::Tensor head_o_out(const Model& m, int layer, int head) {
    const int64_t d = m.config.d_head;
    return f32(m.weights.layers[layer].wo.index({Slice(), Slice(head * d, (head + 1) * d)})).t();  // [d, D]
}

at::Tensor head_q_in(const Model& m, int layer, int head) {
    const int64_t d = m.config.d_head;
    return f32(m.weights.layers[layer].wq.index({Slice(head * d, (head + 1) * d)})).t();  // [D, d]
}

at::Tensor head_k_in(const Model& m, int layer, int head) {
    const int64_t d = m.config.d_head, kv = head / m.config.kv_group();
    return f32(m.weights.layers[layer].wk.index({Slice(kv * d, (kv + 1) * d)})).t();  // [D, d]
}

at::Tensor embed_rows(const Model& m, const at::Tensor& ids) {
    auto idx = ids.to(m.weights.embed.device(), torch::kLong);
    return f32(m.weights.embed.index_select(0, idx)) * m.config.embed_scale;  // [N, D]
}

// The norms and the MLP run in the model's dtype, as the forward does; results come back fp32.
at::Tensor attn_input(const Model& m, int layer, const at::Tensor& x) {
    if (m.config.post_norm_only) return x;
    const auto& lw = m.weights.layers[layer];
    return f32(blocks::norm(m.config, x.to(m.options.dtype), lw.attn_norm_w, lw.attn_norm_b));
}

at::Tensor mlp_input(const Model& m, int layer, const at::Tensor& x) {
    if (m.config.post_norm_only) return x;
    const auto& lw = m.weights.layers[layer];
    return f32(blocks::norm(m.config, x.to(m.options.dtype), lw.mlp_norm_w, lw.mlp_norm_b));
}

at::Tensor mlp_output(const Model& m, int layer, const at::Tensor& x) {
    const auto& lw = m.weights.layers[layer];
    auto y = blocks::mlp(m.config, lw, mlp_input(m, layer, x).to(m.options.dtype));
    if (m.config.sandwich_norm || m.config.post_norm_only)
        y = blocks::norm(m.config, y, lw.post_mlp_norm_w, lw.post_mlp_norm_b);
    return f32(y);
}

at::Tensor final_norm_inv_scale(const Model& m, const at::Tensor& resid) {
    auto x = f32(resid);
    if (m.config.norm == NormKind::kLayerNorm) x = x - x.mean(-1, true);
    return torch::rsqrt(x.pow(2).mean(-1) + m.config.norm_eps);
}

at::Tensor fold_final_norm(const Model& m, const at::Tensor& u) {
    auto y = f32(u);
    const auto& w = m.weights.final_norm_w;
    if (w.defined()) y = y * (m.config.norm == NormKind::kRmsPlusOne ? 1.0 + f32(w) : f32(w));
    if (m.config.norm == NormKind::kLayerNorm) y = y - y.mean(-1, true);
    return y;
}

namespace {

constexpr int64_t kFusedRows = 128;

// Rows [a, b) of the score matrix sit in buf ([b - a, V], contiguous float32 on the CPU): count,
// per row, the entries >= / <= the target's entry, minus the target itself. One read of each row;
// integer counters in a branch-free loop the compiler vectorises.
void count_ranks_cpu(const at::Tensor& buf, const int64_t* tgt, int64_t a, int64_t b, int64_t* desc, int64_t* asc) {
    const int64_t V = buf.size(1);
    const float* base = buf.data_ptr<float>();
    at::parallel_for(0, b - a, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const float* row = base + i * V;
            const float t = row[tgt[a + i]];
            if (desc) {
                int64_t ge = 0;
                for (int64_t j = 0; j < V; ++j) ge += row[j] >= t;
                desc[a + i] = ge - 1;
            }
            if (asc) {
                int64_t le = 0;
                for (int64_t j = 0; j < V; ++j) le += row[j] <= t;
                asc[a + i] = le - 1;
            }
        }
    });
}

}  // namespace

std::pair<at::Tensor, at::Tensor> blocked_target_ranks(const at::Tensor& left, const at::Tensor& right,
                                                       const at::Tensor& targets, int64_t row_block, RankSide side,
                                                       bool fused) {
    if (row_block <= 0) throw UsageError(fmt::format("block size must be positive, got {}", row_block));
    const int64_t N = left.size(0), V = right.size(0);
    const bool want_desc = side != RankSide::kAscending, want_asc = side != RankSide::kDescending;
    at::Tensor desc, asc;
    if (want_desc) desc = torch::empty({N}, torch::kLong);
    if (want_asc) asc = torch::empty({N}, torch::kLong);
    const auto rt = right.t().contiguous();  // [r, V]
    if (fused && left.device().is_cpu() && left.scalar_type() == torch::kFloat && right.scalar_type() == torch::kFloat) {
        // One [block, V] buffer for the whole run (a fresh one per block cost a page fault per
        // 4 KiB: 37 s of system time per GPT-2 head), filled by mm_out and counted in place, 128
        // rows at a time: at V = 50257, d = 64 on 2 cores, 20-row (cache-sized) blocks ran 2.4x
        // slower than 64-128 rows (small-M GEMMs), 2048 rows 1.6x slower (docs/performance.md).
        const int64_t step = std::min(row_block, kFusedRows);
        auto buf = torch::empty({std::min(N, step), V}, torch::kFloat);
        auto tgt = targets.to(torch::kCPU, torch::kLong).contiguous();
        if (N > 0 && (tgt.min().item<int64_t>() < 0 || tgt.max().item<int64_t>() >= V))
            throw UsageError(fmt::format("rank targets outside [0, {})", V));
        const auto lc = left.contiguous();
        for (int64_t a = 0; a < N; a += step) {
            const int64_t b = std::min(N, a + step);
            auto out = buf.narrow(0, 0, b - a);
            at::mm_out(out, lc.narrow(0, a, b - a), rt);
            count_ranks_cpu(out, tgt.data_ptr<int64_t>(), a, b, want_desc ? desc.data_ptr<int64_t>() : nullptr,
                            want_asc ? asc.data_ptr<int64_t>() : nullptr);
        }
        return {desc, asc};
    }
    auto tgt = targets.to(left.device(), torch::kLong);
    for (int64_t a = 0; a < N; a += row_block) {  // other devices and dtypes: tensor ops
        const int64_t b = std::min(N, a + row_block);
        auto s = torch::matmul(left.index({Slice(a, b)}), rt);          // [n, V]
        auto t = s.gather(1, tgt.index({Slice(a, b)}).unsqueeze(1));  // [n, 1]
        // Ties count against the target (minus itself): a head whose P is flat (zero output)
        // must not rank every target first.
        if (want_desc) desc.index_put_({Slice(a, b)}, ((s >= t).sum(1) - 1).cpu());
        if (want_asc) asc.index_put_({Slice(a, b)}, ((s <= t).sum(1) - 1).cpu());
    }
    return {desc, asc};
}

int32_t word_token(const Tokenizer& tok, const std::string& word) {
    const std::string k = tok.kind();
    // SentencePiece-style tokenizers put the word-initial space in themselves (dummy prefix).
    const bool own_prefix = k == "hf-bpe-sentencepiece" || k == "llama2c";
    auto ids = tok.encode(own_prefix ? word : " " + word, false, false);
    return ids.size() == 1 ? ids[0] : -1;
}

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
