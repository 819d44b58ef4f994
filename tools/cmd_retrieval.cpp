// headscope retrieval: needle-in-a-haystack trials scored as retrieval heads (Wu et al. 2024) and
// LOCOS from one greedy decode pass each, with query ablation and random controls.
// Methods: docs/methods.md ("Retrieval heads and LOCOS"); output: docs/hdf5-schema.md (schema::retrieval()).
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "guard.h"
#include "kv_compare_args.h"
#include "decoding_args.h"
#include "needle.h"
#include "needle_store.h"
#include "progress.h"
#include "razor.h"
#include "run_state.h"
#include "schema.h"
#include "stream_sweep.h"
#include "study_config.h"
#include "util.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

namespace hs::cli {

struct RetrievalOptions {
    ModelArgs model;
    OutputArgs out;
    std::string scores = "retrieval,locos";
    std::string haystack, needles, haystack_dir;
    std::string tmpl = kDefaultTemplate;
    std::string ablation_template;
    // The protocol (probes/needle/needle_trials.h) and its choices, each overriding the protocol's default
    // when given (the flags given are in `given`).
    std::string protocol = "headscope";
    int64_t buffer = 0;
    std::string assembly = "tokens", ablation_assembly = "same", insertion = "sentence-end", answer_span = "decoded";
    std::string stop_order = "before", stop_ids, haystack_format = "raw", haystack_repeat = "tokens", rng = "headscope";
    int64_t ablation_max_new_tokens = 50;
    bool dump_steps = false;
    int64_t prefix_cache_mib = 4096;
    std::set<std::string> given;
    std::string lengths = "1000,2000,4000";
    std::string lengths_range;
    std::string depths = "0,25,50,75,100";
    int64_t max_new_tokens = 50;
    double pass_threshold = 0.5;
    double flag_threshold = 0.1;
    int64_t seed = 0;
    int64_t prefill_chunk = 512;
    int64_t bootstrap = 1000;
    std::string ablate;
    std::string ablation = "zero-query";
    int64_t ablate_top = 0;
    std::string from;
    int64_t random_controls = 0;
    int64_t calibration_trials = 50;
    std::string ablation_scope = "all";
    std::string stop = "newline";
    int64_t batch = 1;
    bool no_prefix_reuse = false;
    std::string shard;
    bool resume = false;
    double checkpoint_seconds = 60;
    int pause_ms = 0;
    // decoding under head interventions (probes/decoding/decoding.h)
    std::string decoding = "greedy";
    DecodingArgs dec;
    // Attention windows: --ablation stream and --stream-sweep (run_stream_sweep).
    StreamWindow window;
    bool stream_sweep = false;
    std::string order = "locos";
    std::string razor_preset = "headscope";  // --order razor's scoring and selection (probes/needle/kv/razor.h, RazorPreset)
    std::string full_fractions = "0,0.05,0.1,0.25,0.5,1";
    int64_t random_orders = 3;
    int64_t sweep_rows = 8;
    KvCompareArgs kv;  // --kv-compare (tools/kv_compare_args.h)
};

// LOCOS caps each calibration prompt at this many tokens (nolima_ablation.py, max_cal_tokens).
constexpr int64_t kCalibrationMaxTokens = 5000;

// A shipped data file: as given when it exists, else under the source tree next to the binary
// (build/headscope -> datasets/...).
static std::string shipped_file(const std::string& rel) {
    if (file_exists(rel)) return rel;
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n > 0) {
        buf[n] = 0;
        for (std::string dir = parent_dir(buf); !dir.empty() && dir != "/"; dir = parent_dir(dir)) {
            const std::string p = path_join(dir, rel);
            if (file_exists(p)) return p;
            if (parent_dir(dir) == dir) break;
        }
    }
    return rel;  // read_text_file names it in its error
}

static std::vector<int64_t> parse_int_list(const std::string& s, const std::string& what) {
    std::string bad;
    auto out = split_ints(s, &bad);
    if (!out) throw UsageError(fmt::format("{}: '{}' is not an integer", what, bad));
    if (out->empty()) throw UsageError(fmt::format("{}: no value given", what));
    return *out;
}

static std::vector<double> parse_depths(const std::string& s) {
    std::vector<double> out;
    for (const auto& part : split(s, ',')) {
        const auto p = trim(part);
        if (p.empty()) continue;
        const auto d = parse_double(p);
        if (!d) throw UsageError(fmt::format("--depths: '{}' is not a number", p));
        const double v = *d;
        if (v < 0 || v > 100) throw UsageError(fmt::format("--depths: {} is outside [0, 100] (percent)", p));
        out.push_back(v);
    }
    if (out.empty()) throw UsageError("--depths: no value given");
    return out;
}

// --lengths or --lengths-range START:END:N = round(linspace(START, END, N)) (half to even, as numpy).
static std::vector<int64_t> parse_lengths(const RetrievalOptions& o, bool range_given) {
    std::vector<int64_t> out;
    if (range_given) {
        auto p = split(o.lengths_range, ':');
        const auto a0 = p.size() == 3 ? parse_double(trim(p[0])) : std::nullopt;
        const auto b0 = p.size() == 3 ? parse_double(trim(p[1])) : std::nullopt;
        const auto n0 = p.size() == 3 ? parse_int64(trim(p[2])) : std::nullopt;
        if (!a0 || !b0 || !n0) throw UsageError(fmt::format("--lengths-range '{}': expected START:END:N", o.lengths_range));
        const double a = *a0, b = *b0;
        const int64_t n = *n0;
        if (n < 1) throw UsageError(fmt::format("--lengths-range '{}': N must be >= 1", o.lengths_range));
        for (int64_t i = 0; i < n; ++i)
            out.push_back(static_cast<int64_t>(std::nearbyint(n == 1 ? a : a + (b - a) * static_cast<double>(i) / (n - 1))));
    } else {
        out = parse_int_list(o.lengths, "--lengths");
    }
    for (auto v : out)
        if (v < 2) throw UsageError(fmt::format("--lengths: {} is too short (at least 2 context tokens)", v));
    return out;
}

// A grid's trials: prompts (-1 padded), needle and answer spans (-1 where a search found none),
// length, depth and needle index.
static void write_trial_arrays(ResultWriter& w, const std::string& g, const std::vector<Trial>& trials) {
    const int64_t N = static_cast<int64_t>(trials.size());
    int64_t Tmax = 0;
    for (const auto& t : trials) Tmax = std::max<int64_t>(Tmax, t.prompt.size());
    std::vector<int64_t> prompt_tokens(N * Tmax, -1), span(N * 2), aspan(N * 2), len_v(N), needle_v(N);
    std::vector<float> depth_v(N);
    for (int64_t i = 0; i < N; ++i) {
        const auto& t = trials[i];
        std::copy(t.prompt.begin(), t.prompt.end(), prompt_tokens.begin() + i * Tmax);
        span[2 * i] = t.needle_start, span[2 * i + 1] = t.needle_end;
        aspan[2 * i] = t.answer_start, aspan[2 * i + 1] = t.answer_end;
        len_v[i] = t.length, depth_v[i] = static_cast<float>(t.depth), needle_v[i] = t.needle;
    }
    w.write(g + "/prompt_tokens", prompt_tokens, {N, Tmax});
    w.write(g + "/needle_span", span, {N, 2});
    w.write(g + "/answer_span", aspan, {N, 2});
    w.write(g + "/length", len_v, {N});
    w.write(g + "/depth", depth_v, {N});
    w.write(g + "/needle", needle_v, {N});
}

// The parts of the file that do not depend on the trials' results: the trials' prompts and spans,
// the parameters, the score groups' descriptions (schema::write_needle_results writes the rest).
static void write_needle_static(ResultWriter& w, const NeedleTest& test, const Attrs& params, bool want_ret,
                                bool want_locos, bool want_r2, int64_t bootstrap, int64_t seed) {
    auto with = [&](Attrs a) {
        for (auto& kv : params) a.insert(kv);
        return a;
    };
    if (want_ret)
        w.set_attrs(schema::scores("retrieval"),
                    with({{"probe", std::string("retrieval")},
                          {"description", std::string("Wu et al. 2024 copy criterion: per decode step, 1/|answer span| "
                                                      "when the head's argmax key lies in the answer's tokens inside the "
                                                      "needle and holds the generated token; summed over steps (a "
                                                      "perfect copier scores 1 per trial), mean over passing trials")}}));
    if (want_locos)
        w.set_attrs(schema::scores("locos"),
                    with({{"probe", std::string("locos")},
                          {"description", std::string("mean over answer steps of L+ - L-, phi_{t,j} = alpha_{t,j} u_y^T W_O^h v_j "
                                                      "(raw unembedding row, no final norm); L+ over the needle, L- over "
                                                      "the other keys the head can see times n/(K-n); mean over passing "
                                                      "trials with an answer step")},
                          {"bootstrap_resamples", bootstrap},
                          {"bootstrap_seed", seed},
                          {"ci", std::string("2.5 and 97.5 percentiles of resampled trial means (linear interpolation); "
                                             "NaN when fewer than 10 trials are scored (the reference's rule)")}}));
    if (want_r2)
        w.set_attrs(schema::scores("r2"),
                    with({{"probe", std::string("r2")},
                          {"description", std::string("HeadKV's retrieval-reasoning score (FYYFU/HeadKV "
                                                      "retrieval_head_detection_r2.py lines 218-229): per decode step, "
                                                      "(1/N) x the summed attention weights of the head's top N keys "
                                                      "(N = |answer span|, ties: first indices) that lie in the answer's "
                                                      "span, no copy condition; summed over the first |answer tokens| "
                                                      "steps; mean over passing trials (the reference: qa_f1 > 50)")}}));
    const std::string tg = schema::retrieval_trials();
    write_trial_arrays(w, tg, test.trials());
    w.set_attrs(schema::retrieval(), params);
    w.set_attrs(tg, {{"padding", std::string("-1 past each prompt's end and each generation's end")},
                     {"locos_without_answer_steps", std::string("NaN")},
                     {"done", std::string("1 = the trial's unablated decode ran (a shard runs some, --resume skips those done)")}});
}

