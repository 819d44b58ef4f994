#include "ablation_study.h"

#include "attention_detectors.h"
#include "duo_data.h"
#include "errors.h"
#include "heads.h"
#include "juice.h"
#include "progress.h"
#include "toy_tasks.h"
#include "util.h"

#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <limits>

namespace hs {

namespace {

std::vector<float> host_floats(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kFloat).contiguous();
    return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

std::vector<int64_t> host_longs(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kLong).contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
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

std::vector<ExperimentProbe> compute_probes(const Experiment& e, const Model& m, const std::vector<AblationData>& data) {
    std::vector<ExperimentProbe> out;
    for (const auto& p : e.probes) {
        const AblationData* d = nullptr;
        for (const auto& x : data)
            if (x.name == p.data) d = &x;
        ExperimentProbe r{p.probe, p.data, {}, {{"probe", p.probe}, {"dataset", p.data}}};
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

// Study si's Ablator and configurations (none run yet). The seeds (resample, gating's initial gates,
// duo's controls) derive from the experiment's seed and the study's index.
StudyState make_study(const Experiment& e, size_t si, const Model& m, const AblationData* data, const AblationData* reference,
                      const std::vector<std::pair<std::string, at::Tensor>>& computed, bool prefix_reuse,
                      const Tokenizer* tok) {
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
    st.setup.prefix_reuse = prefix_reuse;
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
        // The fit streams with the training window (the reference's blocks by default), the study's
        // configurations with the mode's (the deployment window).
        DuoGateOptions dg;
        dg.window = s.train_window, dg.steps = s.fit_steps, dg.lr = s.lr, dg.lambda = s.lambda;
        const int64_t study_seed = e.seed * 1000003 + static_cast<int64_t>(si);
        if (s.fit_passkey) {
            // duo_attn/data.py MultiplePasskeyRetrievalDataset with the model's tokenizer (duo_data.h).
            if (!tok) e.fail(s.fit_data_mark, "fit_data kind passkey needs the model's tokenizer (none found; set 'tokenizer:')");
            std::ifstream in(s.passkey_haystack, std::ios::binary);
            std::stringstream text;
            text << in.rdbuf();
            if (!in) e.fail(s.fit_data_mark, fmt::format("haystack: cannot read {}", s.passkey_haystack));
            DuoPasskeyOptions po;
            po.context_length_min = s.passkey_length_min, po.context_length_max = s.passkey_length_max;
            po.context_lengths_num_intervals = s.passkey_length_intervals;
            po.passkeys = s.passkey_count, po.passkey_length = s.passkey_words;
            po.depth_min = s.passkey_depth_min, po.depth_max = s.passkey_depth_max, po.depth_intervals = s.passkey_depth_intervals;
            st.duo_facts.fresh_seed = study_seed + 5;
            const uint64_t seed = static_cast<uint64_t>(st.duo_facts.fresh_seed);
            std::shared_ptr<const DuoPasskeyData> pd;
            try {
                pd = std::make_shared<const DuoPasskeyData>(duo_passkey_data(*tok, text.str(), po, seed));
            } catch (const ConfigError& ex) {
                e.fail(s.passkey_length_mark, fmt::format("fit_data passkey: {}", ex.what()));
            }
            const auto dev = m.options.device;
            dg.sample = [=](int64_t step) { return duo_passkey_sample(*pd, seed, step, dev); };
        } else if (s.fit_fresh) {
            if (m.config.vocab_size != toy::kVocabSize)
                e.fail(s.fit_data_mark, fmt::format("fit_data fresh draws toy recall samples (the {}-token toy vocabulary); this "
                                                    "model has {} tokens (for a real tokenizer use fit_data: {{kind: passkey, "
                                                    "haystack: FILE, length: N}})", toy::kVocabSize, m.config.vocab_size));
            st.duo_facts.fresh_seed = study_seed + 5;
            const auto dev = m.options.device;
            const uint64_t seed = static_cast<uint64_t>(st.duo_facts.fresh_seed);
            const int64_t rows = s.fresh_rows, len = s.fresh_length;
            dg.sample = [=](int64_t step) { return duo_recall_sample(seed, step, rows, len, dev); };
        }
        Progress prog(fmt::format("duo-gates '{}' ({} steps)", s.name, s.fit_steps), s.fit_steps);
        try {
            st.duo = fit_duo_gates(m, *st.ab, dg, [&](int64_t step, double loss) {
                prog.update(step + 1, fmt::format("loss {:.4g}", loss));
            });
        } catch (const ConfigError& ex) {
            e.fail(s.mark, ex.what());
        }
        prog.finish();
        DuoDeploy how;
        how.sparsity = s.deploy_sparsity, how.value = s.deploy_value, how.noise_seed = static_cast<uint64_t>(study_seed + 2);
        st.duo_deploy = duo_deploy(st.duo, how);
        st.duo_facts.distill_full = st.duo.distill_full, st.duo_facts.distill_stream = st.duo.distill_stream;
        st.duo_facts.distill_final = st.duo.distill_final;
        st.duo_facts.deploy_threshold = st.duo_deploy.threshold, st.duo_facts.deploy_streamed = st.duo_deploy.returned_sparsity;
        st.duo_facts.deploy_noise_seed = s.deploy_sparsity ? study_seed + 2 : -1;
        st.cfg = duo_configs(st.duo, st.duo_deploy, s.controls, study_seed);
    } else {
        st.cfg = build_study(e, s, computed, L, H);
    }
    const int64_t S = static_cast<int64_t>(st.cfg.masks.size());
    st.rows = torch::full({S, st.data->rows()}, std::numeric_limits<float>::quiet_NaN());
    st.done.assign(S, 0);
    st.batches = st.ab->plan(torch::stack(st.cfg.masks));
    return st;
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

schema::StudyRecord study_record(const StudyState& st, const jobs::Shard& shard, int64_t L, int64_t H) {
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
    r.attrs = schema::study_attrs(s, static_cast<int64_t>(st.cfg.masks.size()), shard.str(), st.setup.resample_seed);
    return r;
}

schema::GatesRecord gates_record(const StudySpec& s, const GatingResult& gr, int64_t L, int64_t H) {
    schema::GatesRecord g;
    g.starts = gr.g_plus.size(0), g.L = L, g.H = H;
    g.g0 = host_floats(gr.g0), g.g_plus = host_floats(gr.g_plus), g.g_minus = host_floats(gr.g_minus);
    g.roles = host_longs(gr.roles), g.role = host_longs(gr.role), g.role_counts = host_longs(gr.role_counts);
    g.objective = host_floats(gr.objective);
    g.attrs = schema::gates_attrs(s);
    return g;
}

schema::DuoRecord duo_record(const StudySpec& s, const DuoGateResult& d, const schema::DuoFitFacts& f, int64_t L, int64_t H) {
    schema::DuoRecord r;
    r.L = L, r.H = H, r.K = d.alpha_kv.size(1), r.steps = d.history.size(0);
    r.alpha = host_floats(d.alpha), r.alpha_kv = host_floats(d.alpha_kv), r.history = host_floats(d.history);
    r.attrs = schema::duo_attrs(s, f);
    return r;
}

}  // namespace

schema::JuiceRecord juice_record(const at::Tensor& rows, const at::Tensor& masks, const std::vector<double>& factors,
                                 const std::vector<int64_t>& variants) {
    const auto sel = juice_selection(rows, masks, factors, variants);
    schema::JuiceRecord j;
    j.V = static_cast<int64_t>(sel.variants.size()), j.F = static_cast<int64_t>(sel.factors.size());
    j.L = masks.size(1), j.H = masks.size(2);
    j.factors.assign(sel.factors.begin(), sel.factors.end());
    j.variants = sel.variants;
    j.delta = host_floats(sel.delta), j.up = host_floats(sel.up), j.down = host_floats(sel.down);
    j.enhance = host_floats(sel.enhance), j.suppress = host_floats(sel.suppress);
    j.attrs = schema::juice_attrs();
    return j;
}

AblationStudy::AblationStudy(const Experiment& e, const Model& m, const Tokenizer* tok, bool prefix_reuse) : e_(e), m_(m) {
    torch::manual_seed(static_cast<uint64_t>(e.seed));
    check_heads_against_model(e, m.config.n_layers, m.config.n_heads);
    data_.reserve(e.data.size());  // the studies point into it
    for (const auto& d : e.data) data_.push_back(make_data(e, d, m, tok));
    auto find = [&](const std::string& name) -> const AblationData* {
        for (const auto& d : data_)
            if (d.name == name) return &d;
        return nullptr;
    };
    for (const auto& p : e.probes)
        if (find_head_probe(p.probe).repeated_only && find(p.data)->kind != DataKind::kRepeated)
            e.fail(p.data_mark, fmt::format("probe {} needs a repeated dataset", p.probe));
    probes_ = compute_probes(e, m, data_);
    std::vector<std::pair<std::string, at::Tensor>> computed;
    for (const auto& p : probes_) computed.push_back({p.probe, p.score});
    for (size_t si = 0; si < e.studies.size(); ++si) {
        const auto& s = e.studies[si];
        studies_.push_back(make_study(e, si, m, find(s.metric.data), s.mode.data.empty() ? nullptr : find(s.mode.data), computed,
                                      prefix_reuse, tok));
    }
}

void AblationStudy::resume(const ResultReader& r) {
    for (auto& st : studies_) {
        const std::string g = schema::study(st.spec->name);
        const auto stored = schema::read_study(r, st.spec->name);
        if (stored.done.shape.empty()) continue;
        const auto &done = stored.done, &rows = stored.metric_rows, &masks = stored.masks;
        const int64_t S = static_cast<int64_t>(st.cfg.masks.size()), N = st.data->rows();
        const int64_t LH = static_cast<int64_t>(m_.config.n_layers) * m_.config.n_heads;
        if (done.shape != std::vector<int64_t>{S} || rows.shape != std::vector<int64_t>{S, N} ||
            static_cast<int64_t>(masks.values.size()) != S * LH)
            throw StorageError(fmt::format("{}: {} has another shape than this experiment's; refusing to resume", r.path(), g));
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

// The batches one unsharded run forms (Ablator::plan) are the job's items: a shard runs batch k when
// k % N == I and a resumed run skips finished batches, so every configuration is computed in the same
// batch, hence to the same bits, however the work is split.
int64_t AblationStudy::run(const jobs::Shard& shard, jobs::Checkpoint& checkpoint) {
    int64_t ran = 0;
    for (auto& st : studies_) {
        const auto masks = torch::stack(st.cfg.masks);
        const auto& batches = st.batches;
        const auto n_batches = static_cast<int64_t>(batches.size());
        auto done = [&](int64_t k) {
            for (auto c : batches[static_cast<size_t>(k)])
                if (!st.done[c]) return false;
            return true;
        };
        const auto pending = jobs::pending_items(shard, n_batches, done);
        if (pending.empty()) continue;
        int64_t todo = 0;
        for (auto k : pending) todo += static_cast<int64_t>(batches[static_cast<size_t>(k)].size());
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t f0 = st.ab->forwards();
        const double w0 = checkpoint.writing_seconds();
        Progress prog("ablation configurations", todo);
        int64_t progressed = 0;
        jobs::run_items(shard, n_batches, done, [&](int64_t k) {
            const auto& batch = batches[static_cast<size_t>(k)];
            const auto rows = st.ab->evaluate_batch(masks, batch, st.cfg.factor);
            for (size_t j = 0; j < batch.size(); ++j) {
                st.rows[batch[j]].copy_(rows[static_cast<int64_t>(j)]);
                st.done[batch[j]] = 1;
            }
            ran += static_cast<int64_t>(batch.size());
            prog.update(progressed += static_cast<int64_t>(batch.size()));
        }, {}, &checkpoint);
        prog.finish();
        const double flush_s = checkpoint.writing_seconds() - w0;
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - flush_s;
        log_verbose("study {}: {} configurations in {:.3f} s ({:.2f} ms each, {} forward passes; "
                    "{:.3f} s writing the file)", st.spec->name, todo, secs, 1e3 * secs / todo, st.ab->forwards() - f0, flush_s);
    }
    return ran;
}

int64_t AblationStudy::complete(const jobs::Shard& shard) const {
    for (const auto& st : studies_)
        for (size_t k = 0; k < st.batches.size(); ++k)
            if (shard.owns(static_cast<int64_t>(k)))
                for (auto c : st.batches[k])
                    if (!st.done[c]) return 0;
    return 1;
}

schema::AblationRunFile AblationStudy::records(const jobs::Shard& shard) const {
    const int64_t L = m_.config.n_layers, H = m_.config.n_heads;
    schema::AblationRunFile f;
    f.experiment = {{"file", e_.file},
                    {"yaml", e_.text},
                    {"sha256", sha256_bytes(e_.text.data(), e_.text.size())},
                    {"model", m_.path}};
    for (auto& kv : jobs::shard_attrs(shard, complete(shard) != 0)) f.experiment.insert(kv);
    for (const auto& d : data_) f.data.push_back(data_record(e_, d));
    for (const auto& p : probes_) f.probes.push_back({p.probe, p.attrs, {{"score", {{L, H}, host_floats(p.score), {}}}}});
    for (const auto& st : studies_) {
        const StudySpec& s = *st.spec;
        schema::AblationStudyFile sf;
        sf.study = study_record(st, shard, L, H);
        if (s.sweep == SweepKind::kScaleGrid)
            sf.juice = juice_record(st.rows, torch::stack(st.cfg.masks), st.cfg.factor, st.data->variants);
        if (s.sweep == SweepKind::kGating) sf.gates = gates_record(s, st.gating, L, H);
        if (s.sweep == SweepKind::kDuoGates) sf.duo = duo_record(s, st.duo, st.duo_facts, L, H);
        f.studies.push_back(std::move(sf));
    }
    return f;
}

}  // namespace hs
