#include "razor.h"

#include "attention_detectors.h"
#include "errors.h"
#include "hooks.h"
#include "patterns.h"
#include "progress.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>

namespace hs {

namespace {

constexpr int64_t kPaperTokens = 2500;  // RazorAttention's |R| (and 4 repeats)

void check_settings(const Model& m, const RazorSettings& s) {
    if (s.repeats < 2) throw UsageError(fmt::format("{} repeats: need at least 2", s.repeats), "repeats");
    if (s.n_tokens < 0 || s.n_tokens == 1)
        throw UsageError(fmt::format("|R| = {}: need at least 2 (0 = the longest that fits)", s.n_tokens), "n_tokens");
    if (s.n_sequences < 1) throw UsageError(fmt::format("{} sequences: need at least 1", s.n_sequences), "n_sequences");
    if (s.max_rows < 1) throw UsageError(fmt::format("{} rows per forward: need at least 1", s.max_rows), "max_rows");
    for (auto [v, name] : {std::pair{s.echo_share, "echo_share"}, std::pair{s.induction_share, "induction_share"}})
        if (!(v >= 0.0 && v <= 1.0)) throw UsageError(fmt::format("share {}: need a fraction in [0, 1]", v), name);
    if (s.echo_share + s.induction_share <= 0.0)
        throw UsageError("echo and induction shares are both 0: nothing would be kept", "echo_share");
    const int64_t ctx = m.config.max_seq_len;
    if (s.n_tokens > 0 && s.n_tokens > (ctx - 1) / s.repeats)  // 1 + repeats * n > context, without overflow
        throw DataError(fmt::format("|R| = {} repeated {} times after BOS is {} tokens, more than the model's context of {}",
                                    s.n_tokens, s.repeats, 1.0 + static_cast<double>(s.n_tokens) * s.repeats, ctx),
                        "n_tokens");
}

int64_t resolved_tokens(const Model& m, const RazorSettings& s) {
    if (s.n_tokens > 0) return s.n_tokens;
    const int64_t fit = std::min(kPaperTokens, (m.config.max_seq_len - 1) / s.repeats);
    if (fit < 2)
        throw DataError(fmt::format("{} repeats of at least 2 tokens do not fit the model's context of {}", s.repeats,
                                    m.config.max_seq_len),
                        "repeats");
    return fit;
}

// [B, 1 + repeats * n]: the BOS and first R of repeated_random_tokens (the stripe convention's
// drawing: same pool, same generator), R repeated.
at::Tensor razor_tokens(const Model& m, const RazorSettings& s, int64_t n, const Tokenizer* tok) {
    StripeInput in;
    in.seq_len = n, in.batch = s.n_sequences, in.seed = static_cast<int64_t>(s.seed);
    in.token_lo = s.token_lo, in.token_hi = s.token_hi;
    auto two = repeated_random_tokens(m, in, tok);  // [B, 1 + 2n]
    return torch::cat({two.narrow(1, 0, 1), two.narrow(1, 1, n).repeat({1, s.repeats})}, 1);
}

// Adds each query block's share of layer l's echo and induction sums to echo/ind[row0 + b, l].
RowCaptureFn razor_capture(int64_t n, int64_t repeats, at::Tensor& echo, at::Tensor& ind, int64_t row0) {
    return [n, repeats, &echo, &ind, row0](int l, int64_t q0, const at::Tensor& p) {  // p [b, H, rows, S]
        const int64_t q_hi = repeats * n;
        auto e = torch::zeros({p.size(0), p.size(1)});
        auto i = torch::zeros({p.size(0), p.size(1)});
        for (int64_t j = 1; j < repeats; ++j) {  // the copy j repeats back: key q - j n (echo), q - j n + 1 (induction)
            e += diagonal_sum_rows(p, q0, j * n + 1, q_hi, j * n).cpu();
            i += diagonal_sum_rows(p, q0, j * n + 1, q_hi, j * n - 1).cpu();
        }
        const double count = static_cast<double>((repeats - 1) * n);
        echo.narrow(0, row0, p.size(0)).select(1, l).add_(e / count);
        ind.narrow(0, row0, p.size(0)).select(1, l).add_(i / count);
    };
}

// [L, H] -> ranks [L * K] of the KV groups' maxima: how many groups score strictly higher.
at::Tensor group_ranks(const at::Tensor& x, int64_t K) {
    auto grp = std::get<0>(x.to(torch::kDouble).reshape({x.size(0), K, -1}).max(2)).flatten();  // [N]
    return (grp.unsqueeze(0) > grp.unsqueeze(1)).sum(1).to(torch::kDouble);  // [N]: row i counts j with grp_j > grp_i
}

}  // namespace

at::Tensor razor_combine(const at::Tensor& echo, const at::Tensor& induction, int64_t n_kv_heads, double echo_share,
                         double induction_share) {
    HS_REQUIRE(echo.dim() == 2 && echo.sizes() == induction.sizes(), "echo and induction must both be [L, H]");
    HS_REQUIRE(n_kv_heads > 0 && echo.size(1) % n_kv_heads == 0, "heads must split into KV groups");
    const int64_t L = echo.size(0), H = echo.size(1), g = H / n_kv_heads;
    const double N = static_cast<double>(L * n_kv_heads);
    auto e = N * echo_share / (group_ranks(echo.cpu(), n_kv_heads) + 1.0);       // [N]
    auto i = N * induction_share / (group_ranks(induction.cpu(), n_kv_heads) + 1.0);
    auto grp = torch::max(e, i).view({L, n_kv_heads});                          // [L, K]
    return grp.repeat_interleave(g, 1).to(torch::kFloat);                      // [L, H]: head h gets group h / g
}

RazorScores razor_scores(const Model& m, const RazorSettings& s, const Tokenizer* tok) {
    check_settings(m, s);
    const int64_t n = resolved_tokens(m, s);
    const int64_t B = s.n_sequences, L = m.config.n_layers, H = m.config.n_heads;
    RazorScores out;
    out.n_tokens = n;
    out.tokens = razor_tokens(m, s, n, tok);
    auto echo = torch::zeros({B, L, H}), ind = torch::zeros({B, L, H});  // [N, L, H]
    torch::NoGradGuard ng;
    ForwardOptions fo;
    fo.compute_logits = false;
    Progress prog("razor echo/induction scores", (B + s.max_rows - 1) / s.max_rows);
    for (int64_t r0 = 0; r0 < B; r0 += s.max_rows) {
        const int64_t rows = std::min(s.max_rows, B - r0);
        Hooks hooks;
        hooks.capture_rows(Point::kAttnPattern, razor_capture(n, s.repeats, echo, ind, r0));
        m.forward(out.tokens.narrow(0, r0, rows).to(m.options.device), &hooks, nullptr, fo);
        prog.tick();
    }
    prog.finish();
    out.echo = echo.mean(0);
    out.induction = ind.mean(0);
    out.score = razor_combine(out.echo, out.induction, m.config.n_kv_heads, s.echo_share, s.induction_share);
    return out;
}

at::Tensor razor_head_score(const Model& m, const RazorSettings& s, const Tokenizer* tok) {
    return razor_scores(m, s, tok).score;
}

}  // namespace hs
