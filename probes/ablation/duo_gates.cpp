#include "duo_gates.h"

#include "duo_sparsity.h"

#include "errors.h"
#include "heads.h"
#include "hooks.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace hs {

namespace {

// The unchanged copy of one chunk: z at every layer [b, T, H, d] and the final hidden states at the
// scored positions [P, D] float (no grad).
struct Reference {
    Ablator::ScoredRows rows;
    std::vector<at::Tensor> z;
    at::Tensor hidden;
};

at::Tensor final_hidden(const Model& m, const Ablator::ScoredRows& r, Hooks& h) {
    at::Tensor resid;
    h.capture(Point::kResidPost, [&](int, const at::Tensor& x) { resid = x; }, m.config.n_layers - 1);
    ForwardOptions fo;
    fo.compute_logits = false;
    m.forward(r.tokens, &h, nullptr, fo);
    return m.final_norm(resid.index({r.row, r.pos})).to(torch::kFloat);
}

Reference reference_of(const Model& m, const Ablator::ScoredRows& r) {
    torch::NoGradGuard ng;
    Reference ref;
    ref.rows = r;
    ref.z.resize(m.config.n_layers);
    Hooks h;
    h.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { ref.z[l] = x; });
    ref.hidden = final_hidden(m, r, h);
    return ref;
}

std::vector<Reference> references(const Model& m, const Ablator& ab) {
    std::vector<Reference> out;
    for (auto& r : ab.scored_rows()) out.push_back(reference_of(m, r));
    return out;
}

// The gated copy of one chunk: every head streams, and its z is mixed with the reference's.
// Returns the summed (over positions) mean-over-d_model squared error.
at::Tensor gated_error(const Model& m, const Reference& ref, const DuoGateOptions& o, const at::Tensor& alpha_kv) {
    const int L = m.config.n_layers;
    const int64_t H = m.config.n_heads, K = m.config.n_kv_heads, b = ref.rows.tokens.size(0);
    Hooks h;
    auto all = torch::ones({b, H}, torch::TensorOptions().dtype(torch::kBool).device(ref.rows.tokens.device()));
    InterventionSpec stream;
    stream.mode = Intervention::kStream, stream.window = o.window;
    for (int l = 0; l < L; ++l) apply_intervention(h, stream, LayerRows{l, all, {}, false}, {Intervention::kStream});
    auto gates = alpha_kv.clamp(0, 1).repeat_interleave(H / K, 1);  // [L, H]: the reference's clamp(0, 1) in the forward
    h.edit(Point::kAttnZ, [&](int l, const at::Tensor& x) -> std::optional<at::Tensor> {
        auto a = gates.select(0, l).view({1, 1, H, 1}).to(x.scalar_type());
        return a * ref.z[l] + (1 - a) * x;
    });
    auto hs = final_hidden(m, ref.rows, h);
    return (hs - ref.hidden).pow(2).mean(-1).sum();
}

int64_t positions(const std::vector<Reference>& refs) {
    int64_t n = 0;
    for (const auto& r : refs) n += r.rows.row.size(0);
    return n;
}

double loss_at(const Model& m, const std::vector<Reference>& refs, const DuoGateOptions& o, const at::Tensor& alpha_kv) {
    torch::NoGradGuard ng;
    double s = 0;
    for (const auto& r : refs) s += gated_error(m, r, o, alpha_kv).item<double>();
    return s / static_cast<double>(positions(refs));
}

}  // namespace

double duo_distillation_loss(const Model& m, const Ablator& ab, const DuoGateOptions& o, const at::Tensor& alpha_kv) {
    return loss_at(m, references(m, ab), o, alpha_kv.to(m.options.device, torch::kFloat));
}

at::Tensor duo_distillation_grad(const Model& m, const Ablator& ab, const DuoGateOptions& o, const at::Tensor& alpha_kv) {
    const auto refs = references(m, ab);
    const double P = static_cast<double>(positions(refs));
    torch::AutoGradMode grad(true);
    auto a = alpha_kv.to(m.options.device, torch::kFloat).detach().clone().requires_grad_(true);
    for (const auto& ref : refs) (gated_error(m, ref, o, a) / P).backward();
    return a.grad().to(torch::kCPU);
}

