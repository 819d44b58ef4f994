// The one vocabulary of head interventions: what is done to a head's activation, and where.
// `headscope run` / `ablate` (YAML `mode:`), `headscope retrieval --ablation`, the toy trainer's
// checks and every later experiment name interventions from this table, so a name means one thing.
//
//   name        acts on                         the head's activation becomes
//   zero        attn.z (before W_O)             0
//   mean        attn.z                          the mean over a reference dataset
//   resample    attn.z                          another row's activation (a reference row)
//   scale       attn.z                          factor x itself
//   zero-query  attn.q (after RoPE)             0: uniform attention over the visible keys
//   mean-query  attn.q (YAML studies: after RoPE, per position or pooled)
//               attn.q_pre_rope (retrieval: LOCOS's pre-RoPE mean, rotated at each position)
//   stream      the attention mask (keys)       its attention over a window: the first `sink` keys and
//                                               the last `recent` up to the query (StreamWindow;
//                                               DuoAttention's streaming heads, RazorAttention's
//                                               compensation token as an option)
//
// Two appliers read this table: Hooks::intervene_z / intervene_q / intervene_q_pre_rope take one
// head (one batch row or all), used by the needle harness, the trainer and the detectors
// (`HeadSet` in probes/needle.h); the ablation engine applies a whole configuration per batch row as
// one [B, 1, H, 1] mask on the same point (probes/ablation.cpp, add_edits), which is the batched
// form of the same operation. Stream is applied inside the attention (Hooks::window, one head or a
// [B, H] mask of (row, head) pairs): docs/forward.md, "Attention windows".
#pragma once

#include "names.h"

#include <algorithm>
#include <string>
#include <vector>

namespace hs {

enum class Intervention { kNone, kZero, kMean, kResample, kScale, kZeroQuery, kMeanQuery, kStream };

// kStream's parameters: query position q of the head sees keys [0, sink) and (q - recent, q]
// (on a sliding-window layer only those its window shows too); with `compensate`, one more key
// and value, the means of the keys and values it no longer sees (RazorAttention).
struct StreamWindow {
    int64_t sink = 4;
    int64_t recent = 64;
    bool compensate = false;
};

// Every intervention a user can name, in the order help texts and messages list them.
const NameTable<Intervention>& intervention_names();
const char* intervention_name(Intervention i);  // "none" for kNone
// `s` as one of `allowed` (all of them when empty). UsageError "WHAT 's': expected a, b or c".
Intervention parse_intervention(const std::string& s, const std::string& what = "mode",
                                const std::vector<Intervention>& allowed = {});
std::vector<std::string> intervention_name_list(const std::vector<Intervention>& allowed = {});

// Acts on the query (zero-query, mean-query) rather than on z.
bool on_query(Intervention i);
// Needs a clean reference run (mean, mean-query, resample).
bool needs_reference(Intervention i);

// ---- definitions (header-only: small, and shared by src/, probes/ and tools/)

inline const NameTable<Intervention>& intervention_names() {
    static const NameTable<Intervention> t = {
        {Intervention::kZero, "zero"},           {Intervention::kMean, "mean"},
        {Intervention::kResample, "resample"},   {Intervention::kScale, "scale"},
        {Intervention::kZeroQuery, "zero-query"}, {Intervention::kMeanQuery, "mean-query"},
        {Intervention::kStream, "stream"},
    };
    return t;
}

inline const char* intervention_name(Intervention i) { return i == Intervention::kNone ? "none" : name_in(intervention_names(), i); }

inline std::vector<std::string> intervention_name_list(const std::vector<Intervention>& allowed) {
    if (allowed.empty()) return names_in(intervention_names());
    std::vector<std::string> out;
    for (auto a : allowed) out.emplace_back(intervention_name(a));
    return out;
}

inline Intervention parse_intervention(const std::string& s, const std::string& what, const std::vector<Intervention>& allowed) {
    const auto found = find_in(intervention_names(), s);
    bool ok = found.has_value();
    if (ok && !allowed.empty()) ok = std::find(allowed.begin(), allowed.end(), *found) != allowed.end();
    if (!ok) throw UsageError(what + " '" + s + "': expected " + or_list(intervention_name_list(allowed)));
    return *found;
}

inline bool on_query(Intervention i) { return i == Intervention::kZeroQuery || i == Intervention::kMeanQuery; }

inline bool needs_reference(Intervention i) {
    return i == Intervention::kMean || i == Intervention::kMeanQuery || i == Intervention::kResample;
}

}  // namespace hs