// --resume: what a previous run of the same scan (same parameters, model and shard) finished;
// nullptr when the file holds no needle results yet.
static std::unique_ptr<NeedleResults> load_needle_resume(const std::string& path, const Attrs& params, const Shard& shard,
                                                         const Model& m) {
    ResultReader r(path);
    if (!r.exists(schema::retrieval())) return nullptr;
    if (!r.exists(schema::meta()) || attr_text(r.attrs(schema::meta()).count("weights_sha256") ? r.attrs(schema::meta()).at("weights_sha256")
                                                                                 : AttrValue(std::string())) != m.weights_sha256())
        throw StorageError(fmt::format("{}: holds results of another model; refusing to resume", path));
    const auto a = r.attrs(schema::retrieval());
    for (const auto& [k, v] : params) {
        if (k == "haystack_file" || k == "needles_file") continue;  // the contents' sha256 is compared
        const std::string was = a.count(k) ? attr_text(a.at(k)) : "(absent)", now = attr_text(v);
        if (was != now) {
            auto cut = [](std::string s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; };
            throw StorageError(fmt::format("{}: was run with {} {}, not {}; refusing to resume (--force starts over)", path,
                                           k, cut(was), cut(now)));
        }
    }
    const std::string was_shard = a.count("shard") ? attr_text(a.at("shard")) : "(none)";
    if (was_shard != shard.str())
        throw StorageError(fmt::format("{}: was run as shard {}, not {}; refusing to resume", path, was_shard, shard.str()));
    return std::make_unique<NeedleResults>(schema::read_needle_results(r));
}

// ---- streaming heads: --stream-sweep ----

// The window flags, checked before the model loads.
static void check_stream_options(const RetrievalOptions& o, const Shard& shard) {
    if (o.window.sink < 0) throw UsageError(fmt::format("--sink: {} is negative", o.window.sink));
    if (o.window.recent < 1) throw UsageError(fmt::format("--recent: {} must be at least 1 (the query sees itself)", o.window.recent));
    if (o.kv.on() && shard.count > 1) throw UsageError("--kv-compare: not sharded (run it unsharded)");
    if (o.kv.on() && o.random_orders < 0) throw UsageError("--random-orders: need >= 0");
    with_flag("--razor-preset", [&] { return parse_razor_preset(o.razor_preset); });  // before the model loads
    if (!o.stream_sweep) return;
    if (shard.count > 1) throw UsageError("--stream-sweep: not sharded (run it unsharded, or on a merged scan's --order file)");
    if (o.random_orders < 0) throw UsageError("--random-orders: need >= 0");
    with_flag({{"--full-fractions", "full_fractions"}}, [&] { return parse_full_fractions(o.full_fractions); });
}

// --stream-sweep's --order, resolved before the scan (a bad file fails before anything is written):
// a file's [L, H] score or razor's; undefined for this run's locos / retrieval / r2 (known after the scan).
static at::Tensor stream_order_score(const RetrievalOptions& o, const Model& m, bool want_ret, bool want_locos,
                                     bool want_r2, std::string* source) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    if (o.order == "locos" || o.order == "retrieval" || o.order == "r2") {
        if (!(o.order == "locos" ? want_locos : o.order == "r2" ? want_r2 : want_ret))
            throw UsageError(fmt::format("--order {}: this run does not compute it (see --score)", o.order));
        *source = "this run: scores/" + o.order + "/score";
        return {};
    }
    if (o.order == "razor") {
        const RazorPreset preset = with_flag("--razor-preset", [&] { return parse_razor_preset(o.razor_preset); });
        if (preset == RazorPreset::kHeadscope) {
            *source = "razor (RazorAttention: echo and induction scores on repeated random tokens, max over each KV group)";
            return razor_head_score(m, RazorSettings{});
        }
        *source = fmt::format("razor --razor-preset {} (RazorAttention as golden-stick@a50ddc93 scores and selects{}: "
                              "the selected KV groups first, then razor_combine's order)",
                              razor_preset_name(preset), preset == RazorPreset::kPaper ? ", the full union" : ", quirks included");
        return razor_preset_score(m, RazorSettings{}, preset);
    }
    *source = o.order;
    return with_flag("--order", [&] { return read_head_score(split_head_score_ref(o.order), L, H); });
}

// --stream-sweep after the scan (probes/needle/stream_sweep.h): appends /retrieval/streaming to `out`
// (docs/hdf5-schema.md) and prints the curve. `score`: the order's score (stream_order_score), or
// undefined for this run's locos / retrieval / r2 in `sum`.
static void run_stream_sweep(const RetrievalOptions& o, const NeedleTest& test, const Model& m, const NeedleSummary& sum,
                             const std::string& out, at::Tensor score, const std::string& source, int64_t seed) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    StreamSweepSpec spec;
    spec.fractions = with_flag({{"--full-fractions", "full_fractions"}}, [&] { return parse_full_fractions(o.full_fractions); });
    spec.score = score.defined() ? score : o.order == "locos" ? sum.locos : o.order == "r2" ? sum.r2 : sum.ret;
    spec.random_orders = o.random_orders;
    spec.seed = static_cast<uint64_t>(seed);
    spec.window = o.window;
    spec.sweep_rows = o.sweep_rows;
    const StreamSweep sw = hs::run_stream_sweep(test, L, H, spec);
    const int64_t R = static_cast<int64_t>(sw.orders.size()), F = static_cast<int64_t>(sw.fractions.size());

    schema::StreamingRecord rec;
    rec.L = L, rec.H = H, rec.R = R, rec.F = F;
    rec.fractions.assign(sw.fractions.begin(), sw.fractions.end());
    rec.full_heads = sw.full_heads;
    for (const auto& ord : sw.orders) rec.order.insert(rec.order.end(), ord.begin(), ord.end());
    rec.masks = sw.masks, rec.accuracy = sw.accuracy, rec.rougeL_f = sw.rougeL_f, rec.kv_budget = sw.kv_budget;
    rec.attrs = {{"sink", o.window.sink},
                 {"recent", o.window.recent},
                 {"compensate", std::string(o.window.compensate ? "true" : "false")},
                 {"order_source", source},
                 {"random_orders", o.random_orders},
                 {"sweep_rows", o.sweep_rows},
                 {"random_order_seeds", fmt::format("seed + 3 + r (seed {}), heads.h random_subset over all L x H heads", seed)},
                 {"baseline_accuracy", sum.accuracy},
                 {"baseline_rougeL_f", sum.rougeL},
                 {"scope", std::string(ablation_scope_name(test.config().decode.scope))},
                 {"description", std::string("order row 0 ranks heads by order_source (best first, NaN last), rows 1.. are "
                                             "random orders; for fraction rho the first full_heads = round(rho L H) heads "
                                             "of an order keep full attention, every other head streams (keys [0, sink) "
                                             "and (q - recent, q]); masks 1 = the head streams; accuracy and rougeL_f "
                                             "[order, fraction] over every trial; kv_budget = mean over trials of "
                                             "rho + (1 - rho) min(1, (sink + recent [+ 1 compensation]) / prompt tokens)")}};
    ResultWriter w(out, WriteMode::kAppend);
    schema::write_streaming(w, rec);
    w.commit();

    std::printf("streaming sweep: sink %lld, recent %lld%s; order %s; %lld random order%s\n",
                static_cast<long long>(o.window.sink), static_cast<long long>(o.window.recent),
                o.window.compensate ? " + compensation" : "", source.c_str(), static_cast<long long>(o.random_orders),
                o.random_orders == 1 ? "" : "s");
    std::printf("%8s %6s %9s %9s %9s  %s\n", "full", "heads", "kv_budget", "accuracy", "ROUGE-L F", "random orders' accuracy");
    for (int64_t f = 0; f < F; ++f) {
        std::string rnd;
        for (int64_t r = 1; r < R; ++r) rnd += fmt::format("{}{:.3f}", r > 1 ? " " : "", sw.accuracy[r * F + f]);
        std::printf("%8.3f %6lld %9.3f %9.3f %9.3f  %s\n", sw.fractions[f], static_cast<long long>(sw.full_heads[f]),
                    sw.kv_budget[f], sw.accuracy[f], sw.rougeL_f[f], rnd.empty() ? "-" : rnd.c_str());
    }
    std::printf("baseline accuracy %.3f (every head full)\n", sum.accuracy);
}

// What the command line asks for, parsed and cross-checked (single-flag ranges are CLI11 checks in
// setup_retrieval).
struct RetrievalPlan {
    bool want_ret = false, want_locos = false, want_r2 = false;
    WriteMode mode = WriteMode::kCreate;
    NeedleProtocol proto;  // every construction, stop and seed choice, resolved
    NeedleConfig cfg;      // all but max_positions (the model's)
    std::vector<int64_t> extra_stop_ids;
    Intervention ablation = Intervention::kZeroQuery;
    bool ablating = false;
    Shard shard;
    CombineRule decoding = CombineRule::kIndependent;  // independent = greedy (no decoding pass)
};

