// Successor heads (Gould, Ong, Ogden & Conmy 2023, "Successor Heads: Recurring, Interpretable
// Attention Heads In The Wild"): heads whose OV circuit maps a token of an ordinal sequence to its
// successor (1 -> 2, Monday -> Tuesday, January -> February, A -> B). Weights only, like MAPS.
//
// Succession score of head (l, h) (the paper's section 2; docs/methods-weights.md, "Successor heads"):
// for each task (an ordered list of words, each one token) and each of its tokens t_i but the last,
//   logits = e(t_i) W_V^{l,h/g} W_O^{l,h} W_U[task]^T      (restricted to the task's own tokens)
// the head succeeds on t_i when t_{i+1} has the largest logit (ties count against it). The score is
// the fraction of successes over every task's scored tokens; per-task scores are kept.
// e(t) is the source representation (SuccessorEmbedding): the paper's MLP0(norm2_0(W_E[t])) (the
// MLP output only, raw W_E for layer-0 heads, raw W_U: MAPS's processing), copy suppression's W_EE
// read through layer l's norm with the final norm folded into W_U, or raw W_E.
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

struct SuccessorTask {
    std::string name;
    std::vector<std::string> words;  // in order: words[i + 1] succeeds words[i]
};
// The paper's tasks (datasets/successor_tasks.h).
std::vector<SuccessorTask> default_successor_tasks();
// A JSON object {"name": ["w1", "w2", ...], ...} (the file's order kept). DataError naming the file
// for bad JSON, an empty object, a task of fewer than two words, a word that is not a string or is
// empty, a word given twice in one task.
std::vector<SuccessorTask> read_successor_tasks(const std::string& path);
std::string successor_tasks_json(const std::vector<SuccessorTask>& tasks);  // what read_ reads

// A task on a tokenizer, in the first form in which every word is one token (and no two words share
// it): "space" (" word", the whole-word form MAPS uses), "bare" ("word"), or "piece" (a vocabulary
// that spells a word as a lone space token then the word, "▁" "one": the word's token). Else
// skipped (ids empty).
struct TokenizedTask {
    SuccessorTask task;
    std::vector<int64_t> ids;  // [n] one per word; empty: skipped
    std::string form;          // "space", "bare", "piece", or "" (skipped)
    int64_t n_single = 0;      // words that are one token in the better form (coverage)
};
TokenizedTask tokenize_task(const SuccessorTask& t, const Tokenizer& tok);

enum class SuccessorEmbedding { kMlp0, kEffective, kRaw };
const char* successor_embedding_name(SuccessorEmbedding e);  // "mlp0", "effective", "raw"
std::optional<SuccessorEmbedding> parse_successor_embedding(const std::string& s);
std::string successor_embedding_description(SuccessorEmbedding e);

struct SuccessorScores {
    at::Tensor score;       // [L, H] float32: successes / scored tokens over every task
    at::Tensor task_score;  // [T, L, H] float32, T = tasks scored
    at::Tensor rank;        // [L, H, N] int64: the successor's rank among its task's tokens (0 = first)
    at::Tensor predicted;   // [L, H, N] int64: the task token with the largest logit
    std::vector<int64_t> source, target, task;  // [N] token ids, and each row's task index
};
// Tasks with no ids are skipped; at least one must remain (HS_REQUIRE). Heads are scored a layer
// at a time; nothing larger than [N, D] per head is formed.
SuccessorScores successor_scores(const Model& m, const std::vector<TokenizedTask>& tasks, SuccessorEmbedding e);

}  // namespace hs
