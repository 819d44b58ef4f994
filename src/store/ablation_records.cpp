#include "ablation_records.h"

#include "util.h"

#include <fmt/format.h>

namespace hs::schema {

void write_ablation_run(ResultWriter& w, const AblationRunFile& f) {
    write_experiment(w, f.experiment);
    for (const auto& d : f.data) write_data(w, d);
    for (const auto& p : f.probes) write_scores(w, p);
    for (const auto& s : f.studies) {
        write_study(w, s.study);
        if (s.juice) write_juice(w, s.study.name, *s.juice);
        if (s.gates) write_gates(w, s.study.name, *s.gates);
        if (s.duo) write_duo(w, s.study.name, *s.duo);
        w.set_attrs(study(s.study.name), s.study.attrs);
    }
}

void mark_study_merged(ResultWriter& w, const std::string& study_name) {
    w.set_attrs(study(study_name), {{"shard", std::string("merged")}});
}

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

Attrs study_attrs(const StudySpec& s, int64_t n_configurations, const std::string& shard, int64_t resample_seed) {
    const bool answer_metric = s.metric.kind == MetricKind::kAccuracy || s.metric.kind == MetricKind::kLogitDiff ||
                               s.metric.kind == MetricKind::kProb;
    Attrs a = {{"sweep", std::string(name_of(s.sweep))},
               {"mode", std::string(name_of(s.mode.kind))},
               {"metric", std::string(name_of(s.metric.kind))},
               {"dataset", s.metric.data},
               {"positions", std::string(name_of(answer_metric ? Positions::kAnswer : s.metric.positions))},
               {"metric_description", metric_description(s.metric)},
               {"controls", s.controls},
               {"n_configurations", n_configurations},
               {"shard", shard}};
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
        a["mode_block"] = s.mode.window.block;
    }
    if (s.mode.kind == Intervention::kResample) a["resample_seed"] = resample_seed;
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

Attrs gates_attrs(const StudySpec& s) {
    return {{"roles", std::string("0 irrelevant (G+ >= 0.5, G- < 0.5), 1 facilitating (both >= 0.5), 2 interfering "
                                  "(both < 0.5), 3 unstable (G+ < 0.5, G- >= 0.5)")},
            {"loss", std::string("objective - lambda * mean(clamp(logits, -4, 4)); objective = the metric, "
                                 "negated for logit-diff and prob")},
            {"fits", std::string("lambda 0 from uniform(0, 1) gates, then +lambda (G+) and -lambda (G-) from it")},
            {"optimiser", fmt::format("Adam lr {}, gradient norm clipped to 1 per start, {} steps a fit", s.lr, s.fit_steps)},
            {"lambda", s.lambda},
            {"starts", s.starts}};
}

Attrs duo_attrs(const StudySpec& s, const DuoFitFacts& f) {
    Attrs a = {{"loss", std::string("sum over scored positions of mean over d_model of (h_gated - h_full)^2 / #positions "
                                    "+ lambda * mean |alpha|; h = final hidden state after the final norm")},
               {"mix", std::string("z = alpha z_full + (1 - alpha) z_stream at every layer; z_full from the unchanged model")},
               {"optimiser", fmt::format("Adam lr {} (warm-up and cool-down over a fifth of the steps each, from 0.1x), "
                                         "alpha from 1, clamped to [0, 1] before every step, {} steps", s.lr, s.fit_steps)},
               {"lambda", s.lambda},
               {"train_sink", s.train_window.sink},
               {"train_recent", s.train_window.recent},
               {"train_block", s.train_window.block},
               {"train_window", s.train_window.block > 1
                                    ? fmt::format("blocks of {} tokens: the query's block sees blocks [0, ceil(sink / block)) "
                                                  "and the last ceil(recent / block) blocks up to itself, causal within its "
                                                  "block (block_streaming_attn_func)", s.train_window.block)
                                    : std::string("tokens: the query at p sees keys [0, sink) and (p - recent, p]")},
               {"fit_data", std::string(s.fit_passkey ? "passkey" : s.fit_fresh ? "fresh" : "study")},
               {"deploy_select", std::string(s.deploy_sparsity ? "sparsity" : "threshold")},
               {"deploy_streamed", f.deploy_streamed},
               {"distill_full", f.distill_full},
               {"distill_stream", f.distill_stream},
               {"distill_final", f.distill_final},
               {"history_columns", std::string("distillation loss, mean |alpha| (before each step's update)")}};
    if (s.deploy_sparsity) {
        a["deploy_sparsity"] = s.deploy_value;
        a["deploy_noise_seed"] = f.deploy_noise_seed;
        a["deploy_quantile"] = f.deploy_threshold;  // the gates + noise >= it keep full attention (2 / -1 at sparsity 1 / 0)
    } else {
        a["deploy_threshold"] = s.deploy_value;
    }
    if (s.fit_passkey) {
        a["fresh_seed"] = f.fresh_seed;
        a["passkey_haystack"] = s.passkey_haystack;
        a["passkey_length_min"] = s.passkey_length_min;
        a["passkey_length_max"] = s.passkey_length_max;
        a["passkey_length_intervals"] = s.passkey_length_intervals;
        a["passkeys"] = s.passkey_count;
        a["passkey_words"] = s.passkey_words;
        a["passkey_depth_min"] = s.passkey_depth_min;
        a["passkey_depth_max"] = s.passkey_depth_max;
        a["passkey_depth_intervals"] = s.passkey_depth_intervals;
        a["fresh_sample"] = fmt::format(
            "duo_attn/data.py MultiplePasskeyRetrievalDataset (duo_passkey_sample): step s trains on one of the {} context "
            "lengths torch.linspace({}, {}, {}, dtype=int), each once an epoch of {} steps in a shuffled order (train.py's "
            "DataLoader, shuffle=True; epoch e's order from std::mt19937_64(fresh_seed + 2^40 + e)); passkeys of alphabet words "
            "at sorted depths of linspace({}, {}, {}) in the haystack cut to that length, then their questions with the "
            "passkeys; the question-and-answer tokens labelled; step s's draws from std::mt19937_64(fresh_seed + s)",
            s.passkey_length_intervals, s.passkey_length_min, s.passkey_length_max, s.passkey_length_intervals,
            s.passkey_length_intervals, s.passkey_depth_min, s.passkey_depth_max, s.passkey_depth_intervals);
    } else if (s.fit_fresh) {
        a["fresh_rows"] = s.fresh_rows;
        a["fresh_length"] = s.fresh_length;
        a["fresh_seed"] = f.fresh_seed;
        a["fresh_sample"] = std::string("toy recall rows (duo_recall_sample): key -> value pairs in filler, then queries; "
                                        "every token from the first '?' on labelled");
    }
    return a;
}

Attrs juice_attrs() {
    return {{"reference", std::string("GaotangLi/JUICE src/select_intervention_head.py")},
            {"delta", std::string("mean metric with z_h *= factor minus the baseline's, per prompt variant")},
            {"up", std::string("mean of delta over factors > 1 (JUICE's positive alphas, alpha = factor - 1)")},
            {"down", std::string("mean of delta over factors < 1 (JUICE's negative alphas)")},
            {"enhance", std::string("sum over variants of up where up > 0 in every variant, else NaN")},
            {"suppress", std::string("sum over variants of down where down > 0 in every variant, else NaN")}};
}

Attrs influence_attrs(const InfluenceParams& p) {
    Attrs a = {{"corpus", p.corpus},
               {"corpus_sha256", p.corpus_sha256},
               {"heads", p.heads},
               {"random_controls", static_cast<int64_t>(p.heads.size()) - 1},
               {"control_seed", p.control_seed},
               {"loss_tokens", std::string(p.last_only ? "last" : "all")},
               {"max_tokens", p.max_tokens},
               {"n_truncated", p.n_truncated},
               {"masking", p.masking},
               {"select_fraction", p.select_fraction},
               {"select_by", p.select_by},
               {"max_rows", p.max_rows},
               {"chunk", p.chunk}};
    for (const auto& [k, v] : influence_descriptions(p.masking, p.last_only)) a[k] = v;
    a["heads_source"] = p.heads_source;
    a["distinct_controls_possible"] = p.distinct_controls_possible;
    if (!p.detect) return a;
    a["top_share"] = p.top_share;
    a["detect_format"] = p.detect_format;
    a["detect_values"] = p.detect_values;
    a["detect_trials"] = p.detect_trials;
    a["detect_length"] = p.detect_length;
    a["detect_shots"] = p.detect_shots;
    a["detect_seed"] = p.detect_seed;
    a["detect_passed"] = p.detect_passed;
    a["detect_max_prompt"] = p.detect_max_prompt;
    a["detect_pairs"] = fmt::format("{}-{}", p.detect_min_pairs, p.detect_max_pairs);
    a["detect_max_new_tokens"] = p.detect_max_new_tokens;
    a["detect_description"] = std::string(
        "set 0: the top top_share of the heads (ceil of share x heads) by Wu et al.'s retrieval score (copy-paste credit "
        "per decoding step, the mean over passing trials: detect_score) on a synthetic key -> value retrieval task "
        "(Hua et al. 2025, section 4.1 and appendix A), decoded greedily by the needle study");
    return a;
}

Attrs influence_descriptions(const std::string& masking, bool last_only) {
    const std::string how =
        masking == "zero-query"
            ? "zero-query: the heads' query zeroed after RoPE, so their pre-softmax scores are 0 on every key the causal "
              "(and sliding-window) mask shows: uniform attention over the prefix (the retrieval-head lineage's masking, "
              "FYYFU/HeadKV Important_Head/source/modeling_llama.py lines 554-557)"
        : masking == "zero" ? "zero: the heads' attention output z set to 0 in every position"
                            : masking;
    return {{"masking_description", how + "; through the ablation engine's per-row masks"},
            {"loss", std::string(last_only ? "next-token cross-entropy of each sample's last token alone (--loss-tokens last)"
                                           : "mean next-token cross-entropy over positions 1..T-1 of each sample (every token "
                                             "after the first; text samples start with the tokenizer's BOS)")},
            {"score", std::string("(masked_loss - loss) / loss")}};
}

const std::vector<std::string>& influence_identity_keys() {
    static const std::vector<std::string> keys = {"corpus_sha256", "heads", "masking", "control_seed", "loss_tokens",
                                                  "max_tokens", "chunk", "max_rows", "top_share", "detect_format",
                                                  "detect_trials", "detect_length", "detect_shots", "detect_seed"};
    return keys;
}

Attrs influence_ranking_attrs(int64_t n_selected, int64_t n_done, int64_t tokens_selected, int64_t tokens_done) {
    return {{"n_selected", n_selected}, {"n_done", n_done}, {"tokens_selected", tokens_selected}, {"tokens_done", tokens_done}};
}

Attrs influence_run_attrs(int64_t forwards) { return {{"forwards", forwards}}; }

namespace {
// An attribute as text ("" when absent), as schema::attr_text reads it from the file.
std::string text_of(const Attrs& a, const std::string& name) {
    const auto it = a.find(name);
    return it == a.end() ? std::string() : attr_to_string(it->second);
}
}  // namespace

InfluenceShardInfo influence_shard_info(const Attrs& a) {
    InfluenceShardInfo s;
    s.shard = text_of(a, "shard");
    s.index = parse_int64(text_of(a, "shard_index"));
    s.count = parse_int64(text_of(a, "shard_count"));
    s.complete = text_of(a, "complete") == "1";
    return s;
}

std::optional<double> influence_select_fraction(const Attrs& a) { return parse_double(text_of(a, "select_fraction")); }

std::string influence_select_by(const Attrs& a) {
    const std::string s = text_of(a, "select_by");
    return s.empty() ? "samples" : s;
}

}  // namespace hs::schema