// --protocol's defaults, then each choice whose own flag was given.
static NeedleProtocol resolve_protocol(const RetrievalOptions& o) {
    const Protocol pr = with_flag("--protocol", [&] { return parse_name(protocol_names(), o.protocol, "protocol"); });
    NeedleProtocol p = protocol_defaults(pr);
    auto given = [&](const char* flag) { return o.given.count(flag) > 0; };
    if (given("--buffer")) p.buffer = o.buffer;
    if (given("--assembly")) p.assembly = with_flag("--assembly", [&] { return parse_name(assembly_names(), o.assembly, "assembly"); });
    if (given("--ablation-assembly"))
        p.ablation_assembly = o.ablation_assembly == "same" ? p.assembly : with_flag("--ablation-assembly", [&] {
            return parse_name(assembly_names(), o.ablation_assembly, "assembly");
        });
    else if (pr == Protocol::kHeadscope || given("--assembly"))
        p.ablation_assembly = p.assembly;
    if (given("--insertion"))
        p.insertion = with_flag("--insertion", [&] { return parse_name(insertion_names(), o.insertion, "insertion"); });
    if (given("--answer-span"))
        p.answer = with_flag("--answer-span", [&] { return parse_name(answer_search_names(), o.answer_span, "answer span"); });
    if (given("--stop")) p.stop = with_flag("--stop", [&] { return parse_name(stop_rule_names(), o.stop, "stop rule"); });
    if (given("--stop-order"))
        p.stop_order = with_flag("--stop-order", [&] { return parse_name(stop_order_names(), o.stop_order, "stop order"); });
    if (given("--haystack-format"))
        p.haystack_format =
            with_flag("--haystack-format", [&] { return parse_name(haystack_format_names(), o.haystack_format, "haystack format"); });
    if (given("--haystack-repeat"))
        p.repeat = with_flag("--haystack-repeat", [&] { return parse_name(haystack_repeat_names(), o.haystack_repeat, "repeat rule"); });
    if (given("--rng")) p.rng = with_flag("--rng", [&] { return parse_name(rng_kind_names(), o.rng, "random streams"); });
    if (given("--ablation-scope"))
        p.scope = with_flag("--ablation-scope", [&] { return parse_name(ablation_scope_names(), o.ablation_scope, "ablation scope"); });
    if (given("--seed")) p.seed = o.seed;
    if (given("--max-new-tokens")) p.max_new_tokens = o.max_new_tokens;
    p.ablation_max_new_tokens = given("--ablation-max-new-tokens") ? o.ablation_max_new_tokens
                                : pr == Protocol::kLocos                ? p.ablation_max_new_tokens
                                                                        : p.max_new_tokens;
    if (p.buffer < 0) throw UsageError(fmt::format("--buffer: {} is negative", p.buffer));
    if (p.rng == RngKind::kReference && (p.seed < 0 || p.seed > 0xFFFFFFFFLL))
        throw UsageError(fmt::format("--seed: {} is outside [0, 2^32) (numpy's RandomState seeds, --rng reference)", p.seed));
    return p;
}

static RetrievalPlan plan_retrieval(const RetrievalOptions& o, bool range_given) {
    RetrievalPlan p;
    for (const auto& part : split(o.scores, ',')) {
        const auto s = trim(part);
        if (s == "retrieval") p.want_ret = true;
        else if (s == "locos") p.want_locos = true;
        else if (s == "r2") p.want_r2 = true;
        else if (!s.empty()) throw UsageError(fmt::format("--score: unknown score '{}' (valid: retrieval, locos, r2)", s));
    }
    if (!p.want_ret && !p.want_locos && !p.want_r2) throw UsageError("--score: no score named (valid: retrieval, locos, r2)");
    p.mode = write_mode(o.out);
    p.proto = resolve_protocol(o);
    NeedleConfig& c = p.cfg;
    c.tmpl = with_flag("--template", [&] { return parse_template(o.tmpl); });
    c.ablation_tmpl = o.ablation_template.empty() ? c.tmpl : with_flag("--ablation-template", [&] { return parse_template(o.ablation_template); });
    c.lengths = parse_lengths(o, range_given);
    c.depths = parse_depths(o.depths);
    c.pass_threshold = o.pass_threshold, c.batch = o.batch;
    c.decode.max_new_tokens = p.proto.max_new_tokens, c.decode.prefill_chunk = o.prefill_chunk;
    c.decode.keep_stop = p.proto.stop_order == StopOrder::kAfter;
    c.ablation_max_new_tokens = p.proto.ablation_max_new_tokens;
    c.decode.reuse_prefix = !o.no_prefix_reuse;
    c.decode.scope = p.proto.scope;
    c.keep_steps = o.dump_steps;
    c.prefix_max_bytes = o.prefix_cache_mib << 20;
    if (p.proto.max_new_tokens < 1 || p.proto.ablation_max_new_tokens < 1)
        throw UsageError("--max-new-tokens / --ablation-max-new-tokens: need at least 1");
    if (!o.stop_ids.empty()) p.extra_stop_ids = parse_int_list(o.stop_ids, "--stop-ids");
    if (!o.haystack.empty() && !o.haystack_dir.empty()) throw UsageError("give at most one of --haystack and --haystack-dir");
    if (!o.ablate.empty() && o.ablate_top > 0) throw UsageError("give at most one of --ablate and --ablate-top");
    if (!o.from.empty() && o.ablate_top == 0) throw UsageError("--from needs --ablate-top K");
    p.ablating = !o.ablate.empty() || o.ablate_top > 0;
    if (o.random_controls > 0 && !p.ablating && o.decoding != "decore")
        throw UsageError("--random-controls needs --ablate, --ablate-top or --decoding decore");
    // LOCOS's ablation runs default to the mean query (nolima_ablation.py --ablation-mode mean).
    const std::string ablation = o.given.count("--ablation") || p.proto.protocol != Protocol::kLocos ? o.ablation : "mean-query";
    p.ablation = with_flag("--ablation", [&] { return parse_intervention(ablation, "ablation", needle_ablations()); });
    if (!o.shard.empty()) p.shard = parse_shard(o.shard);
    if (p.shard.count > 1 && o.ablate_top > 0 && o.from.empty())
        throw UsageError("--shard: --ablate-top without --from ranks heads by the whole grid's scores, which one shard "
                         "does not have: run the scan, merge it, then --ablate-top K --from MERGED.h5:scores/locos/score");
    if (o.resume && (o.out.force || o.out.append)) throw UsageError("--resume excludes --force and --append");
    if (o.decoding == "greedy") {
        if (o.dec.decore() || o.dec.juice())
            throw UsageError("--contrast, --enhance and --suppress need --decoding decore or juice");
    } else {
        // The flag's words: greedy (no decoding pass), decore, juice (rows decoding independently
        // are generate's --rows, not a needle protocol).
        const auto rule = find_in(combine_rule_names(), o.decoding);
        if (!rule || *rule == CombineRule::kIndependent)
            throw UsageError(fmt::format("--decoding '{}': expected greedy, decore or juice", o.decoding));
        p.decoding = *rule;
        if (p.decoding == CombineRule::kDecore && !o.dec.decore()) throw UsageError("--decoding decore needs --contrast HEADS");
        if (p.decoding == CombineRule::kJuice && !o.dec.juice())
            throw UsageError("--decoding juice needs --enhance and/or --suppress HEADS");
        if (p.shard.count > 1) throw UsageError("--decoding decore|juice is not sharded yet: run it without --shard");
        if (o.resume) throw UsageError("--decoding decore|juice does not resume yet: run it without --resume");
    }
    check_stream_options(o, p.shard);
    return p;
}

// The needles and one haystack text per needle (lengthened as the protocol repeats it), with the
// tokenizer's facts and the stop ids.
struct NeedleInputs {
    std::string needles_path, hay_path;
    std::vector<Needle> needles;
    std::vector<std::string> haystacks;  // per needle
    std::string hay_sha256;              // of the haystack texts as read (before repetition)
    TokenFacts facts;
};

// An eos_token_id of a config file: an int, a list of ints, or absent.
static std::vector<int64_t> json_eos_ids(const std::string& path) {
    std::vector<int64_t> out;
    if (!file_exists(path)) return out;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_text_file(path));
    } catch (const nlohmann::json::exception& e) {
        throw DataError(fmt::format("{}: not JSON ({})", path, e.what()));
    }
    if (!j.is_object() || !j.contains("eos_token_id")) return out;
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) out.push_back(e.get<int64_t>());
    else if (e.is_array())
        for (const auto& v : e)
            if (v.is_number_integer()) out.push_back(v.get<int64_t>());
    return out;
}

static NeedleInputs read_needle_inputs(const RetrievalOptions& o, const RetrievalPlan& p, const Model& m, const Tokenizer& tok) {
    NeedleInputs in;
    in.needles_path = !o.needles.empty()      ? o.needles
                      : !o.haystack_dir.empty() ? path_join(o.haystack_dir, "needles.jsonl")
                                                : shipped_file("datasets/needles/needles.jsonl");
    in.needles = read_needles(in.needles_path);
    std::vector<std::string> texts;
    if (!o.haystack_dir.empty()) {
        in.hay_path = o.haystack_dir;
        texts = read_haystack_dir(o.haystack_dir, in.needles.size(), p.proto.haystack_format);
        for (size_t i = 0; i < texts.size(); ++i)
            if (trim(texts[i]).empty())
                throw DataError(fmt::format("{}: the haystack of needle {} (part{}) is empty", o.haystack_dir, i + 1, i + 1));
    } else {
        in.hay_path = o.haystack.empty() ? shipped_file("datasets/needles/haystack.txt") : o.haystack;
        const std::string text = read_utf8_text_file(in.hay_path);
        if (trim(text).empty() || tok.encode(text, false).empty())
            throw DataError(fmt::format("{}: the haystack is empty", in.hay_path));
        texts.assign(in.needles.size(), text);
    }
    std::string all;
    for (const auto& t : texts) all += t + '\0';
    in.hay_sha256 = o.haystack_dir.empty() ? sha256_bytes(texts[0].data(), texts[0].size()) : sha256_bytes(all.data(), all.size());
    const int64_t max_len = *std::max_element(p.cfg.lengths.begin(), p.cfg.lengths.end());
    for (auto& t : texts) {
        try {
            t = repeat_haystack(t, max_len, p.proto.repeat);
        } catch (const DataError& e) {
            throw DataError(fmt::format("{}: {}", in.hay_path, e.what()));
        }
    }
    in.haystacks = std::move(texts);
    in.facts = token_facts(tok, p.proto.stop);
    in.facts.stop_order = p.proto.stop_order;
    // config.json's EOS stops the newline and eos rules (the model's own end); the locos rule takes
    // generation_config.json's eos ids (transformers' model.generation_config: its own file, else
    // built from config.json), as model_utils.py get_stop_token_ids reads them.
    std::vector<int64_t> config_eos, generation_eos;
    if (m.config.eos_id >= 0) config_eos.push_back(m.config.eos_id);
    if (is_directory(m.path)) {  // the checkpoint folder on disk (a Hugging Face name's snapshot)
        const std::string gen = path_join(m.path, "generation_config.json");
        generation_eos = file_exists(gen) ? json_eos_ids(gen) : json_eos_ids(path_join(m.path, "config.json"));
    } else {
        generation_eos = config_eos;
    }
    for (auto id : p.extra_stop_ids)
        if (id < 0 || id >= tok.vocab_size())
            throw UsageError(fmt::format("--stop-ids: {} is outside the vocabulary (0..{})", id, tok.vocab_size() - 1));
    set_stop_rule(in.facts, tok, p.proto.stop, config_eos, generation_eos, p.extra_stop_ids);
    return in;
}

