// Heads: one vocabulary for naming, parsing, ranking and drawing attention heads, and for reading
// a per-head score [L, H] from a result file. The ablation engine (probes/ablation), the needle
// harness (probes/needle), the toy trainer and every command that names heads use these, so a new
// feature (streaming windows, patching, gates) names, ranks and draws heads the same way.
//
// Errors are neutral: they name the value and what was expected, never a flag or a YAML key;
// the caller says where the value came from (tools/ prefix the flag, the YAML layer its mark).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hs {

// (layer, head), 0-based; query heads (with GQA, query head h reads key/value head h / (H / K)).
using Head = std::pair<int, int>;

std::string format_head(int layer, int head);           // "L1H3"
std::string format_heads(const std::vector<Head>& hs);  // "L1H0,L1H3" (empty for none)
// "L<digits>H<digits>" (at most 6 digits each), nothing else; false otherwise.
bool parse_head_name(const std::string& s, int& layer, int& head);
// "L1H0, L2H3" -> heads in the given order, duplicates dropped. UsageError naming the bad entry,
// a head outside the model, or an empty list.
std::vector<Head> parse_head_list(const std::string& s, int L, int H);

// Flat head indices (l * H + h) of an [L, H] score ranked best first: descending (top) or
// ascending (bottom); NaN last either way; ties keep (layer, head) order.
std::vector<int64_t> rank_heads(const at::Tensor& score, bool descending = true);
// The first k of rank_heads(score, true) as heads.
std::vector<Head> top_heads(const at::Tensor& score, int64_t k);

// Random control sets. Two seeding schemes exist, both kept so that recorded control sets
// reproduce bit for bit:
// - random_head_sets (the needle harness, `headscope retrieval`): ONE std::mt19937_64(seed) for
//   all n_sets; each set is a partial Fisher-Yates draw (uniform_int_distribution) of |exclude|
//   heads from the heads NOT in `exclude`, returned sorted; a set drawn before is drawn again, so
//   the sets are distinct. When the pool holds no more than n_sets distinct sets, all of them are
//   returned (fewer than asked, in combination order) and *possible says how many exist
//   (min(C(pool, k), n_sets + 1)). UsageError when too few heads remain.
// - random_subset (YAML studies, `headscope run`): one std::mt19937_64(seed) per set; the pool is
//   std::shuffle'd and its first k entries are the set (in shuffled order).
std::vector<std::vector<Head>> random_head_sets(int L, int H, const std::vector<Head>& exclude, int64_t n_sets,
                                                uint64_t seed, int64_t* possible = nullptr);
std::vector<int64_t> random_subset(const std::vector<int64_t>& pool, int64_t k, uint64_t seed);

// A score [L, H] read from a result file, named "FILE.h5:DATASET" (split at the last ".h5:", else
// the last ':'; DATASET with or without its leading '/'). Errors: UsageError for a spec without
// both parts, a missing dataset, a group, or a shape other than [L, H] (message "FILE has no
// dataset D" / "FILE:D is [shape], expected [L, H] (this model's layers x heads)"); StorageError
// from the reader for an unreadable file.
struct HeadScoreRef {
    std::string file, dataset;  // dataset with its leading '/'
};
HeadScoreRef split_head_score_ref(const std::string& spec);
at::Tensor read_head_score(const HeadScoreRef& ref, int L, int H);  // [L, H] float64, CPU

}  // namespace hs
