#include "schema.h"

#include "errors.h"
#include "util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <iterator>
#include <regex>
#include <type_traits>

namespace hs::schema {

namespace {
using K = PathEntry::Kind;

// The table itself (a table, not code: each row a path of docs/hdf5-schema.md).
const PathEntry kLayout[] = {
    {"/meta", K::kGroup, "meta"},
    // scores: detect, run's probes:, qk-spectrum, dla, maps, successor, copy-suppression
    {"/scores/<probe>", K::kGroup, "scores"},
    {"/scores/<probe>/score", K::kDataset, "scores"},
    {"/scores/<probe>/samples", K::kDataset, "scores"},
    {"/scores/<probe>/baseline", K::kDataset, "scores"},
    {"/scores/sink-rate/rate", K::kDataset, "scores"},
    {"/scores/sink-rate/layer_rate", K::kDataset, "scores"},
    {"/scores/qk_rank/singular_values", K::kDataset, "scores"},
    {"/scores/dla/per_prompt", K::kDataset, "scores"},
    {"/scores/dla/mlp", K::kDataset, "scores"},
    {"/scores/dla/attn_bias", K::kDataset, "scores"},
    {"/scores/dla/embed", K::kDataset, "scores"},
    {"/scores/dla/final_bias", K::kDataset, "scores"},
    {"/scores/dla/logit_diff", K::kDataset, "scores"},
    {"/scores/dla/per_position/prompt_<i>", K::kDataset, "scores"},
    {"/scores/maps", K::kGroup, "scores"},
    {"/scores/maps/<relation>", K::kGroup, "scores"},
    {"/scores/maps/<relation>/score", K::kDataset, "scores"},
    {"/scores/maps/<relation>/suppression", K::kDataset, "scores"},
    {"/scores/maps/<relation>/dynamic", K::kDataset, "scores"},
    {"/scores/maps/<relation>/target_rank", K::kDataset, "scores"},
    {"/scores/maps/<relation>/source_tokens", K::kDataset, "scores"},
    {"/scores/maps/<relation>/target_tokens", K::kDataset, "scores"},
    {"/scores/successor/successor_head", K::kDataset, "scores"},
    {"/scores/successor/task_score", K::kDataset, "scores"},
    {"/scores/successor/successor_rank", K::kDataset, "scores"},
    {"/scores/successor/predicted", K::kDataset, "scores"},
    {"/scores/successor/source_tokens", K::kDataset, "scores"},
    {"/scores/successor/target_tokens", K::kDataset, "scores"},
    {"/scores/successor/task_index", K::kDataset, "scores"},
    {"/scores/copy-suppression/ov_median_rank", K::kDataset, "scores"},
    {"/scores/copy-suppression/ov_frac_rank0", K::kDataset, "scores"},
    {"/scores/copy-suppression/ov_frac_rank_lt10", K::kDataset, "scores"},
    {"/scores/copy-suppression/ov_log_rank_summary", K::kDataset, "scores"},
    {"/scores/copy-suppression/qk_median_rank", K::kDataset, "scores"},
    {"/scores/copy-suppression/qk_frac_rank0", K::kDataset, "scores"},
    {"/scores/copy-suppression/qk_frac_rank_lt10", K::kDataset, "scores"},
    {"/scores/copy-suppression/qk_log_rank_summary", K::kDataset, "scores"},
    {"/scores/copy-suppression/scored_tokens", K::kDataset, "scores"},
    {"/scores/copy-suppression/dynamic_frac_rank0", K::kDataset, "scores"},
    {"/scores/copy-suppression/dynamic_n_pairs", K::kDataset, "scores"},
    {"/scores/copy-suppression/dynamic_mean_effect", K::kDataset, "scores"},
    {"/inputs/<probe>", K::kGroup, "inputs"},
    {"/inputs/<probe>/tokens", K::kDataset, "inputs"},
    {"/logits", K::kDataset, "logits"},
    {"/tokens", K::kDataset, "logits"},
    // the needle scan (NeedleRecord below; static parts: needle_records.cpp)
    {"/scores/locos/ci_low", K::kDataset, "retrieval"},
    {"/scores/locos/ci_high", K::kDataset, "retrieval"},
    {"/retrieval", K::kGroup, "retrieval"},
    {"/retrieval/trials", K::kGroup, "retrieval"},
    {"/retrieval/trials/prompt_tokens", K::kDataset, "retrieval"},
    {"/retrieval/trials/needle_span", K::kDataset, "retrieval"},
    {"/retrieval/trials/answer_span", K::kDataset, "retrieval"},
    {"/retrieval/trials/generated", K::kDataset, "retrieval"},
    {"/retrieval/trials/response", K::kDataset, "retrieval"},
    {"/retrieval/trials/rouge1_recall", K::kDataset, "retrieval"},
    {"/retrieval/trials/rougeL_f", K::kDataset, "retrieval"},
    {"/retrieval/trials/passed", K::kDataset, "retrieval"},
    {"/retrieval/trials/length", K::kDataset, "retrieval"},
    {"/retrieval/trials/depth", K::kDataset, "retrieval"},
    {"/retrieval/trials/needle", K::kDataset, "retrieval"},
    {"/retrieval/trials/answer_steps", K::kDataset, "retrieval"},
    {"/retrieval/trials/retrieval", K::kDataset, "retrieval"},
    {"/retrieval/trials/locos", K::kDataset, "retrieval"},
    {"/retrieval/trials/done", K::kDataset, "retrieval"},
    {"/retrieval/trials/lplus", K::kDataset, "retrieval"},
    {"/retrieval/trials/lminus", K::kDataset, "retrieval"},
    {"/retrieval/trials/r2", K::kDataset, "retrieval"},
    {"/retrieval/trials/qrhead", K::kDataset, "retrieval"},
    {"/retrieval/steps", K::kGroup, "retrieval"},
    {"/retrieval/steps/credit", K::kDataset, "retrieval"},
    {"/retrieval/steps/lplus", K::kDataset, "retrieval"},
    {"/retrieval/steps/lminus", K::kDataset, "retrieval"},
    {"/retrieval/steps/r2", K::kDataset, "retrieval"},
    {"/retrieval/ablation/generated", K::kDataset, "retrieval"},
    {"/retrieval/ablation/trials", K::kGroup, "retrieval"},
    {"/retrieval/ablation/trials/prompt_tokens", K::kDataset, "retrieval"},
    {"/retrieval/ablation/trials/needle_span", K::kDataset, "retrieval"},
    {"/retrieval/ablation/trials/answer_span", K::kDataset, "retrieval"},
    {"/retrieval/ablation/trials/length", K::kDataset, "retrieval"},
    {"/retrieval/ablation/trials/depth", K::kDataset, "retrieval"},
    {"/retrieval/ablation/trials/needle", K::kDataset, "retrieval"},
    {"/retrieval/ablation", K::kGroup, "retrieval"},
    {"/retrieval/ablation/masks", K::kDataset, "retrieval"},
    {"/retrieval/ablation/rouge1_recall", K::kDataset, "retrieval"},
    {"/retrieval/ablation/rougeL_f", K::kDataset, "retrieval"},
    {"/retrieval/ablation/passed", K::kDataset, "retrieval"},
    {"/retrieval/ablation/done", K::kDataset, "retrieval"},
    {"/retrieval/ablation/accuracy", K::kDataset, "retrieval"},
    {"/retrieval/ablation/baseline_rouge1_recall", K::kDataset, "retrieval"},
    {"/retrieval/ablation/baseline_rougeL_f", K::kDataset, "retrieval"},
    {"/retrieval/ablation/baseline_accuracy", K::kDataset, "retrieval"},
    {"/retrieval/ablation/query_mean", K::kDataset, "retrieval"},
    {"/retrieval/decoding", K::kGroup, "retrieval"},
    {"/retrieval/decoding/rouge1_recall", K::kDataset, "retrieval"},
    {"/retrieval/decoding/rougeL_f", K::kDataset, "retrieval"},
    {"/retrieval/decoding/passed", K::kDataset, "retrieval"},
    {"/retrieval/decoding/answer_margin", K::kDataset, "retrieval"},
    {"/retrieval/decoding/base_margin", K::kDataset, "retrieval"},
    {"/retrieval/decoding/accuracy", K::kDataset, "retrieval"},
    {"/retrieval/decoding/mean_rougeL_f", K::kDataset, "retrieval"},
    {"/retrieval/decoding/mean_answer_margin", K::kDataset, "retrieval"},
    {"/atlas", K::kGroup, "atlas"},
    {"/atlas/scores", K::kDataset, "atlas"},
    {"/atlas/roles", K::kDataset, "atlas"},
    {"/atlas/n_roles", K::kDataset, "atlas"},
    {"/atlas/correlation", K::kDataset, "atlas"},
    {"/influence", K::kGroup, "influence"},
    {"/influence/loss", K::kDataset, "influence"},
    {"/influence/masked_loss", K::kDataset, "influence"},
    {"/influence/score", K::kDataset, "influence"},
    {"/influence/n_tokens", K::kDataset, "influence"},
    {"/influence/line", K::kDataset, "influence"},
    {"/influence/length", K::kDataset, "influence"},
    {"/influence/rank", K::kDataset, "influence"},
    {"/influence/selected", K::kDataset, "influence"},
    {"/influence/truncated", K::kDataset, "influence"},
    {"/influence/done", K::kDataset, "influence"},
    {"/influence/masks", K::kDataset, "influence"},
    {"/influence/preview", K::kDataset, "influence"},
    {"/influence/detect_score", K::kDataset, "influence"},
    {"/retrieval/streaming", K::kGroup, "streaming"},
    {"/retrieval/streaming/fractions", K::kDataset, "streaming"},
    {"/retrieval/streaming/full_heads", K::kDataset, "streaming"},
    {"/retrieval/streaming/order", K::kDataset, "streaming"},
    {"/retrieval/streaming/masks", K::kDataset, "streaming"},
    {"/retrieval/streaming/accuracy", K::kDataset, "streaming"},
    {"/retrieval/streaming/rougeL_f", K::kDataset, "streaming"},
    {"/retrieval/streaming/kv_budget", K::kDataset, "streaming"},
    {"/retrieval/kv_compare", K::kGroup, "kv_compare"},
    {"/retrieval/kv_compare/policies", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/budgets", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/capacities", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/accuracy", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/rougeL_f", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/kv_fraction", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/same_as_full", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/random_same_as_full", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/kv_bytes", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/full_groups", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/peak_cache_bytes", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/decode_ms", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/random_accuracy", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/random_rougeL_f", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/random_kv_fraction", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/partial", K::kGroup, "kv_compare"},
    {"/retrieval/kv_compare/partial/passed", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/partial/rougeL_f", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/partial/same_as_full", K::kDataset, "kv_compare"},
    {"/retrieval/kv_compare/partial/done", K::kDataset, "kv_compare"},
    // an ablation experiment (`headscope run`, `merge`)
    {"/experiment", K::kGroup, "study"},
    {"/data/<name>", K::kGroup, "data"},
    {"/data/<name>/tokens", K::kDataset, "data"},
    {"/data/<name>/lengths", K::kDataset, "data"},
    {"/data/<name>/answers", K::kDataset, "data"},
    {"/data/<name>/counterfactuals", K::kDataset, "data"},
    {"/data/<name>/variant", K::kDataset, "data"},
    {"/ablation/<study>", K::kGroup, "study"},
    {"/ablation/<study>/masks", K::kDataset, "study"},
    {"/ablation/<study>/metric", K::kDataset, "study"},
    {"/ablation/<study>/metric_rows", K::kDataset, "study"},
    {"/ablation/<study>/kind", K::kDataset, "study"},
    {"/ablation/<study>/label", K::kDataset, "study"},
    {"/ablation/<study>/k", K::kDataset, "study"},
    {"/ablation/<study>/control_seed", K::kDataset, "study"},
    {"/ablation/<study>/done", K::kDataset, "study"},
    {"/ablation/<study>/batch", K::kDataset, "study"},
    {"/ablation/<study>/fraction", K::kDataset, "study"},
    {"/ablation/<study>/order", K::kDataset, "study"},
    {"/ablation/<study>/importance", K::kDataset, "study"},
    {"/ablation/<study>/factor", K::kDataset, "study"},
    {"/ablation/<study>/gates", K::kGroup, "gates"},
    {"/ablation/<study>/gates/g0", K::kDataset, "gates"},
    {"/ablation/<study>/gates/g_plus", K::kDataset, "gates"},
    {"/ablation/<study>/gates/g_minus", K::kDataset, "gates"},
    {"/ablation/<study>/gates/roles", K::kDataset, "gates"},
    {"/ablation/<study>/gates/role", K::kDataset, "gates"},
    {"/ablation/<study>/gates/role_counts", K::kDataset, "gates"},
    {"/ablation/<study>/gates/objective", K::kDataset, "gates"},
    {"/ablation/<study>/duo", K::kGroup, "duo"},
    {"/ablation/<study>/duo/alpha", K::kDataset, "duo"},
    {"/ablation/<study>/duo/alpha_kv", K::kDataset, "duo"},
    {"/ablation/<study>/duo/history", K::kDataset, "duo"},
    {"/ablation/<study>/juice", K::kGroup, "juice"},
    {"/ablation/<study>/juice/factors", K::kDataset, "juice"},
    {"/ablation/<study>/juice/variants", K::kDataset, "juice"},
    {"/ablation/<study>/juice/delta", K::kDataset, "juice"},
    {"/ablation/<study>/juice/up", K::kDataset, "juice"},
    {"/ablation/<study>/juice/down", K::kDataset, "juice"},
    {"/ablation/<study>/juice/enhance", K::kDataset, "juice"},
    {"/ablation/<study>/juice/suppress", K::kDataset, "juice"},
    // patching
    {"/patching/<name>", K::kGroup, "patching"},
    {"/patching/<name>/scores", K::kDataset, "patching"},
    {"/patching/<name>/patched", K::kDataset, "patching"},
    {"/patching/<name>/path", K::kDataset, "patching"},
    {"/patching/<name>/metric_clean", K::kDataset, "patching"},
    {"/patching/<name>/metric_corrupt", K::kDataset, "patching"},
    {"/patching/<name>/clean_tokens", K::kDataset, "patching"},
    {"/patching/<name>/clean_lengths", K::kDataset, "patching"},
    {"/patching/<name>/clean_answer", K::kDataset, "patching"},
    {"/patching/<name>/corrupt_tokens", K::kDataset, "patching"},
    {"/patching/<name>/corrupt_lengths", K::kDataset, "patching"},
    {"/patching/<name>/corrupt_answer", K::kDataset, "patching"},
};

}  // namespace

const std::vector<PathEntry>& layout() {
    static const std::vector<PathEntry> t(std::begin(kLayout), std::end(kLayout));
    return t;
}

bool in_layout(const std::string& path) {
    static const std::vector<std::regex> patterns = [] {
        std::vector<std::regex> v;
        for (const auto& e : layout()) {
            std::string rx;
            for (const char* c = e.pattern; *c; ++c) {
                if (*c == '<') {
                    while (*c && *c != '>') ++c;
                    rx += "[^/]+";
                    if (!*c) break;
                } else if (std::string("\\^$.|?*+()[]{}").find(*c) != std::string::npos) {
                    rx += std::string("\\") + *c;
                } else {
                    rx += *c;
                }
            }
            v.emplace_back(rx);
        }
        return v;
    }();
    for (const auto& p : patterns)
        if (std::regex_match(path, p)) return true;
    return false;
}

namespace {

std::string checked(std::string path) {
    HS_REQUIRE(in_layout(path), "HDF5 path '" + path + "' is not in the schema (src/store/schema.cpp layout())");
    return path;
}
std::string below(const std::string& group, const std::string& ds) { return ds.empty() ? group : group + "/" + ds; }

// Reads a dataset when present (numbers, or strings for string datasets); empty shape otherwise.
Dataset read_if(const ResultReader& r, const std::string& path) {
    if (!r.exists(path) || r.is_group(path)) return {};
    return r.read(path);
}
Attrs attrs_if(const ResultReader& r, const std::string& path) { return r.exists(path) ? r.attrs(path) : Attrs{}; }

// Every write of this file goes through put() or attrs(), which refuse a path outside layout().
template <class T>
void put(ResultWriter& w, const std::string& path, const std::vector<T>& v, const std::vector<int64_t>& shape) {
    w.write(checked(path), v, shape);
}
void put(ResultWriter& w, const std::string& path, const std::vector<std::string>& v) { w.write_strings(checked(path), v); }
void attrs(ResultWriter& w, const std::string& path, const Attrs& a) { w.set_attrs(checked(path), a); }

}  // namespace

std::string meta() { return "/meta"; }
std::string scores_root() { return "/scores"; }
std::string scores(const std::string& probe) { return "/scores/" + probe; }
std::string scores(const std::string& probe, const std::string& ds) { return "/scores/" + probe + "/" + ds; }
std::string maps_root() { return "/scores/maps"; }
std::string inputs(const std::string& probe) { return "/inputs/" + probe; }
std::string input_tokens(const std::string& probe) { return "/inputs/" + probe + "/tokens"; }
std::string logits() { return "/logits"; }
std::string logit_tokens() { return "/tokens"; }
std::string experiment() { return "/experiment"; }
std::string data(const std::string& name) { return "/data/" + name; }
std::string data(const std::string& name, const std::string& ds) { return "/data/" + name + "/" + ds; }
std::string ablation_root() { return "/ablation"; }
std::string study(const std::string& name) { return "/ablation/" + name; }
std::string study(const std::string& name, const std::string& ds) { return "/ablation/" + name + "/" + ds; }
std::string patching_root() { return "/patching"; }
std::string patching(const std::string& name) { return "/patching/" + name; }
std::string patching(const std::string& name, const std::string& ds) { return "/patching/" + name + "/" + ds; }
std::string retrieval() { return "/retrieval"; }
std::string retrieval_trials(const std::string& ds) { return below("/retrieval/trials", ds); }
std::string retrieval_ablation(const std::string& ds) { return below("/retrieval/ablation", ds); }
std::string retrieval_decoding(const std::string& ds) { return below("/retrieval/decoding", ds); }
std::string retrieval_streaming(const std::string& ds) { return below("/retrieval/streaming", ds); }
std::string retrieval_kv_compare(const std::string& ds) { return below("/retrieval/kv_compare", ds); }
std::string retrieval_steps(const std::string& ds) { return below("/retrieval/steps", ds); }
std::string influence(const std::string& ds) { return below("/influence", ds); }

void write_array(ResultWriter& w, const std::string& path, const Array& a) {
    std::visit(
        [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::vector<std::string>>) put(w, path, v);
            else put(w, path, v, a.shape);
        },
        a.values);
    if (!a.attrs.empty()) attrs(w, path, a.attrs);
}

// ---- /meta

void write_meta(ResultWriter& w, const Attrs& a) { attrs(w, meta(), a); }
Attrs read_meta(const ResultReader& r) { return attrs_if(r, meta()); }

std::string attr_text(const ResultReader& r, const std::string& obj, const std::string& name) {
    if (!r.exists(obj)) return "";
    const auto a = r.attrs(obj);
    return a.count(name) ? attr_to_string(a.at(name)) : "";
}

// ---- scores

void write_scores(ResultWriter& w, const ScoreGroup& g) {
    const std::string group = scores(g.probe);
    if (w.exists(group)) w.remove(group);
    for (const auto& [name, a] : g.datasets) write_array(w, scores(g.probe, name), a);
    attrs(w, group, g.attrs);
}

std::vector<std::string> score_probes(const ResultReader& r) {
    std::vector<std::string> out;
    if (!r.is_group(scores_root())) return out;
    for (const auto& p : r.children(scores_root())) {
        const std::string g = scores_root() + "/" + p;
        if (r.exists(g + "/score")) {
            out.push_back(p);
        } else if (r.is_group(g)) {
            for (const auto& c : r.children(g))
                if (r.exists(g + "/" + c + "/score")) out.push_back(p + "/" + c);
        }
    }
    return out;
}

StoredScores read_scores(const ResultReader& r, const std::string& probe) {
    const std::string g = scores_root() + "/" + probe;
    StoredScores s;
    s.probe = probe;
    s.attrs = r.attrs(g);
    for (const auto& [k, v] : r.attrs(g + "/score")) s.attrs.emplace(k, v);
    s.score = r.read_numbers(g + "/score");
    for (const auto& c : r.children(g)) {
        if (c == "score" || r.is_group(g + "/" + c)) continue;
        Dataset d = r.read(g + "/" + c);
        if (!d.is_string) s.others.emplace_back(c, std::move(d));
    }
    return s;
}

// ---- inputs, logits

void write_inputs(ResultWriter& w, const InputTokens& in) {
    if (w.exists(inputs(in.probe))) w.remove(inputs(in.probe));
    put(w, input_tokens(in.probe), in.tokens, {in.rows, in.cols});
    attrs(w, inputs(in.probe), {{"padding", std::string(in.ragged ? "ragged: -1 past each sequence's end" : "none")},
                                   {"pad_value", int64_t{-1}}});
}

void write_logits(ResultWriter& w, const Logits& l) {
    if (w.exists(logits())) w.remove(logits());
    if (w.exists(logit_tokens())) w.remove(logit_tokens());
    const int64_t T = static_cast<int64_t>(l.tokens.size());
    put(w, logits(), l.logits, {T, l.vocab});
    put(w, logit_tokens(), l.tokens, {T});
    attrs(w, logits(), {{"description", std::string("logits[t] predicts tokens[t+1]; float32 [T, V]")}});
}

// ---- an ablation experiment

Attrs read_experiment(const ResultReader& r) { return attrs_if(r, experiment()); }
void write_experiment(ResultWriter& w, const Attrs& a) { attrs(w, experiment(), a); }

void write_data(ResultWriter& w, const DataRecord& d) {
    put(w, data(d.name, "tokens"), d.tokens, {d.rows, d.cols});
    put(w, data(d.name, "lengths"), d.lengths, {d.rows});
    if (!d.answers.empty()) {
        put(w, data(d.name, "answers"), d.answers, {d.rows});
        put(w, data(d.name, "counterfactuals"), d.counterfactuals, {d.rows});
    }
    if (!d.variants.empty()) put(w, data(d.name, "variant"), d.variants, {d.rows});
    attrs(w, data(d.name), d.attrs);
}

std::vector<int64_t> read_data_variants(const ResultReader& r, const std::string& name) {
    std::vector<int64_t> out;
    if (name.empty()) return out;
    const std::string p = data(name, "variant");
    if (r.exists(p))
        for (double v : r.read_numbers(p).values) out.push_back(static_cast<int64_t>(v));
    return out;
}

void write_study_results(ResultWriter& w, const StudyRecord& s) {
    for (const char* ds : {"metric", "metric_rows", "done"})
        if (w.exists(study(s.name, ds))) w.remove(study(s.name, ds));
    put(w, study(s.name, "metric"), s.metric, {s.S});
    put(w, study(s.name, "metric_rows"), s.metric_rows, {s.S, s.N});
    put(w, study(s.name, "done"), s.done, {s.S});
}

void write_study(ResultWriter& w, const StudyRecord& s) {
    put(w, study(s.name, "masks"), s.masks, {s.S, s.L, s.H});
    put(w, study(s.name, "metric"), s.metric, {s.S});
    put(w, study(s.name, "metric_rows"), s.metric_rows, {s.S, s.N});
    put(w, study(s.name, "kind"), s.kind);
    put(w, study(s.name, "label"), s.label);
    put(w, study(s.name, "k"), s.k, {s.S});
    put(w, study(s.name, "control_seed"), s.control_seed, {s.S});
    put(w, study(s.name, "done"), s.done, {s.S});
    put(w, study(s.name, "batch"), s.batch, {s.S});
    if (!s.factor.empty()) put(w, study(s.name, "factor"), s.factor, {s.S});
    if (!s.fraction.empty()) {
        put(w, study(s.name, "fraction"), s.fraction, {s.S});
        put(w, study(s.name, "order"), s.order, {static_cast<int64_t>(s.order.size())});
        put(w, study(s.name, "importance"), s.importance, {static_cast<int64_t>(s.importance.size()) / std::max<int64_t>(1, s.L * s.H), s.L, s.H});
    }
}

std::vector<std::string> study_names(const ResultReader& r) {
    std::vector<std::string> out;
    if (!r.is_group(ablation_root())) return out;
    for (const auto& c : r.children(ablation_root()))
        if (r.is_group(ablation_root() + "/" + c)) out.push_back(c);
    return out;
}

StoredStudy read_study(const ResultReader& r, const std::string& name) {
    StoredStudy s;
    s.attrs = attrs_if(r, study(name));
    s.masks = read_if(r, study(name, "masks"));
    s.metric = read_if(r, study(name, "metric"));
    s.metric_rows = read_if(r, study(name, "metric_rows"));
    s.kind = read_if(r, study(name, "kind"));
    s.label = read_if(r, study(name, "label"));
    s.k = read_if(r, study(name, "k"));
    s.control_seed = read_if(r, study(name, "control_seed"));
    s.done = read_if(r, study(name, "done"));
    s.batch = read_if(r, study(name, "batch"));
    s.factor = read_if(r, study(name, "factor"));
    return s;
}

void write_gates(ResultWriter& w, const std::string& study_name, const GatesRecord& g) {
    const std::vector<int64_t> slh{g.starts, g.L, g.H};
    put(w, study(study_name, "gates/g0"), g.g0, slh);
    put(w, study(study_name, "gates/g_plus"), g.g_plus, slh);
    put(w, study(study_name, "gates/g_minus"), g.g_minus, slh);
    put(w, study(study_name, "gates/roles"), g.roles, slh);
    put(w, study(study_name, "gates/role"), g.role, {g.L, g.H});
    put(w, study(study_name, "gates/role_counts"), g.role_counts, {4, g.L, g.H});
    put(w, study(study_name, "gates/objective"), g.objective, {3, g.starts});
    attrs(w, study(study_name, "gates"), g.attrs);
}

void write_duo(ResultWriter& w, const std::string& study_name, const DuoRecord& d) {
    put(w, study(study_name, "duo/alpha"), d.alpha, {d.L, d.H});
    put(w, study(study_name, "duo/alpha_kv"), d.alpha_kv, {d.L, d.K});
    put(w, study(study_name, "duo/history"), d.history, {d.steps, 2});
    attrs(w, study(study_name, "duo"), d.attrs);
}

void write_streaming(ResultWriter& w, const StreamingRecord& s) {
    put(w, retrieval_streaming("fractions"), s.fractions, {s.F});
    put(w, retrieval_streaming("full_heads"), s.full_heads, {s.F});
    put(w, retrieval_streaming("order"), s.order, {s.R, s.L * s.H});
    put(w, retrieval_streaming("masks"), s.masks, {s.R, s.F, s.L, s.H});
    put(w, retrieval_streaming("accuracy"), s.accuracy, {s.R, s.F});
    put(w, retrieval_streaming("rougeL_f"), s.rougeL_f, {s.R, s.F});
    put(w, retrieval_streaming("kv_budget"), s.kv_budget, {s.F});
    attrs(w, retrieval_streaming(), s.attrs);
}

void write_kv_compare(ResultWriter& w, const KvCompareRecord& k) {
    if (w.exists(retrieval_kv_compare())) w.remove(retrieval_kv_compare());  // the partial state, in the same commit
    put(w, retrieval_kv_compare("policies"), k.policies);
    put(w, retrieval_kv_compare("budgets"), k.budgets, {k.B});
    put(w, retrieval_kv_compare("capacities"), k.capacities, {k.B});
    put(w, retrieval_kv_compare("accuracy"), k.accuracy, {k.P, k.B});
    put(w, retrieval_kv_compare("rougeL_f"), k.rougeL_f, {k.P, k.B});
    put(w, retrieval_kv_compare("kv_fraction"), k.kv_fraction, {k.P, k.B});
    put(w, retrieval_kv_compare("same_as_full"), k.same_as_full, {k.P, k.B});
    put(w, retrieval_kv_compare("random_same_as_full"), k.random_same_as_full, {k.P, k.B, k.R});
    put(w, retrieval_kv_compare("kv_bytes"), k.kv_bytes, {k.P, k.B});
    put(w, retrieval_kv_compare("full_groups"), k.full_groups, {k.P, k.B});
    put(w, retrieval_kv_compare("peak_cache_bytes"), k.peak_cache_bytes, {k.P, k.B});
    put(w, retrieval_kv_compare("decode_ms"), k.decode_ms, {k.P, k.B});
    put(w, retrieval_kv_compare("random_accuracy"), k.random_accuracy, {k.P, k.B, k.R});
    put(w, retrieval_kv_compare("random_rougeL_f"), k.random_rougeL_f, {k.P, k.B, k.R});
    put(w, retrieval_kv_compare("random_kv_fraction"), k.random_kv_fraction, {k.P, k.B, k.R});
    Attrs a = k.attrs;
    a["description"] = std::string(
        "accuracy, rougeL_f [policy, column] over the ablation trials (columns: the budgets, then the capacities); "
        "capacities: tokens per query head (-1: a budget column), budgets: the fraction of the cache each column asks "
        "(a capacity's: mean over trials of min(1, C H / (K P))); kv_fraction: the prompt cache a policy keeps / the full "
        "cache (L K P entries), mean over trials; kv_bytes: the same in bytes (K and V, the model's dtype); full_groups: KV "
        "groups kept whole by an order policy (-1: not one); random_*: [policy, budget, order], random KV-group orders at the "
        "same count (NaN: no order); same_as_full: the fraction of trials whose generated tokens equal the full cache's; "
        "peak_cache_bytes, decode_ms: measured on one trial decoded alone (timing_trial_tokens, timed_steps), the cache's "
        "allocated bytes at their peak and the mean ms of a decode step through the compressed cache (the full cache's: "
        "full_peak_cache_bytes, full_decode_ms); docs/methods.md");
    attrs(w, retrieval_kv_compare(), a);
}

KvCompareRecord read_kv_compare(const ResultReader& r) {
    KvCompareRecord k;
    if (!r.exists(retrieval_kv_compare("accuracy")) && r.exists(retrieval_kv_compare("partial")))
        throw StorageError(fmt::format("{}: holds only the partial state of a comparison that did not finish (resuming the run "
                                       "finishes it)", retrieval_kv_compare()));
    const auto acc = r.read(retrieval_kv_compare("accuracy"));
    if (acc.shape.size() != 2) throw StorageError(fmt::format("{}: accuracy is not [policies, budgets]", retrieval_kv_compare()));
    k.P = acc.shape[0], k.B = acc.shape[1];
    auto f = [](const Dataset& d) { return std::vector<float>(d.values.begin(), d.values.end()); };
    k.accuracy = f(acc);
    k.policies = r.read(retrieval_kv_compare("policies")).strings;
    const auto bud = r.read(retrieval_kv_compare("budgets"));
    k.budgets = f(bud);
    if (r.exists(retrieval_kv_compare("capacities")))  // a file before --kv-capacity: every column a budget
        for (double v : r.read(retrieval_kv_compare("capacities")).values) k.capacities.push_back(static_cast<int64_t>(v));
    else
        k.capacities.assign(k.budgets.size(), -1);
    k.rougeL_f = f(r.read(retrieval_kv_compare("rougeL_f")));
    k.kv_fraction = f(r.read(retrieval_kv_compare("kv_fraction")));
    k.same_as_full = f(r.read(retrieval_kv_compare("same_as_full")));
    k.random_same_as_full = f(r.read(retrieval_kv_compare("random_same_as_full")));
    for (double v : r.read(retrieval_kv_compare("kv_bytes")).values) k.kv_bytes.push_back(static_cast<int64_t>(std::llround(v)));
    for (double v : r.read(retrieval_kv_compare("full_groups")).values) k.full_groups.push_back(static_cast<int64_t>(v));
    if (r.exists(retrieval_kv_compare("peak_cache_bytes"))) {  // a file before the packed cache: none
        for (double v : r.read(retrieval_kv_compare("peak_cache_bytes")).values) k.peak_cache_bytes.push_back(static_cast<int64_t>(v));
        k.decode_ms = f(r.read(retrieval_kv_compare("decode_ms")));
    }
    const auto ra = r.read(retrieval_kv_compare("random_accuracy"));
    k.R = ra.shape.size() == 3 ? ra.shape[2] : 0;
    k.random_accuracy = f(ra);
    k.random_rougeL_f = f(r.read(retrieval_kv_compare("random_rougeL_f")));
    k.random_kv_fraction = f(r.read(retrieval_kv_compare("random_kv_fraction")));
    if (static_cast<int64_t>(k.policies.size()) != k.P || static_cast<int64_t>(k.budgets.size()) != k.B ||
        static_cast<int64_t>(k.capacities.size()) != k.B)
        throw StorageError(fmt::format("{}: policies or budgets do not match accuracy", retrieval_kv_compare()));
    k.attrs = r.attrs(retrieval_kv_compare());
    return k;
}

// The trials' ROUGE-L F as float64: the table's means over them then equal an uninterrupted run's.
void write_kv_compare_partial(ResultWriter& w, const KvComparePartialRecord& p) {
    const std::string g = retrieval_kv_compare("partial");
    if (w.exists(g)) w.remove(g);
    put(w, retrieval_kv_compare("partial/passed"), p.passed, {p.S, p.N});
    put(w, retrieval_kv_compare("partial/rougeL_f"), p.rougeL_f, {p.S, p.N});
    put(w, retrieval_kv_compare("partial/same_as_full"), p.same_as_full, {p.S, p.N});
    put(w, retrieval_kv_compare("partial/done"), p.done, {p.G});
    attrs(w, g, p.attrs);
}

KvComparePartialRecord read_kv_compare_partial(const ResultReader& r) {
    const std::string g = retrieval_kv_compare("partial");
    KvComparePartialRecord p;
    const auto passed = r.read_numbers(retrieval_kv_compare("partial/passed"));
    const auto rl = r.read_numbers(retrieval_kv_compare("partial/rougeL_f"));
    const auto same = r.read_numbers(retrieval_kv_compare("partial/same_as_full"));
    const auto done = r.read_numbers(retrieval_kv_compare("partial/done"));
    if (passed.shape.size() != 2 || same.shape != passed.shape || rl.shape != passed.shape ||
        done.shape.size() != 1)
        throw StorageError(fmt::format("{}: {}: passed, rougeL_f, same_as_full and done disagree in shape", r.path(), g));
    p.S = passed.shape[0], p.N = passed.shape[1], p.G = done.shape[0];
    for (double v : passed.values) p.passed.push_back(static_cast<uint8_t>(v != 0));
    for (double v : same.values) p.same_as_full.push_back(static_cast<uint8_t>(v != 0));
    for (double v : done.values) p.done.push_back(static_cast<uint8_t>(v != 0));
    p.rougeL_f = rl.values;
    p.attrs = r.attrs(g);
    return p;
}

// ---- the needle scan's per-trial results

namespace {
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
// A dataset rewritten at every checkpoint: the old one removed first.
template <class T>
void replace(ResultWriter& w, const std::string& path, const std::vector<T>& v, const std::vector<int64_t>& shape) {
    if (w.exists(path)) w.remove(path);
    put(w, path, v, shape);
}
}  // namespace

void NeedleRecord::init(int64_t n, int64_t l, int64_t h, int64_t st, int64_t ast, bool ws, const NeedleArrayNames& names) {
    N = n, L = l, H = h, steps = st, abl_steps = ast, with_steps = ws;
    done.assign(N, 0);
    generated.assign(N * steps, -1);
    response.assign(N, "");
    rouge1.assign(N, kNaNf), rougeL.assign(N, kNaNf);
    passed.assign(N, 0);
    answer_steps.assign(N, 0);
    trial_arrays.clear(), step_arrays.clear();
    for (const auto& [name, every] : names.trials) trial_arrays.push_back({name, every, std::vector<float>(N * L * H, kNaNf)});
    const int64_t per = with_steps ? N * steps * L * H : 0;
    for (const auto& [name, every] : names.steps) step_arrays.push_back({name, every, std::vector<float>(per, kNaNf)});
    S = 0;
    masks.clear(), abl_done.clear(), abl_rouge1.clear(), abl_rougeL.clear(), abl_passed.clear(), abl_generated.clear();
}

void NeedleRecord::init_sets(int64_t s, std::vector<int32_t> m) {
    S = s;
    masks = std::move(m);
    masks.resize(S * L * H, 0);
    abl_done.assign(S * N, 0);
    abl_rouge1.assign(S * N, kNaNf), abl_rougeL.assign(S * N, kNaNf);
    abl_passed.assign(S * N, 0);
    abl_generated.assign(S * N * abl_steps, -1);
}

void write_needle_results(ResultWriter& w, const NeedleRecord& r, const NeedleScoresRecord& s) {
    const int64_t N = r.N, L = r.L, H = r.H;
    replace(w, retrieval_trials("generated"), r.generated, {N, r.steps});
    if (w.exists(retrieval_trials("response"))) w.remove(retrieval_trials("response"));
    put(w, retrieval_trials("response"), r.response);
    replace(w, retrieval_trials("rouge1_recall"), r.rouge1, {N});
    replace(w, retrieval_trials("rougeL_f"), r.rougeL, {N});
    replace(w, retrieval_trials("passed"), r.passed, {N});
    replace(w, retrieval_trials("answer_steps"), r.answer_steps, {N});
    for (const auto& a : r.trial_arrays) replace(w, retrieval_trials(a.name), a.values, {N, L, H});
    replace(w, retrieval_trials("done"), r.done, {N});
    if (r.with_steps) {
        for (const auto& a : r.step_arrays) replace(w, retrieval_steps(a.name), a.values, {N, r.steps, L, H});
        attrs(w, retrieval_steps(), {{"description", std::string("per trial and decode step (NaN past the trial's end): each head's "
                                                                 "retrieval credit, L+ and L- for the step's generated token "
                                                                 "(NaN where the needle's span was not found), and R2 credit "
                                                                 "(every step; a trial's r2 sums the first |answer tokens|)")}});
    }
    const Attrs common = {{"n_passed", s.n_pass}, {"accuracy", s.accuracy}, {"n_trials_done", s.n_done}};
    attrs(w, retrieval(), common);
    for (const auto& g : s.scores) {
        replace(w, scores(g.name, "score"), g.score, {L, H});
        for (const auto& [ds, v] : g.beside) replace(w, scores(g.name, ds), v, {L, H});
        Attrs a = common;
        if (g.with_flagged) a["flagged"] = s.flagged;
        a["n_trials_scored"] = g.n_scored;
        attrs(w, scores(g.name), a);
    }
    if (r.S == 0) return;
    const int64_t S = r.S;
    replace(w, retrieval_ablation("masks"), r.masks, {S, L, H});
    replace(w, retrieval_ablation("rouge1_recall"), r.abl_rouge1, {S, N});
    replace(w, retrieval_ablation("rougeL_f"), r.abl_rougeL, {S, N});
    replace(w, retrieval_ablation("passed"), r.abl_passed, {S, N});
    replace(w, retrieval_ablation("done"), r.abl_done, {S, N});
    replace(w, retrieval_ablation("generated"), r.abl_generated, {S, N, r.abl_steps});
    replace(w, retrieval_ablation("accuracy"), s.abl_accuracy, {S});
    // The baseline of the ablated passes: the scan's trials, or (when the ablation passes decode
    // prompts of their own) the last set, which ablates no head.
    const bool own_baseline =
        S > 1 && std::all_of(r.masks.begin() + (S - 1) * L * H, r.masks.begin() + S * L * H, [](int32_t v) { return v == 0; });
    if (!own_baseline) {
        replace(w, retrieval_ablation("baseline_rouge1_recall"), r.rouge1, {N});
        replace(w, retrieval_ablation("baseline_rougeL_f"), r.rougeL, {N});
        replace(w, retrieval_ablation("baseline_accuracy"), std::vector<float>{static_cast<float>(s.accuracy)}, {1});
        return;
    }
    const int64_t base = S - 1;
    auto row = [&](const std::vector<float>& v) { return std::vector<float>(v.begin() + base * N, v.begin() + (base + 1) * N); };
    replace(w, retrieval_ablation("baseline_rouge1_recall"), row(r.abl_rouge1), {N});
    replace(w, retrieval_ablation("baseline_rougeL_f"), row(r.abl_rougeL), {N});
    replace(w, retrieval_ablation("baseline_accuracy"), std::vector<float>{s.abl_accuracy[static_cast<size_t>(base)]}, {1});
}

namespace {
// `n` of /meta as an integer (StorageError naming the file otherwise).
int64_t meta_int(const ResultReader& f, const char* n) {
    const std::string t = attr_text(f, meta(), n);
    if (t.empty()) throw StorageError(fmt::format("{}: /meta has no attribute {}", f.path(), n));
    const auto v = parse_int64(t);
    if (!v) throw StorageError(fmt::format("{}: /meta attribute {} is not an integer", f.path(), n));
    return *v;
}
}  // namespace

NeedleRecord read_needle_results(const ResultReader& f, const NeedleArrayNames& names) {
    const std::string tg = retrieval_trials(), ag = retrieval_ablation();
    if (!f.exists(retrieval_trials("done")))
        throw StorageError(fmt::format("{}: holds no resumable or mergeable needle results (no {}/done: not written by "
                                       "`headscope retrieval`, or by a version before shards)", f.path(), tg));
    auto done = f.read_numbers(retrieval_trials("done")), gen = f.read_numbers(retrieval_trials("generated"));
    if (done.shape.size() != 1 || gen.shape.size() != 2 || gen.shape[0] != done.shape[0])
        throw StorageError(fmt::format("{}: {}/done {} and generated {} do not fit; damaged file", f.path(), tg,
                                       shape_str(done.shape), shape_str(gen.shape)));
    const int64_t L = meta_int(f, "n_layers"), H = meta_int(f, "n_heads");
    if (L < 1 || H < 1 || L > 100000 || H > 100000) throw StorageError(fmt::format("{}: /meta n_layers {} n_heads {}", f.path(), L, H));
    const int64_t abl_steps = f.exists(ag + "/generated") ? f.read_numbers(ag + "/generated").shape.back() : gen.shape[1];
    const bool with_steps = !names.steps.empty() && f.exists(retrieval_steps(names.steps.front().first));
    NeedleRecord r;
    r.init(done.shape[0], L, H, gen.shape[1], abl_steps, with_steps, names);
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
    conv(r.rouge1, numbers(retrieval_trials("rouge1_recall"), {N}));
    conv(r.rougeL, numbers(retrieval_trials("rougeL_f"), {N}));
    conv(r.passed, numbers(retrieval_trials("passed"), {N}));
    conv(r.answer_steps, numbers(retrieval_trials("answer_steps"), {N}));
    for (auto& a : r.trial_arrays)  // an array not in every file stays NaN where absent
        if (a.in_every_file || f.exists(retrieval_trials(a.name))) conv(a.values, numbers(retrieval_trials(a.name), {N, L, H}));
    if (with_steps)
        for (auto& a : r.step_arrays)
            if (a.in_every_file || f.exists(retrieval_steps(a.name)))
                conv(a.values, numbers(retrieval_steps(a.name), {N, r.steps, L, H}));
    auto resp = f.read(retrieval_trials("response"));
    if (!resp.is_string || static_cast<int64_t>(resp.strings.size()) != N)
        throw StorageError(fmt::format("{}: {}/response is not {} strings; damaged file", f.path(), tg, N));
    r.response = resp.strings;
    if (!f.exists(ag + "/done")) return r;
    auto mk = f.read_numbers(ag + "/masks");
    if (mk.shape.size() != 3 || mk.shape[1] != L || mk.shape[2] != H)
        throw StorageError(fmt::format("{}: {}/masks has shape {}, expected [S, {}, {}]; damaged file", f.path(), ag,
                                       shape_str(mk.shape), L, H));
    std::vector<int32_t> masks(mk.values.size());
    conv(masks, mk.values);
    r.init_sets(mk.shape[0], std::move(masks));
    conv(r.abl_done, numbers(ag + "/done", {r.S, N}));
    conv(r.abl_rouge1, numbers(ag + "/rouge1_recall", {r.S, N}));
    conv(r.abl_rougeL, numbers(ag + "/rougeL_f", {r.S, N}));
    conv(r.abl_passed, numbers(ag + "/passed", {r.S, N}));
    if (f.exists(ag + "/generated")) conv(r.abl_generated, numbers(ag + "/generated", {r.S, N, r.abl_steps}));
    return r;
}

// ---- AttentionInfluence

void write_influence(ResultWriter& w, const InfluenceRecord& r) {
    if (w.exists(influence())) w.remove(influence());
    put(w, influence("loss"), r.loss, {r.N});
    put(w, influence("masked_loss"), r.masked_loss, {r.S, r.N});
    put(w, influence("score"), r.score, {r.S, r.N});
    put(w, influence("n_tokens"), r.n_tokens, {r.N});
    put(w, influence("line"), r.line, {r.N});
    put(w, influence("length"), r.length, {r.N});
    put(w, influence("rank"), r.rank, {r.N});
    put(w, influence("selected"), r.selected, {r.N});
    put(w, influence("truncated"), r.truncated, {r.N});
    put(w, influence("done"), r.done, {r.N});
    put(w, influence("masks"), r.masks, {r.S, r.L, r.H});
    put(w, influence("preview"), r.preview);
    if (!r.detect_score.empty()) put(w, influence("detect_score"), r.detect_score, {r.L, r.H});
    attrs(w, influence(), r.attrs);
}

namespace {
// A numeric dataset of exactly `shape`, as float or int64 values (StorageError otherwise).
Dataset need(const ResultReader& r, const std::string& path, const std::vector<int64_t>& shape) {
    if (!r.exists(path)) throw StorageError(r.path() + ": no dataset " + path);
    Dataset d = r.read_numbers(path);
    if (d.shape != shape) throw StorageError(r.path() + ": " + path + " has another shape than its group's");
    return d;
}
std::vector<float> floats(const Dataset& d) { return {d.values.begin(), d.values.end()}; }
std::vector<int64_t> longs(const Dataset& d) {
    std::vector<int64_t> v;
    for (double x : d.values) v.push_back(static_cast<int64_t>(x));
    return v;
}
}  // namespace

GatesRecord read_gates(const ResultReader& r, const std::string& study_name) {
    GatesRecord g;
    const Dataset g0 = r.read_numbers(study(study_name, "gates/g0"));
    if (g0.shape.size() != 3) throw StorageError(r.path() + ": " + study(study_name, "gates/g0") + " is not [starts, L, H]");
    g.starts = g0.shape[0], g.L = g0.shape[1], g.H = g0.shape[2];
    const std::vector<int64_t> slh{g.starts, g.L, g.H};
    g.g0 = floats(g0);
    g.g_plus = floats(need(r, study(study_name, "gates/g_plus"), slh));
    g.g_minus = floats(need(r, study(study_name, "gates/g_minus"), slh));
    g.roles = longs(need(r, study(study_name, "gates/roles"), slh));
    g.role = longs(need(r, study(study_name, "gates/role"), {g.L, g.H}));
    g.role_counts = longs(need(r, study(study_name, "gates/role_counts"), {4, g.L, g.H}));
    g.objective = floats(need(r, study(study_name, "gates/objective"), {3, g.starts}));
    g.attrs = r.attrs(study(study_name, "gates"));
    return g;
}

DuoRecord read_duo(const ResultReader& r, const std::string& study_name) {
    DuoRecord d;
    const Dataset alpha = r.read_numbers(study(study_name, "duo/alpha")), kv = r.read_numbers(study(study_name, "duo/alpha_kv"));
    if (alpha.shape.size() != 2 || kv.shape.size() != 2 || kv.shape[0] != alpha.shape[0])
        throw StorageError(r.path() + ": " + study(study_name, "duo") + ": alpha and alpha_kv are not [L, H] and [L, K]");
    d.L = alpha.shape[0], d.H = alpha.shape[1], d.K = kv.shape[1];
    d.alpha = floats(alpha), d.alpha_kv = floats(kv);
    const Dataset h = r.read_numbers(study(study_name, "duo/history"));
    if (h.shape.size() != 2 || h.shape[1] != 2) throw StorageError(r.path() + ": " + study(study_name, "duo/history") + " is not [steps, 2]");
    d.steps = h.shape[0], d.history = floats(h);
    d.attrs = r.attrs(study(study_name, "duo"));
    return d;
}

Dataset read_duo_alpha(const ResultReader& r, const std::string& study_name) {
    return read_if(r, study(study_name, "duo/alpha"));
}

void write_juice(ResultWriter& w, const std::string& study_name, const JuiceRecord& j) {
    const std::string g = study(study_name, "juice");
    if (w.exists(g)) w.remove(g);
    put(w, study(study_name, "juice/factors"), j.factors, {j.F});
    put(w, study(study_name, "juice/variants"), j.variants, {j.V});
    put(w, study(study_name, "juice/delta"), j.delta, {j.V, j.L, j.H, j.F});
    put(w, study(study_name, "juice/up"), j.up, {j.V, j.L, j.H});
    put(w, study(study_name, "juice/down"), j.down, {j.V, j.L, j.H});
    put(w, study(study_name, "juice/enhance"), j.enhance, {j.L, j.H});
    put(w, study(study_name, "juice/suppress"), j.suppress, {j.L, j.H});
    attrs(w, g, j.attrs);
}

// ---- patching

void write_patching(ResultWriter& w, const PatchingRecord& p) {
    const std::string g = patching(p.name);
    if (w.exists(g)) w.remove(g);
    put(w, patching(p.name, "scores"), p.scores, p.shape);
    put(w, patching(p.name, "patched"), p.patched, p.shape);
    if (!p.paths.empty()) put(w, patching(p.name, "path"), p.paths);
    put(w, patching(p.name, "metric_clean"), std::vector<float>{p.metric_clean}, {1});
    put(w, patching(p.name, "metric_corrupt"), std::vector<float>{p.metric_corrupt}, {1});
    attrs(w, g, p.attrs);
}

std::vector<std::string> patching_names(const ResultReader& r) {
    std::vector<std::string> out;
    if (!r.is_group(patching_root())) return out;
    for (const auto& c : r.children(patching_root()))
        if (r.is_group(patching_root() + "/" + c) && r.exists(patching_root() + "/" + c + "/scores")) out.push_back(c);
    return out;
}

StoredPatching read_patching(const ResultReader& r, const std::string& name) {
    StoredPatching p;
    p.attrs = attrs_if(r, patching(name));
    p.scores = r.read_numbers(patching(name, "scores"));
    p.path = read_if(r, patching(name, "path"));
    auto scalar = [&](const char* ds) {
        const std::string path = patching(name, ds);
        return r.exists(path) ? r.read_numbers(path).values.at(0) : NAN;
    };
    p.metric_clean = scalar("metric_clean");
    p.metric_corrupt = scalar("metric_corrupt");
    return p;
}

InfluenceRecord read_influence(const ResultReader& r) {
    if (!r.exists(influence("score"))) throw StorageError(r.path() + ": no " + influence() + " (not written by `headscope influence`)");
    InfluenceRecord x;
    const Dataset sc = r.read_numbers(influence("score"));
    const Dataset mk = r.read_numbers(influence("masks"));
    if (sc.shape.size() != 2 || mk.shape.size() != 3 || mk.shape[0] != sc.shape[0])
        throw StorageError(r.path() + ": " + influence("score") + " and masks do not fit; damaged file");
    x.S = sc.shape[0], x.N = sc.shape[1], x.L = mk.shape[1], x.H = mk.shape[2];
    x.score = floats(sc);
    x.masked_loss = floats(need(r, influence("masked_loss"), {x.S, x.N}));
    x.loss = floats(need(r, influence("loss"), {x.N}));
    x.n_tokens = longs(need(r, influence("n_tokens"), {x.N}));
    x.line = longs(need(r, influence("line"), {x.N}));
    // length: absent in files written before selection by tokens (0 each: such a file selected by samples)
    x.length = r.exists(influence("length")) ? longs(need(r, influence("length"), {x.N})) : std::vector<int64_t>(static_cast<size_t>(x.N), 0);
    x.rank = longs(need(r, influence("rank"), {x.N}));
    for (double v : need(r, influence("selected"), {x.N}).values) x.selected.push_back(static_cast<uint8_t>(v));
    for (double v : need(r, influence("truncated"), {x.N}).values) x.truncated.push_back(static_cast<uint8_t>(v));
    for (double v : need(r, influence("done"), {x.N}).values) x.done.push_back(static_cast<uint8_t>(v));
    for (double v : mk.values) x.masks.push_back(static_cast<uint8_t>(v));
    const Dataset pv = r.read(influence("preview"));
    if (!pv.is_string || static_cast<int64_t>(pv.strings.size()) != x.N)
        throw StorageError(r.path() + ": " + influence("preview") + " is not " + std::to_string(x.N) + " strings; damaged file");
    x.preview = pv.strings;
    if (r.exists(influence("detect_score"))) x.detect_score = floats(need(r, influence("detect_score"), {x.L, x.H}));
    x.attrs = r.attrs(influence());
    return x;
}

}  // namespace hs::schema
