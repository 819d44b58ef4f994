#include "patching.h"

#include "errors.h"
#include "guard.h"
#include "hooks.h"
#include "lines.h"
#include "progress.h"
#include "tokenizer.h"
#include "util.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace hs {

const NameTable<MetricKind>& patch_metric_names() {
    static const NameTable<MetricKind> t = subset_of(metric_names(), {MetricKind::kLogitDiff, MetricKind::kLoss, MetricKind::kProb});
    return t;
}

const NameTable<Point>& patch_site_names() {
    static const NameTable<Point> t = {{Point::kAttnZ, "z"}, {Point::kAttnQ, "q"},
                                       {Point::kAttnK, "k"}, {Point::kAttnV, "v"},
                                       {Point::kAttnPattern, "pattern"}, {Point::kAttnHeadOut, "head-out"}};
    return t;
}

// ---------------------------------------------------------------- pairs

PatchPairs read_patch_pairs(const std::string& path, const Model& m, const Tokenizer* tok, MetricKind metric) {
    const std::string text = read_utf8_text_file(path);
    std::vector<std::vector<int64_t>> clean, corrupt;
    PatchPairs out;
    for_each_line(text, path, [&](const std::string& line, const std::string& where, int) {
        const nlohmann::json j = parse_json_line(line, where);
        const bool diff = metric == MetricKind::kLogitDiff;
        const char* shape = diff ? "expected {\"clean\": TEXT or [ids], \"corrupt\": TEXT or [ids], \"answer\": TEXT or id, "
                                   "\"wrong\": TEXT or id}"
                                 : "expected {\"clean\": TEXT or [ids], \"corrupt\": TEXT or [ids], \"answer\": TEXT or id}";
        if (!j.is_object() || !j.contains("clean") || !j.contains("corrupt") || !j.contains("answer") ||
            (diff && !j.contains("wrong")))
            throw DataError(fmt::format("{}: {}", where, shape));
        auto need_tok = [&](const char* key) -> const Tokenizer& {
            if (!tok) throw DataError(fmt::format("{}: \"{}\" is text but no tokenizer was found next to the model (name one, "
                                                  "or give token ids)", where, key));
            return *tok;
        };
        auto seq = [&](const char* key) {
            const auto& v = j[key];
            std::vector<int64_t> ids;
            if (v.is_string()) {
                auto e = need_tok(key).encode(v.get<std::string>(), true);
                ids.assign(e.begin(), e.end());
            } else if (v.is_array()) {
                for (const auto& x : v) {
                    if (!x.is_number_integer()) throw DataError(fmt::format("{}: \"{}\": expected text or a list of token ids", where, key));
                    ids.push_back(x.get<int64_t>());
                }
            } else {
                throw DataError(fmt::format("{}: \"{}\": expected text or a list of token ids", where, key));
            }
            if (ids.empty()) throw DataError(fmt::format("{}: \"{}\" is empty", where, key));
            for (auto id : ids)
                if (id < 0 || id >= m.config.vocab_size)
                    throw DataError(fmt::format("{}: \"{}\": token id {} out of range [0, {})", where, key, id, m.config.vocab_size));
            if (static_cast<int64_t>(ids.size()) > m.config.max_seq_len)
                throw DataError(fmt::format("{}: \"{}\": {} tokens exceed the model's context of {}", where, key, ids.size(),
                                            m.config.max_seq_len));
            return ids;
        };
        auto token = [&](const char* key) -> int64_t {
            const auto& v = j[key];
            int64_t id = -1;
            if (v.is_number_integer()) {
                id = v.get<int64_t>();
            } else if (v.is_string()) {
                auto e = need_tok(key).encode(v.get<std::string>(), false);
                if (e.size() != 1)
                    throw DataError(fmt::format("{}: \"{}\" {} encodes to {} tokens; give one token's text or its id", where, key,
                                                v.dump(), e.size()));
                id = e[0];
            } else {
                throw DataError(fmt::format("{}: \"{}\": expected one token's text or its id", where, key));
            }
            if (id < 0 || id >= m.config.vocab_size)
                throw DataError(fmt::format("{}: \"{}\": token id {} out of range [0, {})", where, key, id, m.config.vocab_size));
            return id;
        };
        auto c = seq("clean"), r = seq("corrupt");
        if (c.size() != r.size())
            throw DataError(fmt::format("{}: clean is {} tokens, corrupt {}; patching needs equal lengths", where, c.size(), r.size()));
        out.answer.push_back(token("answer"));
        out.wrong.push_back(diff ? token("wrong") : -1);
        out.lengths.push_back(static_cast<int64_t>(c.size()));
        clean.push_back(std::move(c));
        corrupt.push_back(std::move(r));
        return true;
    });
    if (clean.empty()) throw DataError(fmt::format("{}: no pairs (the file is empty)", path));
    const int64_t N = static_cast<int64_t>(clean.size());
    const int64_t T = *std::max_element(out.lengths.begin(), out.lengths.end());
    out.clean = torch::zeros({N, T}, torch::kLong);
    out.corrupt = torch::zeros({N, T}, torch::kLong);
    for (int64_t i = 0; i < N; ++i)
        for (int64_t t = 0; t < out.lengths[i]; ++t) out.clean[i][t] = clean[i][t], out.corrupt[i][t] = corrupt[i][t];
    return out;
}

