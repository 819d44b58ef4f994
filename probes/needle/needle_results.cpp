// The needle scan's results, their summary and its work items (see needle_results.h).
#include "needle_results.h"

#include "errors.h"
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

// The registry's arrays as the file names them, in the order written.
schema::NeedleArrayNames array_names() {
    schema::NeedleArrayNames n;
    for (const auto& row : needle_scores()) {
        for (const auto& a : row.trial_arrays) n.trials.push_back({a.name, a.in_every_file});
        for (const auto& a : row.step_arrays) n.steps.push_back({a.name, a.in_every_file});
    }
    return n;
}
}  // namespace

void NeedleResults::init(int64_t n, int64_t l, int64_t h, int64_t st, int64_t ast, bool ws) {
    schema::NeedleRecord r;  // the one place the arrays' initial values are set
    r.init(n, l, h, st, ast, ws, array_names());
    *this = from_record(std::move(r));
}

void NeedleResults::init_sets(int64_t s, std::vector<int32_t> m) {
    S = s;
    masks = std::move(m);
    masks.resize(S * L * H, 0);
    abl_done.assign(S * N, 0);
    abl_rouge1.assign(S * N, kNaNf), abl_rougeL.assign(S * N, kNaNf);
    abl_passed.assign(S * N, 0);
    abl_generated.assign(S * N * abl_steps, -1);
}

schema::NeedleRecord NeedleResults::to_record() const {
    schema::NeedleRecord r;
    r.N = N, r.L = L, r.H = H, r.steps = steps, r.abl_steps = abl_steps, r.with_steps = with_steps;
    r.done = done, r.generated = generated, r.response = response;
    r.rouge1 = rouge1, r.rougeL = rougeL, r.passed = passed, r.answer_steps = answer_steps;
    for (const auto& row : needle_scores()) {
        const auto k = static_cast<size_t>(row.id);
        for (size_t p = 0; p < row.trial_arrays.size(); ++p)
            r.trial_arrays.push_back({row.trial_arrays[p].name, row.trial_arrays[p].in_every_file, arrays[k][p]});
        for (size_t p = 0; p < row.step_arrays.size(); ++p)
            r.step_arrays.push_back({row.step_arrays[p].name, row.step_arrays[p].in_every_file, step_arrays[k][p]});
    }
    r.S = S, r.masks = masks, r.abl_done = abl_done, r.abl_rouge1 = abl_rouge1, r.abl_rougeL = abl_rougeL;
    r.abl_passed = abl_passed, r.abl_generated = abl_generated;
    return r;
}

NeedleResults NeedleResults::from_record(schema::NeedleRecord r) {
    NeedleResults o;
    o.N = r.N, o.L = r.L, o.H = r.H, o.steps = r.steps, o.abl_steps = r.abl_steps, o.with_steps = r.with_steps;
    o.done = std::move(r.done), o.generated = std::move(r.generated), o.response = std::move(r.response);
    o.rouge1 = std::move(r.rouge1), o.rougeL = std::move(r.rougeL), o.passed = std::move(r.passed);
    o.answer_steps = std::move(r.answer_steps);
    o.arrays = per_needle_score_trials<std::vector<float>>();
    o.step_arrays = per_needle_score_steps<std::vector<float>>();
    size_t t = 0, st = 0;  // the record's arrays are the registry's, in its order (array_names)
    for (const auto& row : needle_scores()) {
        const auto k = static_cast<size_t>(row.id);
        for (size_t p = 0; p < row.trial_arrays.size(); ++p, ++t) {
            HS_REQUIRE(t < r.trial_arrays.size() && r.trial_arrays[t].name == row.trial_arrays[p].name,
                       "NeedleResults::from_record: a record of other arrays than the registry's");
            o.arrays[k][p] = std::move(r.trial_arrays[t].values);
        }
        for (size_t p = 0; p < row.step_arrays.size(); ++p, ++st) {
            HS_REQUIRE(st < r.step_arrays.size() && r.step_arrays[st].name == row.step_arrays[p].name,
                       "NeedleResults::from_record: a record of other step arrays than the registry's");
            o.step_arrays[k][p] = std::move(r.step_arrays[st].values);
        }
    }
    o.S = r.S, o.masks = std::move(r.masks), o.abl_done = std::move(r.abl_done);
    o.abl_rouge1 = std::move(r.abl_rouge1), o.abl_rougeL = std::move(r.abl_rougeL);
    o.abl_passed = std::move(r.abl_passed), o.abl_generated = std::move(r.abl_generated);
    return o;
}

