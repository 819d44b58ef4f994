// The per-trial results of `headscope retrieval` as stored, the scores computed from them, and the
// merge of a needle scan's shards (see needle_store.h).
#include "needle_store.h"

#include "schema.h"

#include "common.h"
#include "errors.h"
#include "progress.h"
#include "util.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

namespace hs::cli {

namespace {
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

std::string attr_text(const AttrValue& v) {
    std::string s = attr_to_string(v);
    const bool list = std::holds_alternative<std::vector<int64_t>>(v) || std::holds_alternative<std::vector<double>>(v) ||
                      std::holds_alternative<std::vector<std::string>>(v);
    if (list && s.size() >= 2 && s.front() == '[' && s.back() == ']' && s.find(',') == std::string::npos)
        s = s.substr(1, s.size() - 2);
    return s;
}

void NeedleResults::init(int64_t n, int64_t l, int64_t h, int64_t st, int64_t ast, bool ws) {
    N = n, L = l, H = h, steps = st, abl_steps = ast, with_steps = ws;
    done.assign(N, 0);
    generated.assign(N * steps, -1);
    response.assign(N, "");
    rouge1.assign(N, kNaNf), rougeL.assign(N, kNaNf);
    passed.assign(N, 0);
    answer_steps.assign(N, 0);
    retrieval.assign(N * L * H, kNaNf), locos.assign(N * L * H, kNaNf);
    lplus.assign(N * L * H, kNaNf), lminus.assign(N * L * H, kNaNf);
    const int64_t per = with_steps ? N * steps * L * H : 0;
    step_credit.assign(per, kNaNf), step_lplus.assign(per, kNaNf), step_lminus.assign(per, kNaNf);
    S = 0;
    masks.clear(), abl_done.clear(), abl_rouge1.clear(), abl_rougeL.clear(), abl_passed.clear(), abl_generated.clear();
}

void NeedleResults::init_sets(const std::vector<std::vector<std::pair<int, int>>>& sets) {
    S = static_cast<int64_t>(sets.size());
    masks.assign(S * L * H, 0);
    for (int64_t s = 0; s < S; ++s)
        for (auto [l, h] : sets[s]) masks[(s * L + l) * H + h] = 1;
    abl_done.assign(S * N, 0);
    abl_rouge1.assign(S * N, kNaNf), abl_rougeL.assign(S * N, kNaNf);
    abl_passed.assign(S * N, 0);
    abl_generated.assign(S * N * abl_steps, -1);
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
        const auto v = host_floats(t);
        std::copy(v.begin(), v.end(), dst.begin() + i * LH);
    };
    put(retrieval, r.retrieval), put(locos, r.locos), put(lplus, r.lplus), put(lminus, r.lminus);
    if (with_steps && r.steps_credit.defined()) {
        auto put_steps = [&](std::vector<float>& dst, const at::Tensor& t) {
            const auto v = host_floats(t);  // [taken, L, H], taken <= steps
            std::fill(dst.begin() + i * steps * LH, dst.begin() + (i + 1) * steps * LH, kNaNf);
            std::copy_n(v.begin(), std::min<int64_t>(static_cast<int64_t>(v.size()), steps * LH), dst.begin() + i * steps * LH);
        };
        put_steps(step_credit, r.steps_credit), put_steps(step_lplus, r.steps_lplus), put_steps(step_lminus, r.steps_lminus);
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
    std::copy_n(f.retrieval.begin() + i * L * H, L * H, retrieval.begin() + i * L * H);
    std::copy_n(f.locos.begin() + i * L * H, L * H, locos.begin() + i * L * H);
    std::copy_n(f.lplus.begin() + i * L * H, L * H, lplus.begin() + i * L * H);
    std::copy_n(f.lminus.begin() + i * L * H, L * H, lminus.begin() + i * L * H);
    if (with_steps && f.with_steps && f.steps == steps) {
        const int64_t n = steps * L * H;
        std::copy_n(f.step_credit.begin() + i * n, n, step_credit.begin() + i * n);
        std::copy_n(f.step_lplus.begin() + i * n, n, step_lplus.begin() + i * n);
        std::copy_n(f.step_lminus.begin() + i * n, n, step_lminus.begin() + i * n);
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

MergeStage::MergeStage(const std::string& first, const std::string& out) : tmp_(temp_path_for(out) + "-merge") {
    try {
        std::filesystem::copy_file(first, tmp_, std::filesystem::copy_options::overwrite_existing);
    } catch (const std::exception&) {
        std::remove(tmp_.c_str());
        throw StorageError(fmt::format("{}: cannot create (is the folder writable?)", out));
    }
}

Attrs merged_attrs(const std::vector<std::string>& inputs, bool complete) {
    return {{"shard", std::string("merged")},
            {"merged_from", inputs},
            {"shard_index", int64_t(0)},
            {"shard_count", int64_t(1)},
            {"complete", int64_t(complete)}};
}

MergeStage::~MergeStage() { std::remove(tmp_.c_str()); }

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

void write_needle_results(ResultWriter& w, const NeedleResults& r, const NeedleSummary& s, bool want_ret, bool want_locos) {
    auto put = [&](const std::string& name, const auto& data, const std::vector<int64_t>& shape) {
        if (w.exists(name)) w.remove(name);
        w.write(name, data, shape);
    };
    const int64_t N = r.N, L = r.L, H = r.H;
    const std::string tg = schema::retrieval_trials();
    put(tg + "/generated", r.generated, {N, r.steps});
    if (w.exists(tg + "/response")) w.remove(tg + "/response");
    w.write_strings(tg + "/response", r.response);
    put(tg + "/rouge1_recall", r.rouge1, {N});
    put(tg + "/rougeL_f", r.rougeL, {N});
    put(tg + "/passed", r.passed, {N});
    put(tg + "/answer_steps", r.answer_steps, {N});
    put(tg + schema::retrieval(), r.retrieval, {N, L, H});
    put(tg + "/locos", r.locos, {N, L, H});
    put(tg + "/lplus", r.lplus, {N, L, H});
    put(tg + "/lminus", r.lminus, {N, L, H});
    put(tg + "/done", r.done, {N});
    if (r.with_steps) {
        const std::string sg = schema::retrieval() + "/steps";
        put(sg + "/credit", r.step_credit, {N, r.steps, L, H});
        put(sg + "/lplus", r.step_lplus, {N, r.steps, L, H});
        put(sg + "/lminus", r.step_lminus, {N, r.steps, L, H});
        w.set_attrs(sg, {{"description", std::string("per trial and decode step (NaN past the trial's end): each head's "
                                                      "retrieval credit, and L+ and L- for the step's generated token "
                                                      "(NaN where the needle's span was not found)")}});
    }
    const Attrs common = {{"n_passed", s.n_pass}, {"accuracy", s.accuracy}, {"n_trials_done", s.n_done}};
    w.set_attrs(schema::retrieval(), common);
    if (want_ret) {
        put(schema::scores("retrieval", "score"), host_floats(s.ret), {L, H});
        Attrs a = common;
        a["flagged"] = s.flagged;
        a["n_trials_scored"] = s.n_pass;
        w.set_attrs(schema::scores("retrieval"), a);
    }
    if (want_locos) {
        put(schema::scores("locos", "score"), host_floats(s.locos), {L, H});
        put(schema::scores("locos", "ci_low"), host_floats(s.ci_low), {L, H});
        put(schema::scores("locos", "ci_high"), host_floats(s.ci_high), {L, H});
        Attrs a = common;
        a["n_trials_scored"] = s.n_locos;
        w.set_attrs(schema::scores("locos"), a);
    }
    if (r.S > 0) {
        const std::string ag = schema::retrieval_ablation();
        const int64_t S = r.S;
        put(ag + "/masks", r.masks, {S, L, H});
        put(ag + "/rouge1_recall", r.abl_rouge1, {S, N});
        put(ag + "/rougeL_f", r.abl_rougeL, {S, N});
        put(ag + "/passed", r.abl_passed, {S, N});
        put(ag + "/done", r.abl_done, {S, N});
        put(ag + "/generated", r.abl_generated, {S, N, r.abl_steps});
        put(ag + "/accuracy", s.abl_acc, {S});
        // The baseline of the ablated passes: the scan's trials, or (when the ablation passes decode
        // prompts of their own) the last set, which ablates no head.
        int64_t base = -1;
        if (S > 1 && std::all_of(r.masks.begin() + (S - 1) * L * H, r.masks.begin() + S * L * H, [](int32_t v) { return v == 0; }))
            base = S - 1;
        if (base < 0) {
            put(ag + "/baseline_rouge1_recall", r.rouge1, {N});
            put(ag + "/baseline_rougeL_f", r.rougeL, {N});
            put(ag + "/baseline_accuracy", std::vector<float>{static_cast<float>(s.accuracy)}, {1});
        } else {
            put(ag + "/baseline_rouge1_recall", std::vector<float>(r.abl_rouge1.begin() + base * N, r.abl_rouge1.begin() + (base + 1) * N), {N});
            put(ag + "/baseline_rougeL_f", std::vector<float>(r.abl_rougeL.begin() + base * N, r.abl_rougeL.begin() + (base + 1) * N), {N});
            put(ag + "/baseline_accuracy", std::vector<float>{s.abl_acc[static_cast<size_t>(base)]}, {1});
        }
    }
}

NeedleResults read_needle_results(const ResultReader& f) {
    const std::string tg = schema::retrieval_trials();
    if (!f.exists(tg + "/done"))
        throw StorageError(fmt::format("{}: holds no resumable or mergeable needle results (no {}/done: not written by "
                                       "`headscope retrieval`, or by a version before shards)", f.path(), tg));
    const auto meta = f.exists(schema::meta()) ? f.attrs(schema::meta()) : Attrs{};
    auto meta_int = [&](const char* k) -> int64_t {
        if (!meta.count(k)) throw StorageError(fmt::format("{}: /meta has no attribute {}", f.path(), k));
        try {
            return std::stoll(attr_text(meta.at(k)));
        } catch (const std::exception&) {
            throw StorageError(fmt::format("{}: /meta attribute {} is not an integer", f.path(), k));
        }
    };
    NeedleResults r;
    auto done = f.read_numbers(tg + "/done"), gen = f.read_numbers(tg + "/generated");
    if (done.shape.size() != 1 || gen.shape.size() != 2 || gen.shape[0] != done.shape[0])
        throw StorageError(fmt::format("{}: {}/done {} and generated {} do not fit; damaged file", f.path(), tg,
                                       shape_str(done.shape), shape_str(gen.shape)));
    const int64_t L = meta_int("n_layers"), H = meta_int("n_heads");
    if (L < 1 || H < 1 || L > 100000 || H > 100000) throw StorageError(fmt::format("{}: /meta n_layers {} n_heads {}", f.path(), L, H));
    const std::string ag = schema::retrieval_ablation();
    const int64_t abl_steps = f.exists(ag + "/generated") ? f.read_numbers(ag + "/generated").shape.back() : gen.shape[1];
    const bool with_steps = f.exists("/retrieval/steps/credit");
    r.init(done.shape[0], L, H, gen.shape[1], abl_steps, with_steps);
    const int64_t N = r.N;
    auto numbers = [&](const std::string& name, const std::vector<int64_t>& shape) {
        auto d = f.read_numbers(name);
        if (d.shape != shape)
            throw StorageError(fmt::format("{}: {} has shape {}, expected {}; damaged file", f.path(), name,
                                           shape_str(d.shape), shape_str(shape)));
        return d.values;
    };
    auto conv = [](auto& dst, const std::vector<double>& src) {
        for (size_t k = 0; k < src.size(); ++k) dst[k] = static_cast<std::decay_t<decltype(dst[0])>>(src[k]);
    };
    conv(r.done, done.values);
    conv(r.generated, gen.values);
    conv(r.rouge1, numbers(tg + "/rouge1_recall", {N}));
    conv(r.rougeL, numbers(tg + "/rougeL_f", {N}));
    conv(r.passed, numbers(tg + "/passed", {N}));
    conv(r.answer_steps, numbers(tg + "/answer_steps", {N}));
    conv(r.retrieval, numbers(tg + schema::retrieval(), {N, L, H}));
    conv(r.locos, numbers(tg + "/locos", {N, L, H}));
    if (f.exists(tg + "/lplus")) conv(r.lplus, numbers(tg + "/lplus", {N, L, H}));
    if (f.exists(tg + "/lminus")) conv(r.lminus, numbers(tg + "/lminus", {N, L, H}));
    if (with_steps) {
        conv(r.step_credit, numbers("/retrieval/steps/credit", {N, r.steps, L, H}));
        conv(r.step_lplus, numbers("/retrieval/steps/lplus", {N, r.steps, L, H}));
        conv(r.step_lminus, numbers("/retrieval/steps/lminus", {N, r.steps, L, H}));
    }
    auto resp = f.read(tg + "/response");
    if (!resp.is_string || static_cast<int64_t>(resp.strings.size()) != N)
        throw StorageError(fmt::format("{}: {}/response is not {} strings; damaged file", f.path(), tg, N));
    r.response = resp.strings;
    if (f.exists(ag + "/done")) {
        auto mk = f.read_numbers(ag + "/masks");
        if (mk.shape.size() != 3 || mk.shape[1] != L || mk.shape[2] != H)
            throw StorageError(fmt::format("{}: {}/masks has shape {}, expected [S, {}, {}]; damaged file", f.path(), ag,
                                           shape_str(mk.shape), L, H));
        r.S = mk.shape[0];
        r.masks.assign(r.S * L * H, 0);
        conv(r.masks, mk.values);
        r.abl_done.assign(r.S * N, 0), r.abl_rouge1.assign(r.S * N, kNaNf), r.abl_rougeL.assign(r.S * N, kNaNf);
        r.abl_passed.assign(r.S * N, 0);
        conv(r.abl_done, numbers(ag + "/done", {r.S, N}));
        conv(r.abl_rouge1, numbers(ag + "/rouge1_recall", {r.S, N}));
        conv(r.abl_rougeL, numbers(ag + "/rougeL_f", {r.S, N}));
        conv(r.abl_passed, numbers(ag + "/passed", {r.S, N}));
        r.abl_generated.assign(r.S * N * r.abl_steps, -1);
        if (f.exists(ag + "/generated")) conv(r.abl_generated, numbers(ag + "/generated", {r.S, N, r.abl_steps}));
    }
    return r;
}

std::string needle_config_difference(const ResultReader& a, const ResultReader& b) {
    static const std::set<std::string> kNotConfig = {"n_passed", "accuracy", "n_trials_done", "haystack_file",
                                                     "needles_file", "shard", "shard_index", "shard_count",
                                                     "complete", "merged_from"};
    auto compare = [&](const std::string& obj, const std::set<std::string>& only) -> std::string {
        const bool ea = a.exists(obj), eb = b.exists(obj);
        if (ea != eb) return fmt::format("{}: {} vs {}", obj, ea ? "present" : "absent", eb ? "present" : "absent");
        if (!ea) return "";
        const auto x = a.attrs(obj), y = b.attrs(obj);
        std::set<std::string> keys;
        for (const auto& kv : x) keys.insert(kv.first);
        for (const auto& kv : y) keys.insert(kv.first);
        for (const auto& k : keys) {
            if (kNotConfig.count(k) || (!only.empty() && !only.count(k))) continue;
            const std::string vx = x.count(k) ? attr_text(x.at(k)) : "(absent)", vy = y.count(k) ? attr_text(y.at(k)) : "(absent)";
            if (vx != vy) {
                auto cut = [](std::string v) { return v.size() > 80 ? v.substr(0, 77) + "..." : v; };
                return fmt::format("{} {} vs {}", k, cut(vx), cut(vy));
            }
        }
        return "";
    };
    for (auto d : {compare(schema::meta(), {"weights_sha256", "dtype", "n_layers", "n_heads"}), compare(schema::retrieval(), {}),
                   compare(schema::retrieval_ablation(), {})})
        if (!d.empty()) return d;
    return "";
}

static std::string attr_of(const ResultReader& r, const std::string& obj, const std::string& k) {
    if (!r.exists(obj)) return "";
    const auto a = r.attrs(obj);
    return a.count(k) ? attr_text(a.at(k)) : "";
}

void merge_retrieval(const MergeArgs& o, const std::vector<std::unique_ptr<ResultReader>>& rs) {
    const ResultReader& first = *rs.front();
    std::vector<NeedleResults> parts;
    int64_t count = -1;
    std::map<int64_t, std::string> by_index;
    for (const auto& r : rs) {
        parts.push_back(read_needle_results(*r));
        if (r.get() != &first) {
            const std::string d = needle_config_difference(first, *r);
            if (!d.empty())
                throw StorageError(fmt::format("{}: a shard of another needle scan than {} ({}); refusing to merge",
                                               r->path(), first.path(), d));
        }
        int64_t idx = -1, n = -1;
        try {
            idx = std::stoll(attr_of(*r, schema::retrieval(), "shard_index")), n = std::stoll(attr_of(*r, schema::retrieval(), "shard_count"));
        } catch (const std::exception&) {
            throw StorageError(fmt::format("{}: /retrieval has no shard_index / shard_count (merged already, or not a "
                                           "shard); refusing to merge", r->path()));
        }
        if (attr_of(*r, schema::retrieval(), "shard") == "merged")
            throw StorageError(fmt::format("{}: is a merged file, not a shard; refusing to merge", r->path()));
        if (count < 0) count = n;
        if (n != count)
            throw StorageError(fmt::format("{}: shard {}/{}, but {} is a shard of {}; refusing to merge", r->path(), idx, n,
                                           first.path(), count));
        if (by_index.count(idx))
            throw StorageError(fmt::format("{}: shard {}/{} given twice (also {}); refusing to merge", r->path(), idx, n,
                                           by_index[idx]));
        by_index[idx] = r->path();
        if (!o.partial && attr_of(*r, schema::retrieval(), "complete") != "1")
            throw StorageError(fmt::format("{}: shard {}/{} is incomplete (the task stopped early); rerun it with --resume, "
                                           "or merge with --partial", r->path(), idx, n));
    }
    std::vector<std::string> missing;
    for (int64_t i = 0; i < count; ++i)
        if (!by_index.count(i)) missing.push_back(std::to_string(i));
    if (!missing.empty() && !o.partial)
        throw StorageError(fmt::format("{}: shard{} {} of {} missing (give all {} shard files, or --partial); refusing to merge",
                                       first.path(), missing.size() > 1 ? "s" : "", fmt::join(missing, ", "), count, count));
    // Each trial (and each ablated trial) from the first shard that ran it.
    NeedleResults all;
    const NeedleResults& p0 = parts.front();
    all.init(p0.N, p0.L, p0.H, p0.steps, p0.abl_steps, p0.with_steps);
    if (p0.S > 0) {
        all.S = p0.S;
        all.masks = p0.masks;
        all.abl_done.assign(all.S * all.N, 0), all.abl_rouge1.assign(all.S * all.N, kNaNf);
        all.abl_rougeL.assign(all.S * all.N, kNaNf), all.abl_passed.assign(all.S * all.N, 0);
        all.abl_generated.assign(all.S * all.N * all.abl_steps, -1);
    }
    for (size_t k = 0; k < parts.size(); ++k) {
        const auto& p = parts[k];
        if (p.N != all.N || p.steps != all.steps || p.S != all.S)
            throw StorageError(fmt::format("{}: {} trials x {} steps, {} ablation sets; {} has {} x {}, {}; refusing to merge",
                                           rs[k]->path(), p.N, p.steps, p.S, first.path(), all.N, all.steps, all.S));
        for (int64_t i = 0; i < all.N; ++i)
            if (p.done[i] && !all.done[i]) all.copy_trial(p, i);
        for (int64_t s = 0; s < all.S; ++s) {
            if (!all.same_set(p, s, s))
                throw StorageError(fmt::format("{}: ablation set {} differs from {}'s; refusing to merge", rs[k]->path(), s,
                                               first.path()));
            for (int64_t i = 0; i < all.N; ++i)
                if (p.abl_done[s * all.N + i] && !all.abl_done[s * all.N + i]) all.copy_ablated(p, s, s, i);
        }
    }
    int64_t left = 0;
    for (auto d : all.done) left += !d;
    for (auto d : all.abl_done) left += !d;
    if (left && !o.partial)
        throw StorageError(fmt::format("{}: {} trial decodes are in none of the shards; refusing to merge", first.path(), left));
    int64_t bootstrap = 0, seed = 0;
    double flag = 0;
    try {
        bootstrap = std::stoll(attr_of(first, schema::retrieval(), "bootstrap_resamples"));
        seed = std::stoll(attr_of(first, schema::retrieval(), "seed"));
        flag = std::stod(attr_of(first, schema::retrieval(), "flag_threshold"));
    } catch (const std::exception&) {
        throw StorageError(fmt::format("{}: /retrieval lacks bootstrap_resamples, seed or flag_threshold", first.path()));
    }
    const RngKind rng = find_in(rng_kind_names(), attr_of(first, schema::retrieval(), "rng")).value_or(RngKind::kHeadscope);
    const NeedleSummary sum = summarize(all, bootstrap, static_cast<uint64_t>(seed), flag, rng);

    const MergeStage stage(first.path(), o.out);
    const std::string& tmp = stage.path();
    {
        ResultWriter w(tmp, WriteMode::kAppend);
        write_needle_results(w, all, sum, first.exists(schema::scores("retrieval")), first.exists(schema::scores("locos")));
        w.set_attrs(schema::retrieval(), merged_attrs(o.inputs, left == 0));
        w.commit();
    }
    rename_into_place(tmp, o.out);
    if (left) log_warn(fmt::format("{} trial decodes are in none of the shards (done = 0, NaN)", left));
    log_info(fmt::format("wrote {} (merged {} shards: {} trials, accuracy {:.3f})", o.out, rs.size(), sum.n_done, sum.accuracy));
}

}  // namespace hs::cli