// The scan's parameters as /retrieval records them (and --resume compares).
static Attrs needle_params(const RetrievalOptions& o, const RetrievalPlan& p, const NeedleInputs& in, int64_t n_trials) {
    const NeedleProtocol& pr = p.proto;
    Attrs a = {{"haystack_file", in.hay_path},
               {"needles_file", in.needles_path},
               {"haystack_sha256", in.hay_sha256},
               {"needles_sha256", sha256_file(in.needles_path)},
               {"template", o.tmpl},
               {"lengths", p.cfg.lengths},
               {"depths", p.cfg.depths},
               {"max_new_tokens", pr.max_new_tokens},
               {"pass_threshold", o.pass_threshold},
               {"pass_rule", std::string("rouge1_recall(answer, response) > pass_threshold; ROUGE as rouge_score "
                                         "computes it with use_stemmer=True (Porter stems, NLTK's mode)")},
               {"stop", std::string(stop_rule_name(pr.stop))},
               {"ablation_scope", std::string(ablation_scope_name(pr.scope))},
               {"prefill_chunk", o.prefill_chunk},
               {"batch", o.batch},
               {"prefix_reuse", std::string(o.no_prefix_reuse ? "false" : "true")},
               {"scores", o.scores},
               {"flag_threshold", o.flag_threshold},
               {"bootstrap_resamples", o.bootstrap},
               {"seed", pr.seed},
               {"n_trials", n_trials},
               {"decode", std::string("greedy; prefill prompt[:-1], then one token a step through the KV cache; a stop "
                                      "token (stop_ids) ends the response: unkept and unscored (stop_order before), or "
                                      "kept and scored first (after, Wu's order)")}};
    // The protocol and every choice it resolved to (docs/needle-protocols.md).
    if (pr.protocol != Protocol::kHeadscope || o.given.count("--protocol")) {
        a["protocol"] = std::string(name_in(protocol_names(), pr.protocol));
        a["buffer"] = pr.buffer;
        a["assembly"] = std::string(name_in(assembly_names(), pr.assembly));
        a["ablation_assembly"] = std::string(name_in(assembly_names(), pr.ablation_assembly));
        a["ablation_template"] = p.cfg.ablation_tmpl.text;
        a["ablation_max_new_tokens"] = pr.ablation_max_new_tokens;
        a["insertion"] = std::string(name_in(insertion_names(), pr.insertion));
        a["answer_span"] = std::string(name_in(answer_search_names(), pr.answer));
        a["stop_order"] = std::string(name_in(stop_order_names(), pr.stop_order));
        a["haystack_format"] = std::string(name_in(haystack_format_names(), pr.haystack_format));
        a["haystack_repeat"] = std::string(name_in(haystack_repeat_names(), pr.repeat));
        a["rng"] = std::string(name_in(rng_kind_names(), pr.rng));
    }
    if (in.facts.rule_ids.empty()) a["stop_ids"] = std::string("none");
    else a["stop_ids"] = in.facts.rule_ids;
    return a;
}

