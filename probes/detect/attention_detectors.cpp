#include "attention_detectors.h"

#include "errors.h"
#include "guard.h"
#include "hooks.h"
#include "intervention.h"
#include "progress.h"
#include "tokenizer.h"
#include "util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fmt/format.h>

namespace hs {

using namespace torch::indexing;

const std::vector<HeadProbe>& head_probes() {
    static const std::vector<HeadProbe> t = {
        {"induction", StripeKind::kInduction, false, "stripe: mean over q in [n+1, 2n] of A[q, q-n+1] on [BOS, R, R]"},
        {"previous-token", StripeKind::kPreviousToken, false, "stripe: mean over q in [1, 2n] of A[q, q-1] on [BOS, R, R]"},
        {"duplicate-token", StripeKind::kDuplicateToken, false, "stripe: mean over q in [n+1, 2n] of A[q, q-n] on [BOS, R, R]"},
        {"attention-sink", StripeKind::kAttentionSink, false, "mean attention to position 0 over query positions q >= 1"},
        {"sink-rate", StripeKind::kFirstToken, false,
         "Gu et al.'s alpha_0: mean attention to position 0 over every query position q in [0, T-1] (q = 0 counted, "
         "as sail-sg/Attention-Sink divides column 0 by T); rate: the share of sequences whose alpha_0 exceeds epsilon"},
        {"induction-loss", std::nullopt, true,
         "mean cross-entropy on the repeated half of [BOS, R, R] (predicting tokens n+2..2n) with head "
         "(layer, head)'s z zeroed; compare with attribute baseline_loss"},
    };
    return t;
}

const std::vector<std::string>& detector_probe_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const auto& p : head_probes()) v.emplace_back(p.name);
        return v;
    }();
    return names;
}

const HeadProbe& find_head_probe(const std::string& name) {
    for (const auto& p : head_probes())
        if (name == p.name) return p;
    throw UsageError(fmt::format("unknown probe '{}' (valid: {})", name, fmt::join(detector_probe_names(), ", ")));
}

std::string probe_description(const HeadProbe& p, bool stripe) {
    if (stripe || p.repeated_only || p.pattern == StripeKind::kAttentionSink || p.pattern == StripeKind::kFirstToken)
        return p.stripe_description;
    return std::string("detector: TransformerLens head_detector score against the ") + p.name +
           " detection pattern, averaged over sequences";
}

std::vector<ProbeScores> run_head_probes(const Model& m, const std::vector<std::string>& probes, const ProbeInput& in) {
    const bool stripe = in.stripe_tokens.defined();
    std::vector<StripeKind> kinds;
    for (const auto& name : probes) {
        const HeadProbe& p = find_head_probe(name);
        if (p.repeated_only && !stripe) throw UsageError(fmt::format("probe {} needs [BOS, R, R] rows", p.name));
        if (p.pattern) kinds.push_back(*p.pattern);
    }
    std::vector<ProbeScores> out;
    if (!kinds.empty()) {
        auto scores = stripe ? stripe_scores(m, in.stripe_tokens, in.n, kinds, in.max_rows)
                             : detector_scores(m, in.seqs, kinds, in.detector);
        for (auto& s : scores) {
            ProbeScores r{s.probe, s.score, s.samples, std::nullopt, std::nullopt};
            if (s.probe == stripe_name(StripeKind::kFirstToken)) r.sink = sink_rates(s.samples, in.sink_epsilon);
            out.push_back(std::move(r));
        }
    }
    for (const auto& name : probes)
        if (find_head_probe(name).repeated_only) {  // induction-loss
            auto il = induction_loss(m, in.stripe_tokens, in.n, in.max_rows);
            out.push_back({name, il.ablated, il.samples, il.baseline, std::nullopt});
        }
    return out;
}

std::string stripe_name(StripeKind k) {
    switch (k) {
        case StripeKind::kInduction: return "induction";
        case StripeKind::kPreviousToken: return "previous-token";
        case StripeKind::kDuplicateToken: return "duplicate-token";
        case StripeKind::kAttentionSink: return "attention-sink";
        case StripeKind::kFirstToken: return "sink-rate";
    }
    return "?";
}