void NeedleResults::init_sets(const std::vector<std::vector<std::pair<int, int>>>& sets) {
    const int64_t n = static_cast<int64_t>(sets.size());
    std::vector<int32_t> m(n * L * H, 0);
    for (int64_t s = 0; s < n; ++s)
        for (auto [l, h] : sets[s]) m[(s * L + l) * H + h] = 1;
    init_sets(n, std::move(m));
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
    for (size_t k = 0; k < arrays.size(); ++k)
        for (size_t p = 0; p < arrays[k].size(); ++p) {
            const auto v = floats(r.arrays[k][p]);
            std::copy(v.begin(), v.end(), arrays[k][p].begin() + i * LH);
        }
    if (!with_steps || r.steps.empty()) return;
    for (size_t k = 0; k < step_arrays.size(); ++k)
        for (size_t p = 0; p < step_arrays[k].size(); ++p) {
            auto& dst = step_arrays[k][p];
            const auto v = floats(r.steps[k][p]);  // [taken, L, H], taken <= steps
            std::fill(dst.begin() + i * steps * LH, dst.begin() + (i + 1) * steps * LH, kNaNf);
            std::copy_n(v.begin(), std::min<int64_t>(static_cast<int64_t>(v.size()), steps * LH), dst.begin() + i * steps * LH);
        }
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
    for (size_t k = 0; k < arrays.size(); ++k)
        for (size_t p = 0; p < arrays[k].size(); ++p)
            std::copy_n(f.arrays[k][p].begin() + i * L * H, L * H, arrays[k][p].begin() + i * L * H);
    if (with_steps && f.with_steps && f.steps == steps) {
        const int64_t n = steps * L * H;
        for (size_t k = 0; k < step_arrays.size(); ++k)
            for (size_t p = 0; p < step_arrays[k].size(); ++p)
                std::copy_n(f.step_arrays[k][p].begin() + i * n, n, step_arrays[k][p].begin() + i * n);
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

int64_t NeedleSummary::n_scored(NeedleScore s) const {
    switch (needle_score(s).reduction) {
        case NeedleReduction::kAnswerStepMean: return n_locos;
        case NeedleReduction::kDoneMean: return n_query;
        case NeedleReduction::kPassedMean: break;
    }
    return n_pass;
}

schema::NeedleScoresRecord NeedleSummary::stored(NeedleScoreSet set) const {
    schema::NeedleScoresRecord out;
    out.n_done = n_done, out.n_pass = n_pass, out.accuracy = accuracy;
    for (NeedleScore id : set.list()) {
        const auto& row = needle_score(id);
        schema::NeedleScoreGroup g;
        g.name = row.name;
        g.score = floats(score(id));
        if (row.reduction == NeedleReduction::kAnswerStepMean) g.beside = {{"ci_low", floats(ci_low)}, {"ci_high", floats(ci_high)}};
        g.n_scored = n_scored(id);
        g.with_flagged = row.flags_heads;
        out.scores.push_back(std::move(g));
    }
    out.abl_accuracy = abl_acc;
    out.flagged = flagged;
    return out;
}

// The done trials' [L, H] arrays v at the trials idx, as [idx, L, H] double.
static at::Tensor gather_trials(const NeedleResults& r, const std::vector<float>& v, const std::vector<int64_t>& idx) {
    const int64_t LH = r.L * r.H;
    auto t = torch::empty({static_cast<int64_t>(idx.size()), r.L, r.H}, torch::kDouble);
    auto* p = t.data_ptr<double>();
    for (size_t k = 0; k < idx.size(); ++k)
        for (int64_t j = 0; j < LH; ++j) p[k * LH + j] = v[idx[k] * LH + j];
    return t;
}

// A score's reduction over the done trials (NeedleReduction) into s.
static void reduce_score(const NeedleResults& r, const NeedleScoreRow& row, const std::vector<int64_t>& pass_idx,
                         const std::vector<int64_t>& locos_idx, int64_t bootstrap, uint64_t seed, RngKind rng, NeedleSummary& s) {
    const auto nan = [&] { return torch::full({r.L, r.H}, kNaN, torch::kDouble); };
    auto& out = s.scores[static_cast<size_t>(row.id)];
    const auto& v = r.array(row.id);
    if (row.reduction == NeedleReduction::kPassedMean) {
        // HeadKV averages R2 over the trials with qa_f1 > 50 (retrieval_head_detection_r2.py lines
        // 314-317, 238-241); headscope uses its pass flag (ROUGE-1 recall > pass_threshold) instead.
        out = s.n_pass ? gather_trials(r, v, pass_idx).mean(0) : nan();
        return;
    }
    if (row.reduction == NeedleReduction::kDoneMean) {
        // QRHead's QRScore averages over every example (detect_qrhead_lme.py lines 14-31): here the
        // done trials whose array is a number (the needle's span found, the score computed).
        std::vector<int64_t> idx;
        for (int64_t i = 0; i < r.N; ++i)
            if (r.done[i] && std::isfinite(v[static_cast<size_t>(i * r.L * r.H)])) idx.push_back(i);
        s.n_query = static_cast<int64_t>(idx.size());
        out = idx.empty() ? nan() : gather_trials(r, v, idx).mean(0);
        return;
    }
    // LOCOS: the trials with an answer step, and the bootstrap intervals (one such score: ci_low, ci_high).
    auto samples = gather_trials(r, v, locos_idx);
    out = s.n_locos ? samples.mean(0) : nan();
    s.with_ci = s.n_locos >= kBootstrapMinTrials;
    const auto used = s.with_ci ? samples : samples.narrow(0, 0, 0);
    if (rng == RngKind::kReference)  // logit_contrib.py's numpy draws on the float32 trial scores
        std::tie(s.ci_low, s.ci_high) = bootstrap_ci_numpy(used.to(torch::kFloat), bootstrap, static_cast<uint32_t>(seed));
    else
        std::tie(s.ci_low, s.ci_high) = bootstrap_ci(used, bootstrap, seed);
}

NeedleSummary summarize(const NeedleResults& r, int64_t bootstrap, uint64_t seed, double flag_threshold, RngKind rng) {
    NeedleSummary s;
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
    s.scores.resize(static_cast<size_t>(kNeedleScoreCount));
    for (const auto& row : needle_scores()) {
        reduce_score(r, row, pass_idx, locos_idx, bootstrap, seed, rng, s);
        if (!row.flags_heads) continue;
        const auto& sc = s.score(row.id);
        for (int64_t l = 0; l < r.L; ++l)
            for (int64_t h = 0; h < r.H; ++h)
                if (sc[l][h].item<double>() > flag_threshold) s.flagged.push_back(format_head(static_cast<int>(l), static_cast<int>(h)));
    }
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

void write_needle_results(ResultWriter& w, const NeedleResults& r, const NeedleSummary& s, NeedleScoreSet set) {
    schema::write_needle_results(w, r.to_record(), s.stored(set));
}

NeedleResults read_needle_results(const ResultReader& f) {
    return NeedleResults::from_record(schema::read_needle_results(f, array_names()));
}

NeedleScoreSet needle_scores_in(const ResultReader& f) {
    NeedleScoreSet set;
    for (const auto& row : needle_scores())
        if (f.exists(schema::scores(row.name))) set.add(row.id);
    return set;
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
