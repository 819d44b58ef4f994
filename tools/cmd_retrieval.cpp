// headscope retrieval: needle-in-a-haystack trials scored as retrieval heads (Wu et al. 2024),
// LOCOS and R2 from one greedy decode pass each, with query ablation and random controls. The flags
// become a NeedleStudySpec; the study (probes/needle/needle_study.h) runs the scan and writes the file;
// this file prints. Methods: docs/methods.md ("Retrieval heads and LOCOS"); output: docs/hdf5-schema.md
// (schema::retrieval()).
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "kv_compare_args.h"
#include "decoding_args.h"
#include "needle_print.h"
#include "needle_study.h"
#include "progress.h"
#include "schema.h"
#include "study_config.h"
#include "util.h"

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <optional>
#include <set>

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
    int64_t prefill_chunk = DecodeSettings{}.prefill_chunk;
    int64_t bootstrap = 1000;
    std::string ablate;
    std::string ablation = "zero-query";
    int64_t ablate_top = 0;
    std::string from;
    int64_t random_controls = 0;
    int64_t calibration_trials = 50;
    std::string ablation_scope = "all";
    std::string stop = "newline";
    std::string batch = "auto";  // or N (auto_needle_batching)
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
    // --order razor's and --kv-compare razor's scoring and selection (probes/needle/kv/razor.h, RazorPreset):
    // golden-stick's by default (issue 43), headscope's own as a named preset.
    std::string razor_preset = "reference";
    std::string full_fractions = "0,0.05,0.1,0.25,0.5,1";
    int64_t random_orders = 3;
    std::string sweep_rows = "auto";  // or N
    KvCompareArgs kv;  // --kv-compare (tools/kv_compare_args.h)
};

// --batch / --sweep-rows: "auto" (nullopt) or a positive count.
static std::optional<int64_t> parse_rows(const std::string& text, const char* flag) {
    if (text == "auto") return std::nullopt;
    const auto v = parse_int64(text);
    if (!v || *v < 1) throw UsageError(fmt::format("{}: '{}' is not auto or a count of at least 1", flag, text));
    return *v;
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
        out = with_flag({{"--lengths", "lengths"}}, [&] { return parse_needle_int_list(o.lengths, "lengths"); });
    }
    with_flag({{"--lengths", "lengths"}}, [&] { check_needle_lengths(out); });
    return out;
}

// The window flags, checked before the model loads.
static void check_stream_options(const RetrievalOptions& o, const jobs::Shard& shard, NeedleStudySpec& s) {
    if (o.window.sink < 0) throw UsageError(fmt::format("--sink: {} is negative", o.window.sink));
    if (o.window.recent < 1) throw UsageError(fmt::format("--recent: {} must be at least 1 (the query sees itself)", o.window.recent));
    if (o.kv.on() && shard.count > 1) throw UsageError("--kv-compare: not sharded (run it unsharded)");
    if (o.kv.on() && o.random_orders < 0) throw UsageError("--random-orders: need >= 0");
    with_flag("--razor-preset", [&] { return parse_razor_preset(o.razor_preset); });  // before the model loads
    if (!o.stream_sweep) return;
    if (shard.count > 1) throw UsageError("--stream-sweep: not sharded (run it unsharded, or on a merged scan's --order file)");
    if (o.random_orders < 0) throw UsageError("--random-orders: need >= 0");
    s.full_fractions = with_flag({{"--full-fractions", "full_fractions"}}, [&] { return parse_full_fractions(o.full_fractions); });
    s.random_orders = o.random_orders;
}

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