StripeKind parse_stripe_kind(const std::string& name) {
    const HeadProbe& p = find_head_probe(name);
    if (!p.pattern) throw UsageError(fmt::format("probe {} reads no attention pattern", p.name));
    return *p.pattern;
}

at::Tensor stripe_scores_layer(const at::Tensor& pattern, StripeKind kind, int64_t n) {
    if (pattern.dim() != 4 || pattern.size(-1) != 2 * n + 1 || pattern.size(-2) != 2 * n + 1)
        throw DataError(fmt::format("stripe scores: pattern {} is not [B, H, {}, {}] for n = {}",
                                    shape_str(pattern.sizes().vec()), 2 * n + 1, 2 * n + 1, n));
    if (n < 2) throw UsageError(fmt::format("stripe scores: sequence length {} < 2", n));
    const StripeSpec spec = stripe_spec(kind, n);
    return stripe_sum_rows(pattern, 0, spec) / static_cast<double>(spec.count());
}

at::Tensor detection_pattern(const at::Tensor& tokens, StripeKind kind) {
    if (kind == StripeKind::kAttentionSink || kind == StripeKind::kFirstToken)
        throw UsageError(fmt::format("{} has no detection pattern", stripe_name(kind)));
    const int64_t T = tokens.size(0);
    auto t = tokens.to(torch::kCPU, torch::kLong).reshape({T});
    if (kind == StripeKind::kPreviousToken) {
        auto d = torch::zeros({T, T});  // [T, T]
        if (T > 1) d.index_put_({Slice(1, None), Slice(None, -1)}, torch::eye(T - 1));
        return d;
    }
    // dup[i, j] = 1 where tok_i == tok_j and j < i.
    auto dup = t.unsqueeze(1).eq(t.unsqueeze(0)).to(torch::kFloat).tril(-1);  // [T, T]
    if (kind == StripeKind::kDuplicateToken) return dup;
    // Induction: D[i, j] = dup[i, j - 1] (the token after an earlier copy), column 0 empty, then
    // tril as TransformerLens does (which keeps D[i, i] = dup[i, i - 1]).
    auto d = torch::zeros({T, T});
    if (T > 1) d.index_put_({Slice(), Slice(1, None)}, dup.index({Slice(), Slice(None, -1)}));
    return d.tril();
}

at::Tensor detector_sums_rows(const at::Tensor& rows, int64_t q0, const at::Tensor& detection,
                              const DetectorOptions& opts) {
    const int64_t T = rows.size(-1), n = rows.size(-2);
    if (rows.dim() != 4 || detection.sizes() != at::IntArrayRef({T, T}) || q0 < 0 || q0 + n > T)
        throw DataError(fmt::format("detector scores: pattern rows {} at {} and detection pattern {} disagree",
                                    shape_str(rows.sizes().vec()), q0, shape_str(detection.sizes().vec())));
    auto a = rows.to(torch::kFloat);  // [B, H, n, T]
    auto d = detection.to(a.device(), torch::kFloat).narrow(0, q0, n);  // [n, T]
    // The exclusions act through a mask: the caller's pattern is never written to (TL's in-place bug).
    auto keep = torch::ones({n, T}, a.options());  // [n, T]
    if (opts.exclude_bos) keep.index_put_({Slice(), 0}, 0.0);
    if (opts.exclude_current_token) keep.diagonal(q0).fill_(0.0);  // keep[i, q0 + i]
    if (opts.measure == ErrorMeasure::kMul) {
        auto ak = a * keep;
        return torch::stack({(ak * d).sum({-2, -1}), ak.sum({-2, -1})});  // [2, B, H]
    }
    auto e = ((a - d).abs() * keep).sum({-2, -1});
    return torch::stack({e, torch::zeros_like(e)});
}

at::Tensor detector_score_finish(const at::Tensor& sums, int64_t T, const DetectorOptions& opts) {
    if (opts.measure == ErrorMeasure::kMul) return sums[0] / sums[1];  // sum(A' * D) / sum(A')
    return 1.0 - sums[0] / static_cast<double>(T);  // 1 - mean over rows of the row's L1 distance
}

