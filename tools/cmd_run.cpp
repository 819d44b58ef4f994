// headscope run: a masking/ablation experiment from YAML (docs/experiments.md) into HDF5
// (docs/hdf5-schema.md, "Ablation experiments"). The whole file is rewritten atomically after
// every batch of configurations, so a killed run leaves the last complete file, and --resume
// skips the configurations it records as done.
#include "ablation.h"
#include "attention_detectors.h"
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "experiment.h"
#include "duo_gates.h"
#include "gating.h"
#include "heads.h"
#include "juice.h"
#include "progress.h"
#include "run_state.h"
#include "schema.h"
#include "store.h"
#include "util.h"

#include <torch/torch.h>

#include <filesystem>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <thread>

namespace hs::cli {

void write_juice(ResultWriter& w, const std::string& study, const at::Tensor& rows, const at::Tensor& masks,
                 const std::vector<double>& factors, const std::vector<int64_t>& variants) {
    const auto sel = juice_selection(rows, masks, factors, variants);
    schema::JuiceRecord j;
    j.V = static_cast<int64_t>(sel.variants.size()), j.F = static_cast<int64_t>(sel.factors.size());
    j.L = masks.size(1), j.H = masks.size(2);
    j.factors.assign(sel.factors.begin(), sel.factors.end());
    j.variants = sel.variants;
    j.delta = host_floats(sel.delta), j.up = host_floats(sel.up), j.down = host_floats(sel.down);
    j.enhance = host_floats(sel.enhance), j.suppress = host_floats(sel.suppress);
    j.attrs = {{"reference", std::string("GaotangLi/JUICE src/select_intervention_head.py")},
               {"delta", std::string("mean metric with z_h *= factor minus the baseline's, per prompt variant")},
               {"up", std::string("mean of delta over factors > 1 (JUICE's positive alphas, alpha = factor - 1)")},
               {"down", std::string("mean of delta over factors < 1 (JUICE's negative alphas)")},
               {"enhance", std::string("sum over variants of up where up > 0 in every variant, else NaN")},
               {"suppress", std::string("sum over variants of down where down > 0 in every variant, else NaN")}};
    schema::write_juice(w, study, j);
}

struct RunOptions {
    std::string file, model, out;
    bool resume = false, force = false, no_prefix_reuse = false;
    std::string shard;
    int64_t batch_rows = 0;
    int pause_ms = 0;
};

namespace {

struct ProbeResult {
    std::string probe, data;
    at::Tensor score;  // [L, H]
    Attrs attrs;
};

struct StudyState {
    const StudySpec* spec = nullptr;
    const AblationData* data = nullptr;
    StudyConfigs cfg;
    PrunePlan prune;  // prune sweeps
    GatingResult gating;  // gating sweeps
    DuoGateResult duo;    // duo-gates sweeps
    AblationSetup setup;
    std::unique_ptr<Ablator> ab;
    at::Tensor rows;            // [S, N] float32, NaN where not done
    std::vector<uint8_t> done;  // [S]
    // The batches one unsharded run evaluates (Ablator::plan): batch k belongs to shard k % N.
    std::vector<std::vector<int64_t>> batches;
};

bool higher_is_worse(const MetricSpec& m) { return m.kind == MetricKind::kLoss || m.kind == MetricKind::kKl; }

std::string metric_description(const MetricSpec& m) {
    if (m.kind == MetricKind::kLoss)
        return m.positions == Positions::kRepeatedHalf
                   ? "mean next-token cross-entropy (nats) at positions n+1..2n-1 of [BOS, R, R] (predicting tokens n+2..2n)"
               : m.positions == Positions::kAnswer ? "cross-entropy (nats) of the answer's first token at the last prompt position"
                                         : "mean next-token cross-entropy (nats) over every position of each row";
    if (m.kind == MetricKind::kKl)
        return std::string("mean KL(clean || ablated) (nats) of the next-token distribution at the scored positions (") +
               name_of(m.positions) + ")";
    if (m.kind == MetricKind::kAccuracy) return "1 where the argmax at the last prompt position is the answer's first token";
    if (m.kind == MetricKind::kProb)
        return m.counterfactual ? "p(the counterfactual's first token) at the last prompt position (a conflicts dataset: the context answer)"
                                : "p(the answer's first token) at the last prompt position (a conflicts dataset: the parametric answer)";
    return "logit(answer) - logit(counterfactual) at the last prompt position";
}

// 1 when every configuration this shard owns (those of its batches) is done: the file a killed
// run leaves is a valid file (it is written whole after each batch) but says 0 here, and its
// /ablation/<study>/done says which configurations are missing.
int64_t run_complete(const Shard& shard, const std::vector<StudyState>& studies) {
    for (const auto& st : studies)
        for (size_t k = 0; k < st.batches.size(); ++k)
            if (shard.owns(static_cast<int64_t>(k)))
                for (auto c : st.batches[k])
                    if (!st.done[c]) return 0;
    return 1;
}

schema::DataRecord data_record(const Experiment& e, const AblationData& d) {
    schema::DataRecord r;
    r.name = d.name, r.tokens = d.file_tokens(), r.lengths = d.lengths, r.rows = d.rows(), r.cols = d.tokens.size(1);
    r.answers = d.answers, r.counterfactuals = d.counterfactuals, r.variants = d.variants;
    r.attrs = {{"kind", std::string(name_of(d.kind))}, {"pad_value", int64_t(-1)}};
    if (d.kind == DataKind::kRepeated) r.attrs["length"] = d.n;
    for (const auto& spec : e.data)
        if (spec.name == d.name) {
            if (!spec.file.empty()) r.attrs["source_file"] = spec.file;
            if (spec.kind == DataKind::kRepeated) {
                r.attrs["seed"] = spec.seed >= 0 ? spec.seed : e.seed;
                r.attrs["token_lo"] = spec.token_lo, r.attrs["token_hi"] = spec.token_hi;
            }
            if (spec.kind == DataKind::kText) r.attrs["seq_len"] = spec.seq_len;
        }
    return r;
}

// The study's attributes (docs/hdf5-schema.md, "/ablation/<study>" attrs): the spec, and each
// sweep's own settings.
Attrs study_attrs(const StudyState& st, const Shard& shard) {
    const StudySpec& s = *st.spec;
    const bool answer_metric = s.metric.kind == MetricKind::kAccuracy || s.metric.kind == MetricKind::kLogitDiff ||
                               s.metric.kind == MetricKind::kProb;
    Attrs a = {{"sweep", std::string(name_of(s.sweep))},
               {"mode", std::string(name_of(s.mode.kind))},
               {"metric", std::string(name_of(s.metric.kind))},
               {"dataset", s.metric.data},
               {"positions", std::string(name_of(answer_metric ? Positions::kAnswer : s.metric.positions))},
               {"metric_description", metric_description(s.metric)},
               {"controls", s.controls},
               {"n_configurations", static_cast<int64_t>(st.cfg.masks.size())},
               {"shard", shard.str()}};
    if (!s.mode.data.empty()) a["mode_data"] = s.mode.data;
    if (s.mode.kind == Intervention::kMean || s.mode.kind == Intervention::kMeanQuery)
        a["mode_per_position"] = std::string(s.mode.per_position ? "true" : "false");
    if (s.mode.kind == Intervention::kScale && s.sweep != SweepKind::kScaleGrid) a["mode_factor"] = s.mode.factor;
    if (s.metric.kind == MetricKind::kProb) a["target"] = std::string(s.metric.counterfactual ? "counterfactual" : "answer");
    if (s.sweep == SweepKind::kScaleGrid) a["factors"] = s.factors;
    if (s.mode.kind == Intervention::kStream) {
        a["mode_sink"] = s.mode.window.sink;
        a["mode_recent"] = s.mode.window.recent;
        a["mode_compensate"] = std::string(s.mode.window.compensate ? "true" : "false");
    }
    if (s.mode.kind == Intervention::kResample) a["resample_seed"] = st.setup.resample_seed;
    if (s.sweep == SweepKind::kPrune) {
        a["steps"] = s.steps;
        a["recompute"] = std::string(s.recompute ? "true" : "false");
        a["importance"] = std::string("mean over rows of |d metric / d xi_h| (autograd), L2-normalised per layer");
    }
    if (s.sweep == SweepKind::kGating) a["starts"] = s.starts;
    if (s.sweep == SweepKind::kGating || s.sweep == SweepKind::kDuoGates) {
        a["fit_steps"] = s.fit_steps;
        a["lambda"] = s.lambda;
        a["lr"] = s.lr;
    }
    return a;
}

schema::StudyRecord study_record(const StudyState& st, const Shard& shard, int64_t L, int64_t H) {
    const StudySpec& s = *st.spec;
    schema::StudyRecord r;
    r.name = s.name, r.S = static_cast<int64_t>(st.cfg.masks.size()), r.N = st.data->rows(), r.L = L, r.H = H;
    for (const auto& mk : st.cfg.masks) {
        auto c = mk.contiguous();
        r.masks.insert(r.masks.end(), c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
    }
    r.metric = host_floats(st.rows.mean(1)), r.metric_rows = host_floats(st.rows);
    r.kind = st.cfg.kinds, r.label = st.cfg.labels, r.k = st.cfg.k, r.control_seed = st.cfg.control_seed, r.done = st.done;
    r.batch.assign(r.S, -1);  // the forward that computes each configuration (shard k % N)
    for (size_t k = 0; k < st.batches.size(); ++k)
        for (auto c : st.batches[k]) r.batch[c] = static_cast<int64_t>(k);
    if (s.sweep == SweepKind::kScaleGrid) r.factor.assign(st.cfg.factor.begin(), st.cfg.factor.end());
    if (s.sweep == SweepKind::kPrune) {
        r.fraction.assign(st.cfg.fraction.begin(), st.cfg.fraction.end());
        r.order = st.prune.order;
        for (const auto& t : st.prune.importance) {
            auto v = host_floats(t);
            r.importance.insert(r.importance.end(), v.begin(), v.end());
        }
    }
    r.attrs = study_attrs(st, shard);
    return r;
}

std::vector<int64_t> host_longs(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

schema::GatesRecord gates_record(const StudySpec& s, const GatingResult& gr, int64_t L, int64_t H) {
    schema::GatesRecord g;
    g.starts = gr.g_plus.size(0), g.L = L, g.H = H;
    g.g0 = host_floats(gr.g0), g.g_plus = host_floats(gr.g_plus), g.g_minus = host_floats(gr.g_minus);
    g.roles = host_longs(gr.roles), g.role = host_longs(gr.role), g.role_counts = host_longs(gr.role_counts);
    g.objective = host_floats(gr.objective);
    g.attrs = {{"roles", std::string("0 irrelevant (G+ >= 0.5, G- < 0.5), 1 facilitating (both >= 0.5), 2 interfering "
                                     "(both < 0.5), 3 unstable (G+ < 0.5, G- >= 0.5)")},
               {"loss", std::string("objective - lambda * mean(clamp(logits, -4, 4)); objective = the metric, "
                                    "negated for logit-diff and prob")},
               {"fits", std::string("lambda 0 from uniform(0, 1) gates, then +lambda (G+) and -lambda (G-) from it")},
               {"optimiser", fmt::format("Adam lr {}, gradient norm clipped to 1 per start, {} steps a fit", s.lr, s.fit_steps)},
               {"lambda", s.lambda},
               {"starts", s.starts}};
    return g;
}

schema::DuoRecord duo_record(const StudySpec& s, const DuoGateResult& d, int64_t L, int64_t H) {
    schema::DuoRecord r;
    r.L = L, r.H = H, r.K = d.alpha_kv.size(1), r.steps = d.history.size(0);
    r.alpha = host_floats(d.alpha), r.alpha_kv = host_floats(d.alpha_kv), r.history = host_floats(d.history);
    r.attrs = {{"loss", std::string("sum over scored positions of mean over d_model of (h_gated - h_full)^2 / #positions "
                                    "+ lambda * mean |alpha|; h = final hidden state after the final norm")},
               {"mix", std::string("z = alpha z_full + (1 - alpha) z_stream at every layer; z_full from the unchanged model")},
               {"optimiser", fmt::format("Adam lr {} (warm-up and cool-down over a fifth of the steps each, from 0.1x), "
                                         "alpha from 1, clamped to [0, 1] before every step, {} steps", s.lr, s.fit_steps)},
               {"lambda", s.lambda},
               {"sink", s.mode.window.sink},
               {"recent", s.mode.window.recent},
               {"distill_full", d.distill_full},
               {"distill_stream", d.distill_stream},
               {"distill_final", d.distill_final},
               {"history_columns", std::string("distillation loss, mean |alpha| (before each step's update)")}};
    return r;
}

void write_all(const std::string& path, const Experiment& e, const Model& m, const Shard& shard,
               const std::vector<AblationData>& data, const std::vector<ProbeResult>& probes,
               const std::vector<StudyState>& studies) {
    ResultWriter w(path, WriteMode::kForce);
    write_meta(w, m, e.seed);
    const int64_t L = m.config.n_layers, H = m.config.n_heads;
    schema::write_experiment(w, {{"file", e.file},
                                 {"yaml", e.text},
                                 {"sha256", sha256_bytes(e.text.data(), e.text.size())},
                                 {"model", m.path},
                                 {"shard", shard.str()},
                                 {"shard_index", shard.index},
                                 {"shard_count", shard.count},
                                 {"complete", run_complete(shard, studies)}});
    for (const auto& d : data) schema::write_data(w, data_record(e, d));
    for (const auto& p : probes) schema::write_scores(w, {p.probe, p.attrs, {{"score", {{L, H}, host_floats(p.score), {}}}}});
    for (const auto& st : studies) {
        const StudySpec& s = *st.spec;
        const auto rec = study_record(st, shard, L, H);
        schema::write_study(w, rec);
        if (s.sweep == SweepKind::kScaleGrid)
            write_juice(w, s.name, st.rows, torch::stack(st.cfg.masks), st.cfg.factor, st.data->variants);
        if (s.sweep == SweepKind::kGating) schema::write_gates(w, s.name, gates_record(s, st.gating, L, H));
        if (s.sweep == SweepKind::kDuoGates) schema::write_duo(w, s.name, duo_record(s, st.duo, L, H));
        w.set_attrs(schema::study(s.name), rec.attrs);
    }
    w.commit();
}

std::vector<ProbeResult> compute_probes(const Experiment& e, const Model& m, const std::vector<AblationData>& data) {
    std::vector<ProbeResult> out;
    for (const auto& p : e.probes) {
        const AblationData* d = nullptr;
        for (const auto& x : data)
            if (x.name == p.data) d = &x;
        ProbeResult r{p.probe, p.data, {}, {{"probe", p.probe}, {"dataset", p.data}}};
        const bool stripe = d->kind == DataKind::kRepeated;
        if (find_head_probe(p.probe).repeated_only && !stripe)
            e.fail(p.mark, fmt::format("probe {} needs a repeated dataset", p.probe));
        ProbeInput in;
        if (stripe) {
            in.stripe_tokens = d->tokens, in.n = d->n;
        } else {
            auto acc = d->tokens.accessor<int64_t, 2>();
            for (int64_t i = 0; i < d->rows(); ++i) {
                std::vector<int64_t> s;
                for (int64_t t = 0; t < d->lengths[i]; ++t) s.push_back(acc[i][t]);
                in.seqs.push_back(std::move(s));
            }
        }
        auto scores = run_head_probes(m, {p.probe}, in).front();
        r.score = scores.score;
        if (scores.baseline_loss) r.attrs["baseline_loss"] = *scores.baseline_loss;
        r.attrs["convention"] = std::string(stripe ? "stripe" : "detector");
        out.push_back(std::move(r));
    }
    return out;
}

// Loads what a previous run of the same experiment recorded (--resume).
void load_previous(const std::string& path, const Experiment& e, const Model& m, const Shard& shard,
                   std::vector<StudyState>& studies) {
    ResultReader r(path);
    const auto ea = schema::read_experiment(r);
    auto get = [&](const std::string& k) { return ea.count(k) ? attr_to_string(ea.at(k)) : std::string(); };
    if (get("sha256") != sha256_bytes(e.text.data(), e.text.size()))
        throw StorageError(fmt::format("{}: holds another experiment (its YAML differs from {}); refusing to resume", path, e.file));
    const auto ma = schema::read_meta(r);
    if (!ma.count("weights_sha256") || attr_to_string(ma.at("weights_sha256")) != m.weights_sha256())
        throw StorageError(fmt::format("{}: holds results of another model; refusing to resume", path));
    if (get("shard") != shard.str())
        throw StorageError(fmt::format("{}: was run as shard {}, not {}", path, get("shard"), shard.str()));
    for (auto& st : studies) {
        const std::string g = schema::study(st.spec->name);
        const auto stored = schema::read_study(r, st.spec->name);
        if (stored.done.shape.empty()) continue;
        const auto &done = stored.done, &rows = stored.metric_rows, &masks = stored.masks;
        const int64_t S = static_cast<int64_t>(st.cfg.masks.size()), N = st.data->rows();
        const int64_t LH = static_cast<int64_t>(m.config.n_layers) * m.config.n_heads;
        if (done.shape != std::vector<int64_t>{S} || rows.shape != std::vector<int64_t>{S, N} ||
            static_cast<int64_t>(masks.values.size()) != S * LH)
            throw StorageError(fmt::format("{}: {} has another shape than this experiment's; refusing to resume", path, g));
        for (int64_t i = 0; i < S; ++i) {
            if (done.values[i] == 0) continue;
            // The configuration must be the same heads (a prune order could differ across builds).
            auto mk = st.cfg.masks[i].flatten();
            const int64_t LH = mk.numel();
            bool same = true;
            for (int64_t j = 0; j < LH; ++j) same &= (mk[j].item<int>() != 0) == (masks.values[i * LH + j] != 0);
            if (!same) continue;
            st.done[i] = 1;
            for (int64_t n = 0; n < N; ++n) st.rows[i][n] = rows.values[i * N + n];
        }
    }
}

void print_summary(const StudyState& st) {
    const auto& c = st.cfg;
    auto metric = st.rows.mean(1);
    const int64_t S = metric.size(0);
    const double base = metric[0].item<double>();
    std::string line = fmt::format("{:<14} {} {}: baseline {:.4f}", st.spec->name, name_of(st.spec->metric.kind),
                                   name_of(st.spec->sweep), base);
    if (st.spec->sweep == SweepKind::kPrune) {
        for (int64_t i = 1; i < S; ++i) line += fmt::format("  {} {:.4f}", c.labels[i], metric[i].item<double>());
        std::printf("%s\n", line.c_str());
        return;
    }
    if (st.spec->sweep == SweepKind::kGating) {
        // Roles (the most frequent over the starts, with its count), then the causal checks' means.
        const auto& g = st.gating;
        const int64_t starts = g.roles.size(0), L = g.role.size(0), H = g.role.size(1);
        std::printf("%s\n", line.c_str());
        for (int k : {1, 2, 0, 3}) {
            std::string heads;
            for (int64_t l = 0; l < L; ++l)
                for (int64_t h = 0; h < H; ++h)
                    if (g.role[l][h].item<int>() == k)
                        heads += fmt::format(" {}({}/{})", format_head(static_cast<int>(l), static_cast<int>(h)),
                                             g.role_counts[k][l][h].item<int64_t>(), starts);
            if (!heads.empty()) std::printf("  %-13s%s\n", head_role_name(static_cast<HeadRole>(k)), heads.c_str());
        }
        for (const char* kind : {"circuit", "interfering"}) {
            double sum = 0;
            int n = 0;
            for (int64_t i = 1; i < S; ++i)
                if (c.kinds[i] == kind && !std::isnan(metric[i].item<double>())) sum += metric[i].item<double>(), ++n;
            if (n) std::printf("  check: %s  %.4f (mean over %d starts)\n",
                               std::string(kind) == "circuit" ? "heads with G- < 0.5 zeroed" : "heads with G+ < 0.5 zeroed",
                               sum / n, n);
        }
        return;
    }
    if (st.spec->sweep == SweepKind::kDuoGates) {
        // The learned order (highest alpha first), the distillation losses, then the configurations.
        const auto& d = st.duo;
        const int64_t L = d.alpha.size(0), H = d.alpha.size(1);
        std::printf("%s\n", line.c_str());
        auto order = d.alpha.reshape(-1).argsort(0, true);
        std::string heads;
        for (int64_t i = 0; i < std::min<int64_t>(8, L * H); ++i) {
            const int64_t j = order[i].item<int64_t>();
            heads += fmt::format(" {}={:.2f}", format_head(static_cast<int>(j / H), static_cast<int>(j % H)), d.alpha.view(-1)[j].item<double>());
        }
        std::printf("  alpha (highest):%s\n", heads.c_str());
        std::printf("  distillation loss: all full %.3g, all streaming %.3g, fitted %.3g\n", d.distill_full, d.distill_stream,
                    d.distill_final);
        double csum = 0;
        int cn = 0;
        for (int64_t i = 1; i < S; ++i) {
            if (c.kinds[i] == "control") {
                if (!std::isnan(metric[i].item<double>())) csum += metric[i].item<double>(), ++cn;
                continue;
            }
            std::printf("  %-40s %.4f\n", c.labels[i].c_str(), metric[i].item<double>());
        }
        if (cn) std::printf("  %-40s %.4f (mean over %d)\n", "random controls of the same size", csum / cn, cn);
        return;
    }
    // The most harmful non-control configurations first.
    std::vector<int64_t> idx;
    for (int64_t i = 1; i < S; ++i)
        if (c.kinds[i] != "control" && !std::isnan(metric[i].item<double>())) idx.push_back(i);
    const double sign = higher_is_worse(st.spec->metric) ? 1.0 : -1.0;
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
        return sign * metric[a].item<double>() > sign * metric[b].item<double>();
    });
    for (size_t i = 0; i < std::min<size_t>(5, idx.size()); ++i)
        line += fmt::format("  {} {:.4f}", c.labels[idx[i]], metric[idx[i]].item<double>());
    std::printf("%s\n", line.c_str());
}

}  // namespace

namespace {

// --out or the file's output: (a shard's name when sharded without --out); its folder is made when
// missing (output: out/x.h5 in a fresh clone).
std::string output_path(const RunOptions& o, const Experiment& e, const Shard& shard) {
    std::string out = !o.out.empty() ? o.out : e.output;
    if (out.empty()) throw UsageError(fmt::format("{}: no output: set output: in the file or pass --out", o.file));
    if (o.out.empty() && !o.shard.empty()) out = shard_path(out, shard);
    if (file_exists(out) && !o.resume && !o.force)
        throw StorageError(fmt::format("{}: exists (use --resume to continue it or --force to replace it)", out));
    const auto parent = std::filesystem::path(out).parent_path();
    if (!parent.empty() && !std::filesystem::exists(parent)) {
        std::error_code ec;
        std::filesystem::create_directories(parent, ec);
        if (ec) throw StorageError(fmt::format("{}: cannot create the output folder {}: {}", out, parent.string(), ec.message()));
    }
    return out;
}

// Every check that needs the model's shape, before any forward pass or file: head names in range,
// score files readable.
void check_heads_against_model(const Experiment& e, int L, int H) {
    for (const auto& s : e.studies) {
        if (s.has_heads) check_head_ranges(e, s.heads, L, H);
        for (const auto& kv : s.sets) check_head_ranges(e, kv.second, L, H);
        std::vector<const HeadSpec*> specs;
        if (s.has_heads) specs.push_back(&s.heads);
        for (const auto& kv : s.sets) specs.push_back(&kv.second);
        for (const auto* h : specs)
            for (const HeadSpec* x = h; x; x = x->inner.get())
                if (x->by.find(':') != std::string::npos) resolve_score(e, *x, {}, L, H);
    }
}

// Study si's Ablator and configurations (none run yet).
StudyState make_study(const RunOptions& o, const Experiment& e, size_t si, const Model& m, const AblationData* data,
                      const AblationData* reference, const std::vector<std::pair<std::string, at::Tensor>>& computed) {
    const auto& s = e.studies[si];
    const int L = m.config.n_layers, H = m.config.n_heads;
    StudyState st;
    st.spec = &s;
    st.data = data;
    st.setup.mode = s.mode.kind;
    st.setup.factor = s.mode.factor;
    st.setup.window = s.mode.window;
    st.setup.per_position = s.mode.per_position;
    st.setup.reference = reference;
    st.setup.resample_seed = e.seed + static_cast<int64_t>(si);
    st.setup.metric = s.metric.kind;
    st.setup.positions = s.metric.positions;
    st.setup.counterfactual = s.metric.counterfactual;
    st.setup.max_rows = e.batch_rows;
    st.setup.prefix_reuse = !o.no_prefix_reuse;
    try {
        st.ab = std::make_unique<Ablator>(m, *st.data, st.setup);
    } catch (const ConfigError& ex) {
        e.fail(s.mode.mark, ex.what());
    }
    if (s.sweep == SweepKind::kPrune) {
        st.prune = plan_prune(s, *st.ab, L, H);
        st.cfg = st.prune.configs;
    } else if (s.sweep == SweepKind::kGating) {
        GatingOptions go;
        go.starts = s.starts, go.steps = s.fit_steps, go.lambda = s.lambda, go.lr = s.lr;
        go.seed = static_cast<uint64_t>(e.seed * 1000003 + static_cast<int64_t>(si));
        go.higher_is_better = s.metric.kind == MetricKind::kLogitDiff || s.metric.kind == MetricKind::kProb;
        Progress prog(fmt::format("gating '{}' (3 fits x {} steps)", s.name, s.fit_steps), 3 * s.fit_steps);
        double last = 0;
        st.gating = fit_head_gates(*st.ab, L, H, go, [&](int fit, int64_t step, double loss) {
            last = loss;
            prog.update(fit * s.fit_steps + step + 1, fmt::format("loss {:.4f}", last));
        });
        prog.finish();
        st.cfg = gating_configs(st.gating);
    } else if (s.sweep == SweepKind::kDuoGates) {
        DuoGateOptions dg;
        dg.window = s.mode.window, dg.steps = s.fit_steps, dg.lr = s.lr, dg.lambda = s.lambda;
        Progress prog(fmt::format("duo-gates '{}' ({} steps)", s.name, s.fit_steps), s.fit_steps);
        st.duo = fit_duo_gates(m, *st.ab, dg, [&](int64_t step, double loss) {
            prog.update(step + 1, fmt::format("loss {:.4g}", loss));
        });
        prog.finish();
        st.cfg = duo_configs(st.duo, s.controls, e.seed * 1000003 + static_cast<int64_t>(si));
    } else {
        st.cfg = build_study(e, s, computed, L, H);
    }
    const int64_t S = static_cast<int64_t>(st.cfg.masks.size());
    st.rows = torch::full({S, st.data->rows()}, std::numeric_limits<float>::quiet_NaN());
    st.done.assign(S, 0);
    st.batches = st.ab->plan(torch::stack(st.cfg.masks));
    return st;
}

}  // namespace

void run_run(const RunOptions& o) {
    const Shard shard = o.shard.empty() ? Shard{} : parse_shard(o.shard);
    if (o.resume && o.force) throw UsageError("--resume and --force exclude each other");
    Experiment e = parse_experiment(o.file, detector_probe_names());
    if (!o.model.empty()) e.model = o.model;
    if (o.batch_rows > 0) e.batch_rows = o.batch_rows;
    const std::string out = output_path(o, e, shard);

    ModelArgs ma;
    ma.model = e.model, ma.tokenizer = e.tokenizer, ma.dtype = e.dtype, ma.device = e.device, ma.threads = e.threads;
    ma.attention = e.attention;
    Loaded l;
    try {
        l = open_model(ma, false);
    } catch (const ConfigError& ex) {
        e.fail(e.model_mark, ex.what());
    }
    const Model& m = *l.model;
    torch::manual_seed(static_cast<uint64_t>(e.seed));
    check_heads_against_model(e, m.config.n_layers, m.config.n_heads);

    std::vector<AblationData> data;
    data.reserve(e.data.size());
    for (const auto& d : e.data) data.push_back(make_data(e, d, m, l.tokenizer.get()));
    auto find = [&](const std::string& name) -> const AblationData* {
        for (const auto& d : data)
            if (d.name == name) return &d;
        return nullptr;
    };
    for (const auto& p : e.probes)
        if (find_head_probe(p.probe).repeated_only && find(p.data)->kind != DataKind::kRepeated)
            e.fail(p.data_mark, fmt::format("probe {} needs a repeated dataset", p.probe));

    auto probes = compute_probes(e, m, data);
    std::vector<std::pair<std::string, at::Tensor>> computed;
    for (const auto& p : probes) computed.push_back({p.probe, p.score});

    std::vector<StudyState> studies;
    for (size_t si = 0; si < e.studies.size(); ++si) {
        const auto& s = e.studies[si];
        studies.push_back(make_study(o, e, si, m, find(s.metric.data), s.mode.data.empty() ? nullptr : find(s.mode.data), computed));
    }
    if (o.resume && file_exists(out)) load_previous(out, e, m, shard, studies);

    // The file exists from here on, complete after every batch.
    write_all(out, e, m, shard, data, probes, studies);
    int64_t ran = 0;
    for (auto& st : studies) {
        // The batches one unsharded run forms (Ablator::plan); a shard runs batch k when
        // k % N == I and a resumed run skips finished batches, so every configuration is computed
        // in the same batch, hence to the same bits, however the work is split.
        const auto masks = torch::stack(st.cfg.masks);
        const auto& batches = st.batches;
        std::vector<size_t> mine;
        int64_t todo = 0;
        for (size_t k = 0; k < batches.size(); ++k) {
            if (!shard.owns(static_cast<int64_t>(k))) continue;
            bool all_done = true;
            for (auto c : batches[k]) all_done = all_done && st.done[c];
            if (all_done) continue;
            mine.push_back(k);
            todo += static_cast<int64_t>(batches[k].size());
        }
        if (mine.empty()) continue;
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t f0 = st.ab->forwards();
        double flush_s = 0;
        Progress prog("ablation configurations", todo);
        int64_t progressed = 0;
        for (size_t k : mine) {
            const auto rows = st.ab->evaluate_batch(masks, batches[k], st.cfg.factor);
            for (size_t j = 0; j < batches[k].size(); ++j) {
                st.rows[batches[k][j]].copy_(rows[static_cast<int64_t>(j)]);
                st.done[batches[k][j]] = 1;
            }
            ran += static_cast<int64_t>(batches[k].size());
            prog.update(progressed += static_cast<int64_t>(batches[k].size()));
            const auto w0 = std::chrono::steady_clock::now();
            write_all(out, e, m, shard, data, probes, studies);
            flush_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
            if (o.pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.pause_ms));
        }
        prog.finish();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - flush_s;
        log_verbose("study {}: {} configurations in {:.3f} s ({:.2f} ms each, {} forward passes; "
                                "{:.3f} s writing the file)", st.spec->name, todo, secs, 1e3 * secs / todo,
                                st.ab->forwards() - f0, flush_s);
    }
    for (const auto& st : studies) print_summary(st);
    log_info("wrote {} ({} configurations run{})", out, ran, shard.count > 1 ? ", shard " + shard.str() : "");
}

