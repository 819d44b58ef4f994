// Successor heads: the succession score from weights (see successor.h).
#include "successor.h"

#include "blocks.h"
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
            // A last word equal to the first closes a cycle (the reference's days and months wrap so).
            const bool wrap = i + 1 == words.size() && i >= 2 && w == t.words.front();
            if (!seen.insert(w).second && !wrap)
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

int64_t TokenizedTask::scored_pairs() const {
    int64_t n = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) n += ids[i] >= 0 && ids[i + 1] >= 0;
    return n;
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
    int64_t best_pairs = 0;
    for (const char* form : {"space", "bare", "piece"}) {
        TokenizedTask k{t, {}, form, 0};
        for (const auto& w : t.words) {
            k.ids.push_back(token(w, form));
            k.n_single += k.ids.back() >= 0;
        }
        const int64_t p = k.scored_pairs();
        if (p > best_pairs) best_pairs = p, out = std::move(k);  // the first form wins a tie
        else if (best_pairs == 0) out.n_single = std::max(out.n_single, k.n_single);
    }
    return out;
}

const char* successor_embedding_name(SuccessorEmbedding e) {
    switch (e) {
        case SuccessorEmbedding::kReference: return "reference";
        case SuccessorEmbedding::kHeadscope: return "headscope";
        case SuccessorEmbedding::kEffective: return "effective";
        case SuccessorEmbedding::kRaw: return "raw";
    }
    return "?";
}

std::optional<SuccessorEmbedding> parse_successor_embedding(const std::string& s) {
    for (auto e : {SuccessorEmbedding::kReference, SuccessorEmbedding::kHeadscope, SuccessorEmbedding::kEffective,
                   SuccessorEmbedding::kRaw})
        if (s == successor_embedding_name(e)) return e;
    return std::nullopt;
}

std::string successor_embedding_description(SuccessorEmbedding e) {
    switch (e) {
        case SuccessorEmbedding::kReference:
            return "MLP0(W_E[t]): block 0's MLP on the raw embedding, no norm, the MLP output only, for every layer's "
                   "heads; raw W_U, no final norm (curt-tigges/circuits-over-time test_successor_head.py)";
        case SuccessorEmbedding::kHeadscope:
            return "MLP0(norm2_0(W_E[t])), the MLP output only; raw W_E[t] for layer-0 heads; raw W_U, no final norm "
                   "(headscope's former default)";
        case SuccessorEmbedding::kEffective:
            return "norm1_l(W_EE[t]) with W_EE = W_E + layer 0 attending to itself + MLP0 (copy suppression's "
                   "effective embedding); W_U with the final norm folded in";
        case SuccessorEmbedding::kRaw: return "raw W_E[t]; raw W_U";
    }
    return "?";
}

const char* successor_ties_name(SuccessorTies t) { return t == SuccessorTies::kSuccess ? "success" : "fail"; }

std::optional<SuccessorTies> parse_successor_ties(const std::string& s) {
    for (auto t : {SuccessorTies::kSuccess, SuccessorTies::kFail})
        if (s == successor_ties_name(t)) return t;
    return std::nullopt;
}

namespace {

// One scored task: its distinct single-token words (the candidates, in first-seen order) and its
// scorable pairs as rows (source) and columns (successor) of the candidates.
struct TaskPlan {
    std::vector<int64_t> cand;
    std::vector<int64_t> src_row, dst_col;
};

TaskPlan plan_task(const TokenizedTask& t) {
    TaskPlan p;
    auto col = [&](int64_t id) {
        const auto it = std::find(p.cand.begin(), p.cand.end(), id);
        if (it != p.cand.end()) return static_cast<int64_t>(it - p.cand.begin());
        p.cand.push_back(id);
        return static_cast<int64_t>(p.cand.size()) - 1;
    };
    for (const int64_t id : t.ids)
        if (id >= 0) col(id);
    for (size_t i = 0; i + 1 < t.ids.size(); ++i)
        if (t.ids[i] >= 0 && t.ids[i + 1] >= 0) p.src_row.push_back(col(t.ids[i])), p.dst_col.push_back(col(t.ids[i + 1]));
    return p;
}

// What heads of layer l read: the reference's MLP0 output for every layer (its lines 65-68 use one
// mlp0_W_E); headscope's and the effective embedding give layer-0 heads the raw embedding (MLP0
// comes after them); the effective one goes through layer l's attention norm.
at::Tensor source_rows(const Model& m, SuccessorEmbedding e, const at::Tensor& raw, const at::Tensor& above, int l) {
    switch (e) {
        case SuccessorEmbedding::kReference: return above;
        case SuccessorEmbedding::kHeadscope: return l == 0 ? raw : above;
        case SuccessorEmbedding::kEffective: return attn_input(m, l, l == 0 ? raw : above);
        case SuccessorEmbedding::kRaw: return raw;
    }
    return raw;
}

}  // namespace

