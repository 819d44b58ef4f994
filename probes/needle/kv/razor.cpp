#include "razor.h"

#include "attention_detectors.h"
#include "errors.h"
#include "hooks.h"
#include "patterns.h"
#include "progress.h"
#include "tokenizer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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

// ---- The reference code's scoring and selection ----

namespace {

constexpr int64_t kRefLo = 10000, kRefHi = 12501;  // secrets_gen.randint(10000, 12500): inclusive
constexpr double kRefFutureMask = -1e-5;            // attention_wrappers.py:96: triu(ones) * -1e-5

// [lo, hi) of the reference preset's ids (razor.h, RazorSettings::token_lo).
std::pair<int64_t, int64_t> reference_token_range(const Model& m, const RazorSettings& s) {
    const int64_t V = m.config.vocab_size;
    if (s.token_lo >= 0 || s.token_hi >= 0) {
        const int64_t lo = s.token_lo < 0 ? 0 : s.token_lo, hi = s.token_hi < 0 ? V : s.token_hi;
        if (lo >= hi || hi > V)
            throw UsageError(fmt::format("token range {},{}: need 0 <= lo < hi <= vocab size {}", lo, hi, V), "token_range");
        return {lo, hi};
    }
    if (V > kRefLo) return {kRefLo, std::min(kRefHi, V)};
    return {std::max<int64_t>(0, V - (kRefHi - kRefLo)), V};
}

// [B, 1 + repeats n]: BOS, then R (i.i.d. uniform over [lo, hi), CPU generator seeded with s.seed) repeated.
at::Tensor reference_tokens(const Model& m, const RazorSettings& s, int64_t n, const Tokenizer* tok) {
    int64_t bos = m.config.bos_id;
    if (bos < 0 && tok && tok->bos_id()) bos = *tok->bos_id();
    if (bos < 0) throw ConfigError(fmt::format("{}: no BOS token id known (config or tokenizer)", m.path));
    const auto [lo, hi] = reference_token_range(m, s);
    auto gen = at::detail::createCPUGenerator(s.seed);
    auto r = at::randint(lo, hi, {s.n_sequences, n}, gen, torch::TensorOptions().dtype(torch::kLong));
    return torch::cat({torch::full({s.n_sequences, 1}, bos, torch::kLong), r.repeat({1, s.repeats})}, 1);
}

// One row block [r0, r1) of a layer's mask sums: P [H, rows, S] float32; adds to echo / ind [H] float64.
void add_block_sums(const at::Tensor& p, int64_t r0, int64_t n, at::Tensor& echo, at::Tensor& ind) {
    const int64_t H = p.size(0), R = p.size(1), S = p.size(2), T = (S - 1) / n;  // T: the most entries in a row
    auto lopt = torch::TensorOptions().dtype(torch::kLong).device(p.device());
    auto rows = torch::arange(r0, r0 + R, lopt).unsqueeze(1);  // [R, 1]
    auto t = torch::arange(T, lopt).unsqueeze(0);               // [1, T]
    auto valid = t < rows.div(n, "floor");                       // range(i % n, i, n) has i // n entries
    auto j = torch::where(valid, rows.remainder(n) + t * n, torch::zeros_like(t));  // [R, T]: key columns
    auto vmask = valid.to(torch::kDouble).unsqueeze(0);         // [1, R, T]
    auto gather = [&](const at::Tensor& cols) {
        return (p.gather(2, cols.unsqueeze(0).expand({H, R, T})).to(torch::kDouble) * vmask).sum({1, 2}).cpu();
    };
    echo += gather(j);
    ind += gather(torch::where(valid, j + 1, torch::zeros_like(j)));  // j + 1 <= i - n + 1 < S
}

}  // namespace