void setup_run(CLI::App& app) {
    auto o = std::make_shared<RunOptions>();
    auto* sub = app.add_subcommand(
        "run",
        "run a masking/ablation experiment described in YAML (docs/experiments.md): datasets, probe scores,\n"
        "and studies (sweeps single, layer, set, cumulative, prune, scale-grid, gating, duo-gates; modes zero,\n"
        "mean, resample, scale, zero-query, mean-query, stream; metrics loss, accuracy, logit-diff, kl, prob), written to HDF5 under\n"
        "/ablation/<study>. The file is rewritten atomically after every batch of configurations: a killed\n"
        "run leaves the last complete file, and --resume continues it. --shard I/N runs the batches k of\n"
        "configurations one unsharded run forms with k % N == I; `headscope merge` joins the shards.\n"
        "A scale-grid study with metric prob on a conflicts dataset is JUICE's head selection\n"
        "(/ablation/<study>/juice/{enhance,suppress}); gating and duo-gates fit learned head gates first\n"
        "(/ablation/<study>/gates, /ablation/<study>/duo/alpha: a head order for retrieval --stream-sweep).\n"
        "Example: headscope run datasets/experiments/toy-induction.yaml");
    sub->add_option("experiment", o->file, "the experiment's YAML file")->required();
    sub->add_option("--model", o->model, "use this model instead of the file's model:");
    sub->add_option("-o,--out", o->out, "write here instead of the file's output:");
    sub->add_flag("--resume", o->resume, "continue an existing output file of the same experiment and model");
    sub->add_flag("--force", o->force, "replace an existing output file");
    sub->add_option("--shard", o->shard, "I/N: run every N-th configuration starting at I (output gets .shard-I-of-N "
                                         "unless --out is given); slurm: I and N from SLURM_ARRAY_TASK_ID and "
                                         "SLURM_ARRAY_TASK_COUNT; slurm/N: N given (a task resubmitted alone)");
    sub->add_option("--batch-rows", o->batch_rows, "rows per forward pass (configurations x dataset rows; default: "
                                                   "the file's batch_rows, else 64)");
    sub->add_flag("--no-prefix-reuse", o->no_prefix_reuse, "recompute the layers below the first ablated layer per "
                                                           "configuration (for checks and benchmarks)");
    sub->add_option("--pause-after-batch", o->pause_ms, "testing: sleep this many ms after each flushed batch")
        ->group("");
    sub->callback([o] { run_run(*o); });
}

}  // namespace hs::cli
