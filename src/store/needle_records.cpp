// The needle scan's static file parts (see needle_records.h): every attribute text of /retrieval,
// /retrieval/trials, /retrieval/ablation, /retrieval/decoding, /retrieval/streaming and the needle
// scores' groups that is not a result.
#include "needle_records.h"

#include "schema.h"

#include <fmt/format.h>

#include <algorithm>

namespace hs::schema {

void write_trial_arrays(ResultWriter& w, const std::string& g, const NeedleTrialsRecord& t) {
    const int64_t N = static_cast<int64_t>(t.prompts.size());
    int64_t Tmax = 0;
    for (const auto& p : t.prompts) Tmax = std::max<int64_t>(Tmax, p.size());
    std::vector<int64_t> prompt_tokens(N * Tmax, -1), span(N * 2), aspan(N * 2), len_v(N), needle_v(N);
    std::vector<float> depth_v(N);
    for (int64_t i = 0; i < N; ++i) {
        std::copy(t.prompts[i].begin(), t.prompts[i].end(), prompt_tokens.begin() + i * Tmax);
        span[2 * i] = t.needle_start[i], span[2 * i + 1] = t.needle_end[i];
        aspan[2 * i] = t.answer_start[i], aspan[2 * i + 1] = t.answer_end[i];
        len_v[i] = t.length[i], depth_v[i] = static_cast<float>(t.depth[i]), needle_v[i] = t.needle[i];
    }
    w.write(g + "/prompt_tokens", prompt_tokens, {N, Tmax});
    w.write(g + "/needle_span", span, {N, 2});
    w.write(g + "/answer_span", aspan, {N, 2});
    w.write(g + "/length", len_v, {N});
    w.write(g + "/depth", depth_v, {N});
    w.write(g + "/needle", needle_v, {N});
}

Attrs needle_params(const NeedleParamsRecord& p) {
    Attrs a = {{"haystack_file", p.haystack_file},
               {"needles_file", p.needles_file},
               {"haystack_sha256", p.haystack_sha256},
               {"needles_sha256", p.needles_sha256},
               {"template", p.tmpl},
               {"lengths", p.lengths},
               {"depths", p.depths},
               {"max_new_tokens", p.max_new_tokens},
               {"pass_threshold", p.pass_threshold},
               {"pass_rule", std::string("rouge1_recall(answer, response) > pass_threshold; ROUGE as rouge_score "
                                         "computes it with use_stemmer=True (Porter stems, NLTK's mode)")},
               {"stop", p.stop},
               {"ablation_scope", p.ablation_scope},
               {"prefill_chunk", p.prefill_chunk},
               {"batch", p.batch},
               {"prefix_reuse", std::string(p.prefix_reuse ? "true" : "false")},
               {"scores", p.scores},
               {"flag_threshold", p.flag_threshold},
               {"bootstrap_resamples", p.bootstrap},
               {"seed", p.seed},
               {"n_trials", p.n_trials},
               {"decode", std::string("greedy; prefill prompt[:-1], then one token a step through the KV cache; a stop "
                                      "token (stop_ids) ends the response: unkept and unscored (stop_order before), or "
                                      "kept and scored first (after, Wu's order)")}};
    // The protocol and every choice it resolved to (docs/needle-protocols.md).
    if (p.with_protocol) {
        a["protocol"] = p.protocol;
        a["buffer"] = p.buffer;
        a["assembly"] = p.assembly;
        a["ablation_assembly"] = p.ablation_assembly;
        a["ablation_template"] = p.ablation_template;
        a["ablation_max_new_tokens"] = p.ablation_max_new_tokens;
        a["insertion"] = p.insertion;
        a["answer_span"] = p.answer_span;
        a["stop_order"] = p.stop_order;
        a["haystack_format"] = p.haystack_format;
        a["haystack_repeat"] = p.haystack_repeat;
        a["rng"] = p.rng;
    }
    if (p.stop_ids.empty()) a["stop_ids"] = std::string("none");
    else a["stop_ids"] = p.stop_ids;
    return a;
}

void write_needle_static(ResultWriter& w, const std::vector<NeedleScoreAttrs>& groups, const NeedleTrialsRecord& trials,
                         const Attrs& params, int64_t bootstrap, int64_t seed) {
    auto with = [&](Attrs a) {
        for (auto& kv : params) a.insert(kv);
        return a;
    };
    for (const auto& s : groups) {
        Attrs a = {{"probe", s.name}, {"description", s.description}};
        if (s.with_ci) {
            a["bootstrap_resamples"] = bootstrap;
            a["bootstrap_seed"] = seed;
            a["ci"] = std::string("2.5 and 97.5 percentiles of resampled trial means (linear interpolation); "
                                  "NaN when fewer than 10 trials are scored (the reference's rule)");
        }
        w.set_attrs(scores(s.name), with(std::move(a)));
    }
    const std::string tg = retrieval_trials();
    write_trial_arrays(w, tg, trials);
    w.set_attrs(retrieval(), params);
    w.set_attrs(tg, {{"padding", std::string("-1 past each prompt's end and each generation's end")},
                     {"locos_without_answer_steps", std::string("NaN")},
                     {"done", std::string("1 = the trial's unablated decode ran (a shard runs some, --resume skips those done)")}});
}

void write_needle_job(ResultWriter& w, const Attrs& job) { w.set_attrs(retrieval(), job); }

void write_needle_ablation(ResultWriter& w, const NeedleAblationRecord& r) {
    const std::string ag = retrieval_ablation();
    Attrs aa = {{"ablation", r.ablation},
                {"heads", r.heads},
                {"source", r.source},
                {"random_controls", r.random_controls},
                {"distinct_controls_possible", r.distinct_controls_possible},
                {"control_seed", r.control_seed},
                {"scope", r.scope},
                {"controls", std::string("set 0 = the named heads; sets 1.. = distinct random sets of the same size drawn "
                                         "without replacement from the heads NOT in set 0 (all of them, fewer than "
                                         "random_controls, when distinct_controls_possible <= random_controls)")}};
    if (r.separate_trials) {
        aa["baseline_set"] = r.baseline_set;
        aa["trials"] = std::string("the ablation passes decode prompts of their own (ablation_assembly, "
                                   "ablation_template: /retrieval/ablation/trials); the last set, no heads, is their "
                                   "unablated baseline (baseline_* datasets)");
        write_trial_arrays(w, retrieval_ablation("trials"), r.trials);
    }
    if (r.stream) aa["window"] = r.window;
    if (r.mean_query) {
        aa["calibration_trials"] = r.calibration_trials;
        aa["calibration_trial_indices"] = r.calibration_trial_indices;
        aa["calibration_seed"] = r.calibration_seed;
        aa["calibration_rng"] = std::string(r.reference_rng ? "random.Random(calibration_seed).shuffle of the grid, the first "
                                                              "calibration_trials (nolima_ablation.py)"
                                                            : "std::mt19937_64(calibration_seed), a partial Fisher-Yates draw");
        aa["calibration"] = std::string("LOCOS (nolima_ablation.py): mean PRE-RoPE query (after q-norm) of "
                                        "calibration_trials trials drawn by calibration_seed from the whole grid, "
                                        "unablated prefill of each trial's prompt (context at most 5000 tokens, "
                                        "prompt cut to 5000), averaged over each prompt's positions, then over the "
                                        "prompts (each prompt weighs equally); RoPE is applied at each position to "
                                        "the mean");
        w.write(ag + "/query_mean", r.query_mean, {r.L, r.H, r.d_head});
    }
    w.set_attrs(ag, aa);
}

void write_decoding(ResultWriter& w, const NeedleDecodingRecord& d) {
    const std::string g = retrieval_decoding();
    const int64_t S = d.S, N = d.N;
    std::vector<float> r1(S * N), rl(S * N), margin(S * N), base(S * N), acc(S), mean_rl(S), mean_margin(S);
    std::vector<int64_t> passed(S * N);
    for (int64_t s = 0; s < S; ++s) {
        double a = 0, f = 0, mg = 0;
        for (int64_t i = 0; i < N; ++i) {
            const int64_t k = s * N + i;
            r1[k] = static_cast<float>(d.rouge1_recall[k]);
            rl[k] = static_cast<float>(d.rougeL_f[k]);
            passed[k] = d.passed[k];
            margin[k] = static_cast<float>(d.answer_margin[k]);
            base[k] = static_cast<float>(d.base_margin[k]);
            a += d.passed[k], f += d.rougeL_f[k], mg += d.answer_margin[k];
        }
        acc[s] = static_cast<float>(a / N), mean_rl[s] = static_cast<float>(f / N), mean_margin[s] = static_cast<float>(mg / N);
    }
    w.write(g + "/rouge1_recall", r1, {S, N});
    w.write(g + "/rougeL_f", rl, {S, N});
    w.write(g + "/passed", passed, {S, N});
    w.write(g + "/answer_margin", margin, {S, N});
    w.write(g + "/base_margin", base, {S, N});
    w.write(g + "/accuracy", acc, {S});
    w.write(g + "/mean_rougeL_f", mean_rl, {S});
    w.write(g + "/mean_answer_margin", mean_margin, {S});
    Attrs a = {{"rule", d.rule},
               {"sets", d.sets},
               {"controls", std::string("set 0 = the named heads; sets 1.. = random sets of the same size drawn without "
                                        "replacement from the other heads (control_seed)")},
               {"control_seed", d.control_seed},
               {"margin", std::string("at the first decode step: the score of the answer's first token (as it appears in "
                                      "the needle) minus the best other token's; answer_margin under the rule "
                                      "(decore: (1 + a) l_base - a l_masked), base_margin under the plain model")}};
    if (d.decore) {
        a["alpha"] = d.alpha;
        a["alpha_max"] = d.alpha_max;
    } else {
        a["enhance"] = d.enhance, a["alpha_enhance"] = d.alpha_enhance;
        a["suppress"] = d.suppress, a["alpha_suppress"] = d.alpha_suppress;
    }
    w.set_attrs(g, a);
}

Attrs stream_sweep_attrs(const StreamSweepParams& p) {
    return {{"sink", p.sink},
            {"recent", p.recent},
            {"compensate", std::string(p.compensate ? "true" : "false")},
            {"order_source", p.order_source},
            {"random_orders", p.random_orders},
            {"sweep_rows", p.sweep_rows},
            {"random_order_seeds", fmt::format("seed + 3 + r (seed {}), heads.h random_subset over all L x H heads", p.seed)},
            {"baseline_accuracy", p.baseline_accuracy},
            {"baseline_rougeL_f", p.baseline_rougeL_f},
            {"scope", p.scope},
            {"description", std::string("order row 0 ranks heads by order_source (best first, NaN last), rows 1.. are "
                                        "random orders; for fraction rho the first full_heads = round(rho L H) heads "
                                        "of an order keep full attention, every other head streams (keys [0, sink) "
                                        "and (q - recent, q]); masks 1 = the head streams; accuracy and rougeL_f "
                                        "[order, fraction] over every trial; kv_budget = mean over trials of "
                                        "rho + (1 - rho) min(1, (sink + recent [+ 1 compensation]) / prompt tokens)")}};
}

}  // namespace hs::schema