// ---------------------------------------------------------------- shared

namespace {

bool per_kv_head(Point s) { return s == Point::kAttnK || s == Point::kAttnV; }
int64_t units(const Model& m, Point s) { return per_kv_head(s) ? m.config.n_kv_heads : m.config.n_heads; }
// The dims of a site's activation that hold the unit (head) and the position: [B, T, U, .] except
// the pattern, [B, H, T, S].
int unit_dim(Point s) { return s == Point::kAttnPattern ? 1 : 2; }
int pos_dim(Point s) { return s == Point::kAttnPattern ? 2 : 1; }

void check_pairs(const Model& m, const PatchPairs& p) {
    const int64_t N = p.rows();
    if (N == 0 || !p.clean.defined() || p.clean.sizes() != p.corrupt.sizes() || p.clean.size(0) != N ||
        static_cast<int64_t>(p.answer.size()) != N || static_cast<int64_t>(p.wrong.size()) != N)
        throw ConfigError("patch pairs: clean, corrupt, lengths, answer and wrong must describe the same pairs");
    (void)m;
}

// The device copies the forwards need.
struct Prepared {
    at::Tensor clean, corrupt;  // [N, T] on device
    at::Tensor last;            // [N] int64 on device: each pair's last position
    at::Tensor answer, wrong;   // [N] int64 on device (wrong: 0 where unused)
};

Prepared prepare(const Model& m, const PatchPairs& p) {
    const auto dev = m.options.device;
    Prepared r;
    r.clean = p.clean.to(dev);
    r.corrupt = p.corrupt.to(dev);
    std::vector<int64_t> last, wrong;
    for (auto len : p.lengths) last.push_back(len - 1);
    for (auto w : p.wrong) wrong.push_back(std::max<int64_t>(0, w));
    r.last = torch::tensor(last, torch::kLong).to(dev);
    r.answer = torch::tensor(p.answer, torch::kLong).to(dev);
    r.wrong = torch::tensor(wrong, torch::kLong).to(dev);
    return r;
}

// The metric per row [g*N] (float64) from the final residual [g*N, T, D] of g copies of the pairs.
at::Tensor metric_rows(const Model& m, const Prepared& p, const at::Tensor& resid, int64_t g, MetricKind metric) {
    const int64_t N = p.last.size(0);
    auto rows = torch::arange(g * N, torch::TensorOptions().dtype(torch::kLong).device(resid.device()));
    auto x = resid.index({rows, p.last.repeat({g})});       // [g*N, D]
    auto logits = m.unembed(x).to(torch::kDouble);          // [g*N, V]
    auto a = p.answer.repeat({g}).unsqueeze(1);
    switch (metric) {
        case MetricKind::kLogitDiff: return (logits.gather(1, a) - logits.gather(1, p.wrong.repeat({g}).unsqueeze(1))).squeeze(1);
        case MetricKind::kProb: return (logits.gather(1, a) - torch::logsumexp(logits, -1, true)).exp().squeeze(1);
        case MetricKind::kLoss: return (torch::logsumexp(logits, -1, true) - logits.gather(1, a)).squeeze(1);
        case MetricKind::kAccuracy:
        case MetricKind::kKl: break;
    }
    throw ConfigError(fmt::format("metric {}: patching reads {}", name_of(metric), or_list(names_in(patch_metric_names()))));
}

// Final residual [B, T, D] of a forward with `hooks` (no logits).
at::Tensor final_resid(const Model& m, const at::Tensor& tokens, Hooks& hooks, ForwardOptions fo) {
    at::Tensor out;
    hooks.capture(Point::kResidPost, [&](int, const at::Tensor& x) { out = x; }, m.config.n_layers - 1);
    fo.compute_logits = false;
    m.forward(tokens, &hooks, nullptr, fo);
    return out;
}

double mean_metric(const Model& m, const Prepared& p, const at::Tensor& tokens, Hooks& hooks, MetricKind metric) {
    return metric_rows(m, p, final_resid(m, tokens, hooks, {}), 1, metric).mean().item<double>();
}

void check_gap(double clean, double corrupt) {
    if (!std::isfinite(clean) || !std::isfinite(corrupt))
        throw DataError(fmt::format("patching: the metric is not finite (clean {}, corrupted {})", clean, corrupt));
    if (clean == corrupt)
        throw DataError(fmt::format("patching: the clean and corrupted runs give the same metric ({}); scores would "
                                    "divide by zero (are the pairs' corruptions real?)", clean));
}

}  // namespace