at::Tensor detector_scores_layer(const at::Tensor& pattern, const at::Tensor& detection,
                                 const DetectorOptions& opts) {
    const int64_t T = pattern.size(-1);
    if (pattern.dim() != 4 || pattern.size(-2) != T || detection.sizes() != at::IntArrayRef({T, T}))
        throw DataError(fmt::format("detector scores: pattern {} and detection pattern {} disagree",
                                    shape_str(pattern.sizes().vec()), shape_str(detection.sizes().vec())));
    return detector_score_finish(detector_sums_rows(pattern, 0, detection, opts), T, opts);
}

std::pair<int64_t, int64_t> token_range(const Model& m, const StripeInput& in) {
    const int64_t V = m.config.vocab_size;
    const int64_t lo = in.token_lo < 0 ? 0 : in.token_lo, hi = in.token_hi < 0 ? V : in.token_hi;
    if (lo >= hi || hi > V)
        throw UsageError(fmt::format("token range {},{}: need 0 <= lo < hi <= vocab size {}", lo, hi, V), "token_range");
    return {lo, hi};
}

at::Tensor repeated_random_tokens(const Model& m, const StripeInput& in, const Tokenizer* tok) {
    if (in.seq_len < 2) throw UsageError(fmt::format("|R| = {}: need at least 2", in.seq_len), "seq_len");
    if (in.batch < 1) throw UsageError(fmt::format("{} rows: need at least 1", in.batch), "batch");
    if (in.seq_len > (m.config.max_seq_len - 1) / 2)  // 2n + 1 > context, without overflow for huge n
        throw DataError(fmt::format("|R| = {}: [BOS, R, R] has {} tokens, more than the model's context of {}", in.seq_len,
                                    static_cast<double>(in.seq_len) * 2 + 1, m.config.max_seq_len),
                        "seq_len");
    // The ids, the drawn rows and the result: three [B, 2n + 1] int64 tensors at least.
    check_fits_in_memory(size_product({static_cast<double>(in.batch), 2.0 * in.seq_len + 1, 3 * 8.0}),
                         fmt::format("{} rows of [BOS, R, R] with |R| = {}", in.batch, in.seq_len));
    int64_t bos = m.config.bos_id;
    if (bos < 0 && tok && tok->bos_id()) bos = *tok->bos_id();
    if (bos < 0) throw ConfigError(fmt::format("{}: no BOS token id known (config or tokenizer)", m.path));
    auto [lo, hi] = token_range(m, in);
    std::vector<int64_t> allowed;
    for (int64_t id = lo; id < hi; ++id) {
        if (id == bos || id == m.config.eos_id) continue;
        if (tok && id < tok->vocab_size() && tok->is_special(static_cast<int32_t>(id))) continue;
        allowed.push_back(id);
    }
    if (allowed.empty()) throw UsageError(fmt::format("token range {},{} holds only special tokens", lo, hi), "token_range");
    // A CPU generator: the same seed gives the same tokens on every device.
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(in.seed));
    auto idx = at::randint(static_cast<int64_t>(allowed.size()), {in.batch, in.seq_len}, gen,
                           torch::TensorOptions().dtype(torch::kLong));
    auto r = torch::tensor(allowed, torch::kLong).index({idx});  // [B, n]
    return torch::cat({torch::full({in.batch, 1}, bos, torch::kLong), r, r}, 1);  // [B, 1 + 2n]
}

RowCaptureFn stripe_capture(const std::vector<StripeKind>& kinds, int64_t n, std::vector<at::Tensor>& samples,
                            int64_t row0) {
    if (n < 2) throw UsageError(fmt::format("stripe scores: sequence length {} < 2", n));
    // Each block's share of the stripe means, added up over the layer's query blocks.
    return [kinds, n, &samples, row0](int l, int64_t q0, const at::Tensor& p) {
        if (p.size(-1) != 2 * n + 1)
            throw DataError(fmt::format("stripe scores: pattern over {} keys, want {} for n = {}", p.size(-1), 2 * n + 1, n));
        for (size_t k = 0; k < kinds.size(); ++k) {
            const StripeSpec spec = stripe_spec(kinds[k], n);
            samples[k].narrow(0, row0, p.size(0)).select(1, l).add_(
                (stripe_sum_rows(p, q0, spec) / static_cast<double>(spec.count())).cpu());
        }
    };
}