// What the command line asks for, parsed and cross-checked (single-flag ranges are CLI11 checks in
// setup_retrieval), as the study's spec; what needs the model (heads, scores read from files, the
// decoding rows, the stream order) is filled by run_retrieval.
static NeedleStudySpec plan_retrieval(const RetrievalOptions& o, bool range_given) {
    NeedleStudySpec p;
    p.scores = with_flag("--score", [&] { return parse_needle_scores(o.scores); });
    p.scores_text = o.scores;
    p.mode = write_mode(o.out);
    p.out = o.out.out;
    p.proto = resolve_protocol(o);
    p.record_protocol = p.proto.protocol != Protocol::kHeadscope || o.given.count("--protocol");
    p.needles = o.needles, p.haystack = o.haystack, p.haystack_dir = o.haystack_dir, p.tmpl = o.tmpl;
    p.flag_threshold = o.flag_threshold, p.bootstrap = o.bootstrap;
    p.ablate_top = o.ablate_top, p.from = o.from, p.random_controls = o.random_controls;
    p.calibration_trials = o.calibration_trials, p.window = o.window;
    p.sweep_rows = parse_rows(o.sweep_rows, "--sweep-rows").value_or(8);
    p.resume = o.resume, p.checkpoint_seconds = o.checkpoint_seconds, p.pause_ms = o.pause_ms;
    NeedleConfig& c = p.cfg;
    c.tmpl = with_flag("--template", [&] { return parse_template(o.tmpl); });
    c.ablation_tmpl = o.ablation_template.empty() ? c.tmpl : with_flag("--ablation-template", [&] { return parse_template(o.ablation_template); });
    c.lengths = parse_lengths(o, range_given);
    c.depths = with_flag({{"--depths", "depths"}}, [&] { return parse_needle_depths(o.depths); });
    c.pass_threshold = o.pass_threshold;
    c.batch = parse_rows(o.batch, "--batch").value_or(1);
    c.decode.max_new_tokens = p.proto.max_new_tokens, c.decode.prefill_chunk = o.prefill_chunk;
    c.decode.keep_stop = p.proto.stop_order == StopOrder::kAfter;
    c.ablation_max_new_tokens = p.proto.ablation_max_new_tokens;
    c.decode.reuse_prefix = !o.no_prefix_reuse;
    c.decode.scope = p.proto.scope;
    c.keep_steps = o.dump_steps;
    c.prefix_max_bytes = o.prefix_cache_mib << 20;
    if (p.proto.max_new_tokens < 1 || p.proto.ablation_max_new_tokens < 1)
        throw UsageError("--max-new-tokens / --ablation-max-new-tokens: need at least 1");
    if (!o.stop_ids.empty())
        p.extra_stop_ids = with_flag({{"--stop-ids", "stop_ids"}}, [&] { return parse_needle_int_list(o.stop_ids, "stop_ids"); });
    if (!o.haystack.empty() && !o.haystack_dir.empty()) throw UsageError("give at most one of --haystack and --haystack-dir");
    if (!o.ablate.empty() && o.ablate_top > 0) throw UsageError("give at most one of --ablate and --ablate-top");
    if (!o.from.empty() && o.ablate_top == 0) throw UsageError("--from needs --ablate-top K");
    p.ablating = !o.ablate.empty() || o.ablate_top > 0;
    if (o.random_controls > 0 && !p.ablating && o.decoding != "decore")
        throw UsageError("--random-controls needs --ablate, --ablate-top or --decoding decore");
    // LOCOS's ablation runs default to the mean query (nolima_ablation.py --ablation-mode mean).
    const std::string ablation = o.given.count("--ablation") || p.proto.protocol != Protocol::kLocos ? o.ablation : "mean-query";
    p.ablation = with_flag("--ablation", [&] { return parse_intervention(ablation, "ablation", needle_ablations()); });
    if (!o.shard.empty()) p.shard = jobs::parse_shard(o.shard);
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
    check_stream_options(o, p.shard, p);
    return p;
}

// --order for --stream-sweep, resolved before the scan (a bad file fails before anything is
// written): this run's score (known after the scan: undefined here), razor's, or a file's.
static at::Tensor stream_order(const RetrievalOptions& o, const Model& m, NeedleStudySpec& s, std::string* source) {
    StreamOrderSpec& ord = s.order;
    ord.kind = StreamOrderSpec::Kind::kFile, ord.file = o.order;
    for (const auto& row : needle_scores())
        if (o.order == row.name) ord.kind = StreamOrderSpec::Kind::kRunScore, ord.score = row.id;
    if (ord.kind == StreamOrderSpec::Kind::kRunScore && !s.scores.has(ord.score))
        throw UsageError(fmt::format("--order {}: this run does not compute it (see --score)", o.order));
    if (o.order == "razor") {
        ord.kind = StreamOrderSpec::Kind::kRazor;
        ord.preset = with_flag("--razor-preset", [&] { return parse_razor_preset(o.razor_preset); });
    }
    if (ord.kind != StreamOrderSpec::Kind::kFile) return stream_order_score(ord, m, source);
    return with_flag("--order", [&] { return stream_order_score(ord, m, source); });
}