namespace {
// Patching each position needs one length: UsageError (param each_position) when the pairs differ.
void check_each_position(const PatchPairs& pairs, const PatchOptions& o) {
    if (!o.each_position) return;
    for (auto len : pairs.lengths)
        if (len != pairs.clean.size(1))
            throw UsageError("patching each position needs pairs of one length (they differ); patch all positions together",
                             "each_position");
}
}  // namespace

// ---------------------------------------------------------------- exact

PatchResult exact_patching(const Model& m, const PatchPairs& pairs, const PatchOptions& o) {
    torch::NoGradGuard ng;
    check_pairs(m, pairs);
    const int64_t N = pairs.rows(), T = pairs.clean.size(1), L = m.config.n_layers, U = units(m, o.site);
    check_each_position(pairs, o);
    const bool fixed = !o.mean_source.empty();  // Todd et al.'s mean activation at the last position
    HS_REQUIRE(!fixed || (static_cast<int64_t>(o.mean_source.size()) == L && o.site != Point::kAttnPattern && !o.each_position),
               "a fixed patch source needs one [U, d] tensor a layer, a site other than the pattern, all positions");
    const auto p = prepare(m, pairs);
    const Point pt = o.site;
    PatchResult r;
    // The clean run's site at every layer (or the fixed source at each row's last position), and
    // the corrupted run's resid_pre (prefix reuse).
    std::vector<at::Tensor> clean_act(L), resid_pre(L);
    {
        if (!fixed) {
            Hooks h;
            h.capture(pt, [&](int l, const at::Tensor& x) { clean_act[l] = x.clone(); });
            r.metric_clean = mean_metric(m, p, p.clean, h, o.metric);
            ++r.forwards;
        } else {
            r.metric_clean = std::numeric_limits<double>::quiet_NaN();
        }
        Hooks hc;
        hc.capture(Point::kResidPre, [&](int l, const at::Tensor& x) { resid_pre[l] = x.clone(); });
        if (fixed)
            hc.capture(pt, [&](int l, const at::Tensor& x) {
                const auto& src = o.mean_source[l];  // [U, d]
                HS_REQUIRE(src.dim() == 2 && src.size(0) == x.size(2) && src.size(1) == x.size(3),
                           "the fixed patch source's shape does not match the site");
                auto full = torch::zeros_like(x);
                auto rows = torch::arange(N, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
                full.index_put_({rows, p.last}, src.to(x.device(), x.scalar_type()).unsqueeze(0).expand({N, src.size(0), src.size(1)}));
                clean_act[l] = full;
            });
        r.metric_corrupt = mean_metric(m, p, p.corrupt, hc, o.metric);
        ++r.forwards;
    }
    if (!fixed) check_gap(r.metric_clean, r.metric_corrupt);
    else if (!std::isfinite(r.metric_corrupt))
        throw DataError(fmt::format("patching: the corrupted runs' metric is not finite ({})", r.metric_corrupt));
    // Configurations per layer: (unit, position) with position -1 = every position.
    std::vector<std::pair<int64_t, int64_t>> cfgs;
    for (int64_t u = 0; u < U; ++u) {
        if (fixed) cfgs.push_back({u, -2});  // -2: each row's last position
        else if (!o.each_position) cfgs.push_back({u, -1});
        else
            for (int64_t t = 0; t < T; ++t) cfgs.push_back({u, t});
    }
    const int64_t C = static_cast<int64_t>(cfgs.size());
    const int64_t per = std::max<int64_t>(1, o.max_rows / N);
    auto patched = torch::full({L, C}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble);
    Progress prog("patches", L * C);
    for (int64_t l = 0; l < L; ++l) {
        for (int64_t c0 = 0; c0 < C; c0 += per) {
            const int64_t g = std::min(per, C - c0);
            // Mask with the site's rank, 1 in the last dim: true where row j*N+i takes the clean value.
            auto shape = clean_act[l].sizes().vec();
            shape[0] = g * N;
            shape.back() = 1;
            auto mask = torch::zeros(shape, torch::kBool);
            for (int64_t j = 0; j < g; ++j) {
                auto [u, t] = cfgs[c0 + j];
                auto rows = mask.narrow(0, j * N, N).select(unit_dim(o.site), u);  // drops the unit dim
                const int pd = pos_dim(o.site) < unit_dim(o.site) ? pos_dim(o.site) : pos_dim(o.site) - 1;
                if (t == -2)
                    for (int64_t i = 0; i < N; ++i) rows[i].select(pd - 1, pairs.lengths[i] - 1).fill_(true);
                else if (t < 0) rows.fill_(true);
                else rows.select(pd, t).fill_(true);
            }
            mask = mask.to(m.options.device);
            std::vector<int64_t> rep(clean_act[l].dim(), 1);
            rep[0] = g;
            auto clean_rep = clean_act[l].repeat(rep);
            Hooks h;
            h.edit(pt, [mask, clean_rep](int, const at::Tensor& x) -> std::optional<at::Tensor> {
                return torch::where(mask, clean_rep.to(x.scalar_type()), x);
            }, static_cast<int>(l));
            ForwardOptions fo;
            if (l > 0) {
                fo.start_layer = static_cast<int>(l);
                fo.start_resid = resid_pre[l].repeat({g, 1, 1});
            }
            auto tokens = p.corrupt.repeat({g, 1});
            auto vals = metric_rows(m, p, final_resid(m, tokens, h, fo), g, o.metric).view({g, N}).mean(1).to(torch::kCPU);
            patched[l].narrow(0, c0, g).copy_(vals);
            ++r.forwards;
            prog.update(l * C + c0 + g);
        }
    }
    prog.finish();
    r.patched = o.each_position ? patched.view({L, U, T}) : patched.view({L, U});
    r.scores = fixed ? r.patched - r.metric_corrupt : (r.patched - r.metric_corrupt) / (r.metric_clean - r.metric_corrupt);
    return r;
}

MeanAtLast mean_site_at_last(const Model& m, const at::Tensor& tokens, const std::vector<int64_t>& lengths,
                             const std::vector<int64_t>& answer, Point site, int64_t max_rows) {
    torch::NoGradGuard ng;
    const int64_t N = tokens.size(0), L = m.config.n_layers;
    HS_REQUIRE(N > 0 && static_cast<int64_t>(lengths.size()) == N && static_cast<int64_t>(answer.size()) == N &&
               site != Point::kAttnPattern, "mean_site_at_last: one length and one answer a prompt, a site other than the pattern");
    MeanAtLast out;
    out.mean.assign(L, at::Tensor());
    double prob = 0, top1 = 0;
    const int64_t per = std::max<int64_t>(1, max_rows);
    for (int64_t i0 = 0; i0 < N; i0 += per) {
        const int64_t n = std::min(per, N - i0);
        PatchPairs chunk;
        chunk.corrupt = chunk.clean = tokens.narrow(0, i0, n);
        chunk.lengths.assign(lengths.begin() + i0, lengths.begin() + i0 + n);
        chunk.answer.assign(answer.begin() + i0, answer.begin() + i0 + n);
        chunk.wrong.assign(n, -1);
        const auto p = prepare(m, chunk);
        Hooks h;
        h.capture(site, [&](int l, const at::Tensor& x) {  // [n, T, U, d]: each row's last position, summed
            auto rows = torch::arange(n, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
            auto s = x.index({rows, p.last}).to(torch::kDouble).sum(0).to(torch::kCPU);
            out.mean[l] = out.mean[l].defined() ? out.mean[l] + s : s;
        });
        auto resid = final_resid(m, p.clean, h, {});
        auto x = resid.index({torch::arange(n, torch::TensorOptions().dtype(torch::kLong).device(resid.device())), p.last});
        auto logits = m.unembed(x).to(torch::kDouble);
        prob += metric_rows(m, p, resid, 1, MetricKind::kProb).sum().item<double>();
        top1 += (logits.argmax(-1) == p.answer).sum().item<double>();
        ++out.forwards;
    }
    for (auto& t : out.mean) t = t / static_cast<double>(N);
    out.prob = prob / static_cast<double>(N);
    out.top1 = top1 / static_cast<double>(N);
    return out;
}

// ---------------------------------------------------------------- attribution

PatchResult attribution_patching(const Model& m, const PatchPairs& pairs, const PatchOptions& o) {
    check_pairs(m, pairs);
    const int64_t L = m.config.n_layers;
    check_each_position(pairs, o);
    const auto p = prepare(m, pairs);
    const Point pt = o.site;
    PatchResult r;
    std::vector<at::Tensor> clean_act(L), corrupt_act(L), delta(L);
    {
        torch::NoGradGuard ng;
        Hooks h;
        h.capture(pt, [&](int l, const at::Tensor& x) { clean_act[l] = x.clone(); });
        r.metric_clean = mean_metric(m, p, p.clean, h, o.metric);
        ++r.forwards;
    }
    {
        torch::AutoGradMode grad(true);
        Hooks h;
        // x + delta with delta = 0 a leaf: d M / d delta is d M / d x along every later path.
        h.edit(pt, [&](int l, const at::Tensor& x) -> std::optional<at::Tensor> {
            corrupt_act[l] = x.detach().clone();
            delta[l] = torch::zeros_like(x).requires_grad_(true);
            return x + delta[l];
        });
        auto rows = metric_rows(m, p, final_resid(m, p.corrupt, h, {}), 1, o.metric);
        auto mean = rows.mean();
        r.metric_corrupt = mean.item<double>();
        mean.backward();
        ++r.forwards;
    }
    check_gap(r.metric_clean, r.metric_corrupt);
    torch::NoGradGuard ng;
    std::vector<at::Tensor> per_layer;
    for (int64_t l = 0; l < L; ++l) {
        if (!delta[l].defined() || !delta[l].grad().defined())
            throw ConfigError(fmt::format("attribution patching: no gradient reached layer {}'s {}", l, patch_site_name(o.site)));
        auto prod = ((clean_act[l] - corrupt_act[l]).to(torch::kDouble) * delta[l].grad().to(torch::kDouble)).sum(-1);
        if (o.site == Point::kAttnPattern) prod = prod.permute({0, 2, 1});  // [N, H, T] -> [N, T, H]
        auto by_pos = prod.sum(0).transpose(0, 1);                           // [U, T]
        per_layer.push_back(o.each_position ? by_pos : by_pos.sum(1));
    }
    auto est = torch::stack(per_layer).to(torch::kCPU);  // the first-order change of the mean metric
    r.patched = est + r.metric_corrupt;
    r.scores = est / (r.metric_clean - r.metric_corrupt);
    return r;
}

// ---------------------------------------------------------------- path

std::string PathSpec::label() const {
    return fmt::format("{}->{}:{}", format_heads(senders), format_heads(receivers), patch_site_name(input));
}

PathSpec parse_path_spec(const std::string& s, int L, int H) {
    const auto arrow = s.find("->");
    const auto colon = s.rfind(':');
    if (arrow == std::string::npos || colon == std::string::npos || colon < arrow)
        throw UsageError(fmt::format("'{}': expected SENDERS->RECEIVERS:q|k|v, e.g. L0H2->L1H0,L1H1:k", s));
    PathSpec p;
    p.senders = parse_head_list(s.substr(0, arrow), L, H);
    p.receivers = parse_head_list(s.substr(arrow + 2, colon - arrow - 2), L, H);
    const std::string in = s.substr(colon + 1);
    if (in == "q") p.input = Point::kAttnQ;
    else if (in == "k") p.input = Point::kAttnK;
    else if (in == "v") p.input = Point::kAttnV;
    else throw UsageError(fmt::format("'{}': the receivers' input '{}' must be q, k or v", s, in));
    int last_sender = -1, first_receiver = L;
    for (auto [l, h] : p.senders) last_sender = std::max(last_sender, l);
    for (auto [l, h] : p.receivers) first_receiver = std::min(first_receiver, l);
    if (first_receiver <= last_sender)
        throw UsageError(fmt::format("'{}': every receiver must be in a later layer than every sender (receiver layer {}, "
                                     "sender layer {})", s, first_receiver, last_sender));
    return p;
}

PathResult path_patching(const Model& m, const PatchPairs& pairs, const PathSpec& ps, MetricKind metric) {
    torch::NoGradGuard ng;
    check_pairs(m, pairs);
    const auto& c = m.config;
    const int64_t L = c.n_layers;
    const auto p = prepare(m, pairs);
    const Point pt = ps.input;
    std::set<int> send_layers, recv_layers;
    for (auto [l, h] : ps.senders) send_layers.insert(l);
    for (auto [l, h] : ps.receivers) recv_layers.insert(l);
    PathResult r;
    // The senders' outputs summed per layer, in both runs; the corrupted resid_pre at receiver layers.
    auto sender_sum = [&](int l, const at::Tensor& head_out) {  // head_out [N, T, H, D]
        std::vector<int64_t> hs;
        for (auto [sl, sh] : ps.senders)
            if (sl == l) hs.push_back(sh);
        return head_out.index_select(2, torch::tensor(hs, torch::kLong).to(head_out.device())).sum(2).to(torch::kFloat);
    };
    at::Tensor delta;
    std::vector<at::Tensor> x(L);
    {
        Hooks h;
        h.capture(Point::kAttnHeadOut, [&](int l, const at::Tensor& ho) {
            if (send_layers.count(l)) delta = delta.defined() ? delta + sender_sum(l, ho) : sender_sum(l, ho);
        });
        r.metric_clean = mean_metric(m, p, p.clean, h, metric);
        Hooks hc;
        hc.capture(Point::kAttnHeadOut, [&](int l, const at::Tensor& ho) {
            if (send_layers.count(l)) delta = delta - sender_sum(l, ho);
        });
        hc.capture(Point::kResidPre, [&](int l, const at::Tensor& xr) {
            if (recv_layers.count(l)) x[l] = xr.clone();
        });
        r.metric_corrupt = mean_metric(m, p, p.corrupt, hc, metric);
        r.forwards += 2;
    }
    check_gap(r.metric_clean, r.metric_corrupt);
    // The receivers' q/k/v computed from resid x + delta with the corrupted run's norm scale.
    const bool no_input_norm = c.post_norm_only;
    const bool renormed = ps.input != Point::kAttnV && (c.qk_norm || c.qk_norm_full);
    auto sigma = [&](const at::Tensor& v) {  // [N, T, D] -> [N, T] float64
        auto d = v.to(torch::kDouble);
        if (c.norm == NormKind::kLayerNorm) return (d.var(-1, /*unbiased=*/false) + c.norm_eps).sqrt();
        return (d.pow(2).mean(-1) + c.norm_eps).sqrt();
    };
    auto site_from = [&](int l, const at::Tensor& resid) {
        at::Tensor s;
        Hooks h;
        h.capture(pt, [&](int, const at::Tensor& a) { s = a.clone(); }, l);
        ForwardOptions fo;
        fo.compute_logits = false;
        fo.start_layer = l;
        fo.start_resid = resid;
        fo.stop_after_layer = l;
        m.forward(p.corrupt, &h, nullptr, fo);
        ++r.forwards;
        return s;
    };
    Hooks fin;
    for (int l : recv_layers) {
        auto y = (x[l].to(torch::kFloat) + delta).to(x[l].scalar_type());
        auto s_y = site_from(l, y);
        at::Tensor s_in = s_y;
        if (!no_input_norm && !renormed) {
            auto s_0 = site_from(l, torch::zeros_like(y));
            auto scale = (sigma(y) / sigma(x[l])).view({y.size(0), y.size(1), 1, 1});
            s_in = (s_0.to(torch::kDouble) + scale * (s_y.to(torch::kDouble) - s_0.to(torch::kDouble))).to(s_y.scalar_type());
        }
        std::vector<int64_t> us;
        for (auto [rl, rh] : ps.receivers)
            if (rl == l) us.push_back(per_kv_head(ps.input) ? rh / c.kv_group() : rh);
        auto mask = torch::zeros({1, 1, s_in.size(2), 1}, torch::kBool);
        for (auto u : us) mask[0][0][u] = true;
        mask = mask.to(s_in.device());
        fin.edit(pt, [mask, s_in](int, const at::Tensor& a) -> std::optional<at::Tensor> {
            return torch::where(mask, s_in.to(a.scalar_type()), a);
        }, l);
    }
    r.metric_patched = mean_metric(m, p, p.corrupt, fin, metric);
    ++r.forwards;
    r.score = (r.metric_patched - r.metric_corrupt) / (r.metric_clean - r.metric_corrupt);
    return r;
}

}  // namespace hs
