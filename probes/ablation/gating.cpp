#include "gating.h"

#include "errors.h"

#include <fmt/format.h>
#include <torch/torch.h>

namespace hs {

const char* head_role_name(HeadRole r) {
    switch (r) {
        case HeadRole::kIrrelevant: return "irrelevant";
        case HeadRole::kFacilitating: return "facilitating";
        case HeadRole::kInterfering: return "interfering";
        case HeadRole::kUnstable: return "unstable";
    }
    return "?";
}

at::Tensor head_roles(const at::Tensor& g_plus, const at::Tensor& g_minus) {
    auto p = g_plus.ge(0.5), m = g_minus.ge(0.5);
    auto r = torch::full(g_plus.sizes(), static_cast<int8_t>(HeadRole::kUnstable), torch::kChar);
    r.masked_fill_(p.logical_and(m), static_cast<int8_t>(HeadRole::kFacilitating));
    r.masked_fill_(p.logical_not().logical_and(m.logical_not()), static_cast<int8_t>(HeadRole::kInterfering));
    r.masked_fill_(p.logical_and(m.logical_not()), static_cast<int8_t>(HeadRole::kIrrelevant));
    return r;
}

namespace {

// One fit of `logits` [S, L, H] (a leaf) at `lambda`; returns the final objective per start [S].
at::Tensor fit(const Ablator& ab, at::Tensor& logits, double lambda, const GatingOptions& o, int which,
               const std::function<void(int, int64_t, double)>& step_fn) {
    torch::AutoGradMode grad(true);
    const int64_t S = logits.size(0);
    torch::optim::Adam opt({logits}, torch::optim::AdamOptions(o.lr));
    const double sign = o.higher_is_better ? -1.0 : 1.0;
    for (int64_t step = 0; step < o.steps; ++step) {
        opt.zero_grad();
        auto gates = torch::sigmoid(logits);
        auto objective = sign * ab.gated_metric(gates).to(torch::kDouble);                       // [S]
        auto reg = logits.clamp(-4, 4).to(torch::kDouble).mean(std::vector<int64_t>{1, 2});    // [S]
        auto loss = objective - lambda * reg;
        loss.sum().backward();  // starts are independent: each start's gradient is its own loss's
        {
            torch::NoGradGuard ng;
            auto g = logits.grad();
            auto norm = g.view({S, -1}).norm(2, 1).clamp_min(1e-12);                           // [S]
            auto scale = (o.clip / norm).clamp_max(1.0).view({S, 1, 1});
            g.mul_(scale);
        }
        opt.step();
        if (step_fn) step_fn(which, step, loss.mean().item<double>());
    }
    torch::NoGradGuard ng;
    return (sign * ab.gated_metric(torch::sigmoid(logits)).to(torch::kDouble)).to(torch::kCPU) * sign;
}

}  // namespace

StudyConfigs gating_configs(const GatingResult& r) {
    StudyConfigs c;
    const int64_t S = r.g_plus.size(0), L = r.g_plus.size(1), H = r.g_plus.size(2);
    auto add = [&](at::Tensor m, const std::string& kind, const std::string& label) {
        const int64_t k = m.sum().item<int64_t>();
        c.masks.push_back(std::move(m)), c.kinds.push_back(kind), c.labels.push_back(label), c.k.push_back(k);
        c.control_seed.push_back(-1), c.fraction.push_back(static_cast<double>(k) / static_cast<double>(L * H));
    };
    add(torch::zeros({L, H}, torch::kUInt8), "baseline", "baseline");
    for (int64_t s = 0; s < S; ++s) {
        add(r.g_minus[s].lt(0.5).to(torch::kUInt8), "circuit", fmt::format("start {}: G- < 0.5 zeroed", s));
        add(r.g_plus[s].lt(0.5).to(torch::kUInt8), "interfering", fmt::format("start {}: G+ < 0.5 zeroed", s));
    }
    return c;
}

GatingResult fit_head_gates(const Ablator& ab, int L, int H, const GatingOptions& o,
                            const std::function<void(int, int64_t, double)>& step_fn) {
    if (o.starts < 1 || o.steps < 1) throw ConfigError("gating: starts and steps must be at least 1");
    // The package's create_masks: uniform(0, 1), clamped to [1e-6, 1 - 1e-6], to logits. Drawn on the
    // CPU from a seeded generator so a seed gives the same starts on every device.
    auto gen = at::detail::createCPUGenerator(o.seed);
    auto u = torch::rand({o.starts, L, H}, gen, torch::TensorOptions().dtype(torch::kFloat)).clamp(1e-6, 1 - 1e-6);
    const auto dev = ab.device();
    auto l0 = torch::log(u / (1 - u)).to(dev).requires_grad_(true);
    GatingResult r;
    r.objective = torch::zeros({3, o.starts}, torch::kDouble);
    r.objective[0] = fit(ab, l0, 0.0, o, 0, step_fn);
    auto lp = l0.detach().clone().requires_grad_(true);
    r.objective[1] = fit(ab, lp, o.lambda, o, 1, step_fn);
    auto lm = l0.detach().clone().requires_grad_(true);
    r.objective[2] = fit(ab, lm, -o.lambda, o, 2, step_fn);
    torch::NoGradGuard ng;
    r.g0 = torch::sigmoid(l0.detach()).to(torch::kCPU);
    r.g_plus = torch::sigmoid(lp.detach()).to(torch::kCPU);
    r.g_minus = torch::sigmoid(lm.detach()).to(torch::kCPU);
    r.roles = head_roles(r.g_plus, r.g_minus);
    r.role_counts = torch::zeros({4, L, H}, torch::kLong);
    for (int k = 0; k < 4; ++k) r.role_counts[k] = r.roles.eq(k).sum(0);
    r.role = r.role_counts.argmax(0).to(torch::kChar);  // first maximum: the lower role value on ties
    return r;
}

}  // namespace hs