SuccessorScores successor_scores(const Model& m, const std::vector<TokenizedTask>& tasks, SuccessorEmbedding e,
                                 SuccessorTies ties) {
    torch::NoGradGuard ng;
    const int L = m.config.n_layers, H = m.config.n_heads;
    std::vector<TaskPlan> plans;
    std::vector<int64_t> all_ids, first;  // every task's candidates; where each task's start in all_ids
    SuccessorScores s;
    for (const auto& t : tasks) {
        if (t.ids.empty()) continue;
        plans.push_back(plan_task(t));
        const auto& p = plans.back();
        const auto k = static_cast<int64_t>(plans.size()) - 1;
        for (size_t i = 0; i < p.src_row.size(); ++i) {
            s.source.push_back(p.cand[static_cast<size_t>(p.src_row[i])]);
            s.target.push_back(p.cand[static_cast<size_t>(p.dst_col[i])]);
            s.task.push_back(k);
        }
        first.push_back(static_cast<int64_t>(all_ids.size()));
        all_ids.insert(all_ids.end(), p.cand.begin(), p.cand.end());
    }
    HS_REQUIRE(!s.source.empty(), "successor_scores: no task has a pair of single-token words");
    const auto T = static_cast<int64_t>(plans.size()), N = static_cast<int64_t>(s.source.size());
    auto ids_t = torch::tensor(all_ids, torch::kLong).to(m.options.device);
    auto raw = embed_rows(m, ids_t);  // [A, D]
    at::Tensor above;                 // what heads above layer 0 read (all layers: reference), [A, D]
    if (e == SuccessorEmbedding::kReference) {
        // test_successor_head.py lines 58-59: model.blocks[0].mlp on W_E, the block's MLP without ln2.
        const auto& lw = m.weights.layers[0];
        above = blocks::mlp(m.config, lw, raw.to(m.options.dtype), false).to(torch::kFloat);
    } else if (e == SuccessorEmbedding::kHeadscope) {
        above = mlp_output(m, 0, raw);
    } else if (e == SuccessorEmbedding::kEffective) {
        above = effective_embedding_rows(m, ids_t);
    } else {
        above = raw;
    }
    // The task tokens' unembedding rows only ([A, D]; the fold is row by row, so folding after the
    // gather equals gathering from the folded [V, D]).
    const auto u_rows = m.weights.unembed.index({ids_t}).to(torch::kFloat);
    const auto u_task = e == SuccessorEmbedding::kEffective ? fold_final_norm(m, u_rows) : u_rows;
    std::vector<at::Tensor> rows, cols;  // per task: its pairs' source rows and successor columns
    for (int64_t k = 0; k < T; ++k) {
        rows.push_back(torch::tensor(plans[static_cast<size_t>(k)].src_row, torch::kLong).to(m.options.device));
        cols.push_back(torch::tensor(plans[static_cast<size_t>(k)].dst_col, torch::kLong).to(m.options.device).view({-1, 1}));
    }
    s.score = torch::zeros({L, H});
    s.task_score = torch::zeros({T, L, H});
    s.rank = torch::zeros({L, H, N}, torch::kLong);
    s.predicted = torch::zeros({L, H, N}, torch::kLong);
    for (int l = 0; l < L; ++l) {
        const auto x = source_rows(m, e, raw, above, l);
        for (int h = 0; h < H; ++h) {
            auto p = torch::matmul(torch::matmul(x, head_v_in(m, l, h)), head_o_out(m, l, h));  // [A, D]
            std::vector<at::Tensor> ranks, preds;
            for (int64_t k = 0; k < T; ++k) {
                const int64_t a = first[static_cast<size_t>(k)];
                const auto n = static_cast<int64_t>(plans[static_cast<size_t>(k)].cand.size());
                auto cand = Slice(a, a + n);
                // [pairs, n]: each pair's source row against the task's distinct tokens (lines 77-80).
                auto logits = torch::matmul(p.index({cand}).index({rows[k]}), u_task.index({cand}).t());
                auto at_succ = logits.gather(1, cols[k]);
                // Line 83: success when the successor's logit equals the largest (ties succeed); the
                // successor never beats itself, so a rank of 0 is exactly that.
                ranks.push_back(ties == SuccessorTies::kSuccess ? (logits > at_succ).sum(1) : (logits >= at_succ).sum(1) - 1);
                preds.push_back(ids_t.index({cand}).index({logits.argmax(1)}));
            }
            auto r = torch::cat(ranks).to(torch::kCPU), pr = torch::cat(preds).to(torch::kCPU);
            s.rank[l][h] = r;
            s.predicted[l][h] = pr;
            auto ok = (r == 0).to(torch::kFloat);
            s.score[l][h] = ok.mean();  // line 88: the mean over every task's pairs
            int64_t off = 0;
            for (int64_t k = 0; k < T; ++k) {
                const auto n = static_cast<int64_t>(plans[static_cast<size_t>(k)].src_row.size());
                s.task_score[k][l][h] = ok.index({Slice(off, off + n)}).mean();
                off += n;
            }
        }
    }
    return s;
}

std::vector<std::pair<int, int>> successor_heads(const at::Tensor& score, double threshold) {
    std::vector<std::pair<int, int>> out;
    // Lines 90 and 93: accuracy > 0.4 on a float32 tensor, where torch compares with the scalar cast to
    // float32: a score of exactly 2/5 (0.4f) is not above 0.4.
    auto c = score.to(torch::kCPU, torch::kFloat).contiguous();
    const int64_t L = c.size(0), H = c.size(1);
    const float* v = c.data_ptr<float>();
    const auto t = static_cast<float>(threshold);
    for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h)
            if (v[l * H + h] > t) out.emplace_back(static_cast<int>(l), static_cast<int>(h));
    return out;
}

}  // namespace hs