// /retrieval/decoding: per set (0 = the named heads, 1.. random controls) and trial, the combined
// output's ROUGE, the pass flag and the answer's first-token margins (docs/hdf5-schema.md).
template <class Pass>
static void write_decoding(ResultWriter& w, const Pass& d, size_t n_trials) {
    const std::string g = schema::retrieval_decoding();
    const int64_t S = static_cast<int64_t>(d.sets.size()), N = static_cast<int64_t>(n_trials);
    std::vector<float> r1(S * N), rl(S * N), margin(S * N), base(S * N), acc(S), mean_rl(S), mean_margin(S);
    std::vector<int64_t> passed(S * N);
    for (int64_t s = 0; s < S; ++s) {
        double a = 0, f = 0, mg = 0;
        for (int64_t i = 0; i < N; ++i) {
            const auto& t = d.trials[s][i];
            r1[s * N + i] = static_cast<float>(t.result.rouge1_recall);
            rl[s * N + i] = static_cast<float>(t.result.rougeL_f);
            passed[s * N + i] = t.result.passed;
            margin[s * N + i] = static_cast<float>(t.answer_margin);
            base[s * N + i] = static_cast<float>(t.base_margin);
            a += t.result.passed, f += t.result.rougeL_f, mg += t.answer_margin;
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
    std::vector<std::string> names;
    for (const auto& s : d.sets) names.push_back(format_heads(s));
    Attrs a = {{"rule", std::string(name_in(combine_rule_names(), d.spec.rule))},
               {"sets", names},
               {"controls", std::string("set 0 = the named heads; sets 1.. = random sets of the same size drawn without "
                                        "replacement from the other heads (control_seed)")},
               {"control_seed", d.control_seed},
               {"margin", std::string("at the first decode step: the score of the answer's first token (as it appears in "
                                      "the needle) minus the best other token's; answer_margin under the rule "
                                      "(decore: (1 + a) l_base - a l_masked), base_margin under the plain model")}};
    if (d.spec.rule == CombineRule::kDecore) {
        a["alpha"] = d.spec.alpha_entropy ? std::string("entropy") : fmt::format("{}", d.spec.alpha);
        a["alpha_max"] = d.spec.alpha_max;
    } else {
        a["enhance"] = format_heads(d.spec.enhance), a["alpha_enhance"] = d.spec.alpha_enhance;
        a["suppress"] = format_heads(d.spec.suppress), a["alpha_suppress"] = d.spec.alpha_suppress;
    }
    w.set_attrs(g, a);
}

// A scan while it runs: the results so far (with what a resumed file had), the ablation sets, the
// mean-query calibration, the work this shard owns, and the whole file written atomically at
// checkpoints and at the end.
//
// Work items: baseline batch g, then ablation set s's batch g; this shard owns item k when
// k % N == I (k = g for the baseline, (1 + s) * G + g for set s).
class NeedleScan {
public:
    NeedleScan(const RetrievalOptions& o, const RetrievalPlan& p, const Model& m, const NeedleTest& test, Attrs params,
               std::unique_ptr<NeedleResults> prev, bool resuming)
        : o_(o), p_(p), m_(m), test_(test), work_(test, p.cfg.decode.scope == AblationScope::kDecode && o.sweep_rows > 1),
          params_(std::move(params)), prev_(std::move(prev)), resuming_(resuming) {
        const int64_t N = static_cast<int64_t>(test.trials().size());
        res_.init(N, m.config.n_layers, m.config.n_heads, p.proto.max_new_tokens, p.proto.ablation_max_new_tokens,
                  p.cfg.keep_steps);
        if (prev_)
            for (int64_t i = 0; i < N; ++i)
                if (prev_->done[i]) res_.copy_trial(*prev_, i);
    }

    const NeedleResults& results() const { return res_; }
    const std::vector<std::vector<Head>>& sets() const { return sets_; }
    // The scan's work items (probes/needle/needle_results.h NeedleWork): with an unablated prefill (scope
    // decode) and --sweep-rows > 1 the sets decode as rows of shared forwards, one item a batch for
    // every set.
    bool rows_mode() const { return work_.rows(); }
    bool owns(int64_t set, int64_t g) const { return p_.shard.owns(work_.item(set, g)); }
    int64_t owned_decodes(int64_t n_sets) const { return work_.owned_decodes(n_sets, p_.shard.index, p_.shard.count); }

    // Set 0 = `heads` (from --ablate, --ablate-top K --from, or this run's scores), sets 1.. the
    // random controls (distinct; fewer when the other heads hold fewer distinct sets), then, when
    // the ablation passes have prompts of their own (LOCOS), the unablated set (no heads): their
    // baseline. A resumed file's ablated trials are kept where it ablated the same heads.
    void choose_sets(std::vector<Head> heads, std::string source) {
        const int L = m_.config.n_layers, H = m_.config.n_heads;
        ablate_source_ = std::move(source);
        sets_ = {heads};
        if (o_.random_controls > 0)  // (none asked: a set of more than half the heads needs no room for controls)
            for (auto& s : with_flag("--random-controls", [&] {
                     return random_head_sets(L, H, heads, o_.random_controls, static_cast<uint64_t>(p_.proto.seed) + 1,
                                             &possible_controls_);
                 }))
                sets_.push_back(s);
        if (o_.random_controls > 0 && possible_controls_ <= o_.random_controls)
            log_warn(fmt::format("--random-controls {}: the {} heads outside {} hold only {} distinct sets of {}; all {} run",
                                 o_.random_controls, L * H - static_cast<int64_t>(heads.size()), format_heads(heads),
                                 possible_controls_, heads.size(), possible_controls_));
        if (test_.separate_ablation_trials()) sets_.push_back({});
        res_.init_sets(sets_);
        if (!prev_) return;
        const int64_t N = res_.N;
        for (int64_t s = 0; s < res_.S; ++s)
            if (res_.same_set(*prev_, s, s))
                for (int64_t i = 0; i < N; ++i)
                    if (prev_->abl_done[s * N + i]) res_.copy_ablated(*prev_, s, s, i);
    }

    // Decodes this shard's batches of one pass (set -1 = the scored baseline), skipping the done
    // ones; tick() per trial, a checkpoint after each batch that ran.
    void run_pass(int64_t set, const HeadSet* ablate, const std::function<void()>& tick) {
        const auto& batches = work_.batches_of(set);
        const int64_t G = static_cast<int64_t>(batches.size());
        for (int64_t g = 0; g < G; ++g) {
            if (!owns(set, g)) continue;
            if (work_.batch_done(res_, set, g)) {
                for (size_t k = 0; k < batches[g].size(); ++k) tick();
                continue;
            }
            const auto rs = set < 0 ? test_.run_baseline_batch(g) : test_.run_ablated_batch(*ablate, g);
            for (size_t k = 0; k < rs.size(); ++k) {
                if (set < 0) res_.set_trial(batches[g][k], rs[k]);
                else res_.set_ablated(set, batches[g][k], rs[k]);
                tick();
            }
            checkpoint();
        }
    }

    // Every set's pass at once (rows_mode): each owned ablation batch with its sets as rows.
    void run_sets_pass(const std::vector<HeadSet>& sets, const std::function<void()>& tick) {
        const auto& batches = test_.ablation_batches();
        std::vector<const HeadSet*> ptrs;
        for (const auto& hs : sets) ptrs.push_back(&hs);
        for (int64_t g = 0; g < static_cast<int64_t>(batches.size()); ++g) {
            if (!owns(0, g)) continue;
            bool all_done = true;
            for (int64_t si = 0; si < static_cast<int64_t>(sets.size()); ++si) all_done = all_done && work_.batch_done(res_, si, g);
            if (all_done) {
                for (size_t k = 0; k < batches[g].size() * sets.size(); ++k) tick();
                continue;
            }
            const auto rs = test_.run_ablated_sets_batch(ptrs, g, o_.sweep_rows);
            for (size_t si = 0; si < sets.size(); ++si)
                for (size_t k = 0; k < batches[g].size(); ++k) {
                    res_.set_ablated(static_cast<int64_t>(si), batches[g][k], rs[si][k]);
                    tick();
                }
            checkpoint();
        }
    }

    void calibrate(int64_t n, const std::function<void()>& tick) {
        n_calib_ = n;
        q_mean_ = test_.calibrate(n, calibration_seed(), kCalibrationMaxTokens, &calib_idx_, tick);
    }
    // headscope: seed + 2 (its own stream); the reference's: LOCOS's --seed itself.
    uint64_t calibration_seed() const {
        return static_cast<uint64_t>(p_.proto.seed) + (p_.proto.rng == RngKind::kReference ? 0 : 2);
    }
    const at::Tensor& q_mean() const { return q_mean_; }

    // Every item this shard owns is done (the planned sets included).
    bool complete(int64_t n_sets_planned) const { return work_.complete(res_, n_sets_planned, p_.shard.index, p_.shard.count); }
    // The sets an ablating run decodes: the named heads, the controls, the ablation trials' baseline.
    int64_t n_sets_planned() const {
        if (!p_.ablating) return 0;
        const int64_t controls = res_.S > 0 ? static_cast<int64_t>(sets_.size()) - 1 - (test_.separate_ablation_trials() ? 1 : 0)
                                            : o_.random_controls;
        return 1 + controls + (test_.separate_ablation_trials() ? 1 : 0);
    }

    void write(int64_t n_sets_planned);

    // The decoding pass (--decoding decore|juice): set 0 the named heads, sets 1.. random controls
    // (DeCoRe), each with every trial's outcome.
    struct DecodingPass {
        DecodingSpec spec;  // of set 0
        std::vector<std::vector<Head>> sets;
        std::vector<std::vector<NeedleTest::Decoded>> trials;
        int64_t control_seed = 0;
    };
    void set_decoding(DecodingPass d) { decoding_ = std::move(d); }
    const std::optional<DecodingPass>& decoding() const { return decoding_; }

private:
    void checkpoint() {
        const auto now = std::chrono::steady_clock::now();
        if (std::chrono::duration<double>(now - last_write_).count() < o_.checkpoint_seconds) return;
        write(n_sets_planned());
        last_write_ = std::chrono::steady_clock::now();
        if (o_.pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.pause_ms));
    }

    const RetrievalOptions& o_;
    const RetrievalPlan& p_;
    const Model& m_;
    const NeedleTest& test_;
    NeedleWork work_;
    Attrs params_;
    std::unique_ptr<NeedleResults> prev_;
    bool resuming_ = false, first_write_ = true;
    NeedleResults res_;
    std::vector<std::vector<Head>> sets_;
    std::string ablate_source_;
    int64_t n_calib_ = 0, possible_controls_ = 0;
    std::vector<int64_t> calib_idx_;
    at::Tensor q_mean_;
    std::optional<DecodingPass> decoding_;
    std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
};

void NeedleScan::write(int64_t n_sets_planned) {
    const int L = m_.config.n_layers, H = m_.config.n_heads;
    ResultWriter w(o_.out.out, first_write_ && !resuming_ ? p_.mode : WriteMode::kAppend);
    first_write_ = false;
    if (w.exists(schema::meta())) check_same_model(w, m_);
    write_meta(w, m_, p_.proto.seed);
    for (const std::string& g : {schema::scores("retrieval"), schema::scores("locos"), schema::scores("r2"), schema::retrieval()})
        if (w.exists(g)) w.remove(g);
    const NeedleSummary sum = summarize(res_, o_.bootstrap, static_cast<uint64_t>(p_.proto.seed), o_.flag_threshold, p_.proto.rng);
    write_needle_static(w, test_, params_, p_.want_ret, p_.want_locos, p_.want_r2, o_.bootstrap, p_.proto.seed);
    w.set_attrs(schema::retrieval(), {{"shard", p_.shard.str()},
                               {"shard_index", p_.shard.index},
                               {"shard_count", p_.shard.count},
                               {"complete", int64_t(complete(n_sets_planned))}});
    schema::write_needle_results(w, res_, sum.stored(), p_.want_ret, p_.want_locos, p_.want_r2);
    if (res_.S > 0) {
        const std::string ag = schema::retrieval_ablation();
        std::vector<std::string> names;
        for (const auto& s : sets_) names.push_back(format_heads(s));
        Attrs aa = {{"ablation", std::string(intervention_name(p_.ablation))},
                    {"heads", names},
                    {"source", ablate_source_},
                    {"random_controls", o_.random_controls},
                    {"distinct_controls_possible", possible_controls_},
                    {"control_seed", p_.proto.seed + 1},
                    {"scope", std::string(ablation_scope_name(p_.cfg.decode.scope))},
                    {"controls", std::string("set 0 = the named heads; sets 1.. = distinct random sets of the same size drawn "
                                             "without replacement from the heads NOT in set 0 (all of them, fewer than "
                                             "random_controls, when distinct_controls_possible <= random_controls)")}};
        if (test_.separate_ablation_trials()) {
            aa["baseline_set"] = static_cast<int64_t>(sets_.size()) - 1;
            aa["trials"] = std::string("the ablation passes decode prompts of their own (ablation_assembly, "
                                       "ablation_template: /retrieval/ablation/trials); the last set, no heads, is their "
                                       "unablated baseline (baseline_* datasets)");
            write_trial_arrays(w, schema::retrieval_ablation("trials"), test_.ablation_trials());
        }
        if (p_.ablation == Intervention::kStream)
            aa["window"] = std::vector<int64_t>{o_.window.sink, o_.window.recent, o_.window.compensate ? 1 : 0};
        if (p_.ablation == Intervention::kMeanQuery) {
            aa["calibration_trials"] = n_calib_;
            aa["calibration_trial_indices"] = calib_idx_;
            aa["calibration_seed"] = static_cast<int64_t>(calibration_seed());
            aa["calibration_rng"] = std::string(p_.proto.rng == RngKind::kReference
                                                    ? "random.Random(calibration_seed).shuffle of the grid, the first "
                                                      "calibration_trials (nolima_ablation.py)"
                                                    : "std::mt19937_64(calibration_seed), a partial Fisher-Yates draw");
            aa["calibration"] = std::string("LOCOS (nolima_ablation.py): mean PRE-RoPE query (after q-norm) of "
                                            "calibration_trials trials drawn by calibration_seed from the whole grid, "
                                            "unablated prefill of each trial's prompt (context at most 5000 tokens, "
                                            "prompt cut to 5000), averaged over each prompt's positions, then over the "
                                            "prompts (each prompt weighs equally); RoPE is applied at each position to "
                                            "the mean");
            w.write(ag + "/query_mean", host_floats(q_mean_), {L, H, m_.config.d_head});
        }
        w.set_attrs(ag, aa);
    }
    if (decoding_) write_decoding(w, *decoding_, test_.trials().size());
    w.commit();
}

// The protocol's resolved choices in one line (printed when --protocol is given or not headscope).
static std::string protocol_line(const NeedleProtocol& pr, const std::vector<int64_t>& stop_ids) {
    return fmt::format("protocol {}: context = length - {} tokens, assembly {} (ablation {}), insertion {}, answer span {}, "
                       "stop {} on ids {} ({}), {} steps (ablation {}), ablation scope {}, haystack {} {}, rng {}",
                       name_in(protocol_names(), pr.protocol), pr.buffer, name_in(assembly_names(), pr.assembly),
                       name_in(assembly_names(), pr.ablation_assembly), name_in(insertion_names(), pr.insertion),
                       name_in(answer_search_names(), pr.answer), stop_rule_name(pr.stop),
                       stop_ids.empty() ? std::string("none") : fmt::format("{}", fmt::join(stop_ids, ",")),
                       pr.stop_order == StopOrder::kAfter ? "kept and scored, then stop" : "unkept",
                       pr.max_new_tokens, pr.ablation_max_new_tokens, ablation_scope_name(pr.scope),
                       name_in(haystack_format_names(), pr.haystack_format), name_in(haystack_repeat_names(), pr.repeat),
                       name_in(rng_kind_names(), pr.rng));
}

// The printed summary: accuracy, the top heads of each score, the ablation sets' accuracies.
static void print_needle_summary(const RetrievalPlan& p, const NeedleScan& scan, const NeedleSummary& sum,
                                 double flag_threshold, int L, int H) {
    const int64_t N = scan.results().N;
    if (p.shard.count > 1)
        std::printf("shard %s: trials %lld of %lld, passed %lld (accuracy %.3f, ROUGE-L F %.3f)\n", p.shard.str().c_str(),
                    static_cast<long long>(sum.n_done), static_cast<long long>(N), static_cast<long long>(sum.n_pass),
                    sum.accuracy, sum.rougeL);
    else
        std::printf("trials %lld, passed %lld (accuracy %.3f, ROUGE-L F %.3f)\n", static_cast<long long>(N),
                    static_cast<long long>(sum.n_pass), sum.accuracy, sum.rougeL);
    auto print_top = [&](const char* name, const at::Tensor& s) {
        std::string line = fmt::format("{:<10}", name);
        for (auto [l, h] : top_heads(s, std::min<int64_t>(5, L * H)))
            line += fmt::format(" {} {:.4f}", format_head(l, h), s[l][h].item<double>());
        std::printf("%s\n", line.c_str());
    };
    if (p.want_ret) {
        print_top("retrieval", sum.ret);
        std::printf("flagged (> %.2f): %s\n", flag_threshold,
                    sum.flagged.empty() ? "none" : fmt::format("{}", fmt::join(sum.flagged, ",")).c_str());
    }
    if (p.want_locos) {
        print_top("locos", sum.locos);
        if (!sum.with_ci && sum.n_locos > 0)
            std::printf("locos CI: not computed (%lld scored trials, the reference's minimum is %lld): NaN\n",
                        static_cast<long long>(sum.n_locos), static_cast<long long>(kBootstrapMinTrials));
    }
    if (p.want_r2) print_top("r2", sum.r2);
    const auto& sets = scan.sets();
    // The ablation passes' own prompts (LOCOS) have their own unablated baseline: the last set.
    double base_acc = sum.accuracy, base_rl = sum.rougeL;
    if (!sets.empty() && sets.back().empty() && sets.size() > 1) base_acc = sum.abl_acc.back(), base_rl = sum.abl_rougeL.back();
    for (size_t si = 0; si < sets.size(); ++si) {
        if (sets[si].empty() && si > 0) {
            std::printf("ablation baseline %-24s accuracy %.3f (the ablation prompts, unablated; the scan's %.3f)  ROUGE-L F %.3f\n",
                        "(no heads)", sum.abl_acc[si], sum.accuracy, sum.abl_rougeL[si]);
            continue;
        }
        std::printf("ablation %s %-24s accuracy %.3f (baseline %.3f)  ROUGE-L F %.3f (baseline %.3f)\n",
                    si == 0 ? "heads  " : "control", format_heads(sets[si]).c_str(), sum.abl_acc[si], base_acc,
                    sum.abl_rougeL[si], base_rl);
    }
    if (const auto& d = scan.decoding()) {
        double base_margin = 0;
        for (const auto& t : d->trials[0]) base_margin += t.base_margin;
        base_margin /= std::max<size_t>(1, d->trials[0].size());
        for (size_t s = 0; s < d->sets.size(); ++s) {
            double acc = 0, rl = 0, mg = 0;
            for (const auto& t : d->trials[s]) acc += t.result.passed, rl += t.result.rougeL_f, mg += t.answer_margin;
            const double n = std::max<size_t>(1, d->trials[s].size());
            std::printf("decoding %s %s %-24s accuracy %.3f (greedy %.3f)  ROUGE-L F %.3f  answer margin %+.3f (greedy %+.3f)\n",
                        name_in(combine_rule_names(), d->spec.rule), s == 0 ? "heads  " : "control",
                        d->spec.rule == CombineRule::kJuice ? "(enhance/suppress)" : format_heads(d->sets[s]).c_str(),
                        acc / n, sum.accuracy, rl / n, mg / n, base_margin);
        }
    }
}

// --decoding decore|juice: every trial decoded under the rule (DeCoRe: the named heads, then
// --random-controls random sets of the same size drawn by --seed + 3 from the other heads).
static void run_decoding_pass(const RetrievalOptions& o, const RetrievalPlan& p, const Model& m, const NeedleTest& test,
                              NeedleScan& scan, const std::function<void()>& tick) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    NeedleScan::DecodingPass d;
    d.control_seed = p.proto.seed + 3;
    if (p.decoding == CombineRule::kDecore) {
        d.spec = decore_from(o.dec, L, H);
        const auto& heads = d.spec.rows[1].heads;
        d.sets = {heads};
        for (auto& s : with_flag("--random-controls", [&] {
                 return random_head_sets(L, H, heads, o.random_controls, static_cast<uint64_t>(d.control_seed));
             }))
            d.sets.push_back(s);
    } else {
        d.spec = juice_from(o.dec, L, H);
        d.sets = {d.spec.enhance};
    }
    for (const auto& set : d.sets) {
        DecodingSpec spec = d.spec;
        if (spec.rule == CombineRule::kDecore) spec.rows[1].heads = set;
        d.trials.push_back(test.run_decoding(spec, tick));
    }
    scan.set_decoding(std::move(d));
}

