// Successor heads (Gould, Ong, Ogden & Conmy 2023, "Successor Heads: Recurring, Interpretable
// Attention Heads In The Wild"): heads whose OV circuit maps a token of an ordinal sequence to its
// successor (1 -> 2, Monday -> Tuesday, January -> February, A -> B). Weights only, like MAPS.
//
// The succession score as the one public reimplementation computes it (curt-tigges/circuits-over-time
// test_successor_head.py; docs/methods-weights.md, "Successor heads", cites its lines): for each task
// (an ordered list of words; days and months wrap, their first word repeated at the end) and each
// pair (t_i, t_{i+1}) of single-token words,
//   logits = e(t_i) W_V^{l,h/g} W_O^{l,h} W_U[task]^T      (over the task's distinct tokens)
// the head succeeds on the pair when t_{i+1}'s logit equals the largest (ties succeed), or, with
// SuccessorTies::kFail, exceeds every other. The score is the fraction of successes over every
// task's scored pairs; a successor head scores above 0.4. Per-task scores are kept.
// e(t) is the source representation (SuccessorEmbedding): the reference's MLP0(W_E[t]) (block 0's
// MLP on the raw embedding, no norm, for every layer; raw W_U), headscope's former
// MLP0(norm2_0(W_E[t])) with raw W_E[t] for layer-0 heads, copy suppression's W_EE read through
// layer l's norm with the final norm folded into W_U, or raw W_E.
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hs {

class Tokenizer;

struct SuccessorTask {
    std::string name;
    std::vector<std::string> words;  // in order: words[i + 1] succeeds words[i]; a wrap ends on words[0]
};
// The reference's tasks (datasets/successor_tasks.h).
std::vector<SuccessorTask> default_successor_tasks();
// A JSON object {"name": ["w1", "w2", ...], ...} (the file's order kept). DataError naming the file
// for bad JSON, an empty object, a task of fewer than two words, a word that is not a string or is
// empty, a word given twice in one task (except a last word equal to the first: a wrap-around).
std::vector<SuccessorTask> read_successor_tasks(const std::string& path);
std::string successor_tasks_json(const std::vector<SuccessorTask>& tasks);  // what read_ reads

// A task on a tokenizer, in the form with the most scorable pairs (the first on a tie): "space"
// (" word", the reference's and MAPS's whole-word form), "bare" ("word"), or "piece" (a vocabulary
// that spells a word as a lone space token then the word, "▁" "one": the word's token). A pair is
// scorable when both its words are one token; the others are dropped (the reference refuses any
// multi-token word instead). A task with no scorable pair is skipped (ids empty).
struct TokenizedTask {
    SuccessorTask task;
    std::vector<int64_t> ids;  // [n] one per word, -1 where a word is not one token; empty: skipped
    std::string form;          // "space", "bare", "piece", or "" (skipped)
    int64_t n_single = 0;      // words that are one token in `form` (in the best form when skipped)
    int64_t pairs() const { return static_cast<int64_t>(task.words.size()) - 1; }
    int64_t scored_pairs() const;  // pairs whose two words are one token each
};
TokenizedTask tokenize_task(const SuccessorTask& t, const Tokenizer& tok);

enum class SuccessorEmbedding { kReference, kHeadscope, kEffective, kRaw };
// "reference", "headscope", "effective", "raw"
const char* successor_embedding_name(SuccessorEmbedding e);
std::optional<SuccessorEmbedding> parse_successor_embedding(const std::string& s);
std::string successor_embedding_description(SuccessorEmbedding e);

// How a successor whose logit equals another task token's counts: kSuccess (the reference: logit ==
// max) or kFail (headscope's former rule: it must exceed every other).
enum class SuccessorTies { kSuccess, kFail };
const char* successor_ties_name(SuccessorTies t);  // "success", "fail"
std::optional<SuccessorTies> parse_successor_ties(const std::string& s);

// The reference's threshold: a head is a successor head when its score is above (>) 0.4.
constexpr double kSuccessorThreshold = 0.4;

struct SuccessorScores {
    at::Tensor score;       // [L, H] float32: successes / scored pairs over every task
    at::Tensor task_score;  // [T, L, H] float32, T = tasks scored
    at::Tensor rank;        // [L, H, N] int64: the task's other tokens that beat the successor (> its
                            // logit; with kFail, >=): 0 = success
    at::Tensor predicted;   // [L, H, N] int64: the task token with the largest logit (the first on a tie)
    std::vector<int64_t> source, target, task;  // [N] token ids, and each pair's task index
};
// Tasks with no ids are skipped; at least one must remain (HS_REQUIRE). Heads are scored a layer
// at a time; nothing larger than [A, D] per head is formed (A the tasks' distinct tokens).
SuccessorScores successor_scores(const Model& m, const std::vector<TokenizedTask>& tasks, SuccessorEmbedding e,
                                 SuccessorTies ties = SuccessorTies::kSuccess);
// The heads whose score is above `threshold` ({layer, head}, in (layer, head) order).
std::vector<std::pair<int, int>> successor_heads(const at::Tensor& score, double threshold);

}  // namespace hs
