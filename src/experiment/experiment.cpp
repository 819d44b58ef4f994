#include "experiment.h"

#include "errors.h"
#include "guard.h"
#include "util.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>

namespace hs {

std::string mark_str(const std::string& file, const YamlMark& m) {
    if (m.line <= 0) return file;
    return fmt::format("{}:{}:{}", file, m.line, m.col);
}

void Experiment::fail(const YamlMark& m, const std::string& msg) const {
    throw ConfigError(fmt::format("{}: {}", mark_str(file, m), msg));
}

const NameTable<DataKind>& data_kind_names() {
    static const NameTable<DataKind> t = {
        {DataKind::kRepeated, "repeated"}, {DataKind::kText, "text"}, {DataKind::kTokens, "tokens"}, {DataKind::kPrompts, "prompts"},
        {DataKind::kConflicts, "conflicts"}};
    return t;
}

const NameTable<SweepKind>& sweep_names() {
    static const NameTable<SweepKind> t = {{SweepKind::kSingle, "single"}, {SweepKind::kLayer, "layer"},
                                           {SweepKind::kSet, "set"},       {SweepKind::kCumulative, "cumulative"},
                                           {SweepKind::kPrune, "prune"},   {SweepKind::kScaleGrid, "scale-grid"},
                                           {SweepKind::kGating, "gating"},
                                           {SweepKind::kDuoGates, "duo-gates"}};
    return t;
}

const NameTable<MetricKind>& metric_names() {
    static const NameTable<MetricKind> t = {
        {MetricKind::kLoss, "loss"}, {MetricKind::kAccuracy, "accuracy"}, {MetricKind::kLogitDiff, "logit-diff"}, {MetricKind::kKl, "kl"},
        {MetricKind::kProb, "prob"}};
    return t;
}

const NameTable<Positions>& positions_names() {
    static const NameTable<Positions> t = {
        {Positions::kAll, "all"}, {Positions::kRepeatedHalf, "repeated-half"}, {Positions::kAnswer, "answer"}};
    return t;
}

const DataSpec* Experiment::find_data(const std::string& name) const {
    for (const auto& d : data)
        if (d.name == name) return &d;
    return nullptr;
}


namespace {

YamlMark mark_of(const YAML::Node& n) {
    const auto m = n.Mark();
    if (m.line < 0) return {};
    return {m.line + 1, m.column + 1};
}

const char* type_name(const YAML::Node& n) {
    switch (n.Type()) {
        case YAML::NodeType::Map: return "a mapping";
        case YAML::NodeType::Sequence: return "a list";
        case YAML::NodeType::Scalar: return "a scalar";
        case YAML::NodeType::Null: return "nothing";
        default: return "an undefined node";
    }
}

// Reading helpers bound to one experiment (for file names in messages).
struct Reader {
    const Experiment& e;

    [[noreturn]] void fail(const YAML::Node& n, const std::string& msg) const { e.fail(mark_of(n), msg); }

