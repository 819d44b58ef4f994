// The needle study's file (needle_study.h): each checkpoint's whole file through the schema's
// needle records (src/store/needle_records.h), and the stream sweep after the scan.
#include "needle_study.h"

#include "errors.h"
#include "heads.h"
#include "needle_records.h"
#include "schema.h"

#include <torch/torch.h>

#include <fmt/format.h>

namespace hs {

static schema::NeedleTrialsRecord trials_record(const std::vector<Trial>& trials) {
    schema::NeedleTrialsRecord r;
    for (const auto& t : trials) {
        r.prompts.push_back(t.prompt);
        r.needle_start.push_back(t.needle_start), r.needle_end.push_back(t.needle_end);
        r.answer_start.push_back(t.answer_start), r.answer_end.push_back(t.answer_end);
        r.length.push_back(t.length), r.depth.push_back(t.depth), r.needle.push_back(t.needle);
    }
    return r;
}

// The score groups this run writes, in registry order (LOCOS with its bootstrap's attributes).
static std::vector<schema::NeedleScoreAttrs> score_groups(NeedleScoreSet scores) {
    std::vector<schema::NeedleScoreAttrs> out;
    for (NeedleScore s : scores.list())
        out.push_back({needle_score_name(s), needle_score(s).description, s == NeedleScore::kLocos});
    return out;
}

static schema::NeedleDecodingRecord decoding_record(const NeedleDecodingPass& d, size_t n_trials) {
    schema::NeedleDecodingRecord r;
    r.S = static_cast<int64_t>(d.sets.size()), r.N = static_cast<int64_t>(n_trials);
    for (int64_t s = 0; s < r.S; ++s)
        for (int64_t i = 0; i < r.N; ++i) {
            const auto& t = d.trials[s][i];
            r.rouge1_recall.push_back(t.result.rouge1_recall);
            r.rougeL_f.push_back(t.result.rougeL_f);
            r.passed.push_back(t.result.passed);
            r.answer_margin.push_back(t.answer_margin);
            r.base_margin.push_back(t.base_margin);
        }
    r.rule = name_in(combine_rule_names(), d.spec.rule);
    for (const auto& s : d.sets) r.sets.push_back(format_heads(s));
    r.control_seed = d.control_seed;
    r.decore = d.spec.rule == CombineRule::kDecore;
    r.alpha = d.spec.alpha_entropy ? std::string("entropy") : fmt::format("{}", d.spec.alpha);
    r.alpha_max = d.spec.alpha_max;
    r.enhance = format_heads(d.spec.enhance), r.alpha_enhance = d.spec.alpha_enhance;
    r.suppress = format_heads(d.spec.suppress), r.alpha_suppress = d.spec.alpha_suppress;
    return r;
}

void NeedleStudy::write(int64_t n_sets_planned) {
    const int L = m_.config.n_layers, H = m_.config.n_heads;
    ResultWriter w(spec_.out, first_write_ && !resuming_ ? spec_.mode : WriteMode::kAppend);
    first_write_ = false;
    write_meta_(w);
    std::vector<std::string> groups;
    for (const auto& row : needle_scores()) groups.push_back(schema::scores(row.name));
    groups.push_back(schema::retrieval());
    for (const std::string& g : groups)
        if (w.exists(g)) w.remove(g);
    const NeedleSummary sum = summary();
    schema::write_needle_static(w, score_groups(spec_.scores), trials_record(test_.trials()), params_, spec_.bootstrap,
                                spec_.proto.seed);
    schema::write_needle_job(w, jobs::shard_attrs(spec_.shard, complete(n_sets_planned)));
    write_needle_results(w, res_, sum, spec_.scores);
    if (res_.S > 0) {
        schema::NeedleAblationRecord a;
        a.ablation = intervention_name(spec_.ablation);
        for (const auto& s : sets_) a.heads.push_back(format_heads(s));
        a.source = ablate_source_;
        a.random_controls = spec_.random_controls;
        a.distinct_controls_possible = possible_controls_;
        a.control_seed = spec_.proto.seed + 1;
        a.scope = ablation_scope_name(spec_.cfg.decode.scope);
        if ((a.separate_trials = test_.separate_ablation_trials())) {
            a.baseline_set = static_cast<int64_t>(sets_.size()) - 1;
            a.trials = trials_record(test_.ablation_trials());
        }
        if ((a.stream = spec_.ablation == Intervention::kStream))
            a.window = {spec_.window.sink, spec_.window.recent, spec_.window.compensate ? 1 : 0};
        if ((a.mean_query = spec_.ablation == Intervention::kMeanQuery)) {
            a.calibration_trials = n_calib_;
            a.calibration_trial_indices = calib_idx_;
            a.calibration_seed = static_cast<int64_t>(calibration_seed());
            a.reference_rng = spec_.proto.rng == RngKind::kReference;
            const at::Tensor q = q_mean_.to(torch::kCPU, torch::kFloat).contiguous();
            a.query_mean.assign(q.data_ptr<float>(), q.data_ptr<float>() + q.numel());
            a.L = L, a.H = H, a.d_head = m_.config.d_head;
        }
        schema::write_needle_ablation(w, a);
    }
    if (decoding_) schema::write_decoding(w, decoding_record(*decoding_, test_.trials().size()));
    w.commit();
}

at::Tensor stream_order_score(const StreamOrderSpec& o, const Model& m, std::string* source) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    switch (o.kind) {
        case StreamOrderSpec::Kind::kRunScore:
            *source = "this run: scores/" + std::string(needle_score_name(o.score)) + "/score";
            return {};
        case StreamOrderSpec::Kind::kRazor:
            if (o.preset == RazorPreset::kHeadscope) {
                *source = "razor (RazorAttention: echo and induction scores on repeated random tokens, max over each KV group)";
                return razor_head_score(m, RazorSettings{});
            }
            *source = fmt::format("razor --razor-preset {} (RazorAttention as golden-stick@a50ddc93 scores and selects{}: "
                                  "the selected KV groups first, then razor_combine's order)",
                                  razor_preset_name(o.preset),
                                  o.preset == RazorPreset::kPaper ? ", the full union" : ", quirks included");
            return razor_preset_score(m, RazorSettings{}, o.preset);
        case StreamOrderSpec::Kind::kFile: break;
    }
    *source = o.file;
    return read_head_score(split_head_score_ref(o.file), L, H);
}

