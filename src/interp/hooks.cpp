#include "hooks.h"

#include "errors.h"

#include <torch/torch.h>

namespace hs {

namespace {
const char* const kPointNames[kNumPoints] = {
    "resid_pre", "attn.q_pre_rope", "attn.q", "attn.k", "attn.v", "attn.scores", "attn.pattern", "attn.z",
    "attn.head_out", "attn_out", "resid_mid", "mlp_out", "resid_post"};
}

const char* point_name(Point p) { return kPointNames[static_cast<int>(p)]; }

std::vector<std::string> all_point_names() { return {std::begin(kPointNames), std::end(kPointNames)}; }

Point parse_point(const std::string& name) {
    for (int i = 0; i < kNumPoints; ++i)
        if (name == kPointNames[i]) return static_cast<Point>(i);
    std::string valid;
    for (auto* n : kPointNames) valid += std::string(valid.empty() ? "" : ", ") + n;
    throw ConfigError(fmt::format("unknown capture point '{}' (valid: {})", name, valid));
}

void Hooks::capture(Point p, CaptureFn fn, int layer) {
    entries_[static_cast<int>(p)].push_back({layer, std::move(fn), nullptr, nullptr});
}

void Hooks::capture_rows(Point p, RowCaptureFn fn, int layer) {
    if (p != Point::kAttnScores && p != Point::kAttnPattern)
        throw ConfigError(fmt::format("row-block capture is for attn.scores and attn.pattern, not {}", point_name(p)));
    entries_[static_cast<int>(p)].push_back({layer, nullptr, nullptr, std::move(fn)});
}

void Hooks::edit(Point p, EditFn fn, int layer) {
    entries_[static_cast<int>(p)].push_back({layer, nullptr, std::move(fn), nullptr});
}

void Hooks::intervene_z(const HeadIntervention& iv) { z_ivs_.push_back(iv); }
void Hooks::intervene_q(const HeadIntervention& iv) { q_ivs_.push_back(iv); }
void Hooks::intervene_q_pre_rope(const HeadIntervention& iv) { q_pre_ivs_.push_back(iv); }

void Hooks::window(const HeadWindow& w) {
    if (w.window.sink < 0) throw ConfigError(fmt::format("attention window: sink {} is negative", w.window.sink));
    if (w.window.from < 0) throw ConfigError(fmt::format("attention window: from {} is negative", w.window.from));
    if (w.window.recent < 1)
        throw ConfigError(fmt::format("attention window: recent {} must be at least 1 (the query sees itself)", w.window.recent));
    if (w.window.block < 1) throw ConfigError(fmt::format("attention window: block {} must be at least 1", w.window.block));
    if (w.window.block > 1 && w.window.compensate)
        throw ConfigError(fmt::format("attention window: a block window (block {}) does not compensate", w.window.block));
    windows_.push_back(w);
}

void Hooks::keep(const HeadKeep& k) {
    if (k.from < 1) throw ConfigError(fmt::format("kept positions: the prompt length {} must be at least 1", k.from));
    if (!k.keep.defined() || k.keep.dim() != 2 || k.keep.size(1) != k.from)
        throw ConfigError(fmt::format("kept positions: the keep mask must be [heads, {}]", k.from));
    keeps_.push_back(k);
}

bool Hooks::has_keeps(int layer) const {
    for (const auto& k : keeps_)
        if (k.layer == layer) return true;
    return false;
}

LayerKeeps Hooks::keeps(int layer, int64_t B, int64_t H, c10::Device device) const {
    using namespace torch::indexing;
    LayerKeeps lk;
    if (!has_keeps(layer)) return lk;
    int64_t F = 0;
    for (const auto& k : keeps_)
        if (k.layer == layer) F = std::max(F, k.from);
    auto vis = torch::ones({B, H, F}, torch::kBool);
    auto from = torch::zeros({B}, torch::kLong);
    auto comp = torch::zeros({B, H}, torch::kBool);
    std::vector<char> taken(static_cast<size_t>(B), 0);
    for (const auto& k : keeps_) {
        if (k.layer != layer) continue;
        if (k.keep.size(0) != H) throw ConfigError(fmt::format("kept positions: the keep mask has {} heads, expected {}", k.keep.size(0), H));
        if (k.row >= B) throw ConfigError(fmt::format("kept positions: row {} out of range [0, {})", k.row, B));
        const int64_t r0 = k.row < 0 ? 0 : k.row, r1 = k.row < 0 ? B : k.row + 1;
        for (int64_t r = r0; r < r1; ++r) {
            if (taken[static_cast<size_t>(r)]) throw ConfigError(fmt::format("kept positions: two keeps on row {} of layer {}", r, layer));
            taken[static_cast<size_t>(r)] = 1;
            vis.index_put_({r, Slice(), Slice(0, k.from)}, k.keep.to(torch::kCPU).to(torch::kBool));
            from[r] = k.from;
            comp[r].fill_(k.compensate);
        }
    }
    lk.max_from = F;
    lk.any_compensate = comp.any().item<bool>();
    lk.visible = vis.to(device);
    lk.from = from.to(device);
    lk.compensate = comp.to(device);
    return lk;
}

void Hooks::clear() {
    for (auto& e : entries_) e.clear();
    z_ivs_.clear();
    q_ivs_.clear();
    q_pre_ivs_.clear();
    windows_.clear();
    keeps_.clear();
}

bool Hooks::wants(Point p, int layer) const {
    for (const auto& e : entries_[static_cast<int>(p)])
        if (e.layer < 0 || e.layer == layer) return true;
    return false;
}

bool Hooks::touches(int layer) const {
    for (int p = 0; p < kNumPoints; ++p)
        if (wants(static_cast<Point>(p), layer)) return true;
    return has_z_interventions(layer) || has_q_interventions(layer) || has_q_pre_rope_interventions(layer) ||
           has_windows(layer) || has_keeps(layer);
}

bool Hooks::needs_whole(Point p, int layer) const {
    for (const auto& e : entries_[static_cast<int>(p)])
        if ((e.layer < 0 || e.layer == layer) && !e.rows) return true;
    return false;
}

bool Hooks::has_row_specific_interventions() const {
    for (const auto* v : {&z_ivs_, &q_ivs_, &q_pre_ivs_})
        for (const auto& iv : *v)
            if (iv.row >= 0) return true;
    for (const auto& w : windows_)
        if (w.row >= 0 || w.rows_heads.defined()) return true;
    for (const auto& k : keeps_)
        if (k.row >= 0) return true;
    return false;
}

static bool any_for_layer(const std::vector<HeadIntervention>& v, int layer) {
    for (const auto& iv : v)
        if (iv.layer == layer) return true;
    return false;
}

bool Hooks::has_z_interventions(int layer) const { return any_for_layer(z_ivs_, layer); }
bool Hooks::has_q_interventions(int layer) const { return any_for_layer(q_ivs_, layer); }
bool Hooks::has_q_pre_rope_interventions(int layer) const { return any_for_layer(q_pre_ivs_, layer); }

bool Hooks::has_windows(int layer) const {
    for (const auto& w : windows_)
        if (w.layer == layer) return true;
    return false;
}

LayerWindows Hooks::windows(int layer, int64_t B, int64_t H, c10::Device device) const {
    using namespace torch::indexing;
    LayerWindows lw;
    if (!has_windows(layer)) return lw;
    auto sink = torch::zeros({B, H}, torch::kLong), recent = torch::full({B, H}, LayerWindows::kNoWindow, torch::kLong);
    auto comp = torch::zeros({B, H}, torch::kBool);
    auto from = torch::zeros({B, H}, torch::kLong);
    auto block = torch::ones({B, H}, torch::kLong);
    for (const auto& w : windows_) {
        if (w.layer != layer) continue;
        at::Tensor where;  // [B, H] bool
        if (w.rows_heads.defined()) {
            if (w.rows_heads.dim() != 2 || w.rows_heads.size(0) != B || w.rows_heads.size(1) != H)
                throw ConfigError(fmt::format("attention window: the (row, head) mask has {} dims ({} elements), expected [{}, {}]",
                                              w.rows_heads.dim(), w.rows_heads.numel(), B, H));
            where = w.rows_heads.to(torch::kCPU).ne(0);
        } else {
            if (w.head < 0 || w.head >= H)
                throw ConfigError(fmt::format("attention window: head {} out of range [0, {})", w.head, H));
            if (w.row >= B) throw ConfigError(fmt::format("attention window: row {} out of range [0, {})", w.row, B));
            where = torch::zeros({B, H}, torch::kBool);
            where.index_put_({w.row < 0 ? Slice() : Slice(w.row, w.row + 1), w.head}, true);
        }
        // A block window in token terms (LayerWindows): whole sink blocks, and the recent blocks
        // before the query's own as (ceil(recent / b) - 1) b + 1, the query's place in its block added
        // where the mask is built.
        const int64_t b = w.window.block, sink_blocks = (w.window.sink + b - 1) / b, recent_blocks = (w.window.recent + b - 1) / b;
        sink.masked_fill_(where, sink_blocks * b);
        recent.masked_fill_(where, (recent_blocks - 1) * b + 1);
        comp.masked_fill_(where, w.window.compensate);
        from.masked_fill_(where, w.window.from);
        block.masked_fill_(where, b);
    }
    lw.any_compensate = comp.any().item<bool>();
    lw.any_from = from.gt(0).any().item<bool>();
    lw.any_block = block.gt(1).any().item<bool>();
    lw.block = block.to(device);
    lw.from = from.to(device);
    lw.sink = sink.to(device);
    lw.recent = recent.to(device);
    lw.compensate = comp.to(device);
    return lw;
}

at::Tensor Hooks::run(Point p, int layer, at::Tensor x) const {
    for (const auto& e : entries_[static_cast<int>(p)]) {
        if (e.layer >= 0 && e.layer != layer) continue;
        if (e.edit) {
            auto r = e.edit(layer, x);
            if (r) {
                if (r->sizes() != x.sizes())
                    throw ConfigError(fmt::format("edit at {} layer {} changed the shape", point_name(p), layer));
                x = r->to(x.dtype());
            }
        } else if (e.rows) {
            e.rows(layer, 0, x);
        } else {
            e.capture(layer, x);
        }
    }
    return x;
}

void Hooks::run_rows(Point p, int layer, int64_t q0, const at::Tensor& rows) const {
    for (const auto& e : entries_[static_cast<int>(p)])
        if ((e.layer < 0 || e.layer == layer) && e.rows) e.rows(layer, q0, rows);
}

// x [B, T, H, d]; returns a modified copy with every intervention for `layer` applied in order.
static at::Tensor apply_heads(const std::vector<HeadIntervention>& ivs, int layer, const at::Tensor& x0,
                              const char* what) {
    using namespace torch::indexing;
    at::Tensor x;
    const int64_t B = x0.size(0), T = x0.size(1), H = x0.size(2);
    for (const auto& iv : ivs) {
        if (iv.layer != layer) continue;
        if (iv.head < 0 || iv.head >= H)
            throw ConfigError(fmt::format("{} intervention: head {} out of range [0, {})", what, iv.head, H));
        if (iv.row >= B) throw ConfigError(fmt::format("{} intervention: row {} out of range [0, {})", what, iv.row, B));
        if (!x.defined()) x = x0.clone();
        auto rows = iv.row < 0 ? Slice() : Slice(iv.row, iv.row + 1);
        auto slot = x.index({rows, Slice(), iv.head});  // [b, T, d]
        switch (iv.op) {
            case HeadOp::kZero: slot.zero_(); break;
            case HeadOp::kScale: slot.mul_(iv.scale); break;
            case HeadOp::kReplace: {
                auto v = iv.value.to(x.device(), x.scalar_type());
                // [d] -> every position; [T, d] -> per position (the first T rows of a longer value).
                if (v.dim() == 2 && v.size(0) > T) v = v.index({Slice(v.size(0) - T, None)});
                slot.copy_(v.dim() == 1 ? v.view({1, 1, -1}).expand_as(slot) : v.unsqueeze(0).expand_as(slot));
                break;
            }
            case HeadOp::kAddPeer: {
                if (iv.row < 0 || iv.peer < 0 || iv.peer >= B || iv.peer == iv.row)
                    throw ConfigError(fmt::format("{} intervention: peer row {} of row {} (batch of {})", what, iv.peer,
                                                  iv.row, B));
                slot.add_(x0.index({Slice(iv.peer, iv.peer + 1), Slice(), iv.head}), iv.scale);
                break;
            }
        }
    }
    return x.defined() ? x : x0;
}

at::Tensor Hooks::apply_z(int layer, const at::Tensor& z) const { return apply_heads(z_ivs_, layer, z, "z"); }
at::Tensor Hooks::apply_q(int layer, const at::Tensor& q) const { return apply_heads(q_ivs_, layer, q, "query"); }
at::Tensor Hooks::apply_q_pre_rope(int layer, const at::Tensor& q) const {
    return apply_heads(q_pre_ivs_, layer, q, "pre-RoPE query");
}

}  // namespace hs