void run_retrieval(const RetrievalOptions& o, bool range_given) {
    NeedleStudySpec p = plan_retrieval(o, range_given);
    auto lm = open_model(o.model, true);
    const Model& m = *lm.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    const NeedleInputs in = with_flag({{"--lengths", "lengths"}, {"--stop-ids", "stop_ids"}},
                                      [&] { return read_needle_inputs(p, m, *lm.tokenizer); });
    if (!o.ablate.empty()) p.ablate_heads = with_flag("--ablate", [&] { return parse_head_list(o.ablate, L, H); });
    if (o.ablate_top > L * H) throw UsageError(fmt::format("--ablate-top {}: the model has {} heads", o.ablate_top, L * H));
    if (!o.from.empty()) p.from_score = with_flag("--from", [&] { return read_head_score(split_head_score_ref(o.from), L, H); });
    {  // rows of one decode forward, from the grid, the model and the memory (printed)
        const auto b = auto_needle_batching(p, m, in, o.batch == "auto", o.sweep_rows == "auto", free_cache_memory(m));
        p.cfg.batch = b.batch, p.sweep_rows = b.sweep_rows;
        if (!b.note.empty()) log_info(b.note);
    }
    at::Tensor stream_score;
    std::string stream_source;
    if (o.stream_sweep) stream_score = stream_order(o, m, p, &stream_source);
    std::optional<KvComparePlan> kv_plan;  // every file read and flag checked before anything is written
    if (o.kv.on())
        kv_plan = plan_kv_compare(o.kv, m, p.scores, o.random_orders, p.sweep_rows, static_cast<uint64_t>(p.proto.seed),
                                  o.razor_preset);
    const auto test = with_flag({{"--lengths", ""}, {"--score", "scores"}}, [&] { return make_needle_test(p, m, *lm.tokenizer, in); });

    // ---- the output: refuse early, or pick up what a killed run of this scan finished ----
    const std::string& out = p.out;
    const bool resuming = o.resume && file_exists(out);
    if (file_exists(out) && !o.resume && p.mode == WriteMode::kCreate)
        throw StorageError(fmt::format("{}: exists (use --resume to continue it, --force to replace it or --append to add to it)", out));
    { ResultWriter probe = open_result(out, resuming ? WriteMode::kAppend : p.mode); }  // fails now (unwritable) rather than after the trials
    if (p.decoding == CombineRule::kDecore) p.decoding_spec = decore_from(o.dec, L, H);
    if (p.decoding == CombineRule::kJuice) p.decoding_spec = juice_from(o.dec, L, H);
    auto meta = [&m, seed = p.proto.seed](ResultWriter& w) {
        if (w.exists(schema::meta())) check_same_model(w, m);
        write_meta(w, m, seed);
    };
    std::unique_ptr<NeedleStudy> study;
    try {
        study = std::make_unique<NeedleStudy>(p, m, *test, in, meta);
        if (kv_plan)  // a resumed comparison is read now: the scan rewrites /retrieval
            prepare_kv_compare(&*kv_plan, *test, m, *lm.tokenizer, o.kv, {p.out, p.checkpoint_seconds, p.pause_ms, {}}, o.resume);
    } catch (const StorageError& e) {  // another scan's file: the flag that starts over
        if (e.param() != "resume") throw;
        throw StorageError(std::string(e.what()) + " (--force starts over)", e.param());
    }
    with_flag({{"--random-controls", "random_controls"}}, [&] { study->run(); });
    const NeedleSummary sum = study->summary();
    if (p.record_protocol) std::printf("%s\n", needle_protocol_line(p.proto, in.facts.rule_ids).c_str());
    print_needle_summary(p, *study, sum, L, H);
    if (o.stream_sweep)
        print_stream_sweep(p, run_needle_stream_sweep(p, *test, m, sum, stream_score, stream_source), stream_source, sum);
    if (kv_plan) run_kv_compare_args(*kv_plan, *test, m, sum, out);
    log_info(fmt::format("wrote {} ({} trials{})", out, sum.n_done, p.shard.count > 1 ? ", shard " + p.shard.str() : ""));
}