StreamSweep run_needle_stream_sweep(const NeedleStudySpec& s, const NeedleTest& test, const Model& m, const NeedleSummary& sum,
                                    const at::Tensor& score, const std::string& source) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    StreamSweepSpec spec;
    spec.fractions = s.full_fractions;
    spec.score = score.defined() ? score : sum.score(s.order.score);
    spec.random_orders = s.random_orders;
    spec.seed = static_cast<uint64_t>(s.proto.seed);
    spec.window = s.window;
    spec.sweep_rows = s.sweep_rows;
    StreamSweep sw = run_stream_sweep(test, L, H, spec);

    schema::StreamingRecord rec;
    rec.L = L, rec.H = H, rec.R = static_cast<int64_t>(sw.orders.size()), rec.F = static_cast<int64_t>(sw.fractions.size());
    rec.fractions.assign(sw.fractions.begin(), sw.fractions.end());
    rec.full_heads = sw.full_heads;
    for (const auto& ord : sw.orders) rec.order.insert(rec.order.end(), ord.begin(), ord.end());
    rec.masks = sw.masks, rec.accuracy = sw.accuracy, rec.rougeL_f = sw.rougeL_f, rec.kv_budget = sw.kv_budget;
    schema::StreamSweepParams p;
    p.sink = s.window.sink, p.recent = s.window.recent, p.compensate = s.window.compensate;
    p.order_source = source;
    p.random_orders = s.random_orders, p.sweep_rows = s.sweep_rows, p.seed = s.proto.seed;
    p.baseline_accuracy = sum.accuracy, p.baseline_rougeL_f = sum.rougeL;
    p.scope = ablation_scope_name(test.config().decode.scope);
    rec.attrs = schema::stream_sweep_attrs(p);
    ResultWriter w(s.out, WriteMode::kAppend);
    schema::write_streaming(w, rec);
    w.commit();
    return sw;
}

}  // namespace hs
