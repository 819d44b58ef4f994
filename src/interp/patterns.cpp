#include "patterns.h"

#include "errors.h"

#include <torch/torch.h>

#include <fmt/format.h>

namespace hs {

using namespace torch::indexing;

StripeSpec stripe_spec(StripeKind kind, int64_t n) {
    switch (kind) {
        case StripeKind::kInduction: return {n + 1, 2 * n, n - 1, -1};
        case StripeKind::kPreviousToken: return {1, 2 * n, 1, -1};
        case StripeKind::kDuplicateToken: return {n + 1, 2 * n, n, -1};
        case StripeKind::kAttentionSink: return {1, 2 * n, 0, 0};
        case StripeKind::kFirstToken: return {0, 2 * n, 0, 0};
    }
    return {};
}

static void check_rows(const at::Tensor& rows, const char* what) {
    if (rows.dim() != 4) throw DataError(fmt::format("{}: pattern rows must be [B, H, n, S], got {} dims", what, rows.dim()));
}

// The block's queries within [q_lo, q_hi]: [lo, hi) in block-local row indices.
static std::pair<int64_t, int64_t> local_range(const at::Tensor& rows, int64_t q0, int64_t q_lo, int64_t q_hi) {
    const int64_t n = rows.size(2);
    const int64_t lo = std::max<int64_t>(q_lo, q0), hi = std::min<int64_t>(q_hi + 1, q0 + n);
    return {lo - q0, std::max<int64_t>(lo, hi) - q0};
}

at::Tensor diagonal_sum_rows(const at::Tensor& rows, int64_t q0, int64_t q_lo, int64_t q_hi, int64_t back) {
    check_rows(rows, "diagonal stripe");
    auto [a, b] = local_range(rows, q0, q_lo, q_hi);
    auto zero = torch::zeros({rows.size(0), rows.size(1)}, rows.options().dtype(torch::kFloat));
    if (b <= a) return zero;
    if (q0 + a - back < 0 || q0 + b - 1 - back >= rows.size(3))
        throw DataError(fmt::format("diagonal stripe: keys {}..{} outside [0, {})", q0 + a - back, q0 + b - 1 - back, rows.size(3)));
    // Local row i holds query q0 + i, whose key is q0 + i - back: the diagonal with offset q0 - back.
    auto diag = rows.narrow(2, a, b - a).diagonal(q0 + a - back, 2, 3);  // [B, H, b - a]
    return diag.to(torch::kFloat).sum(-1);
}

at::Tensor column_sum_rows(const at::Tensor& rows, int64_t q0, int64_t q_lo, int64_t q_hi, int64_t column) {
    check_rows(rows, "column stripe");
    auto [a, b] = local_range(rows, q0, q_lo, q_hi);
    if (b <= a) return torch::zeros({rows.size(0), rows.size(1)}, rows.options().dtype(torch::kFloat));
    return rows.narrow(2, a, b - a).select(3, column).to(torch::kFloat).sum(-1);
}

at::Tensor stripe_sum_rows(const at::Tensor& rows, int64_t q0, const StripeSpec& s) {
    return s.column >= 0 ? column_sum_rows(rows, q0, s.q_lo, s.q_hi, s.column)
                         : diagonal_sum_rows(rows, q0, s.q_lo, s.q_hi, s.back);
}

at::Tensor pick_rows(const at::Tensor& rows, int64_t q0, const at::Tensor& qpos, const at::Tensor& kpos) {
    check_rows(rows, "pick");
    const int64_t B = rows.size(0), n = rows.size(2);
    auto qp = qpos.to(torch::kCPU, torch::kLong), kp = kpos.to(torch::kCPU, torch::kLong);
    auto out = torch::zeros({B, rows.size(1)}, rows.options().dtype(torch::kFloat));
    for (int64_t b = 0; b < B; ++b) {
        const int64_t q = qp[b].item<int64_t>() - q0;
        if (q < 0 || q >= n) continue;
        out[b].copy_(rows[b].select(1, q).select(1, kp[b].item<int64_t>()).to(torch::kFloat));
    }
    return out;
}

}  // namespace hs
