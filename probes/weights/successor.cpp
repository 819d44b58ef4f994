// Successor heads: the succession score from weights (see successor.h).
#include "successor.h"

#include "copy_suppression.h"
#include "errors.h"
#include "guard.h"
#include "successor_tasks.h"
#include "tokenizer.h"
#include "weight_circuits.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <set>

namespace hs {

using namespace torch::indexing;

std::vector<SuccessorTask> default_successor_tasks() {
    std::vector<SuccessorTask> out;
    for (const auto& [name, words] : data::successor_tasks()) out.push_back({name, words});
    return out;
}

std::vector<SuccessorTask> read_successor_tasks(const std::string& path) {
    const std::string text = read_utf8_text_file(path);
    nlohmann::ordered_json j;
    try {
        j = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
        const size_t at = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
        const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
        throw DataError(fmt::format("{}:{}: not valid JSON (tasks are {{\"name\": [\"word\", ...], ...}})", path, line));
    } catch (const nlohmann::json::exception& e) {
        // The parser's other refusal: a number beyond a double's range (out_of_range 406, "1E400"),
        // which parse_error does not cover; still bad input, not an internal error.
        throw DataError(fmt::format("{}: a number is out of range ({}) (tasks are {{\"name\": [\"word\", ...], ...}})", path,
                                    e.what()));
    }
    if (!j.is_object())
        throw DataError(fmt::format("{}: expected an object of tasks {{\"name\": [\"word\", ...], ...}}", path));
    if (j.empty()) throw DataError(fmt::format("{}: no tasks (an empty object)", path));
    std::vector<SuccessorTask> out;
    for (const auto& [name, words] : j.items()) {
        if (!words.is_array() || words.size() < 2)
            throw DataError(fmt::format("{}: task \"{}\" is not a list of at least two words", path, name));
        SuccessorTask t{name, {}};
        std::set<std::string> seen;
        for (size_t i = 0; i < words.size(); ++i) {
            if (!words[i].is_string() || words[i].get<std::string>().empty())
                throw DataError(fmt::format("{}: task \"{}\" word {} is not a non-empty string", path, name, i));
            const auto w = words[i].get<std::string>();
            if (!seen.insert(w).second)
                throw DataError(fmt::format("{}: task \"{}\" lists \"{}\" twice (its successor would be ambiguous)", path,
                                            name, w));
            t.words.push_back(w);
        }
        out.push_back(std::move(t));
    }
    return out;
}

std::string successor_tasks_json(const std::vector<SuccessorTask>& tasks) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (const auto& t : tasks) j[t.name] = t.words;
    return j.dump(1) + "\n";
}

TokenizedTask tokenize_task(const SuccessorTask& t, const Tokenizer& tok) {
    TokenizedTask out{t, {}, "", 0};
    // The one token of `w` in `form` (-1 when it is not one token so).
    auto token = [&](const std::string& w, const std::string& form) -> int64_t {
        // SentencePiece-style tokenizers add the word-initial space themselves (weight_circuits.h word_token).
        if (form == "space") return word_token(tok, w);
        const auto ids = tok.encode(w, false, false);
        if (form == "bare") return ids.size() == 1 ? ids[0] : -1;
        // "piece": a vocabulary that spells a word as a lone space token and the word ("▁", "one").
        if (ids.size() != 2) return -1;
        const std::string sp = tok.token_text(ids[0]);
        return sp == "\u2581" || sp == " " || sp == "\u0120" ? ids[1] : -1;
    };
    for (const char* form : {"space", "bare", "piece"}) {
        std::vector<int64_t> ids;
        for (const auto& w : t.words) {
            const int64_t id = token(w, form);
            if (id >= 0) ids.push_back(id);
        }
        const auto n = static_cast<int64_t>(ids.size());
        out.n_single = std::max(out.n_single, n);
        if (n == static_cast<int64_t>(t.words.size()) && std::set<int64_t>(ids.begin(), ids.end()).size() == ids.size()) {
            out.ids = std::move(ids);
            out.form = form;
            return out;
        }
    }
    return out;
}

const char* successor_embedding_name(SuccessorEmbedding e) {
    switch (e) {
        case SuccessorEmbedding::kMlp0: return "mlp0";
        case SuccessorEmbedding::kEffective: return "effective";
        case SuccessorEmbedding::kRaw: return "raw";
    }
    return "?";
}

std::optional<SuccessorEmbedding> parse_successor_embedding(const std::string& s) {
    for (auto e : {SuccessorEmbedding::kMlp0, SuccessorEmbedding::kEffective, SuccessorEmbedding::kRaw})
        if (s == successor_embedding_name(e)) return e;
    return std::nullopt;
}