std::pair<at::Tensor, at::Tensor> razor_reference_layer(const at::Tensor& q, const at::Tensor& k, int64_t n, double scale,
                                                        int64_t block_elems) {
    HS_REQUIRE(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2),
               "razor_reference_layer: q [S, H, d] and k [S, K, d]");
    HS_REQUIRE(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "razor_reference_layer: H must be a multiple of K");
    HS_REQUIRE(n >= 1, "razor_reference_layer: n >= 1");
    const int64_t S = q.size(0), H = q.size(1), K = k.size(1), g = H / K, d = q.size(2);
    auto qk = q.to(torch::kFloat).permute({1, 0, 2}).reshape({K, g, S, d});  // [K, g, S, d]: head h = group h / g
    auto kt = k.to(torch::kFloat).permute({1, 2, 0});                         // [K, d, S]
    auto echo = torch::zeros({H}, torch::kDouble), ind = torch::zeros({H}, torch::kDouble);
    const int64_t block = std::max<int64_t>(1, block_elems / std::max<int64_t>(1, H * S));
    auto cols = torch::arange(S, torch::TensorOptions().dtype(torch::kLong).device(q.device())).unsqueeze(0);  // [1, S]
    for (int64_t r0 = n; r0 < S; r0 += block) {  // rows i < n have i // n == 0: no mask entries
        const int64_t R = std::min(block, S - r0);
        auto qb = qk.narrow(2, r0, R).reshape({K, g * R, d});
        auto sc = at::bmm(qb, kt).mul_(scale).view({H, R, S});
        auto rows = torch::arange(r0, r0 + R, cols.options()).unsqueeze(1);                  // [R, 1]
        sc.add_((cols > rows).to(torch::kFloat).mul_(kRefFutureMask).unsqueeze(0));        // future keys: -1e-5
        add_block_sums(torch::softmax(sc, -1), r0, n, echo, ind);
    }
    const double s2 = static_cast<double>(S) * static_cast<double>(S);  // ops.mean over the [S, S] cells
    return {echo / s2, ind / s2};
}

RazorScores razor_reference_scores(const Model& m, const RazorSettings& s, const Tokenizer* tok) {
    check_settings(m, s);
    const int64_t n = resolved_tokens(m, s);
    const int64_t B = s.n_sequences, L = m.config.n_layers, H = m.config.n_heads, d = m.config.d_head;
    const double scale = m.config.attn_scale > 0 ? m.config.attn_scale : 1.0 / std::sqrt(static_cast<double>(d));
    RazorScores out;
    out.n_tokens = n;
    out.tokens = reference_tokens(m, s, n, tok);
    auto echo = torch::zeros({L, H}, torch::kDouble), ind = torch::zeros({L, H}, torch::kDouble);
    torch::NoGradGuard ng;
    ForwardOptions fo;
    fo.compute_logits = false;
    Progress prog("razor reference scores", B);
    for (int64_t b = 0; b < B; ++b) {  // batch 1, as the reference's one prompt
        at::Tensor q_layer;
        int q_of = -1;
        Hooks hooks;
        hooks.capture(Point::kAttnQ, [&](int l, const at::Tensor& q) { q_layer = q, q_of = l; });
        hooks.capture(Point::kAttnK, [&](int l, const at::Tensor& k) {  // attention.cpp: q's hook runs first
            HS_REQUIRE(q_of == l, "razor reference: attn.k without this layer's attn.q");
            auto [e, i] = razor_reference_layer(q_layer.select(0, 0), k.select(0, 0), n, scale);
            echo.select(0, l).add_(e), ind.select(0, l).add_(i);
            q_layer = at::Tensor(), q_of = -1;
        });
        m.forward(out.tokens.narrow(0, b, 1).to(m.options.device), &hooks, nullptr, fo);
        prog.tick();
    }
    prog.finish();
    out.echo = (echo / static_cast<double>(B)).to(torch::kFloat);
    out.induction = (ind / static_cast<double>(B)).to(torch::kFloat);
    out.score = razor_combine(out.echo, out.induction, m.config.n_kv_heads, s.echo_share, s.induction_share);
    return out;
}

int64_t round_half_even(double x) {
    const double f = std::floor(x), frac = x - f;
    const auto fi = static_cast<int64_t>(f);
    if (frac > 0.5) return fi + 1;
    if (frac < 0.5) return fi;
    return fi % 2 == 0 ? fi : fi + 1;
}