void run_retrieval(const RetrievalOptions& o, bool range_given) {
    const RetrievalPlan p = plan_retrieval(o, range_given);
    auto lm = open_model(o.model, true);
    const Model& m = *lm.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    // A length whose context alone exceeds the model's positions is refused before any haystack is
    // lengthened to it or trial built.
    for (auto len : p.cfg.lengths)
        if (m.config.max_seq_len > 0 && len - p.proto.buffer > m.config.max_seq_len)
            throw UsageError(fmt::format("--lengths: length {}: {} context tokens in the prompt are beyond the model's "
                                         "context of {}",
                                         len, len - p.proto.buffer, m.config.max_seq_len));
    const NeedleInputs in = read_needle_inputs(o, p, m, *lm.tokenizer);
    std::vector<Head> ablate_heads;
    at::Tensor from_score;
    if (!o.ablate.empty()) ablate_heads = with_flag("--ablate", [&] { return parse_head_list(o.ablate, L, H); });
    if (o.ablate_top > L * H) throw UsageError(fmt::format("--ablate-top {}: the model has {} heads", o.ablate_top, L * H));
    if (!o.from.empty()) from_score = with_flag("--from", [&] { return read_head_score(split_head_score_ref(o.from), L, H); });
    at::Tensor stream_score;
    std::string stream_source;
    if (o.stream_sweep) stream_score = stream_order_score(o, m, p.want_ret, p.want_locos, p.want_r2, &stream_source);
    std::optional<KvComparePlan> kv_plan;  // every file read and flag checked before anything is written
    if (o.kv.on())
        kv_plan = plan_kv_compare(o.kv, m, RunScores{p.want_ret, p.want_locos, p.want_r2}, o.random_orders, o.sweep_rows,
                                  static_cast<uint64_t>(p.proto.seed), o.razor_preset);

    NeedleConfig cfg = p.cfg;
    cfg.max_positions = m.config.max_seq_len;
    const NeedleTest test = with_flag("--lengths", [&] {
        return NeedleTest(m, *lm.tokenizer, TrialBuilder(*lm.tokenizer, p.proto, in.facts, in.needles, in.needles_path, in.haystacks),
                          cfg);
    });
    const int64_t N = static_cast<int64_t>(test.trials().size());

    // ---- the output: refuse early, or pick up what a killed run of this scan finished ----
    const std::string& out = o.out.out;
    const bool resuming = o.resume && file_exists(out);
    if (file_exists(out) && !o.resume && p.mode == WriteMode::kCreate)
        throw StorageError(fmt::format("{}: exists (use --resume to continue it, --force to replace it or --append to add to it)", out));
    { ResultWriter probe = open_result(out, resuming ? WriteMode::kAppend : p.mode); }  // fails now (unwritable) rather than after the trials
    Attrs params = needle_params(o, p, in, N);
    std::unique_ptr<NeedleResults> prev = resuming ? load_needle_resume(out, params, p.shard, m) : nullptr;
    if (prev) {
        int64_t had = 0;
        for (auto d : prev->done) had += d;
        for (auto d : prev->abl_done) had += d;
        log_info(fmt::format("resuming {}: {} decodes already done", out, had));
    }
    NeedleScan scan(o, p, m, test, std::move(params), std::move(prev), resuming);

    // Ablation sets known before the trials (--ablate, --ablate-top K --from FILE); else chosen by
    // this run's scores after the baseline pass.
    const bool sets_first = p.ablating && !(o.ablate_top > 0 && o.from.empty());
    auto choose_sets = [&](const NeedleSummary* scored_here) {
        if (o.ablate_top == 0) return scan.choose_sets(ablate_heads, "--ablate");
        const at::Tensor& src = from_score.defined() ? from_score
                                : p.want_locos        ? scored_here->locos
                                : p.want_ret          ? scored_here->ret
                                                      : scored_here->r2;  // --score r2 alone: ranked by R2
        const std::string own = p.want_locos ? "locos" : p.want_ret ? "retrieval" : "r2";
        scan.choose_sets(top_heads(src, o.ablate_top), !o.from.empty() ? o.from : "this run: scores/" + own + "/score");
    };
    if (sets_first) choose_sets(nullptr);

    const int64_t n_sets_planned = scan.n_sets_planned();
    const bool calibrate = p.ablating && p.ablation == Intervention::kMeanQuery;
    const int64_t n_calib = calibrate ? std::min(o.calibration_trials, N) : 0;
    int64_t planned = n_calib + scan.owned_decodes(n_sets_planned);
    if (p.decoding != CombineRule::kIndependent)
        planned += N * (p.decoding == CombineRule::kDecore ? 1 + o.random_controls : 1);
    Progress prog("needle trials", planned);
    auto tick = [&prog] { prog.tick(); };

    // ---- the baseline pass: both scores from one decode per trial ----
    if (p.ablating && scan.rows_mode() && !test.separate_ablation_trials()) {  // the ablation rows decode from the scan's prefills
        std::vector<char> owned(static_cast<size_t>(N), 0);
        const auto& batches = test.ablation_batches();
        for (int64_t g = 0; g < static_cast<int64_t>(batches.size()); ++g)
            if (scan.owns(0, g))
                for (auto i : batches[static_cast<size_t>(g)]) owned[static_cast<size_t>(i)] = 1;
        test.keep_scan_prefills([&owned](int64_t i) { return owned[static_cast<size_t>(i)] != 0; });
    }
    scan.run_pass(-1, nullptr, tick);
    NeedleSummary sum = summarize(scan.results(), o.bootstrap, static_cast<uint64_t>(p.proto.seed), o.flag_threshold, p.proto.rng);
    if (p.shard.count == 1) {
        if (sum.n_pass == 0) log_warn(fmt::format("no trial passed (ROUGE-1 recall > {}): the head scores are NaN", o.pass_threshold));
        else if (p.want_locos && sum.n_locos == 0) log_warn("no passing trial generated the answer's tokens: the LOCOS scores are NaN");
    }

    // ---- ablation: mean-query calibration (over the whole grid, the same in every shard), then the sets ----
    if (calibrate) scan.calibrate(n_calib, tick);
    if (p.ablating && !sets_first) choose_sets(&sum);
    std::vector<HeadSet> sets;
    for (const auto& heads : scan.sets()) sets.push_back(HeadSet{heads, p.ablation, scan.q_mean(), o.window});
    if (scan.rows_mode()) {
        scan.run_sets_pass(sets, tick);
    } else {
        for (size_t si = 0; si < sets.size(); ++si) scan.run_pass(static_cast<int64_t>(si), &sets[si], tick);
    }
    if (p.decoding != CombineRule::kIndependent) run_decoding_pass(o, p, m, test, scan, tick);
    prog.finish();
    if (const auto [reused, computed] = test.prefix_stats(); reused > 0)
        log_info(fmt::format("prefill: {} of {} prompt positions ({:.0f}%) taken from kept prefills "
                             "(--no-prefix-reuse prefills every trial whole)",
                             reused, reused + computed, 100.0 * static_cast<double>(reused) / static_cast<double>(reused + computed)));
    {
        const auto& t = test.times();
        log_info(fmt::format("time: prefill {:.2f} s, decode steps {:.2f} s, scoring {:.2f} s", t.prefill, t.decode, t.score));
    }
    scan.write(scan.n_sets_planned());
    sum = summarize(scan.results(), o.bootstrap, static_cast<uint64_t>(p.proto.seed), o.flag_threshold, p.proto.rng);
    if (p.proto.protocol != Protocol::kHeadscope || o.given.count("--protocol"))
        std::printf("%s\n", protocol_line(p.proto, in.facts.rule_ids).c_str());
    print_needle_summary(p, scan, sum, o.flag_threshold, L, H);
    if (o.stream_sweep) run_stream_sweep(o, test, m, sum, out, stream_score, stream_source, p.proto.seed);
    if (kv_plan) run_kv_compare_args(*kv_plan, test, m, *lm.tokenizer, sum, out, o.kv);
    log_info(fmt::format("wrote {} ({} trials{})", out, sum.n_done, p.shard.count > 1 ? ", shard " + p.shard.str() : ""));
}

