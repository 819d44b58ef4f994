// QRHead's calibrated query attention and its span and document scores (see qrhead.h).
#include "qrhead.h"

#include "errors.h"
#include "hooks.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

namespace hs {

using torch::indexing::Slice;

const char* const kQrheadNullQuery = "N/A";

KVCache qrhead_prefill(const Model& m, const std::vector<int64_t>& tokens, int64_t n, int64_t chunk) {
    torch::NoGradGuard ng;
    HS_REQUIRE(n >= 0 && n <= static_cast<int64_t>(tokens.size()), "qrhead_prefill: n outside the prompt");
    KVCache cache;
    if (n == 0) return cache;
    cache.reserve(n);
    const auto ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.begin() + n), torch::kLong)
                         .view({1, n})
                         .to(m.options.device);
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    const int64_t c = std::max<int64_t>(1, chunk);
    for (int64_t p0 = 0; p0 < n; p0 += c) m.forward(ids.index({Slice(), Slice(p0, std::min(n, p0 + c))}), nullptr, &cache, no_logits);
    return cache;
}

at::Tensor qrhead_query_rows(const Model& m, const KVCache& prefix, const std::vector<int64_t>& query) {
    torch::NoGradGuard ng;
    const int L = m.config.n_layers;
    const int64_t Q = static_cast<int64_t>(query.size());
    HS_REQUIRE(Q > 0, "qrhead_query_rows: no query token");
    KVCache cache = prefix;  // a copy: its appends go to buffers of its own
    const int64_t S = cache.length() + Q;
    std::vector<at::Tensor> sum(static_cast<size_t>(L));
    Hooks hooks;
    // Rows [q0, q0 + r) of layer l's [1, H, Q, S] pattern: their sum over the query rows, in double.
    hooks.capture_rows(Point::kAttnPattern, [&sum](int l, int64_t, const at::Tensor& rows) {
        auto part = rows[0].to(torch::kDouble).sum(1);  // [H, S]
        auto& acc = sum[static_cast<size_t>(l)];
        acc = acc.defined() ? acc + part : part;
    });
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    m.forward(torch::tensor(query, torch::kLong).view({1, Q}).to(m.options.device), &hooks, &cache, no_logits);
    std::vector<at::Tensor> out;
    for (int l = 0; l < L; ++l) {
        HS_REQUIRE(sum[static_cast<size_t>(l)].defined() && sum[static_cast<size_t>(l)].size(1) == S,
                   "qrhead_query_rows: a layer's pattern was not seen whole");
        out.push_back((sum[static_cast<size_t>(l)] / static_cast<double>(Q)).to(torch::kCPU));
    }
    return torch::stack(out);  // [L, H, S]
}

at::Tensor qrhead_calibrated(const Model& m, const KVCache& prefix, const std::vector<int64_t>& query,
                             const std::vector<int64_t>& null_query) {
    const auto a = qrhead_query_rows(m, prefix, query);
    const auto b = qrhead_query_rows(m, prefix, null_query);
    const int64_t n = std::min(a.size(2), b.size(2));  // min_length (line 216)
    return a.narrow(2, 0, n) - b.narrow(2, 0, n);
}

// x [..., n]: the values above mean - 2 std (unbiased) summed over the last dimension (lines 244-247,
// 304-311; a NaN threshold keeps nothing, as `>` against NaN is false).
static at::Tensor thresholded_sum(const at::Tensor& x) {
    const auto mean = x.mean(-1, true);
    const auto sd = x.size(-1) > 1 ? x.std(-1, /*unbiased=*/true, /*keepdim=*/true)
                                   : torch::full_like(mean, std::numeric_limits<double>::quiet_NaN());
    const auto keep = x > (mean - 2 * sd);
    return x.masked_fill(keep.logical_not(), 0.0).sum(-1);
}

at::Tensor qrhead_span_scores(const at::Tensor& cal, int64_t start, int64_t end) {
    if (start < 0 || end <= start || end > cal.size(2))
        return torch::full({cal.size(0), cal.size(1)}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble);
    return thresholded_sum(cal.narrow(2, start, end - start).to(torch::kDouble));
}

std::vector<double> qrhead_doc_scores(const at::Tensor& cal, const std::vector<Head>& heads,
                                      const std::vector<std::pair<int64_t, int64_t>>& spans) {
    HS_REQUIRE(!heads.empty(), "qrhead_doc_scores: no head");
    auto per_token = torch::zeros({cal.size(2)}, torch::kDouble);
    for (auto [l, h] : heads) per_token += cal[l][h].to(torch::kDouble);  // per_token_scores_CAL[layers, heads].sum(0)
    std::vector<double> out;
    for (auto [s, e] : spans) {
        HS_REQUIRE(s >= 0 && e > s && e <= per_token.size(0), "qrhead_doc_scores: a span outside the prompt");
        out.push_back(thresholded_sum(per_token.narrow(0, s, e - s)).item<double>());
    }
    return out;
}

}  // namespace hs