namespace {

// _select_top_heads (razor_attention.py:225-245): k = round(N share); value in sorted[:k].
at::Tensor top_by_value(const at::Tensor& x, double share, int64_t* k_out) {
    auto flat = x.to(torch::kDouble).flatten();
    const int64_t k = round_half_even(static_cast<double>(flat.numel()) * share);
    *k_out = k;
    if (k <= 0) return torch::zeros(x.sizes(), torch::kBool);
    auto sorted = std::get<0>(flat.sort(0, /*descending=*/true));
    return (flat >= sorted[k - 1]).view(x.sizes());
}

// headscope's rule: rank (groups strictly higher) + 1 <= N share.
at::Tensor top_by_rank(const at::Tensor& x, double share, int64_t* k_out) {
    auto flat = x.to(torch::kDouble).flatten();
    const double cap = static_cast<double>(flat.numel()) * share;
    *k_out = static_cast<int64_t>(std::floor(cap));
    auto rank = (flat.unsqueeze(0) > flat.unsqueeze(1)).sum(1).to(torch::kDouble);
    return (rank + 1.0 <= cap).view(x.sizes());
}

}  // namespace

RazorPick razor_select(const at::Tensor& echo, const at::Tensor& induction, double echo_share, double induction_share,
                       RazorPreset preset) {
    HS_REQUIRE(echo.dim() == 2 && echo.sizes() == induction.sizes(), "razor_select: echo and induction must both be [L, K]");
    RazorPick p;
    const bool by_rank = preset == RazorPreset::kHeadscope;
    p.echo = by_rank ? top_by_rank(echo.cpu(), echo_share, &p.echo_k) : top_by_value(echo.cpu(), echo_share, &p.echo_k);
    p.induction = by_rank ? top_by_rank(induction.cpu(), induction_share, &p.induction_k)
                          : top_by_value(induction.cpu(), induction_share, &p.induction_k);
    if (preset != RazorPreset::kReference) {
        p.kv = p.echo | p.induction;
        return p;
    }
    // _get_retrieval_heads (razor_attention.py:209-218): the `return` inside the loop merges only
    // the first layer of the (layer-ordered) echo dict.
    p.kv = p.induction.clone();
    for (int64_t l = 0; l < echo.size(0); ++l)
        if (p.echo[l].any().item<bool>()) {
            p.kv[l] |= p.echo[l];
            break;
        }
    return p;
}

const char* razor_preset_name(RazorPreset p) {
    switch (p) {
        case RazorPreset::kHeadscope: return "headscope";
        case RazorPreset::kReference: return "reference";
        case RazorPreset::kPaper: return "paper";
    }
    return "?";
}

RazorPreset parse_razor_preset(const std::string& name) {
    for (auto p : {RazorPreset::kHeadscope, RazorPreset::kReference, RazorPreset::kPaper})
        if (name == razor_preset_name(p)) return p;
    throw UsageError(fmt::format("razor preset '{}': want headscope, reference or paper", name));
}

RazorSelection razor_reference_selection(const Model& m, const RazorSettings& s, RazorPreset preset, const Tokenizer* tok) {
    RazorSelection r;
    r.preset = preset;
    r.scores = preset == RazorPreset::kHeadscope ? razor_scores(m, s, tok) : razor_reference_scores(m, s, tok);
    const int64_t L = m.config.n_layers, K = m.config.n_kv_heads, g = m.config.kv_group();
    auto group_max = [&](const at::Tensor& x) { return std::get<0>(x.reshape({L, K, g}).max(2)).contiguous(); };
    r.echo = group_max(r.scores.echo);  // _max_every_group
    r.induction = group_max(r.scores.induction);
    r.pick = razor_select(r.echo, r.induction, s.echo_share, s.induction_share, preset);
    r.full = r.pick.kv.repeat_interleave(g, 1);
    if (preset == RazorPreset::kHeadscope) {
        r.order = r.scores.score;
    } else {
        auto c = razor_combine(r.echo, r.induction, K, s.echo_share, s.induction_share).to(torch::kDouble);  // [L, K]
        r.order = (r.pick.kv.to(torch::kDouble) + c / (1.0 + c)).repeat_interleave(g, 1).to(torch::kFloat);
    }
    return r;
}

at::Tensor razor_preset_score(const Model& m, const RazorSettings& s, RazorPreset preset, const Tokenizer* tok) {
    if (preset == RazorPreset::kHeadscope) return razor_head_score(m, s, tok);
    return razor_reference_selection(m, s, preset, tok).order;
}

}  // namespace hs
