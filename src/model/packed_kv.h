// A compressed KV cache: the entries a KV-cache policy keeps of a prompt's cache, packed per (row,
// layer, cache head) with ragged lengths, and the tokens decoded after them appended to every head
// (docs/forward.md "Compressed caches"). KVCache::packed holds one; blocks::attention reads it.
//
// Layout: per layer one flat buffer of keys and one of values, [N, d] in the model's dtype, and the
// entries' absolute positions [N] int64 (-1: RazorAttention's mean token, seen by every later query).
// A segment is one cache head of one row: entries [off, off + len) of the layer's buffers, with room
// up to cap for the tokens still to be decoded, read by the query heads [h0, h0 + nh): a KV head's
// whole group (its entries shared by its g query heads, as Ada-KV, RazorAttention and DuoAttention
// keep them) or one query head (SnapKV and HeadKV select per query head after repeat_kv, so their
// cache holds H heads). Nothing is padded: a layer's bytes are its segments' entries and room.
//
// A decode step's attention over it (packed_attention) appends the step's keys and values to every
// segment, then runs each segment's queries against that segment's entries alone: the softmax over
// the kept keys, the same set of keys the masked model (Hooks::keep, StreamWindow::from) shows.
#pragma once

#include "model.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace hs {

struct PackedSegment {
    int64_t row = 0, kv_head = 0;  // whose keys and values it holds (the appended ones too)
    int64_t h0 = 0, nh = 1;        // the query heads reading it
    int64_t off = 0, len = 0, cap = 0;
    // A window sliding with the query (DuoAttention's streaming heads): the query at p sees the
    // entries at positions < sink or > p - recent. recent 0: no window.
    int64_t sink = 0, recent = 0;
};

struct PackedLayer {
    at::Tensor k, v;  // [N, d]
    at::Tensor pos;   // [N] int64, on the buffers' device
    int64_t length = 0;  // absolute positions this layer has cached (the next token's position)
    std::vector<PackedSegment> segs;
};

struct PackedKV {
    std::vector<PackedLayer> layers;
    // The allocated bytes of every layer's buffers (keys, values, positions): the cache's memory.
    int64_t bytes() const;
};

int64_t packed_length(const PackedKV& p);
std::shared_ptr<PackedKV> clone_packed(const PackedKV& p);

// What one batch row of a whole cache keeps when it is packed (a KV-cache policy's decision,
// probes/needle/kv). Every row's compression point is the cache's length F.
struct PackRow {
    at::Tensor keep;              // [L, H, F] bool: the positions each query head keeps (undefined: all)
    bool per_query_head = false;  // one segment a query head; else a KV head's, whose query heads' keep
                                  // rows must agree (HS_REQUIRE)
    bool compensate = false;      // + one entry a segment, the means of its dropped keys and values
    at::Tensor window;            // [L, H] bool: heads keeping [0, sink) and the last recent - 1 positions,
                                  // their window sliding with the query (StreamWindow: recent counts the query)
    int64_t sink = 0, recent = 0;
};

// The whole cache `full` (rows [B, F, K, d] a layer, F = full.length()) packed row by row as `rows`
// say (one PackRow a row), each segment with room for `room` more tokens. The entries keep their
// order (ascending position; the mean token first).
std::shared_ptr<PackedKV> pack_kv_cache(const ModelConfig& cfg, const KVCache& full, const std::vector<PackRow>& rows,
                                        int64_t room);

// One layer's attention over the packed cache: appends k_new, v_new [B, T, K, d] (positions
// length .. length + T - 1) to every segment of the layer, then z [B, T, H, d] (before W_O) of the
// queries q [B, T, H, d] (after RoPE): scaled, soft-capped scores, causal, the layer's sliding window
// and each segment's window applied by position, softmax in float32.
at::Tensor packed_attention(const ModelConfig& cfg, int layer, PackedKV& p, const at::Tensor& q, const at::Tensor& k_new,
                            const at::Tensor& v_new);

}  // namespace hs