static std::vector<LayerHeadScores> finish(const std::vector<StripeKind>& kinds, std::vector<at::Tensor>& samples) {
    std::vector<LayerHeadScores> out;
    for (size_t k = 0; k < kinds.size(); ++k) out.push_back({stripe_name(kinds[k]), samples[k].mean(0), samples[k]});
    return out;
}

std::vector<LayerHeadScores> stripe_scores(const Model& m, const at::Tensor& tokens, int64_t n,
                                           const std::vector<StripeKind>& kinds, int64_t max_rows) {
    const int64_t B = tokens.size(0), L = m.config.n_layers, H = m.config.n_heads;
    std::vector<at::Tensor> samples;
    for (size_t k = 0; k < kinds.size(); ++k) samples.push_back(torch::zeros({B, L, H}));  // [N, L, H]
    torch::NoGradGuard ng;
    ForwardOptions fo;
    fo.compute_logits = false;
    const int64_t step = std::max<int64_t>(1, max_rows);
    Progress prog("stripe scores", (B + step - 1) / step);
    for (int64_t r0 = 0; r0 < B; r0 += step) {
        const int64_t rows = std::min(step, B - r0);
        Hooks hooks;
        hooks.capture_rows(Point::kAttnPattern, stripe_capture(kinds, n, samples, r0));
        m.forward(tokens.narrow(0, r0, rows), &hooks, nullptr, fo);
        prog.tick();
    }
    prog.finish();
    return finish(kinds, samples);
}

std::vector<LayerHeadScores> detector_scores(const Model& m, const std::vector<std::vector<int64_t>>& seqs,
                                             const std::vector<StripeKind>& kinds, const DetectorOptions& opts) {
    const int64_t N = static_cast<int64_t>(seqs.size()), L = m.config.n_layers, H = m.config.n_heads;
    if (N == 0) throw DataError("detector scores: no sequences");
    std::vector<at::Tensor> samples;
    for (size_t k = 0; k < kinds.size(); ++k) samples.push_back(torch::zeros({N, L, H}));  // [N, L, H]
    torch::NoGradGuard ng;
    ForwardOptions fo;
    fo.compute_logits = false;
    Progress prog("detector scores", N);
    for (int64_t s = 0; s < N; ++s) {
        auto t = torch::tensor(seqs[s], torch::kLong);  // [T]
        const int64_t T = t.size(0);
        std::vector<at::Tensor> det(kinds.size());
        for (size_t k = 0; k < kinds.size(); ++k)
            if (kinds[k] != StripeKind::kAttentionSink && kinds[k] != StripeKind::kFirstToken)
                det[k] = detection_pattern(t, kinds[k]);
        // Column 0's query range: q >= 1 (attention-sink) or every q (sink-rate's alpha_0).
        auto first_q = [&](size_t k) -> int64_t { return kinds[k] == StripeKind::kFirstToken ? 0 : 1; };
        // Partial sums per kind and layer, [2, 1, H] (detection patterns) or [1, H] (column 0),
        // added over the query blocks of each layer's pattern.
        std::vector<std::vector<at::Tensor>> acc(kinds.size(), std::vector<at::Tensor>(L));
        Hooks hooks;
        hooks.capture_rows(Point::kAttnPattern, [&](int l, int64_t q0, const at::Tensor& p) {  // p [1, H, n, T]
            for (size_t k = 0; k < kinds.size(); ++k) {
                auto part = det[k].defined() ? detector_sums_rows(p, q0, det[k], opts)
                                             : column_sum_rows(p, q0, first_q(k), T - 1, 0);
                acc[k][l] = acc[k][l].defined() ? acc[k][l] + part : part;
            }
        });
        m.forward(t.unsqueeze(0), &hooks, nullptr, fo);
        for (size_t k = 0; k < kinds.size(); ++k)
            for (int64_t l = 0; l < L; ++l) {
                const int64_t count = T - first_q(k);  // the queries column 0's sum ran over
                auto v = det[k].defined() ? detector_score_finish(acc[k][l], T, opts)
                         : count > 0      ? acc[k][l] / static_cast<double>(count)
                                          : torch::ones({1, H});
                samples[k][s][l].copy_(v[0].cpu());
            }
        prog.tick();
    }
    prog.finish();
    return finish(kinds, samples);
}