std::string successor_embedding_description(SuccessorEmbedding e) {
    switch (e) {
        case SuccessorEmbedding::kMlp0:
            return "MLP0(norm2_0(W_E[t])), the MLP output only (the paper's effective embedding); raw W_E[t] for "
                   "layer-0 heads; raw W_U, no final norm";
        case SuccessorEmbedding::kEffective:
            return "norm1_l(W_EE[t]) with W_EE = W_E + layer 0 attending to itself + MLP0 (copy suppression's "
                   "effective embedding); W_U with the final norm folded in";
        case SuccessorEmbedding::kRaw: return "raw W_E[t]; raw W_U";
    }
    return "?";
}

SuccessorScores successor_scores(const Model& m, const std::vector<TokenizedTask>& tasks, SuccessorEmbedding e) {
    torch::NoGradGuard ng;
    const int L = m.config.n_layers, H = m.config.n_heads;
    const auto dev = torch::TensorOptions().dtype(torch::kLong).device(m.options.device);
    std::vector<const TokenizedTask*> used;
    for (const auto& t : tasks)
        if (!t.ids.empty()) used.push_back(&t);
    HS_REQUIRE(!used.empty(), "successor_scores: no task has single-token words");
    SuccessorScores s;
    std::vector<int64_t> all_ids, first;  // every task's tokens; where each task starts in all_ids
    for (size_t k = 0; k < used.size(); ++k) {
        first.push_back(static_cast<int64_t>(all_ids.size()));
        const auto& ids = used[k]->ids;
        all_ids.insert(all_ids.end(), ids.begin(), ids.end());
        for (size_t i = 0; i + 1 < ids.size(); ++i) {
            s.source.push_back(ids[i]), s.target.push_back(ids[i + 1]);
            s.task.push_back(static_cast<int64_t>(k));
        }
    }
    const auto T = static_cast<int64_t>(used.size()), N = static_cast<int64_t>(s.source.size());
    auto ids_t = torch::tensor(all_ids, torch::kLong).to(m.options.device);
    auto raw = embed_rows(m, ids_t);  // [A, D]
    at::Tensor above;                 // what heads above layer 0 read, [A, D]
    if (e == SuccessorEmbedding::kMlp0) above = mlp_output(m, 0, raw);
    else if (e == SuccessorEmbedding::kEffective) above = effective_embedding_rows(m, ids_t);
    else above = raw;
    // The task tokens' unembedding rows only ([A, D]; the fold is row by row, so folding after the
    // gather equals gathering from the folded [V, D]).
    const auto u_rows = m.weights.unembed.index({ids_t}).to(torch::kFloat);
    const auto u_task = e == SuccessorEmbedding::kEffective ? fold_final_norm(m, u_rows) : u_rows;
    s.score = torch::zeros({L, H});
    s.task_score = torch::zeros({T, L, H});
    s.rank = torch::zeros({L, H, N}, torch::kLong);
    s.predicted = torch::zeros({L, H, N}, torch::kLong);
    std::vector<int64_t> task_n(static_cast<size_t>(T));
    for (int64_t k = 0; k < T; ++k) task_n[static_cast<size_t>(k)] = static_cast<int64_t>(used[static_cast<size_t>(k)]->ids.size()) - 1;
    for (int l = 0; l < L; ++l) {
        const auto& read = l == 0 ? raw : above;  // layer 0 reads the embedding itself
        const auto x = e == SuccessorEmbedding::kEffective ? attn_input(m, l, read) : read;
        for (int h = 0; h < H; ++h) {
            auto p = torch::matmul(torch::matmul(x, head_v_in(m, l, h)), head_o_out(m, l, h));  // [A, D]
            std::vector<at::Tensor> ranks, preds;
            for (int64_t k = 0; k < T; ++k) {
                const int64_t a = first[static_cast<size_t>(k)], n = task_n[static_cast<size_t>(k)] + 1;
                auto logits = torch::matmul(p.index({Slice(a, a + n - 1)}), u_task.index({Slice(a, a + n)}).t());  // [n-1, n]
                auto succ = torch::arange(1, n, dev);
                auto at_succ = logits.gather(1, succ.view({-1, 1}));
                ranks.push_back((logits >= at_succ).sum(1) - 1);
                preds.push_back(ids_t.index({Slice(a, a + n)}).index({logits.argmax(1)}));
            }
            auto r = torch::cat(ranks).to(torch::kCPU), pr = torch::cat(preds).to(torch::kCPU);
            s.rank[l][h] = r;
            s.predicted[l][h] = pr;
            auto ok = (r == 0).to(torch::kFloat);
            s.score[l][h] = ok.mean();
            int64_t off = 0;
            for (int64_t k = 0; k < T; ++k) {
                const int64_t n = task_n[static_cast<size_t>(k)];
                s.task_score[k][l][h] = ok.index({Slice(off, off + n)}).mean();
                off += n;
            }
        }
    }
    return s;
}

}  // namespace hs
