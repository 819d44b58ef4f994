#include "weight_circuits.h"

#include "blocks.h"
#include "errors.h"
#include "tokenizer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

namespace hs {

using namespace torch::indexing;


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
    auto y = blocks::mlp(m.config, lw, mlp_input(m, layer, x).to(m.options.dtype), false);
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

}  // namespace hs