DuoGateResult fit_duo_gates(const Model& m, const Ablator& ab, const DuoGateOptions& o,
                            const std::function<void(int64_t, double)>& step_fn) {
    if (o.steps < 1) throw ConfigError("duo-gates: steps must be at least 1");
    if (o.window.sink < 0 || o.window.recent < 1) throw ConfigError("duo-gates: the window needs sink >= 0 and recent >= 1");
    const int64_t L = m.config.n_layers, H = m.config.n_heads, K = m.config.n_kv_heads;
    const auto dev = m.options.device;
    const auto refs = references(m, ab);
    const double P = static_cast<double>(positions(refs));
    DuoGateResult r;
    const auto fopt = torch::TensorOptions().dtype(torch::kFloat).device(dev);
    r.distill_full = loss_at(m, refs, o, torch::ones({L, K}, fopt));
    r.distill_stream = loss_at(m, refs, o, torch::zeros({L, K}, fopt));
    auto alpha = torch::full({L, K}, o.init, fopt).requires_grad_(true);
    torch::optim::Adam opt({alpha}, torch::optim::AdamOptions(o.lr));
    r.history = torch::zeros({o.steps, 2}, torch::kDouble);
    // The reference's LambdaLR: min(1, max((s + 1) / (N // 5), 0.1), max((N - s) / (N // 5), 0.1)).
    const double fifth = static_cast<double>(std::max<int64_t>(1, o.steps / 5));
    for (int64_t step = 0; step < o.steps; ++step) {
        {
            torch::NoGradGuard ng;
            alpha.clamp_(0, 1);
        }
        torch::AutoGradMode grad(true);
        opt.zero_grad();
        double distill = 0;
        std::vector<Reference> fresh;  // this step's own sample (o.sample), else the fixed prompts
        if (o.sample) {
            fresh.push_back(reference_of(m, o.sample(step)));
            if (fresh.back().rows.row.size(0) == 0) throw ConfigError(fmt::format("duo-gates: step {}'s sample labels no position", step));
        }
        const auto& step_refs = o.sample ? fresh : refs;
        const double step_P = o.sample ? static_cast<double>(positions(fresh)) : P;
        for (const auto& ref : step_refs) {  // one backward per chunk: memory of one chunk's graph
            auto e = gated_error(m, ref, o, alpha) / step_P;
            e.backward();
            distill += e.item<double>();
        }
        auto reg = alpha.abs().mean();
        (o.lambda * reg).backward();
        const double s = static_cast<double>(step);
        const double n = static_cast<double>(o.steps);
        const double f = std::min({1.0, std::max((s + 1) / fifth, 0.1), std::max((n - s) / fifth, 0.1)});
        static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options()).lr(o.lr * f);
        opt.step();
        r.history[step][0] = distill;
        r.history[step][1] = reg.item<double>();
        if (step_fn) step_fn(step, distill + o.lambda * reg.item<double>());
    }
    torch::NoGradGuard ng;
    r.alpha_kv = alpha.detach().clamp(0, 1).to(torch::kCPU);
    r.alpha = r.alpha_kv.repeat_interleave(H / K, 1).contiguous();
    r.distill_final = loss_at(m, refs, o, r.alpha_kv.to(dev));
    return r;
}

DuoDeployment duo_deploy(const DuoGateResult& r, const DuoDeploy& d) {
    if (!(d.value >= 0 && d.value <= 1))
        throw ConfigError(fmt::format("duo-gates deploy: {} {} is not in [0, 1]", d.sparsity ? "sparsity" : "threshold", d.value));
    const int64_t L = r.alpha_kv.size(0), K = r.alpha_kv.size(1), H = r.alpha.size(1);
    DuoDeployment out;
    out.how = d;
    auto a = r.alpha_kv.to(torch::kCPU, torch::kDouble).contiguous();
    std::vector<double> gates(a.data_ptr<double>(), a.data_ptr<double>() + L * K);
    out.streamed_kv = torch::zeros({L, K}, torch::kUInt8);
    auto* s = out.streamed_kv.data_ptr<uint8_t>();
    if (d.sparsity) {  // duo_attn/utils.py l. 353-373, the one transcription (duo_sparsity.h)
        const DuoSparsified sp = duo_sparsify(gates, d.value, duo_tie_noise(L * K, d.noise_seed));
        for (int64_t i = 0; i < L * K; ++i) s[i] = sp.full[static_cast<size_t>(i)] ? 0 : 1;
        out.threshold = sp.threshold, out.returned_sparsity = sp.sparsity;
    } else {
        int64_t n = 0;
        for (int64_t i = 0; i < L * K; ++i) n += (s[i] = gates[static_cast<size_t>(i)] < d.value ? 1 : 0);
        out.threshold = d.value, out.returned_sparsity = static_cast<double>(n) / static_cast<double>(L * K);
    }
    out.streamed = out.streamed_kv.repeat_interleave(H / K, 1).contiguous();
    return out;
}

StudyConfigs duo_configs(const DuoGateResult& r, const DuoDeployment& d, int64_t controls, int64_t seed) {
    StudyConfigs c;
    const int64_t L = r.alpha.size(0), H = r.alpha.size(1);
    auto add = [&](at::Tensor m, const std::string& kind, const std::string& label, int64_t cs) {
        const int64_t k = m.sum().item<int64_t>();
        c.masks.push_back(std::move(m)), c.kinds.push_back(kind), c.labels.push_back(label), c.k.push_back(k);
        c.control_seed.push_back(cs), c.fraction.push_back(static_cast<double>(k) / static_cast<double>(L * H));
    };
    add(torch::zeros({L, H}, torch::kUInt8), "baseline", "baseline", -1);
    auto streamed = d.streamed.clone();
    const int64_t k = streamed.sum().item<int64_t>();
    const int64_t K = d.streamed_kv.size(1), kv = d.streamed_kv.sum().item<int64_t>();
    add(streamed, "duo",
        d.how.sparsity ? fmt::format("sparsity {}: {} of {} KV heads streamed ({} of {} heads)", d.how.value, kv, L * K, k, L * H)
                       : fmt::format("alpha < {} streamed ({} of {} heads)", d.how.value, k, L * H),
        -1);
    std::vector<int64_t> pool(static_cast<size_t>(L * H));
    for (int64_t j = 0; j < L * H; ++j) pool[static_cast<size_t>(j)] = j;
    for (int64_t i = 0; i < controls; ++i) {
        const int64_t cs = seed * 1000003 + 1009 + i;
        auto m = torch::zeros({L, H}, torch::kUInt8);
        for (int64_t t : random_subset(pool, k, static_cast<uint64_t>(cs))) m[t / H][t % H] = 1;
        add(m, "control", fmt::format("control {}: {} random heads streamed", i, k), cs);
    }
    return c;
}

}  // namespace hs
