// The needle scan's results, their summary and its work items (see needle_results.h).
#include "needle_results.h"

#include "heads.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

namespace hs {

namespace {
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<float> floats(const at::Tensor& t) {
    const auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous();
    return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}
}  // namespace

void NeedleResults::init_sets(const std::vector<std::vector<std::pair<int, int>>>& sets) {
    const int64_t n = static_cast<int64_t>(sets.size());
    std::vector<int32_t> m(n * L * H, 0);
    for (int64_t s = 0; s < n; ++s)
        for (auto [l, h] : sets[s]) m[(s * L + l) * H + h] = 1;
    schema::NeedleRecord::init_sets(n, std::move(m));
}

void NeedleResults::set_trial(int64_t i, const TrialResult& r) {
    done[i] = 1;
    std::fill(generated.begin() + i * steps, generated.begin() + (i + 1) * steps, -1);
    std::copy_n(r.generated.begin(), std::min<int64_t>(steps, r.generated.size()), generated.begin() + i * steps);
    response[i] = r.response;
    rouge1[i] = static_cast<float>(r.rouge1_recall), rougeL[i] = static_cast<float>(r.rougeL_f);
    passed[i] = r.passed;
    answer_steps[i] = r.answer_steps;
    const int64_t LH = L * H;
    auto put = [&](std::vector<float>& dst, const at::Tensor& t) {
        const auto v = floats(t);
        std::copy(v.begin(), v.end(), dst.begin() + i * LH);
    };
    put(retrieval, r.retrieval), put(locos, r.locos), put(lplus, r.lplus), put(lminus, r.lminus), put(r2, r.r2);
    if (!with_steps || !r.steps_credit.defined()) return;
    auto put_steps = [&](std::vector<float>& dst, const at::Tensor& t) {
        const auto v = floats(t);  // [taken, L, H], taken <= steps
        std::fill(dst.begin() + i * steps * LH, dst.begin() + (i + 1) * steps * LH, kNaNf);
        std::copy_n(v.begin(), std::min<int64_t>(static_cast<int64_t>(v.size()), steps * LH), dst.begin() + i * steps * LH);
    };
    put_steps(step_credit, r.steps_credit), put_steps(step_lplus, r.steps_lplus), put_steps(step_lminus, r.steps_lminus);
    put_steps(step_r2, r.steps_r2);
}

void NeedleResults::set_ablated(int64_t s, int64_t i, const TrialResult& r) {
    abl_done[s * N + i] = 1;
    abl_rouge1[s * N + i] = static_cast<float>(r.rouge1_recall);
    abl_rougeL[s * N + i] = static_cast<float>(r.rougeL_f);
    abl_passed[s * N + i] = r.passed;
    auto g = abl_generated.begin() + (s * N + i) * abl_steps;
    std::fill(g, g + abl_steps, -1);
    std::copy_n(r.generated.begin(), std::min<int64_t>(abl_steps, r.generated.size()), g);
}

void NeedleResults::copy_trial(const NeedleResults& f, int64_t i) {
    done[i] = 1;
    std::copy_n(f.generated.begin() + i * steps, steps, generated.begin() + i * steps);
    response[i] = f.response[i];
    rouge1[i] = f.rouge1[i], rougeL[i] = f.rougeL[i], passed[i] = f.passed[i], answer_steps[i] = f.answer_steps[i];
    std::copy_n(f.retrieval.begin() + i * L * H, L * H, retrieval.begin() + i * L * H);
    std::copy_n(f.locos.begin() + i * L * H, L * H, locos.begin() + i * L * H);
    std::copy_n(f.lplus.begin() + i * L * H, L * H, lplus.begin() + i * L * H);
    std::copy_n(f.lminus.begin() + i * L * H, L * H, lminus.begin() + i * L * H);
    std::copy_n(f.r2.begin() + i * L * H, L * H, r2.begin() + i * L * H);
    if (with_steps && f.with_steps && f.steps == steps) {
        const int64_t n = steps * L * H;
        std::copy_n(f.step_credit.begin() + i * n, n, step_credit.begin() + i * n);
        std::copy_n(f.step_lplus.begin() + i * n, n, step_lplus.begin() + i * n);
        std::copy_n(f.step_lminus.begin() + i * n, n, step_lminus.begin() + i * n);
        std::copy_n(f.step_r2.begin() + i * n, n, step_r2.begin() + i * n);
    }
}

void NeedleResults::copy_ablated(const NeedleResults& f, int64_t fs, int64_t s, int64_t i) {
    abl_done[s * N + i] = 1;
    abl_rouge1[s * N + i] = f.abl_rouge1[fs * N + i];
    abl_rougeL[s * N + i] = f.abl_rougeL[fs * N + i];
    abl_passed[s * N + i] = f.abl_passed[fs * N + i];
    if (f.abl_steps == abl_steps)
        std::copy_n(f.abl_generated.begin() + (fs * N + i) * abl_steps, abl_steps, abl_generated.begin() + (s * N + i) * abl_steps);
}

bool NeedleResults::same_set(const NeedleResults& o, int64_t os, int64_t s) const {
    if (o.L != L || o.H != H || os >= o.S || s >= S) return false;
    return std::equal(masks.begin() + s * L * H, masks.begin() + (s + 1) * L * H, o.masks.begin() + os * L * H);
}

schema::NeedleScoresRecord NeedleSummary::stored() const {
    schema::NeedleScoresRecord s;
    s.n_done = n_done, s.n_pass = n_pass, s.n_locos = n_locos, s.accuracy = accuracy;
    s.retrieval = floats(ret), s.locos = floats(locos), s.ci_low = floats(ci_low), s.ci_high = floats(ci_high);
    s.r2 = floats(r2);
    s.abl_accuracy = abl_acc;
    s.flagged = flagged;
    return s;
}

NeedleSummary summarize(const NeedleResults& r, int64_t bootstrap, uint64_t seed, double flag_threshold, RngKind rng) {
    NeedleSummary s;
    const int64_t LH = r.L * r.H;
    std::vector<int64_t> pass_idx, locos_idx;
    double rl = 0;
    for (int64_t i = 0; i < r.N; ++i) {
        if (!r.done[i]) continue;
        ++s.n_done;
        rl += r.rougeL[i];
        if (!r.passed[i]) continue;
        pass_idx.push_back(i);
        if (r.answer_steps[i] > 0) locos_idx.push_back(i);
    }
    s.n_pass = static_cast<int64_t>(pass_idx.size()), s.n_locos = static_cast<int64_t>(locos_idx.size());
    s.accuracy = s.n_done ? static_cast<double>(s.n_pass) / static_cast<double>(s.n_done) : kNaN;
    s.rougeL = s.n_done ? rl / static_cast<double>(s.n_done) : kNaN;
    auto gather = [&](const std::vector<float>& v, const std::vector<int64_t>& idx) {
        auto t = torch::empty({static_cast<int64_t>(idx.size()), r.L, r.H}, torch::kDouble);
        auto* p = t.data_ptr<double>();
        for (size_t k = 0; k < idx.size(); ++k)
            for (int64_t j = 0; j < LH; ++j) p[k * LH + j] = v[idx[k] * LH + j];
        return t;
    };
    s.ret = s.n_pass ? gather(r.retrieval, pass_idx).mean(0) : torch::full({r.L, r.H}, kNaN, torch::kDouble);
    // HeadKV's R2 is averaged over the trials with qa_f1 > 50 (retrieval_head_detection_r2.py lines
    // 314-317, 238-241); headscope uses its pass flag (ROUGE-1 recall > pass_threshold) instead.
    s.r2 = s.n_pass ? gather(r.r2, pass_idx).mean(0) : torch::full({r.L, r.H}, kNaN, torch::kDouble);
    auto samples = gather(r.locos, locos_idx);
    s.locos = s.n_locos ? samples.mean(0) : torch::full({r.L, r.H}, kNaN, torch::kDouble);
    s.with_ci = s.n_locos >= kBootstrapMinTrials;
    const auto used = s.with_ci ? samples : samples.narrow(0, 0, 0);
    if (rng == RngKind::kReference)  // logit_contrib.py's numpy draws on the float32 trial scores
        std::tie(s.ci_low, s.ci_high) = bootstrap_ci_numpy(used.to(torch::kFloat), bootstrap, static_cast<uint32_t>(seed));
    else
        std::tie(s.ci_low, s.ci_high) = bootstrap_ci(used, bootstrap, seed);
    for (int64_t l = 0; l < r.L; ++l)
        for (int64_t h = 0; h < r.H; ++h)
            if (s.ret[l][h].item<double>() > flag_threshold) s.flagged.push_back(format_head(static_cast<int>(l), static_cast<int>(h)));
    for (int64_t si = 0; si < r.S; ++si) {
        int64_t cnt = 0, passed = 0;
        double rls = 0;
        for (int64_t i = 0; i < r.N; ++i) {
            if (!r.abl_done[si * r.N + i]) continue;
            ++cnt, passed += r.abl_passed[si * r.N + i], rls += r.abl_rougeL[si * r.N + i];
        }
        s.abl_acc.push_back(cnt ? static_cast<float>(passed) / static_cast<float>(cnt) : kNaNf);
        s.abl_rougeL.push_back(cnt ? static_cast<float>(rls / static_cast<double>(cnt)) : kNaNf);
    }
    return s;
}

int64_t NeedleWork::item(int64_t set, int64_t g) const {
    const int64_t G = static_cast<int64_t>(test_.batches().size()), Ga = static_cast<int64_t>(test_.ablation_batches().size());
    if (set < 0) return g;
    return rows_ ? G + g : G + set * Ga + g;
}

bool NeedleWork::batch_done(const NeedleResults& r, int64_t set, int64_t g) const {
    const auto& done = set < 0 ? r.done : r.abl_done;
    const int64_t offset = set < 0 ? 0 : set * r.N;
    for (auto i : batches_of(set)[static_cast<size_t>(g)])
        if (!done[offset + i]) return false;
    return true;
}

bool NeedleWork::complete(const NeedleResults& r, int64_t n_sets, int64_t shard_index, int64_t shard_count) const {
    for (int64_t set = -1; set < n_sets; ++set) {
        const int64_t G = static_cast<int64_t>(batches_of(set).size());
        for (int64_t g = 0; g < G; ++g) {
            if (item(set, g) % shard_count != shard_index) continue;
            if (set >= 0 && r.S <= set) return false;
            if (!batch_done(r, set, g)) return false;
        }
    }
    return true;
}

int64_t NeedleWork::owned_decodes(int64_t n_sets, int64_t shard_index, int64_t shard_count) const {
    int64_t n = 0;
    for (int64_t set = -1; set < n_sets; ++set) {
        const auto& batches = batches_of(set);
        for (int64_t g = 0; g < static_cast<int64_t>(batches.size()); ++g)
            if (item(set, g) % shard_count == shard_index) n += static_cast<int64_t>(batches[static_cast<size_t>(g)].size());
    }
    return n;
}

}  // namespace hs