// The trial grid and how each trial is built, decoded, stopped and judged.
static void add_trial_options(CLI::App* sub, RetrievalOptions* o) {
    sub->add_option("--score", o->scores, "comma-separated: retrieval,locos,r2,qrhead (r2: HeadKV's retrieval-reasoning score; qrhead: QRHead's "
                    "query-focused score, two more forwards of the question a trial)")
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
        ->check(at_least(1))->capture_default_str();
    sub->add_option("--stop", o->stop,
                    "newline: a token that decodes to exactly \"\\n\" or EOS ends the response; eos: EOS only; none: run "
                    "--max-new-tokens steps; wu: the newline token (<0x0A>, or one decoding to exactly \"\\n\"), never "
                    "EOS; locos: <0x0A>, encode(\"\\n\")'s last token, the tokenizer's and generation_config.json's EOS")
        ->capture_default_str();
    sub->add_option("--pass-threshold", o->pass_threshold, "a trial passes when ROUGE-1 recall > this")
        ->check(in_range(0, 1))->capture_default_str();
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
        ->check(at_least(1))->capture_default_str();
    sub->add_option("--prefill-chunk", o->prefill_chunk, "prompt positions per prefill forward (more: faster GEMMs, activations O(chunk x d_ff))")
        ->check(at_least(1))->capture_default_str();
    sub->add_option("--batch", o->batch,
                    "trials decoded together, of any lengths (ragged rows; of one prompt length where rows cannot read "
                    "their prompt caches in place: LOCOS, KV policies, windows) (memory x batch); auto: the grid's trials, "
                    "at most 64 (96 / the head sets with --ablate-top or --full-ablation; without ragged rows a length's "
                    "trials, at most 16) and what half the free memory holds, cut into batches of equal size (the log "
                    "says what it chose). A trial's numbers do not depend on it")
        ->capture_default_str();
    sub->add_option("--bootstrap", o->bootstrap, "LOCOS bootstrap resamples over trials")
        ->check(at_least(0))->capture_default_str();
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
        ->check(at_least(0))->capture_default_str();
    sub->add_option("--calibration-trials", o->calibration_trials,
                    "mean-query: trials drawn by --seed from the grid whose pre-RoPE queries are averaged (prefill only, "
                    "at most 5000 tokens each, each prompt weighing equally: LOCOS's nolima_ablation.py)")
        ->check(at_least(1))->capture_default_str();
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
        ->check(at_least(0))->capture_default_str();
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
                    "--order razor and --kv-compare razor: reference (golden-stick's scoring and selection as it runs, "
                    "quirks included: the default), paper (the same, echo and induction heads' full union) or headscope "
                    "(headscope's own causal scores and rank order)")
        ->capture_default_str();
    sub->add_option("--full-fractions", o->full_fractions, "stream sweep: fractions of heads kept full")->capture_default_str();
    sub->add_option("--random-orders", o->random_orders, "stream sweep: random head orders (controls, seeded by --seed)")
        ->capture_default_str();
    sub->add_option("--sweep-rows", o->sweep_rows,
                    "stream sweep: batch rows of one forward, (head set, trial) pairs: the head sets of a batch of "
                    "--batch trials decode together (memory: KV cache x rows); auto: --batch x the head sets, at most 96 "
                    "and what half the free memory holds")
        ->capture_default_str();
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
        "  qrhead (QRHead, --score qrhead): the question's attention rows after the prefill, minus the same with\n"
        "    the question 'N/A', over the needle: the values above mean - 2 std summed; mean over the trials.\n"
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
        "KV-cache policies at equal memory (uniform SnapKV, HeadKV by R2, RazorAttention, streaming by LOCOS), at two "
        "budgets and two fixed capacities per head, the context compressed before the question:\n"
        "Example: headscope retrieval models/toy-recall --haystack datasets/needles/toy_recall_haystack.txt "
        "--needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' --lengths 48,80,120 "
        "--max-new-tokens 1 --score locos,r2 --kv-compare full,snapkv,headkv,razor,stream:locos --kv-budgets 0.2,0.42 "
        "--kv-capacity 12,40 --kv-compress-at question --duo-window 1,4 --razor-window 1,3 --snapkv-window 2 --snapkv-kernel 1 "
        "--random-orders 3 --out kv.h5\n"
        "DuoAttention deployed as its LongBench runs (scripts/run_longbench.sh: sparsity 0, 0.5, 0.75 = budgets 1, 0.5, "
        "0.25; --duo-select budget fits the groups to the budget instead), given the gates of a `headscope run` duo-gates "
        "study in duo.h5 (a fit of minutes, so not an example run by the tests):\n"
        "  headscope retrieval models/toy-recall --haystack datasets/needles/toy_recall_haystack.txt "
        "--needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' --lengths 48,96 "
        "--max-new-tokens 1 --kv-compare full,duo --duo-gates duo.h5:/ablation/duo/duo/alpha --kv-budgets 1,0.5,0.25 "
        "--duo-window 1,4 --out kv-duo.h5");
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