// The trial grid and how each trial is built, decoded, stopped and judged.
static void add_trial_options(CLI::App* sub, RetrievalOptions* o) {
    sub->add_option("--score", o->scores, "comma-separated: retrieval,locos,r2 (r2: HeadKV's retrieval-reasoning score)")
        ->capture_default_str();
    sub->add_option("--protocol", o->protocol,
                    "how trials are built, decoded and stopped: headscope (token space, exact spans), wu (Retrieval_Head's "
                    "retrieval_head_detection.py and needle_in_haystack_with_mask.py as they run), locos (LOCOS's "
                    "logit_contrib.py scan and nolima_ablation.py ablation runs); each choice below overrides it "
                    "(docs/needle-protocols.md)")
        ->capture_default_str();
    sub->add_option("--haystack", o->haystack, "plain text, repeated to fill each length (default datasets/needles/haystack.txt)");
    sub->add_option("--haystack-dir", o->haystack_dir,
                    "a reference repository's haystack folder (haystack_for_detect/: needles.jsonl, part1/ part2/ ... "
                    "one per needle): the needles from its needles.jsonl unless --needles, needle i's haystack from part<i+1>/");
    sub->add_option("--needles", o->needles,
                    "JSON lines {\"needle\", \"question\", \"answer\" (or \"real_needle\")} (default "
                    "datasets/needles/needles.jsonl, or --haystack-dir's needles.jsonl)");
    sub->add_option("--template", o->tmpl,
                    "prompt with {context} and {question} placeholders; special tokens written in it (a chat format: "
                    "docs/needle-protocols.md has Llama-3, Qwen and Gemma's) are tokens under --protocol wu|locos")
        ->capture_default_str();
    sub->add_option("--ablation-template", o->ablation_template,
                    "the ablated and decoding passes' template (default --template; LOCOS's ablation runs apply the "
                    "model's chat format, its scan does not)");
    sub->add_option("--buffer", o->buffer, "context tokens left free: a length's context is length - buffer (wu, locos: 200)");
    sub->add_option("--assembly", o->assembly,
                    "tokens (headscope), text (wu: encode/decode round trips), tracked (locos's scan), joined (locos's "
                    "ablation runs)");
    sub->add_option("--ablation-assembly", o->ablation_assembly, "the ablated and decoding passes' assembly, or same (locos: joined)");
    sub->add_option("--ablation-max-new-tokens", o->ablation_max_new_tokens,
                    "the ablated and decoding passes' steps at most (default --max-new-tokens; locos: 100)");
    sub->add_option("--insertion", o->insertion,
                    "sentence-end (after . ! ? or a newline), period (wu: the \".\" pieces), encoded-period (locos: "
                    "encode(\".\"))");
    sub->add_option("--answer-span", o->answer_span,
                    "the span retrieval credits: decoded (exact, in the needle), wu (the first prompt window with > 90% "
                    "token overlap; none: no credit), locos (the same over whole windows, else the needle)");
    sub->add_option("--stop-order", o->stop_order, "before: a stop token is not kept; after: kept and scored, then stop (wu)");
    sub->add_option("--stop-ids", o->stop_ids, "more token ids that end a response, e.g. 144 (Retrieval_Head's literal id)");
    sub->add_option("--haystack-format", o->haystack_format,
                    "--haystack-dir's files: raw (text as is, wu) or rows (p1.plain.txt, else p1.txt's JSON rows, locos)");
    sub->add_option("--haystack-repeat", o->haystack_repeat,
                    "tokens (cycle the tokens), concat (append the text until it has max(lengths) words, wu), double "
                    "(text += \"\\n\\n\" + text until then, locos)");
    sub->add_option("--rng", o->rng,
                    "headscope (std::mt19937_64) or reference (locos: numpy RandomState bootstrap, Python random "
                    "calibration sample)");
    sub->add_flag("--dump-steps", o->dump_steps,
                  "also write each decode step's credit, L+ and L- per head (/retrieval/steps; an audit of the scores)");
    sub->add_option("--lengths", o->lengths, "context lengths in tokens (haystack + needle)")->capture_default_str();
    sub->add_option("--lengths-range", o->lengths_range, "START:END:N = round(linspace(START, END, N))");
    sub->add_option("--depths", o->depths, "needle depths in percent of the context")->capture_default_str();
    sub->add_option("--max-new-tokens", o->max_new_tokens, "greedy steps at most (see --stop)")
        ->check(at_least(1))
        ->capture_default_str();
    sub->add_option("--stop", o->stop,
                    "newline: a token that decodes to exactly \"\\n\" or EOS ends the response; eos: EOS only; none: run "
                    "--max-new-tokens steps; wu: the newline token (<0x0A>, or one decoding to exactly \"\\n\"), never "
                    "EOS; locos: <0x0A>, encode(\"\\n\")'s last token, the tokenizer's and generation_config.json's EOS")
        ->capture_default_str();
    sub->add_option("--pass-threshold", o->pass_threshold, "a trial passes when ROUGE-1 recall > this")
        ->check(in_range(0, 1))
        ->capture_default_str();
    sub->add_option("--flag-threshold", o->flag_threshold, "retrieval heads: score > this")->capture_default_str();
    sub->add_option("--seed", o->seed, "bootstrap and random-control seed")->capture_default_str();
}

// Prefill reuse, memory and batching, and the bootstrap.
static void add_work_options(CLI::App* sub, RetrievalOptions* o) {
    sub->add_flag("--no-prefix-reuse", o->no_prefix_reuse,
                  "prefill every trial whole; by default a trial takes the positions it shares with an earlier trial "
                  "from its kept prefill (bit for bit what it would compute; --prefix-cache-mib bounds them)");
    sub->add_option("--prefix-cache-mib", o->prefix_cache_mib,
                    "the trials' kept prefills (reused by the trials that share their prefixes, and the scan's by the "
                    "ablation rows) take at most this many MiB, the least recently used dropped first")
        ->check(at_least(1))
        ->capture_default_str();
    sub->add_option("--prefill-chunk", o->prefill_chunk, "query rows per prefill forward (memory O(chunk x T))")
        ->check(at_least(1))
        ->capture_default_str();
    sub->add_option("--batch", o->batch, "trials of equal prompt length decoded together (memory x batch)")
        ->check(at_least(1))
        ->capture_default_str();
    sub->add_option("--bootstrap", o->bootstrap, "LOCOS bootstrap resamples over trials")
        ->check(at_least(0))
        ->capture_default_str();
}