    void keys(const YAML::Node& map, const std::string& what, const std::vector<std::string>& allowed) const {
        if (!map.IsMap()) fail(map, fmt::format("{}: expected a mapping, got {}", what, type_name(map)));
        for (const auto& kv : map) {
            const std::string k = kv.first.as<std::string>();
            if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
                fail(kv.first, fmt::format("unknown key '{}' in {} (expected one of: {})", k, what, fmt::join(allowed, ", ")));
        }
    }
    std::string str(const YAML::Node& n, const std::string& key) const {
        if (!n.IsScalar()) fail(n, fmt::format("'{}': expected a string, got {}", key, type_name(n)));
        return n.Scalar();
    }
    int64_t integer(const YAML::Node& n, const std::string& key) const {
        if (n.IsScalar()) {
            const std::string s = n.Scalar();
            char* end = nullptr;
            const long long v = std::strtoll(s.c_str(), &end, 10);
            if (!s.empty() && end && *end == 0) return v;
        }
        fail(n, fmt::format("'{}': expected an integer, got {}", key, n.IsScalar() ? "'" + n.Scalar() + "'" : type_name(n)));
    }
    double number(const YAML::Node& n, const std::string& key) const {
        if (n.IsScalar()) {
            const std::string s = n.Scalar();
            char* end = nullptr;
            const double v = std::strtod(s.c_str(), &end);
            if (!s.empty() && end && *end == 0) return v;
        }
        fail(n, fmt::format("'{}': expected a number, got {}", key, n.IsScalar() ? "'" + n.Scalar() + "'" : type_name(n)));
    }
    bool boolean(const YAML::Node& n, const std::string& key) const {
        if (n.IsScalar()) {
            const std::string s = n.Scalar();
            if (s == "true" || s == "yes") return true;
            if (s == "false" || s == "no") return false;
        }
        fail(n, fmt::format("'{}': expected true or false", key));
    }
    std::string choice(const YAML::Node& n, const std::string& key, const std::vector<std::string>& valid) const {
        const std::string s = str(n, key);
        if (std::find(valid.begin(), valid.end(), s) == valid.end())
            fail(n, fmt::format("'{}': unknown value '{}' (expected one of: {})", key, s, fmt::join(valid, ", ")));
        return s;
    }
    // One of a vocabulary's words (its table, in order, lists the expected ones).
    template <class E>
    E pick(const YAML::Node& n, const std::string& key, const NameTable<E>& t) const {
        const std::string s = str(n, key);
        if (auto v = find_in(t, s)) return *v;
        fail(n, fmt::format("'{}': unknown value '{}' (expected one of: {})", key, s, fmt::join(names_in(t), ", ")));
    }
    int64_t positive(const YAML::Node& n, const std::string& key) const {
        const int64_t v = integer(n, key);
        if (v <= 0) fail(n, fmt::format("'{}': expected a positive integer, got {}", key, v));
        return v;
    }
};

DataSpec parse_data(const Reader& r, const std::string& name, const YAML::Node& n) {
    DataSpec d;
    d.name = name;
    d.mark = mark_of(n);
    if (!n.IsMap()) r.fail(n, fmt::format("data '{}': expected a mapping with a 'kind', got {}", name, type_name(n)));
    if (!n["kind"]) r.fail(n, fmt::format("data '{}': missing 'kind' ({})", name, or_list(names_in(data_kind_names()))));
    d.kind = r.pick(n["kind"], "kind", data_kind_names());
    const std::string what = fmt::format("data '{}' ({})", name, name_of(d.kind));
    if (d.kind == DataKind::kRepeated) {
        r.keys(n, what, {"kind", "length", "count", "token_range", "seed"});
        if (!n["length"]) r.fail(n, what + ": missing 'length' (|R|)");
        if (!n["count"]) r.fail(n, what + ": missing 'count' (rows)");
        d.length = r.positive(n["length"], "length");
        if (d.length < 2) r.fail(n["length"], "'length': need at least 2");
        d.count = r.positive(n["count"], "count");
        if (n["token_range"]) {
            const auto tr = n["token_range"];
            if (!tr.IsSequence() || tr.size() != 2) r.fail(tr, "'token_range': expected [lo, hi)");
            d.token_lo = r.integer(tr[0], "token_range");
            d.token_hi = r.integer(tr[1], "token_range");
            if (d.token_lo < 0 || d.token_lo >= d.token_hi) r.fail(tr, "'token_range': need 0 <= lo < hi");
        }
        if (n["seed"]) d.seed = r.integer(n["seed"], "seed");
        return d;
    }
    if (d.kind == DataKind::kText) r.keys(n, what, {"kind", "file", "seq_len", "count"});
    else if (d.kind == DataKind::kConflicts)
        r.keys(n, what, {"kind", "file", "count", "clean", "separator", "answer_prefix", "answer_token"});
    else r.keys(n, what, {"kind", "file", "count"});
    if (n["clean"]) d.clean = r.boolean(n["clean"], "clean");
    if (n["separator"]) d.separator = r.str(n["separator"], "separator");
    if (n["answer_prefix"]) d.answer_prefix = r.str(n["answer_prefix"], "answer_prefix");
    if (n["answer_token"]) d.answer_alone = r.choice(n["answer_token"], "answer_token", {"continuation", "alone"}) == "alone";
    if (!n["file"]) r.fail(n, what + ": missing 'file'");
    d.file = r.str(n["file"], "file");
    d.file_mark = mark_of(n["file"]);
    if (n["count"]) d.count = r.positive(n["count"], "count");
    if (d.kind == DataKind::kText) {
        if (!n["seq_len"]) r.fail(n, what + ": missing 'seq_len'");
        d.seq_len = r.positive(n["seq_len"], "seq_len");
    }
    return d;
}

HeadSpec parse_heads(const Reader& r, const YAML::Node& n, bool allow_list_k);

// A list of k values or one.
std::vector<int64_t> parse_ks(const Reader& r, const YAML::Node& n, const std::string& key, bool allow_list) {
    std::vector<int64_t> ks;
    if (n.IsSequence()) {
        if (!allow_list) r.fail(n, fmt::format("'{}': a list of sizes is only meaningful in a cumulative sweep", key));
        if (n.size() == 0) r.fail(n, fmt::format("'{}': empty list", key));
        for (const auto& x : n) ks.push_back(r.positive(x, key));
    } else {
        ks.push_back(r.positive(n, key));
    }
    return ks;
}

HeadSpec parse_heads(const Reader& r, const YAML::Node& n, bool allow_list_k) {
    HeadSpec h;
    h.mark = mark_of(n);
    if (n.IsScalar()) {
        const std::string s = n.Scalar();
        if (s == "all") return h;
        int l, hh;
        if (parse_head_name(s, l, hh)) {
            h.kind = HeadSpec::Kind::kList;
            h.heads.push_back({l, hh});
            h.head_marks.push_back(mark_of(n));
            return h;
        }
        r.fail(n, fmt::format("heads: '{}' is not a head set (expected all, L<layer>H<head>, a list of heads, or a "
                              "mapping with layers, top, bottom, threshold or not)", s));
    }
    if (n.IsSequence()) {
        h.kind = HeadSpec::Kind::kList;
        if (n.size() == 0) r.fail(n, "heads: empty list");
        for (const auto& x : n) {
            int l, hh;
            if (!x.IsScalar() || !parse_head_name(x.Scalar(), l, hh))
                r.fail(x, fmt::format("heads: expected a head name like L1H3, got {}",
                                      x.IsScalar() ? "'" + x.Scalar() + "'" : type_name(x)));
            h.heads.push_back({l, hh});
            h.head_marks.push_back(mark_of(x));
        }
        return h;
    }
    if (!n.IsMap()) r.fail(n, fmt::format("heads: expected a head set, got {}", type_name(n)));
    if (n["layers"]) {
        r.keys(n, "heads (layers)", {"layers"});
        h.kind = HeadSpec::Kind::kLayers;
        const auto ls = n["layers"];
        if (ls.IsSequence()) {
            for (const auto& x : ls) h.layers.push_back(static_cast<int>(r.integer(x, "layers")));
        } else {
            h.layers.push_back(static_cast<int>(r.integer(ls, "layers")));
        }
        h.by_mark = mark_of(ls);
        return h;
    }
    if (n["not"]) {
        r.keys(n, "heads (not)", {"not"});
        h.kind = HeadSpec::Kind::kComplement;
        h.inner = std::make_shared<HeadSpec>(parse_heads(r, n["not"], false));
        return h;
    }
    const bool top = static_cast<bool>(n["top"]), bottom = static_cast<bool>(n["bottom"]),
               thr = static_cast<bool>(n["threshold"]);
    if (int(top) + int(bottom) + int(thr) != 1)
        r.fail(n, "heads: expected exactly one of layers, not, top, bottom, threshold");
    if (top || bottom) {
        const std::string key = top ? "top" : "bottom";
        r.keys(n, "heads (" + key + ")", {key, "by"});
        h.kind = top ? HeadSpec::Kind::kTop : HeadSpec::Kind::kBottom;
        h.ks = parse_ks(r, n[key], key, allow_list_k);
    } else {
        r.keys(n, "heads (threshold)", {"threshold", "by", "above"});
        h.kind = HeadSpec::Kind::kThreshold;
        h.threshold = r.number(n["threshold"], "threshold");
        if (n["above"]) h.above = r.boolean(n["above"], "above");
    }
    if (!n["by"]) r.fail(n, "heads: missing 'by' (a score: scores/<probe>/score or FILE.h5:/path)");
    h.by = r.str(n["by"], "by");
    h.by_mark = mark_of(n["by"]);
    return h;
}

ModeSpec parse_mode(const Reader& r, const YAML::Node& n) {
    const auto& kinds = study_intervention_names();
    ModeSpec m;
    m.mark = mark_of(n);
    if (n.IsScalar()) {
        m.kind = r.pick(n, "mode", kinds);
    } else {
        r.keys(n, "mode", {"kind", "data", "per_position", "factor", "seed", "sink", "recent", "compensate", "block"});
        if (!n["kind"]) r.fail(n, "mode: missing 'kind' (" + fmt::format("{}", fmt::join(names_in(kinds), ", ")) + ")");
        m.kind = r.pick(n["kind"], "kind", kinds);
        if (n["data"]) m.data = r.str(n["data"], "data");
        if (n["per_position"]) m.per_position = r.boolean(n["per_position"], "per_position");
        if (n["factor"]) m.factor = r.number(n["factor"], "factor");
        if (n["factor"] && m.kind != Intervention::kScale) r.fail(n["factor"], "mode: 'factor' applies to mode scale only");
        for (const char* key : {"sink", "recent", "compensate", "block"})
            if (n[key] && m.kind != Intervention::kStream) r.fail(n[key], fmt::format("mode: '{}' applies to mode stream only", key));
        if (m.kind == Intervention::kStream) {
            for (const char* key : {"sink", "recent"})
                if (!n[key]) r.fail(n, fmt::format("mode stream: needs '{}', e.g. {{kind: stream, sink: 4, recent: 64}}", key));
            m.window.sink = r.integer(n["sink"], "sink");
            if (m.window.sink < 0) r.fail(n["sink"], fmt::format("'sink': expected an integer >= 0, got {}", m.window.sink));
            m.window.recent = r.positive(n["recent"], "recent");
            if (n["compensate"]) m.window.compensate = r.boolean(n["compensate"], "compensate");
            if (n["block"]) m.window.block = r.positive(n["block"], "block");
            if (m.window.block > 1 && m.window.compensate)
                r.fail(n["block"], fmt::format("mode stream: a block window (block {}) does not compensate", m.window.block));
        }
    }
    if (m.kind == Intervention::kStream && n.IsScalar())
        r.fail(n, "mode stream: needs a window, e.g. {kind: stream, sink: 4, recent: 64}");
    const bool needs_data = needs_reference(m.kind);
    const char* kind = name_of(m.kind);
    if (needs_data && m.data.empty())
        r.fail(n, fmt::format("mode {}: needs 'data' (the reference dataset), e.g. {{kind: {}, data: NAME}}", kind, kind));
    if (!needs_data && !m.data.empty()) r.fail(n, fmt::format("mode {}: takes no 'data'", kind));
    if (m.kind == Intervention::kScale && !n["factor"]) r.fail(n, "mode scale: needs 'factor', e.g. {kind: scale, factor: 2.0}");
    return m;
}

MetricSpec parse_metric(const Reader& r, const YAML::Node& n) {
    MetricSpec m;
    m.mark = mark_of(n);
    r.keys(n, "metric", {"kind", "data", "positions", "target"});
    if (!n["kind"]) r.fail(n, "metric: missing 'kind' (loss, accuracy, logit-diff, kl, prob, retrieval)");
    if (n["kind"].IsScalar() && n["kind"].Scalar() == "retrieval")
        r.fail(n["kind"], "metric retrieval: needle tests are not a YAML metric; the retrieval command runs them, with its own ablations");
    m.kind = r.pick(n["kind"], "kind", metric_names());
    if (!n["data"]) r.fail(n, "metric: missing 'data' (a dataset name)");
    m.data = r.str(n["data"], "data");
    if (n["positions"]) {
        m.positions = r.pick(n["positions"], "positions", positions_names());
        m.positions_mark = mark_of(n["positions"]);
        if (m.kind == MetricKind::kAccuracy || m.kind == MetricKind::kLogitDiff || m.kind == MetricKind::kProb)
            r.fail(n["positions"], fmt::format("metric {}: 'positions' does not apply (it reads the answer position)", name_of(m.kind)));
    }
    if (n["target"]) {
        if (m.kind != MetricKind::kProb) r.fail(n["target"], "metric: 'target' applies to metric prob only");
        // parametric / context: the names of a conflicts dataset's answer / counterfactual
        const std::string t = r.choice(n["target"], "target", {"answer", "counterfactual", "parametric", "context"});
        m.counterfactual = t == "counterfactual" || t == "context";
    }
    return m;
}

// fit_data {kind: passkey, ...}: duo_attn/data.py MultiplePasskeyRetrievalDataset with the arguments
// train.py passes it (l. 324-336): num_passkeys 10 of 20 ordinals, 32 words; one context length
// (`length`) or scripts/train.sh's `--context_length_min/max --context_lengths_num_intervals 50`
// (`length_min`, `length_max`, `length_intervals`); its `--min/max_needle_depth_ratio 0.05/0.95
// --depth_ratio_num_intervals 1000` (`depth_min`, `depth_max`, `depth_intervals`).
void parse_passkey_data(const Reader& r, const YAML::Node& f, StudySpec& s) {
    if (!f["haystack"]) r.fail(f, "fit_data: kind passkey needs 'haystack' (a text file)");
    const bool range = f["length_min"] || f["length_max"] || f["length_intervals"];
    if (f["length"] && range) {
        const char* other = f["length_min"] ? "length_min" : f["length_max"] ? "length_max" : "length_intervals";
        r.fail(f[other], fmt::format("fit_data: '{}' and 'length' exclude each other (one length, or length_min and length_max)", other));
    }
    if (!f["length"] && !range)
        r.fail(f, "fit_data: kind passkey needs 'length' (the sample's context length in tokens) or 'length_min' and 'length_max'");
    s.passkey_haystack = r.str(f["haystack"], "haystack");
    if (!std::ifstream(s.passkey_haystack)) r.fail(f["haystack"], fmt::format("haystack: cannot read {}", s.passkey_haystack));
    if (f["length"]) {
        s.passkey_length_min = s.passkey_length_max = r.positive(f["length"], "length");
        s.passkey_length_intervals = 1;
        s.passkey_length_mark = mark_of(f["length"]);
    } else {
        for (const char* key : {"length_min", "length_max"})
            if (!f[key]) r.fail(f, fmt::format("fit_data: a range of lengths needs both 'length_min' and 'length_max' ('{}' is missing)", key));
        s.passkey_length_min = r.positive(f["length_min"], "length_min");
        s.passkey_length_max = r.positive(f["length_max"], "length_max");
        if (s.passkey_length_min > s.passkey_length_max)
            r.fail(f["length_min"], fmt::format("'length_min' {} is above 'length_max' {}", s.passkey_length_min, s.passkey_length_max));
        s.passkey_length_intervals = f["length_intervals"] ? r.positive(f["length_intervals"], "length_intervals") : 50;
        s.passkey_length_mark = mark_of(f["length_max"]);
    }
    if (f["passkeys"]) {
        s.passkey_count = r.positive(f["passkeys"], "passkeys");
        if (s.passkey_count > 20)
            r.fail(f["passkeys"], fmt::format("'passkeys': expected 1..20 (the reference's 20 ordinals), got {}", s.passkey_count));
    }
    if (f["words"]) s.passkey_words = r.positive(f["words"], "words");
    for (const char* key : {"depth_min", "depth_max"})
        if (f[key]) {
            const double v = r.number(f[key], key);
            if (!(v >= 0 && v <= 1)) r.fail(f[key], fmt::format("'{}': expected a number in [0, 1], got {}", key, f[key].Scalar()));
            (std::string(key) == "depth_min" ? s.passkey_depth_min : s.passkey_depth_max) = v;
        }
    if (s.passkey_depth_min > s.passkey_depth_max)
        r.fail(f["depth_min"] ? f["depth_min"] : f["depth_max"],
               fmt::format("'depth_min' {} is above 'depth_max' {}", s.passkey_depth_min, s.passkey_depth_max));
    if (f["depth_intervals"]) s.passkey_depth_intervals = r.positive(f["depth_intervals"], "depth_intervals");
    if (s.passkey_count > s.passkey_depth_intervals)
        r.fail(f["depth_intervals"] ? f["depth_intervals"] : f["passkeys"],
               fmt::format("'passkeys' {} is above 'depth_intervals' {} (each passkey takes its own depth)", s.passkey_count,
                           s.passkey_depth_intervals));
}

// duo-gates' own keys: train_window {sink, recent, block} (each defaulting to the reference's training,
// 128, 256, 128), fit_data (study | fresh | {kind: fresh, rows, length} | {kind: passkey, haystack,
// length | length_min + length_max + length_intervals, passkeys, words, depth_min, depth_max,
// depth_intervals}), deploy ({select: sparsity,
// sparsity: S} | {select: threshold, threshold: T}).
void parse_duo_keys(const Reader& r, const YAML::Node& n, StudySpec& s) {
    if (const auto w = n["train_window"]) {
        r.keys(w, "train_window", {"sink", "recent", "block"});
        if (w["sink"]) {
            s.train_window.sink = r.integer(w["sink"], "sink");
            if (s.train_window.sink < 0) r.fail(w["sink"], fmt::format("'sink': expected an integer >= 0, got {}", s.train_window.sink));
        }
        if (w["recent"]) s.train_window.recent = r.positive(w["recent"], "recent");
        if (w["block"]) s.train_window.block = r.positive(w["block"], "block");
    }
    if (const auto f = n["fit_data"]) {
        s.fit_data_mark = mark_of(f);
        if (f.IsScalar()) {
            s.fit_fresh = r.choice(f, "fit_data", {"study", "fresh"}) == "fresh";
        } else {
            r.keys(f, "fit_data", {"kind", "rows", "length", "haystack", "passkeys", "words", "length_min", "length_max",
                                   "length_intervals", "depth_min", "depth_max", "depth_intervals"});
            if (!f["kind"]) r.fail(f, "fit_data: missing 'kind' (study, fresh or passkey)");
            const std::string kind = r.choice(f["kind"], "kind", {"study", "fresh", "passkey"});
            s.fit_fresh = kind != "study";
            s.fit_passkey = kind == "passkey";
            if (f["rows"] && kind != "fresh") r.fail(f["rows"], "fit_data: 'rows' applies to kind fresh only");
            if (f["length"] && !s.fit_fresh) r.fail(f["length"], "fit_data: 'length' applies to kinds fresh and passkey only");
            for (const char* key : {"haystack", "passkeys", "words", "length_min", "length_max", "length_intervals", "depth_min",
                                    "depth_max", "depth_intervals"})
                if (f[key] && !s.fit_passkey) r.fail(f[key], fmt::format("fit_data: '{}' applies to kind passkey only", key));
            if (s.fit_passkey) parse_passkey_data(r, f, s);
            if (f["rows"]) s.fresh_rows = r.positive(f["rows"], "rows");
            if (f["length"] && !s.fit_passkey) {
                s.fresh_length = r.positive(f["length"], "length");
                if (s.fresh_length < 8) r.fail(f["length"], fmt::format("'length': expected at least 8 tokens, got {}", s.fresh_length));
            }
        }
    }
    if (const auto d = n["deploy"]) {
        r.keys(d, "deploy", {"select", "sparsity", "threshold"});
        if (!d["select"]) r.fail(d, "deploy: missing 'select' (sparsity or threshold)");
        s.deploy_sparsity = r.choice(d["select"], "select", {"sparsity", "threshold"}) == "sparsity";
        const char* key = s.deploy_sparsity ? "sparsity" : "threshold";
        const char* other = s.deploy_sparsity ? "threshold" : "sparsity";
        if (d[other]) r.fail(d[other], fmt::format("deploy: '{}' applies to select {} only", other, other));
        if (d[key]) {
            s.deploy_value = r.number(d[key], key);
            if (!(s.deploy_value >= 0 && s.deploy_value <= 1))
                r.fail(d[key], fmt::format("'{}': expected a number in [0, 1], got {}", key, d[key].Scalar()));
        }
    }
}

StudySpec parse_study(const Reader& r, const YAML::Node& n) {
    StudySpec s;
    s.mark = mark_of(n);
    r.keys(n, "study", {"name", "sweep", "heads", "sets", "mode", "metric", "controls", "steps", "recompute", "factors",
                        "starts", "fit_steps", "lambda", "lr", "train_window", "fit_data", "deploy"});
    if (!n["name"]) r.fail(n, "study: missing 'name'");
    s.name = r.str(n["name"], "name");
    if (s.name.empty() || s.name.find_first_of("/ ") != std::string::npos)
        r.fail(n["name"], fmt::format("study name '{}': expected a non-empty name without '/' or spaces", s.name));
    if (!n["sweep"]) r.fail(n, fmt::format("study '{}': missing 'sweep' ({})", s.name, or_list(names_in(sweep_names()))));
    s.sweep = r.pick(n["sweep"], "sweep", sweep_names());
    s.sweep_mark = mark_of(n["sweep"]);
    if (n["heads"]) {
        s.heads = parse_heads(r, n["heads"], s.sweep == SweepKind::kCumulative);
        s.has_heads = true;
        s.heads_mark = mark_of(n["heads"]);
    }
    if (s.sweep == SweepKind::kCumulative) {
        if (!s.has_heads || (s.heads.kind != HeadSpec::Kind::kTop && s.heads.kind != HeadSpec::Kind::kBottom))
            r.fail(s.has_heads ? n["heads"] : n, fmt::format("study '{}': a cumulative sweep needs heads: {{top: [k, ...], by: SCORE}} (or bottom)", s.name));
    }
    if (n["sets"]) {
        if (s.sweep != SweepKind::kSet) r.fail(n["sets"], fmt::format("study '{}': 'sets' belongs to sweep: set", s.name));
        const auto sets = n["sets"];
        if (!sets.IsMap() || sets.size() == 0) r.fail(sets, "sets: expected a mapping NAME: HEADS");
        for (const auto& kv : sets) s.sets.push_back({kv.first.as<std::string>(), parse_heads(r, kv.second, false)});
    }
    if (s.sweep == SweepKind::kSet && s.sets.empty() && !s.has_heads)
        r.fail(n, fmt::format("study '{}': sweep set needs 'sets' (NAME: HEADS) or 'heads'", s.name));
    if (s.sweep == SweepKind::kSet && s.sets.empty()) s.sets.push_back({"heads", s.heads});
    if (n["mode"]) s.mode = parse_mode(r, n["mode"]);
    if (!n["metric"]) r.fail(n, fmt::format("study '{}': missing 'metric'", s.name));
    s.metric = parse_metric(r, n["metric"]);
    if (n["controls"]) {
        const auto c = n["controls"];
        r.keys(c, "controls", {"random"});
        if (!c["random"]) r.fail(c, "controls: expected {random: N}");
        s.controls = r.integer(c["random"], "random");
        if (s.controls < 0) r.fail(c["random"], "controls: random must be >= 0");
        s.controls_mark = mark_of(c);
        if (s.sweep == SweepKind::kPrune) r.fail(c, "controls: not defined for a prune sweep");
    }
    if (s.sweep == SweepKind::kPrune) {
        if (!n["steps"]) r.fail(n, fmt::format("study '{}': a prune sweep needs 'steps' (fractions, e.g. [0.1, 0.2, 0.5])", s.name));
        const auto st = n["steps"];
        if (!st.IsSequence() || st.size() == 0) r.fail(st, "steps: expected a list of fractions");
        double prev = 0;
        for (const auto& x : st) {
            const double f = r.number(x, "steps");
            if (f <= prev || f > 1) r.fail(x, "steps: fractions must increase within (0, 1]");
            s.steps.push_back(prev = f);
        }
        if (n["recompute"]) s.recompute = r.boolean(n["recompute"], "recompute");
        if (s.mode.kind != Intervention::kZero) r.fail(n["mode"], "prune: the head mask multiplies z, so mode must be zero");
    } else {
        if (n["steps"]) r.fail(n["steps"], "'steps' belongs to sweep: prune");
        if (n["recompute"]) r.fail(n["recompute"], "'recompute' belongs to sweep: prune");
    }
    if (s.sweep == SweepKind::kScaleGrid) {
        // JUICE (src/select_intervention_head.py): o_h += alpha o_h for alpha in {1, 3, 5, 10, 30} and
        // {-1, -2, -5}, i.e. z *= 1 + alpha.
        if (n["mode"]) r.fail(n["mode"], fmt::format("study '{}': sweep scale-grid scales z by each of 'factors'; it takes no mode", s.name));
        if (n["controls"]) r.fail(n["controls"], "controls: not defined for a scale-grid sweep");
        s.mode.kind = Intervention::kScale;
        s.factors = {2, 4, 6, 11, 31, 0, -1, -4};
        if (n["factors"]) {
            const auto f = n["factors"];
            if (!f.IsSequence() || f.size() == 0) r.fail(f, "factors: expected a list of numbers, e.g. [2, 4, 0, -1]");
            s.factors.clear();
            for (const auto& x : f) {
                const double v = r.number(x, "factors");
                if (!std::isfinite(v) || v == 1.0) r.fail(x, "factors: expected finite numbers other than 1 (1 leaves the head unchanged)");
                if (std::find(s.factors.begin(), s.factors.end(), v) != s.factors.end())
                    r.fail(x, fmt::format("factors: {} listed twice", v));
                s.factors.push_back(v);
            }
        }
    } else if (n["factors"]) {
        r.fail(n["factors"], "'factors' belongs to sweep: scale-grid");
    }
    const bool learned = s.sweep == SweepKind::kGating || s.sweep == SweepKind::kDuoGates;
    if (s.sweep == SweepKind::kDuoGates) {
        // The reference's run script (scripts/run_train.sh, scripts/train.sh): lr 0.02, reg_weight 0.05, 2000 steps.
        s.lambda = 0.05, s.lr = 0.02, s.fit_steps = 2000;
        parse_duo_keys(r, n, s);
        if (n["heads"]) r.fail(n["heads"], "duo-gates fits a gate on every head; it takes no 'heads'");
        if (!n["mode"] || s.mode.kind != Intervention::kStream)
            r.fail(n["mode"] ? n["mode"] : n, fmt::format("study '{}': duo-gates mixes full attention with a window: it needs "
                                                          "mode: {{kind: stream, sink: S, recent: R}}", s.name));
        if (n["starts"]) r.fail(n["starts"], "'starts' belongs to sweep: gating");
    }
    if (s.sweep == SweepKind::kGating) {
        if (n["controls"]) r.fail(n["controls"], "controls: not defined for a gating sweep");
        if (n["heads"]) r.fail(n["heads"], "gating fits a gate on every head; it takes no 'heads'");
        if (s.mode.kind != Intervention::kZero)
            r.fail(n["mode"], "gating: the gates multiply z and its configurations zero heads, so mode must be zero");
    }
    if (learned) {  // the fit's keys, shared by gating and duo-gates
        if (n["starts"]) s.starts = r.positive(n["starts"], "starts");
        if (n["fit_steps"]) s.fit_steps = r.positive(n["fit_steps"], "fit_steps");
        if (n["lambda"]) {
            s.lambda = r.number(n["lambda"], "lambda");
            if (!(s.lambda > 0) || !std::isfinite(s.lambda))
                r.fail(n["lambda"], s.sweep == SweepKind::kGating ? "lambda: expected a number > 0 (the G+ fit uses +lambda, G- -lambda)"
                                                                  : "lambda: expected a number > 0 (the weight of mean |alpha|)");
        }
        if (n["lr"]) {
            s.lr = r.number(n["lr"], "lr");
            if (!(s.lr > 0) || !std::isfinite(s.lr)) r.fail(n["lr"], "lr: expected a number > 0");
        }
    } else {
        for (const char* key : {"starts", "fit_steps", "lambda", "lr"})
            if (n[key]) r.fail(n[key], fmt::format("'{}' belongs to sweep: gating{}", key, std::string(key) == "starts" ? "" : " or duo-gates"));
    }
    if (s.sweep != SweepKind::kDuoGates)
        for (const char* key : {"train_window", "fit_data", "deploy"})
            if (n[key]) r.fail(n[key], fmt::format("'{}' belongs to sweep: duo-gates", key));
    return s;
}

}  // namespace

Experiment parse_experiment(const std::string& path, const std::vector<std::string>& probe_names) {
    std::string text = read_text_file(path);
    try {
        check_utf8(text, path);
    } catch (const DataError& e) {
        throw ConfigError(e.what());  // a YAML experiment is configuration (exit 3), FILE:LINE as the others
    }
    return parse_experiment_text(text, path, probe_names);
}

Experiment parse_experiment_text(const std::string& text, const std::string& file_name,
                                 const std::vector<std::string>& probe_names) {
    Experiment e;
    e.file = file_name;
    e.text = text;
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::ParserException& ex) {
        e.fail({ex.mark.line + 1, ex.mark.column + 1}, "not valid YAML: " + ex.msg);
    }
    Reader r{e};
    if (!root.IsMap()) e.fail({1, 1}, "expected a mapping with model, data and studies at the top");
    try {
        r.keys(root, "the experiment", {"model", "tokenizer", "dtype", "device", "attention", "threads", "seed", "output",
                                        "batch_rows", "data", "probes", "studies"});
        if (!root["model"]) e.fail({1, 1}, "missing 'model' (a checkpoint folder or file)");
        e.model = r.str(root["model"], "model");
        e.model_mark = mark_of(root["model"]);
        if (root["tokenizer"]) e.tokenizer = r.str(root["tokenizer"], "tokenizer");
        if (root["dtype"]) e.dtype = r.choice(root["dtype"], "dtype", {"auto", "float32", "float16", "bfloat16"});
        if (root["device"]) e.device = r.str(root["device"], "device");
        if (root["attention"]) e.attention = r.choice(root["attention"], "attention", {"auto", "blocked", "fused"});
        if (root["threads"]) e.threads = static_cast<int>(r.integer(root["threads"], "threads"));
        if (root["seed"]) e.seed = r.integer(root["seed"], "seed");
        if (root["batch_rows"]) e.batch_rows = r.positive(root["batch_rows"], "batch_rows");
        if (root["output"]) e.output = r.str(root["output"], "output");
        if (!root["data"]) e.fail({1, 1}, "missing 'data' (named datasets)");
        const auto data = root["data"];
        if (!data.IsMap() || data.size() == 0) r.fail(data, "data: expected a mapping NAME: {kind: ...}");
        for (const auto& kv : data) e.data.push_back(parse_data(r, kv.first.as<std::string>(), kv.second));
        auto need_data = [&](const YAML::Node& at, const std::string& name) {
            if (!e.find_data(name)) {
                std::vector<std::string> names;
                for (const auto& d : e.data) names.push_back(d.name);
                r.fail(at, fmt::format("no dataset named '{}' under data: (have: {})", name, fmt::join(names, ", ")));
            }
        };
        if (root["probes"]) {
            const auto ps = root["probes"];
            if (!ps.IsSequence()) r.fail(ps, "probes: expected a list of {probe: NAME, data: DATASET}");
            for (const auto& p : ps) {
                r.keys(p, "probe", {"probe", "data"});
                if (!p["probe"] || !p["data"]) r.fail(p, "probe: expected {probe: NAME, data: DATASET}");
                ProbeSpec s{r.choice(p["probe"], "probe", probe_names),
                            r.str(p["data"], "data"), mark_of(p), mark_of(p["data"])};
                need_data(p["data"], s.data);
                for (const auto& q : e.probes)
                    if (q.probe == s.probe) r.fail(p, fmt::format("probe '{}' listed twice", s.probe));
                e.probes.push_back(s);
            }
        }
        if (!root["studies"]) e.fail({1, 1}, "missing 'studies'");
        const auto st = root["studies"];
        if (!st.IsSequence() || st.size() == 0) r.fail(st, "studies: expected a list of studies");
        std::set<std::string> names;
        for (const auto& sn : st) {
            auto s = parse_study(r, sn);
            if (!names.insert(s.name).second) r.fail(sn["name"], fmt::format("study name '{}' used twice", s.name));
            need_data(sn["metric"]["data"], s.metric.data);
            if (!s.mode.data.empty()) need_data(sn["mode"]["data"], s.mode.data);
            // What the metric needs from its dataset.
            const DataKind dk = e.find_data(s.metric.data)->kind;
            const char* dkn = name_of(dk);
            const auto mnode = sn["metric"];
            const MetricKind mk = s.metric.kind;
            const bool answers = dk == DataKind::kPrompts || dk == DataKind::kConflicts;
            if ((mk == MetricKind::kAccuracy || mk == MetricKind::kLogitDiff || mk == MetricKind::kProb) && !answers)
                r.fail(mnode, fmt::format("metric {} needs a prompts or conflicts dataset (prompt/answer pairs); '{}' is {}",
                                          name_of(mk), s.metric.data, dkn));
            if (s.metric.positions == Positions::kRepeatedHalf && dk != DataKind::kRepeated)
                r.fail(mnode["positions"], fmt::format("positions repeated-half needs a repeated dataset; '{}' is {}",
                                                       s.metric.data, dkn));
            if (s.metric.positions == Positions::kAnswer && !answers)
                r.fail(mnode["positions"], fmt::format("positions answer needs a prompts or conflicts dataset; '{}' is {}",
                                                       s.metric.data, dkn));
            if ((s.sweep == SweepKind::kPrune || s.sweep == SweepKind::kGating) && mk == MetricKind::kAccuracy)
                r.fail(mnode, fmt::format("{} needs a differentiable metric (loss, kl, logit-diff or prob), not {}",
                                          name_of(s.sweep), name_of(mk)));
            if (mk == MetricKind::kKl && s.mode.kind == Intervention::kScale && s.mode.factor == 1.0)
                r.fail(sn["mode"], "mode scale with factor 1 leaves the model unchanged: kl would be 0");
            auto check_by = [&](const HeadSpec& h, auto&& self) -> void {
                if (h.inner) self(*h.inner, self);
                if (h.by.empty() || h.by.find(':') != std::string::npos) return;
                // scores/<probe>/score of this run
                auto parts = split(h.by, '/');
                std::vector<std::string> p;
                for (auto& x : parts)
                    if (!x.empty()) p.push_back(x);
                if (p.size() != 3 || p[0] != "scores" || p[2] != "score")
                    e.fail(h.by_mark, fmt::format("by: '{}': expected scores/<probe>/score or FILE.h5:/path", h.by));
                bool found = false;
                for (const auto& pr : e.probes) found |= pr.probe == p[1];
                if (!found)
                    e.fail(h.by_mark, fmt::format("by: '{}': this experiment computes no probe '{}' (list it under probes:)",
                                                  h.by, p[1]));
            };
            if (s.has_heads) check_by(s.heads, check_by);
            for (const auto& kv : s.sets) check_by(kv.second, check_by);
            e.studies.push_back(std::move(s));
        }
    } catch (const YAML::Exception& ex) {  // e.g. a key that is not a scalar
        e.fail({ex.mark.line + 1, ex.mark.column + 1}, ex.msg);
    }
    return e;
}

}  // namespace hs
