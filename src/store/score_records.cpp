// The single-pass commands' records written: every dataset name and attribute text beside its path.
#include "score_records.h"

#include "errors.h"

#include <fmt/format.h>

#include <utility>

namespace hs::schema {

void write_run_meta(ResultWriter& w, const MetaRecord& m) {
    Attrs a;
    a["tool"] = std::string("headscope");
    a["tool_version"] = m.tool_version;
    a["git_commit"] = m.git_commit;
    a["command_line"] = m.command_line;
    a["utc_time"] = m.utc_time;
    a["model_path"] = m.model_path;
    a["weights_sha256"] = m.weights_sha256;
    a["model_format"] = m.model_format;
    a["hub_repo"] = m.hub_repo;
    a["hub_revision"] = m.hub_revision;
    a["hub_commit"] = m.hub_commit;
    a["architecture"] = m.architecture;
    a["family"] = m.family;
    a["n_layers"] = m.n_layers;
    a["n_heads"] = m.n_heads;
    a["n_kv_heads"] = m.n_kv_heads;
    a["d_model"] = m.d_model;
    a["d_head"] = m.d_head;
    a["vocab_size"] = m.vocab_size;
    a["dtype"] = m.dtype;
    a["device"] = m.device;
    // The attention kernel where nothing observes the pattern (docs/forward.md, "Attention kernels").
    a["attention"] = std::string(m.fused_attention ? "fused where no pattern is observed, blocked elsewhere" : "blocked");
    a["threads"] = m.threads;
    a["seed"] = m.seed;
    if (!m.study_config.empty()) a["study_config"] = m.study_config;
    write_meta(w, a);
}

// ---- detect

void write_head_probe(ResultWriter& w, const HeadProbeRun& run, const HeadProbeRecord& r) {
    Attrs a = {{"convention", std::string(run.stripe ? "stripe" : "detector")}};
    if (run.stripe)
        a.insert({{"seq_len", run.seq_len}, {"batch", run.batch}, {"seed", run.seed}, {"token_lo", run.token_lo},
                  {"token_hi", run.token_hi}});
    else
        a.insert({{"n_sequences", run.n_sequences}, {"source_file", run.source_file}});
    a["probe"] = r.probe;
    a["description"] = r.description;
    if (r.baseline_loss) {
        a["baseline_loss"] = *r.baseline_loss;
        a["ablation"] = std::string("zero z of one head (all positions)");
    } else if (r.detector_options) {
        a["error_measure"] = run.error_measure;
        a["exclude_bos"] = int64_t(run.exclude_bos);
        a["exclude_current_token"] = int64_t(run.exclude_current_token);
    }
    ScoreGroup g{r.probe, a, {{"score", {{r.L, r.H}, r.score, {}}}}};
    if (!r.samples.empty()) g.datasets.push_back({"samples", {{r.n_samples, r.L, r.H}, r.samples, {}}});
    if (r.baseline_loss)
        g.datasets.push_back({"baseline", {{1}, std::vector<float>{static_cast<float>(*r.baseline_loss)}, {}}});
    if (r.sink) {
        // Gu et al.'s sink rates (sail-sg/Attention-Sink eval_sink_open_source.py:46-49).
        g.attrs["epsilon"] = r.sink->epsilon;
        g.attrs["model_rate"] = r.sink->model_rate;
        g.attrs["model_rate_description"] =
            std::string("share of (sequence, layer, head) triples whose alpha_0 exceeds epsilon (the reference prints it x 100)");
        g.datasets.push_back({"rate", {{r.L, r.H}, r.sink->head_rate,
                                       {{"description", std::string("share of sequences whose alpha_0 of this head exceeds epsilon")}}}});
        g.datasets.push_back({"layer_rate", {{r.L}, r.sink->layer_rate,
                                             {{"description", std::string("the layer's sink rate: share of (sequence, head) pairs "
                                                                          "whose alpha_0 exceeds epsilon")}}}});
    }
    write_scores(w, g);
}

// ---- copy-suppression

static void add_rank_stats(ScoreGroup& g, const std::string& circuit, const RankStatsRecord& s, const Attrs& base,
                           int64_t L, int64_t H) {
    auto put = [&](const std::string& name, const std::vector<float>& v, const std::string& desc) {
        Attrs a = base;
        a["description"] = desc;
        g.datasets.push_back({circuit + "_" + name, {{L, H}, v, a}});
    };
    put("median_rank", s.median, circuit + " circuit: median rank of the source token (lower median)");
    put("frac_rank0", s.frac_rank0, circuit + " circuit: fraction of scored tokens at rank 0");
    put("frac_rank_lt10", s.frac_lt10, circuit + " circuit: fraction of scored tokens at rank < 10");
    put("log_rank_summary", s.summary, circuit + " circuit: mean log(rank + 1) - (log V - 1)");
}

void write_copy_suppression(ResultWriter& w, const CopySuppressionRecord& r) {
    const int64_t L = r.L, H = r.H;
    Attrs base{{"probe", std::string("copy-suppression")},
               {"block_size", r.block_size},
               {"n_tokens", r.n_tokens},
               {"seed", r.seed},
               {"weight_processing", std::string("folded+centered")},
               {"embedding", std::string("effective: W_E + layer-0 self-attention OV + MLP0")},
               {"qk_position", std::string("weights-only QK uses unrotated q and k: RoPE position ignored")}};
    Attrs sa = base;
    sa["description"] = std::string("OV circuit: fraction of scored tokens whose own logit is the most suppressed "
                                    "(rank 0); = ov_frac_rank0");
    ScoreGroup g{"copy-suppression", base, {{"score", {{L, H}, r.ov.frac_rank0, sa}}}};
    add_rank_stats(g, "ov", r.ov, base, L, H);
    add_rank_stats(g, "qk", r.qk, base, L, H);
    g.datasets.push_back({"scored_tokens", {{static_cast<int64_t>(r.scored_tokens.size())}, r.scored_tokens, {}}});
    if (!r.text_file.empty()) {
        Attrs da = base;
        da["text_file"] = r.text_file;
        da["threshold"] = r.threshold;
        da["n_windows"] = r.n_windows;
        for (const auto& [name, v, desc] :
             {std::tuple{"dynamic_frac_rank0", &r.dynamic_frac_rank0, "fraction of (q,k) pairs with A > threshold, k != 0, "
                                                                      "whose source token is the most suppressed (NaN: none)"},
              {"dynamic_n_pairs", &r.dynamic_n_pairs, "qualifying (q,k) pairs"},
              {"dynamic_mean_effect", &r.dynamic_mean_effect, "mean A[q,k] (v_k W_O) . W_U_f[token_k] / scale[q] over "
                                                              "qualifying pairs"}}) {
            da["description"] = std::string(desc);
            g.datasets.push_back({name, {{L, H}, *v, da}});
        }
    }
    write_scores(w, g);
}

// ---- dla

void write_dla(ResultWriter& w, const DlaRecord& r) {
    const int64_t L = r.L, H = r.H, P = r.P;
    Attrs a{{"probe", std::string("dla")},
            {"prompts_file", r.prompts_file},
            {"n_prompts", P},
            {"weight_processing", std::string("final norm weight folded into W_U; clean-run final-norm scale")},
            {"position", std::string("last")}};
    ScoreGroup g{"dla", a, {}};
    auto put = [&](const std::string& name, const std::vector<float>& v, const std::vector<int64_t>& shape,
                   const std::string& desc) {
        Attrs x = a;
        x["description"] = desc;
        g.datasets.push_back({name, {shape, v, x}});
    };
    put("score", r.score, {L, H}, "mean over prompts of the head's direct effect on logit(correct) - logit(incorrect)");
    put("per_prompt", r.per_prompt, {P, L, H}, "per prompt head direct effects");
    put("mlp", r.mlp, {P, L}, "per prompt MLP direct effects");
    put("attn_bias", r.attn_bias, {P, L}, "per prompt attention-output bias direct effects");
    put("embed", r.embed, {P}, "per prompt embedding direct effect");
    put("final_bias", r.final_bias, {P}, "per prompt final-norm and unembedding bias terms");
    put("logit_diff", r.logit_diff, {P}, "the model's logit(correct) - logit(incorrect); the terms above sum to it");
    for (size_t i = 0; i < r.per_position.size(); ++i)
        put(fmt::format("per_position/prompt_{}", i), r.per_position[i].values, {L, H, r.per_position[i].T},
            "A[last, k] (v_k W_O^h) . direction per key position k; sums over k to the head's score");
    write_scores(w, g);
}

// ---- maps

void write_maps_relation(ResultWriter& w, const MapsRelationRecord& r) {
    const int64_t L = r.L, H = r.H, N = r.N;
    Attrs a{{"probe", std::string("maps")},
            {"relation", r.relation},
            {"relation_file", r.relation_file},
            {"category", r.category},
            {"k", r.k},
            {"block_size", r.block_size},
            {"weight_processing", std::string("raw")},
            {"source_representation", std::string("MLP0(norm2_0(W_E[s])) output only; raw W_E[s] for layer-0 heads")},
            {"n_pairs_total", r.n_pairs_total},
            {"n_pairs_kept", N},
            {"min_pairs", r.min_pairs}};
    ScoreGroup g{"maps/" + r.relation, {}, {}};
    Attrs sa = a;
    sa["description"] = std::string("fraction of pairs whose target is in the top-k of E_s W_VO W_U^T");
    g.datasets.push_back({"score", {{L, H}, r.score, sa}});
    if (!r.suppression.empty()) {
        sa["description"] = std::string("fraction of pairs whose target is in the top-k of -(E_s W_VO W_U^T)");
        g.datasets.push_back({"suppression", {{L, H}, r.suppression, sa}});
    }
    g.datasets.push_back({"target_rank", {{L, H, N}, r.target_rank, {}}});
    g.datasets.push_back({"source_tokens", {{N}, r.source_tokens, {}}});
    g.datasets.push_back({"target_tokens", {{N}, r.target_tokens, {}}});
    if (!r.dynamic.empty()) {
        sa["description"] = std::string("mean over templates of the top-k criterion on z[-1,h] W_O^h W_U^T");
        sa["templates"] = r.templates;
        g.datasets.push_back({"dynamic", {{L, H}, r.dynamic, sa}});
        a["static_dynamic_pearson"] = r.static_dynamic_pearson;
    }
    g.attrs = a;
    write_scores(w, g);
}

void write_maps_run(ResultWriter& w, const MapsRunRecord& r) {
    std::string names, skipped;
    for (const auto& n : r.relations) names += (names.empty() ? "" : ",") + n;
    for (const auto& s : r.skipped) skipped += (skipped.empty() ? "" : ",") + s;
    w.set_attrs(maps_root(), {{"probe", std::string("maps")},
                              {"relations", names},
                              {"skipped_relations", skipped},  // too few single-token pairs
                              {"min_pairs", r.min_pairs}});
}

// ---- qk-spectrum

// "rope" attribute: what the weights-only form means for this family's positions.
static std::string rope_note(const QkRankRecord& r) {
    if (r.learned_positions) return "none: learned absolute positions live in the residual stream; M_h is the whole form";
    std::string s = "unrotated: RoPE makes the form W_Q R_(j-i) W_K^T depend on the offset j - i; M_h is its value "
                    "at offset 0";
    if (r.rotary_pct < 1.0) s += fmt::format(" (only the first {:.0f}% of each head's dims rotate)", 100.0 * r.rotary_pct);
    return s;
}

static std::string qk_norm_note(const QkRankRecord& r) {
    if (r.qk_norm_full) return "folded: OLMo-2's q/k RMSNorm weights (over the whole projection) scale each head's columns";
    if (r.qk_norm)
        return r.gemma ? "folded: Gemma 3's per-head q/k RMSNorm scales (1 + w)" : "folded: the per-head q/k RMSNorm weights";
    return "none (this family has no q/k norm)";
}

void write_qk_rank(ResultWriter& w, const QkRankRecord& r) {
    Attrs a{{"probe", std::string("qk_rank")},
            {"description", std::string("effective rank exp(H(p)), p = singular values of M_h = W_Q^h W_K^(h/g)T "
                                        "normalised to sum 1 (Roy & Vetterli); NaN for a zero form")},
            {"method", std::string("thin QR of W_Q^h and W_K^(h/g); singular values of the d x d core R_Q R_K^T")},
            {"weight_processing", std::string("raw W_Q, W_K (pre-attention norm weight not folded)")},
            {"qk_norm", qk_norm_note(r)},
            {"biases", std::string(r.attention_bias ? "ignored: b_q adds a per-key term, b_k a per-query constant "
                                                      "(softmax-invariant); neither is in the bilinear form"
                                                    : "none")},
            {"rope", rope_note(r)}};
    write_scores(w, {"qk_rank", a, {{"score", {{r.L, r.H}, r.effective_rank, {}}},
                                    {"singular_values", {{r.L, r.H, r.S}, r.singular_values, {}}}}});
}

// ---- successor

void write_successor(ResultWriter& w, const SuccessorRecord& r) {
    const int64_t L = r.L, H = r.H, N = r.N;
    std::vector<std::string> used, skipped, names, forms;
    std::vector<int64_t> n_words, n_single, n_pairs, n_skipped;
    int64_t skipped_pairs = 0;
    for (const auto& t : r.tasks) {
        (t.form.empty() ? skipped : used).push_back(t.name);
        names.push_back(t.name);
        forms.push_back(t.form.empty() ? "skipped" : t.form);
        n_words.push_back(t.words);
        n_single.push_back(t.single_tokens);
        n_pairs.push_back(t.pairs);
        n_skipped.push_back(t.skipped_pairs);
        skipped_pairs += t.skipped_pairs;
    }
    const auto T = static_cast<int64_t>(used.size());
    Attrs a{{"probe", std::string("successor")},
            {"tasks_source", r.tasks_file.empty() ? std::string("the reference's tasks (datasets/successor_tasks.cpp)")
                                                  : r.tasks_file},
            {"tasks", used},
            {"skipped_tasks", skipped},
            {"all_tasks", names},
            {"task_form", forms},
            {"task_words", n_words},
            {"task_single_tokens", n_single},
            {"task_pairs", n_pairs},
            {"task_skipped_pairs", n_skipped},
            {"n_skipped_pairs", skipped_pairs},
            {"embedding", r.embedding},
            {"source_representation", r.source_representation},
            {"ties", r.ties},
            {"threshold", r.threshold},
            {"successor_heads", r.successor_heads},
            {"n_scored", N}};
    Attrs sa = a;
    sa["description"] = std::string("fraction of scored pairs (each word of a task and the next, both one token) whose "
                                    "successor's logit of e(t) W_V W_O W_U^T is the largest among its task's tokens "
                                    "(the ties attribute: success when it equals the largest, fail unless it exceeds "
                                    "every other)");
    ScoreGroup g{"successor", a, {}};
    g.datasets.push_back({"score", {{L, H}, r.score, sa}});
    g.datasets.push_back({"successor_head", {{L, H}, r.successor_head,
                                             {{"description", std::string("1 where score > threshold (a successor head), "
                                                                          "else 0")}}}});
    sa["description"] = std::string("the same fraction per task (the tasks attribute's order)");
    g.datasets.push_back({"task_score", {{T, L, H}, r.task_score, sa}});
    g.datasets.push_back({"successor_rank", {{L, H, N}, r.successor_rank, {}}});
    g.datasets.push_back({"predicted", {{L, H, N}, r.predicted, {}}});
    g.datasets.push_back({"source_tokens", {{N}, r.source_tokens, {}}});
    g.datasets.push_back({"target_tokens", {{N}, r.target_tokens, {}}});
    g.datasets.push_back({"task_index", {{N}, r.task_index, {}}});
    write_scores(w, g);
}

// ---- patch

void write_patching_run(ResultWriter& w, PatchingRecord p, const PatchingRun& run) {
    Attrs a{{"metric", run.metric},
            {"pairs", run.pairs},
            {"n_pairs", run.n_pairs},
            {"normalisation", std::string("(M_patched - M_corrupt) / (M_clean - M_corrupt), each M averaged over the pairs "
                                          "first: 1 = the clean behaviour fully restored, 0 = no effect")}};
    if (!run.path) {
        a["method"] = run.method;
        a["what"] = run.what;
        a["positions"] = run.positions;
        a["units"] = std::string(run.kv_units ? "key/value heads" : "query heads");
        a["forwards"] = run.forwards;
        a["seconds"] = run.seconds;
        if (run.method == "attribution")
            a["estimate"] = std::string("sum over the site's dims (and positions for all) of (a_clean - a_corrupt) * "
                                        "dM/da at the corrupted run, M the mean over pairs");
    } else {
        a["method"] = std::string("path");
        a["what"] = std::string("senders' head-out into the receivers' q, k or v (frozen input-norm scale)");
        a["forwards"] = run.forwards;
    }
    p.attrs = std::move(a);
    write_patching(w, p);
}

// ---- fv-heads

void write_fv_heads(ResultWriter& w, PatchingRecord p, const FvHeadsRun& run, const FvPromptsRecord& q) {
    p.attrs = Attrs{{"method", std::string("function-vector")},
                    {"what", std::string("z")},
                    {"positions", std::string("last")},
                    {"units", std::string("query heads")},
                    {"metric", std::string("prob")},
                    {"pairs", run.task},
                    {"n_pairs", run.n_trials},
                    {"normalisation", std::string("none: the average indirect effect (Todd et al. 2024), the mean over the "
                                                  "corrupted (shuffled-label) prompts of p(answer) with the head's mean clean z "
                                                  "at the last token minus p(answer) without; metric_clean is the clean prompts' "
                                                  "mean p(answer)")},
                    {"n_shots", run.n_shots},
                    {"n_trials", run.n_trials},
                    {"seed", static_cast<int64_t>(run.seed)},
                    {"test_split", run.test_split},
                    {"input_prefix", run.input_prefix},
                    {"output_prefix", run.output_prefix},
                    {"input_separator", run.input_sep},
                    {"output_separator", run.output_sep},
                    {"prepend_space", static_cast<int64_t>(run.prepend_space)},
                    {"top1_clean", run.top1_clean},
                    {"forwards", run.forwards},
                    {"seconds", run.seconds}};
    const std::string name = p.name;
    write_patching(w, p);
    auto put = [&](const std::string& ds, const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
        const std::string path = patching(name, ds);
        HS_REQUIRE(in_layout(path), "HDF5 path '" + path + "' is not in the schema (src/store/schema.cpp layout())");
        w.write(path, v, shape);
    };
    const int64_t N = static_cast<int64_t>(q.clean_lengths.size());
    put("clean_tokens", q.clean_tokens, q.clean_shape);
    put("corrupt_tokens", q.corrupt_tokens, q.corrupt_shape);
    put("clean_lengths", q.clean_lengths, {N});
    put("corrupt_lengths", q.corrupt_lengths, {static_cast<int64_t>(q.corrupt_lengths.size())});
    put("clean_answer", q.clean_answer, {N});
    put("corrupt_answer", q.corrupt_answer, {static_cast<int64_t>(q.corrupt_answer.size())});
}

void write_fv_heads_mean(ResultWriter& w, PatchingRecord p, const std::vector<std::string>& tasks,
                         const std::vector<std::string>& groups) {
    std::string t, g;
    for (size_t i = 0; i < tasks.size(); ++i) t += (i ? "," : "") + tasks[i], g += (i ? "," : "") + groups[i];
    p.attrs = Attrs{{"method", std::string("function-vector")},
                    {"what", std::string("z")},
                    {"positions", std::string("last")},
                    {"units", std::string("query heads")},
                    {"metric", std::string("prob")},
                    {"pairs", t},
                    {"task_groups", g},
                    {"normalisation", std::string("none: the mean over the tasks of each task's average indirect effect "
                                                  "(Todd et al. 2024 rank heads by it); patched, metric_clean and "
                                                  "metric_corrupt are the tasks' means too")}};
    write_patching(w, p);
}

}  // namespace hs::schema