SinkRates sink_rates(const at::Tensor& alpha, double epsilon) {
    if (!(epsilon >= 0 && epsilon <= 1))
        throw UsageError(fmt::format("sink epsilon {}: need a number in [0, 1]", epsilon), "sink_epsilon");
    if (alpha.dim() != 3 || alpha.size(0) == 0)
        throw DataError(fmt::format("sink rates: alpha_0 {} is not [N, L, H] with N >= 1", shape_str(alpha.sizes().vec())));
    // sail-sg/Attention-Sink eval_sink_open_source.py:48: (importance_scores > epsilon).mean(dim=(0,1,2)):
    // the indicator per (sequence, layer, head), then its means. The comparison is in float32, as the
    // reference's (its scores are float32, and torch compares a float32 tensor with a Python float in
    // float32: alpha_0 = 0.3f is not above epsilon 0.3).
    auto above = alpha.to(torch::kCPU, torch::kFloat).gt(epsilon).to(torch::kDouble);  // [N, L, H]
    SinkRates r;
    r.epsilon = epsilon;
    r.head_rate = above.mean(0).to(torch::kFloat);         // [L, H]
    r.layer_rate = above.mean(at::IntArrayRef{0, 2}).to(torch::kFloat);  // [L]
    r.model_rate = above.mean().item<double>();
    return r;
}

at::Tensor induction_loss_rows(const at::Tensor& logits, const at::Tensor& tokens, int64_t n) {
    if (n < 2 || tokens.size(1) != 2 * n + 1)
        throw DataError(fmt::format("induction loss: tokens {} are not [B, 2n+1] for n = {}", shape_str(tokens.sizes().vec()), n));
    // Position p predicts token p + 1; p in [n+1, 2n-1] -> targets n+2..2n.
    auto lp = torch::log_softmax(logits.narrow(1, n + 1, n - 1).to(torch::kFloat), -1);  // [B, n-1, V]
    auto tgt = tokens.narrow(1, n + 2, n - 1).to(lp.device(), torch::kLong).unsqueeze(-1);  // [B, n-1, 1]
    return -lp.gather(-1, tgt).squeeze(-1).mean(1).cpu();  // [B]
}

InductionLoss induction_loss(const Model& m, const at::Tensor& tokens, int64_t n, int64_t max_rows) {
    const int64_t B = tokens.size(0), L = m.config.n_layers, H = m.config.n_heads;
    torch::NoGradGuard ng;
    InductionLoss out;
    out.baseline_rows = induction_loss_rows(m.forward(tokens), tokens, n);  // [B]
    out.baseline = out.baseline_rows.mean().item<double>();
    out.samples = torch::zeros({B, L, H});
    // Row j*B + r of a forward is row r of the batch with head h0 + j ablated.
    const int64_t per_fwd = std::max<int64_t>(1, max_rows / B);
    Progress prog("induction-loss ablations", L * H);
    for (int64_t h0 = 0; h0 < L * H; h0 += per_fwd) {
        const int64_t hc = std::min(per_fwd, L * H - h0);
        Hooks hooks;
        for (int64_t j = 0; j < hc; ++j)
            for (int64_t r = 0; r < B; ++r)
                apply_intervention(hooks, {Intervention::kZero}, {{static_cast<int>((h0 + j) / H), static_cast<int>((h0 + j) % H)}},
                                   j * B + r, {Intervention::kZero});
        auto batch = tokens.repeat({hc, 1});  // [hc * B, T]
        auto rows = induction_loss_rows(m.forward(batch, &hooks), batch, n).view({hc, B});
        for (int64_t j = 0; j < hc; ++j) out.samples.select(1, (h0 + j) / H).select(1, (h0 + j) % H).copy_(rows[j]);
        prog.update(h0 + hc);
    }
    prog.finish();
    out.ablated = out.samples.mean(0);  // [L, H]
    return out;
}

}  // namespace hs