// Ablated reruns, their controls, shards and checkpoints.
static void add_ablation_options(CLI::App* sub, RetrievalOptions* o) {
    sub->add_option("--ablate", o->ablate, "heads to ablate, e.g. L1H0,L2H3");
    sub->add_option("--ablation", o->ablation, "zero-query, mean-query, zero or stream (--sink, --recent)")->capture_default_str();
    sub->add_option("--ablate-top", o->ablate_top,
                    "ablate the top K heads of --from (default: this run's LOCOS score, else retrieval)")
        ->check(at_least(0));
    sub->add_option("--from", o->from, "FILE.h5:DATASET with an [L, H] score, e.g. scores.h5:scores/locos/score");
    sub->add_option("--random-controls", o->random_controls, "random head sets of the same size, excluding the ablated heads")
        ->check(at_least(0))
        ->capture_default_str();
    sub->add_option("--calibration-trials", o->calibration_trials,
                    "mean-query: trials drawn by --seed from the grid whose pre-RoPE queries are averaged (prefill only, "
                    "at most 5000 tokens each, each prompt weighing equally: LOCOS's nolima_ablation.py)")
        ->check(at_least(1))
        ->capture_default_str();
    sub->add_option("--ablation-scope", o->ablation_scope,
                    "all: ablate in the prefill and every decode step (LOCOS, nolima_ablation.py); decode: decode "
                    "steps only (Wu et al., needle_in_haystack_with_mask.py)")
        ->capture_default_str();
    sub->add_option("--shard", o->shard,
                    "I/N: this task's share of the work (batches of trials, for the baseline and each ablation set, "
                    "k % N == I); slurm: I, N from SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT; slurm/N: N given. "
                    "`headscope merge` joins the N files into what one run writes");
    sub->add_flag("--resume", o->resume, "continue --out, a file a killed run of the same scan (and shard) left: its done trials are kept");
    sub->add_option("--checkpoint-seconds", o->checkpoint_seconds,
                    "rewrite --out (atomically) after a batch when this long has passed since the last write (0: every batch)")
        ->check(at_least(0))
        ->capture_default_str();
}

// Streaming windows, the stream sweep and the decoding rows.
static void add_stream_options(CLI::App* sub, RetrievalOptions* o) {
    sub->add_option("--sink", o->window.sink, "stream: the first keys a streaming head sees")->capture_default_str();
    sub->add_option("--recent", o->window.recent, "stream: the last keys up to and including the query")->capture_default_str();
    sub->add_flag("--compensate", o->window.compensate,
                  "stream: one more key/value per streaming head, the means of those its window hides (RazorAttention)");
    sub->add_flag("--stream-sweep", o->stream_sweep,
                  "after the scan: for each --full-fractions rho the top rho of heads by --order keep full attention, "
                  "the rest stream (--sink, --recent); also --random-orders random orders; writes /retrieval/streaming");
    sub->add_option("--order", o->order,
                    "stream sweep: locos, retrieval or r2 (this run's score), FILE.h5:DATASET (an [L, H] score), or razor")
        ->capture_default_str();
    sub->add_option("--razor-preset", o->razor_preset,
                    "--order razor: headscope (its own scores and order), reference (golden-stick's scoring and "
                    "selection as it runs, quirks included) or paper (the same, echo and induction heads' full union)")
        ->capture_default_str();
    sub->add_option("--full-fractions", o->full_fractions, "stream sweep: fractions of heads kept full")->capture_default_str();
    sub->add_option("--random-orders", o->random_orders, "stream sweep: random head orders (controls, seeded by --seed)")
        ->capture_default_str();
    sub->add_option("--sweep-rows", o->sweep_rows,
                    "stream sweep: batch rows of one forward, (head set, trial) pairs: the head sets of a batch of "
                    "--batch trials decode together (memory: KV cache x rows)")
        ->capture_default_str()
        ->check(at_least(1));
    sub->add_option("--decoding", o->decoding,
                    "greedy, or also decode every trial under DeCoRe (decore: --contrast HEADS --alpha entropy|F "
                    "[--alpha-max X], with --random-controls N random contrast sets) or JUICE (juice: --enhance/--suppress "
                    "HEADS with --alpha-enhance/--alpha-suppress), written to /retrieval/decoding (headscope generate "
                    "--help says how each decodes)")
        ->capture_default_str();
    add_decoding_args(sub, o->dec);
    sub->add_option("--pause-after-batch", o->pause_ms, "testing: sleep this many ms after each checkpoint")->group("");

}

void setup_retrieval(CLI::App& app) {
    auto o = std::make_shared<RetrievalOptions>();
    auto* sub = app.add_subcommand(
        "retrieval",
        "needle-in-a-haystack trials: hide a needle in a haystack at each --lengths x --depths x needle, decode\n"
        "greedily, and credit heads two ways from that one decode pass:\n"
        "  retrieval (Wu et al. 2024): per step, 1/|answer| when the head's argmax key is one of the answer's\n"
        "    tokens inside the needle and equals the generated token; summed over steps (a perfect copier\n"
        "    scores 1), mean over passing trials; heads above 0.1 flagged.\n"
        "  locos: per answer step, L+ - L- with phi_{t,j} = alpha_{t,j} u_y^T W_O^h v_j (L+ over the needle,\n"
        "    L- over the other keys scaled by n/(K-n)); mean over steps then passing trials, bootstrap 95% CI.\n"
        "  r2 (HeadKV, --score r2): per step, (1/N) x the weights of the head's top N keys (N = |answer|) that\n"
        "    lie in the answer; summed over the first |answer tokens| steps, mean over passing trials.\n"
        "A trial passes when the ROUGE-1 recall of the answer in the response is > --pass-threshold (ROUGE as\n"
        "rouge_score computes it with use_stemmer=True, as both reference codes do).\n"
        "--ablate / --ablate-top rerun the trials with heads ablated (zero-query = uniform attention over the\n"
        "prefix; mean-query = LOCOS's pre-RoPE mean query; zero = output zeroed) and --random-controls N random\n"
        "sets excluding them; --ablation-scope all (LOCOS: every forward) or decode (Wu et al.: decode steps).\n"
        "Example: headscope retrieval ../shared/testdata/tinystories-656k --haystack datasets/needles/tinystories_haystack.txt "
        "--needles datasets/needles/tinystories_needles.jsonl --lengths 100,200 --depths 0,50,100 --max-new-tokens 8 --out needle.h5\n"
        "The same trials as Retrieval_Head's retrieval_head_detection.py builds them (buffer 200, text round trips, period "
        "insertion, score then stop on the newline token):\n"
        "Example: headscope retrieval ../shared/testdata/tinystories-656k --protocol wu --haystack "
        "datasets/needles/tinystories_haystack.txt --needles datasets/needles/tinystories_wu_needles.jsonl --lengths 300,400 "
        "--depths 0,50,100 --max-new-tokens 8 --out needle-wu.h5\n"
        "A study as one reviewable file (keys: these options without the dashes; the command line wins over it):\n"
        "Example: headscope retrieval --config datasets/needles/toy-recall-study.yaml --out needle-study.h5\n"
        "Shards (a Slurm job array: --shard slurm; scripts/slurm/), joined by `headscope merge` into what one run writes:\n"
        "Example: headscope retrieval models/toy-recall --haystack datasets/needles/toy_recall_haystack.txt "
        "--needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' --lengths 24,40 "
        "--max-new-tokens 1 --ablate L1H0,L1H1 --random-controls 2 --shard 0/2 --out needle.shard-0-of-2.h5\n"
        "Example: headscope retrieval models/toy-recall --haystack datasets/needles/toy_recall_haystack.txt "
        "--needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' --lengths 24,40 "
        "--max-new-tokens 1 --ablate L1H0,L1H1 --random-controls 2 --shard 1/2 --out needle.shard-1-of-2.h5\n"
        "Streaming heads (DuoAttention): the top heads by LOCOS keep full attention, the others see 1 sink + 4 recent keys:\n"
        "Example: headscope retrieval models/toy-recall --haystack datasets/needles/toy_recall_haystack.txt "
        "--needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' --lengths 48,96 "
        "--max-new-tokens 1 --stream-sweep --order locos --sink 1 --recent 4 --full-fractions 0,0.25,0.5,1 --out stream.h5\n"
        "KV-cache policies at equal memory (uniform SnapKV, HeadKV by R2, RazorAttention, streaming by LOCOS), the context "
        "compressed before the question:\n"
        "Example: headscope retrieval models/toy-recall --haystack datasets/needles/toy_recall_haystack.txt "
        "--needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' --lengths 48,80,120 "
        "--max-new-tokens 1 --score locos,r2 --kv-compare full,snapkv,headkv,razor,stream:locos --kv-budgets 0.2,0.42,1 "
        "--kv-compress-at question --duo-window 1,4 --razor-window 1,3 --snapkv-window 2 --snapkv-kernel 1 "
        "--random-orders 3 --out kv.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    add_trial_options(sub, o.get());
    add_work_options(sub, o.get());
    add_ablation_options(sub, o.get());
    add_stream_options(sub, o.get());
    add_kv_compare_args(sub, o->kv);
    add_study_config(app, sub);
    sub->callback([o, sub] {
        const auto* range = sub->get_option("--lengths-range");
        if (range->count() > 0 && sub->get_option("--lengths")->count() > 0) throw UsageError("give at most one of --lengths and --lengths-range");
        for (const auto* opt : sub->get_options())
            if (opt->count() > 0) o->given.insert(opt->get_name());
        run_retrieval(*o, range->count() > 0);
    });
}

}  // namespace hs::cli
