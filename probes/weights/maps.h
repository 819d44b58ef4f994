// MAPS (Elhelo & Geva 2024; code amitelhelo/MAPS; methods-reference.md section 4): how strongly a
// head's OV circuit maps a relation's source tokens to its target tokens, from raw weights
// (static) and from the head's output on short templates (dynamic).
// The weight-circuit helpers it shares with copy suppression and DLA are in src/interp/weight_circuits.h.
#pragma once

#include "model.h"
#include "weight_circuits.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

class Tokenizer;

// ---- MAPS ----

struct Relation {
    std::string name;      // file stem unless the object form names it
    std::string category;  // algorithmic | knowledge | linguistic | translation | unknown
    int k = 0;             // 0: the default for the relation (1 for copying relations, else 10)
    std::vector<std::pair<std::string, std::string>> pairs;
    std::string source;    // file it came from
};

// Reads a JSON list of [source, target] pairs, or {"name", "category", "k", "pairs": [...]}.
// Throws DataError naming the file and the first bad entry.
Relation read_relation(const std::string& path);
// "a.json,b.json" or a folder (every *.json in it, sorted).
std::vector<Relation> read_relations(const std::string& spec);
// Default k as the paper: 1 for copying relations (copying, name_copying), else 10.
int default_k(const Relation& r);

struct TokenizedRelation {
    Relation rel;
    std::vector<int64_t> src, dst;  // kept pairs (both sides one token)
    int64_t n_total = 0;
};
TokenizedRelation tokenize_relation(const Relation& r, const Tokenizer& tok);

struct MapsOptions {
    int k = 0;                 // 0: per relation (default_k or the file's "k")
    int64_t block_size = 2048;
    bool suppression = false;  // also score -P
};

struct MapsScores {
    at::Tensor score;        // [L, H] float32: fraction of pairs with target in top-k(P_s)
    at::Tensor suppression;  // [L, H] with -P (undefined unless asked)
    at::Tensor target_rank;  // [L, H, N] int64: #{j != dst : P_sj >= P_s,dst} per pair
    int k = 0;
};

// Static MAPS: E_s = MLP0(norm2_0(W_E[s])) (the MLP output only; raw W_E[s] for layer-0 heads),
// P = E_s W_V^{l,h/g} W_O^{l,h} W_U^T, raw weights, no biases, no final norm.
MapsScores maps_static(const Model& m, const TokenizedRelation& r, const MapsOptions& o);

// The published-style dynamic templates, "<X>" replaced by the source token.
const std::vector<std::string>& maps_templates();

// Dynamic MAPS: each template with the source token appended as its last token (BOS as the
// tokenizer adds it), the model run, head (l,h)'s z at the last position projected:
// P = z W_O^{l,h} W_U^T, the same top-k criterion, averaged over templates. [L, H] float32.
at::Tensor maps_dynamic(const Model& m, const Tokenizer& tok, const TokenizedRelation& r, int k);

// Pearson correlation of two equally shaped tensors (NaN when either is constant).
double pearson(const at::Tensor& a, const at::Tensor& b);

}  // namespace hs
