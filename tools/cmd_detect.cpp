// headscope detect: pattern-based head scores (induction, previous-token, duplicate-token,
// attention-sink) and the causal induction-loss ablation, written to HDF5 (docs/hdf5-schema.md).
#include "attention_detectors.h"
#include "commands.h"
#include "common.h"
#include "lines.h"
#include "score_records.h"
#include "errors.h"
#include "heads.h"
#include "guard.h"
#include "progress.h"
#include "util.h"

#include <torch/torch.h>

#include <algorithm>

namespace hs::cli {

struct DetectOptions {
    ModelArgs model;
    OutputArgs out;
    std::string probes = "induction,previous-token,duplicate-token,attention-sink";
    int64_t seq_len = 50;
    bool seq_len_given = false;  // --seq-len on the command line: never adapted
    int64_t batch = 10;
    int64_t seed = 0;
    std::string token_range;
    std::string tokens_file, text_file;
    std::string error_measure = "mul";
    bool exclude_bos = false;
    bool exclude_current_token = false;
    bool samples = false;
    int64_t max_rows = 64;
    double sink_epsilon = 0.3;
    bool sink_epsilon_given = false;
    int64_t first_tokens = 0;  // detector: keep each sequence's first N tokens (0: all)
};

static std::vector<std::string> parse_probes(const std::string& s) {
    std::vector<std::string> out;
    const auto& valid = detector_probe_names();
    for (const auto& part : split(s, ',')) {
        auto p = trim(part);
        if (p.empty()) continue;
        if (std::find(valid.begin(), valid.end(), p) == valid.end())
            throw UsageError(fmt::format("--probe: unknown probe '{}' (valid: {})", p, fmt::join(valid, ", ")));
        if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
    if (out.empty()) throw UsageError(fmt::format("--probe: no probe named (valid: {})", fmt::join(valid, ", ")));
    return out;
}

// One sequence a line: comma-separated ids, or text encoded with the model's tokenizer (BOS added
// as the tokenizer says). Blank lines are skipped; every id and length is checked here so that
// bad input fails before any forward pass, naming the file and line.
static std::vector<std::vector<int64_t>> read_sequences(const DetectOptions& o, const Loaded& l) {
    const bool text = !o.text_file.empty();
    const std::string& file = text ? o.text_file : o.tokens_file;
    const auto& cfg = l.model->config;
    std::vector<std::vector<int64_t>> seqs;
    for_each_line(read_utf8_text_file(file), file, [&](const std::string& line, const std::string& where, int) {
        std::vector<int64_t> ids;
        if (text)
            for (auto id : l.tokenizer->encode(line, true)) ids.push_back(id);
        else
            ids = parse_token_list(line, where);
        for (auto id : ids)
            if (id < 0 || id >= cfg.vocab_size)
                throw DataError(fmt::format("{}: token id {} out of range [0, {})", where, id, cfg.vocab_size));
        if (o.first_tokens > 0) {
            // As sail-sg/Attention-Sink eval_sink_open_source.py:19-21: every sequence at least N long, cut to N.
            if (static_cast<int64_t>(ids.size()) < o.first_tokens)
                throw DataError(fmt::format("{}: --first-tokens {}: the sequence has only {} tokens", where, o.first_tokens,
                                            ids.size()));
            ids.resize(o.first_tokens);
        }
        if (static_cast<int64_t>(ids.size()) > cfg.max_seq_len)
            throw DataError(fmt::format("{}: sequence of {} tokens exceeds the model's context of {}", where,
                                        ids.size(), cfg.max_seq_len));
        seqs.push_back(std::move(ids));
        return true;
    });
    if (seqs.empty()) throw DataError(fmt::format("{}: no sequences (the file is empty)", file));
    return seqs;
}

// [N, T] int32, -1 past each sequence's end.
static std::vector<int32_t> padded(const std::vector<std::vector<int64_t>>& seqs, int64_t T) {
    std::vector<int32_t> out(seqs.size() * T, -1);
    for (size_t i = 0; i < seqs.size(); ++i)
        std::copy(seqs[i].begin(), seqs[i].end(), out.begin() + i * T);
    return out;
}

// One probe's scores and the record its group stores.
struct Result {
    ProbeScores scores;
    schema::HeadProbeRecord record;
};

static void print_top(const ProbeScores& r, int k) {
    auto flat = r.score.flatten();
    const int64_t H = r.score.size(1), n = std::min<int64_t>(k, flat.numel());
    const auto order = rank_heads(r.score, true);
    std::string line = fmt::format("{:<16}", r.probe);
    for (int64_t i = 0; i < n; ++i) {
        const int64_t j = order[i];
        line += fmt::format(" {} {:.4f}", format_head(static_cast<int>(j / H), static_cast<int>(j % H)), flat[j].item<double>());
    }
    if (r.baseline_loss) line += fmt::format("  (baseline {:.4f})", *r.baseline_loss);
    std::printf("%s\n", line.c_str());
    if (!r.sink) return;
    // Gu et al.'s rates, in percent as the reference prints them.
    std::string layers;
    const auto lr = r.sink->layer_rate.contiguous();
    for (int64_t l = 0; l < lr.size(0); ++l) layers += fmt::format(" L{} {:.1f}", l, 100 * lr[l].item<double>());
    std::printf("%-16s model %.2f%% of heads have alpha_0 > %g; per layer:%s\n", "sink rate", 100 * r.sink->model_rate,
                r.sink->epsilon, layers.c_str());
}

static void write_results(ResultWriter& w, const Model& m, const DetectOptions& o, const schema::HeadProbeRun& run,
                          const std::vector<Result>& results, const std::vector<int32_t>& tokens, int64_t N, int64_t T,
                          bool ragged) {
    if (w.exists(schema::meta())) check_same_model(w, m);
    write_meta(w, m, o.seed);
    for (const auto& r : results) {
        schema::write_head_probe(w, run, r.record);
        schema::write_inputs(w, {r.record.probe, tokens, N, T, ragged});
    }
    w.commit();
}

static StripeInput stripe_input(const DetectOptions& o) {
    StripeInput in;
    in.seq_len = o.seq_len, in.batch = o.batch, in.seed = o.seed;
    if (o.token_range.empty()) return in;
    auto r = split(o.token_range, ',');
    try {
        if (r.size() != 2) throw std::invalid_argument("");
        in.token_lo = std::stoll(trim(r[0])), in.token_hi = std::stoll(trim(r[1]));
    } catch (const std::exception&) {
        throw UsageError(fmt::format("--token-range '{}': expected lo,hi", o.token_range));
    }
    if (in.token_lo < 0) throw UsageError(fmt::format("--token-range '{}': lo must be >= 0", o.token_range));
    return in;
}

// What every score group of this run shares (docs/hdf5-schema.md).
static schema::HeadProbeRun probe_run(const DetectOptions& o, const Model& m, const StripeInput& in, bool stripe,
                                      int64_t n_seqs) {
    schema::HeadProbeRun run;
    run.stripe = stripe;
    if (stripe) {
        auto [lo, hi] = with_flag({{"--token-range", "token_range"}}, [&] { return token_range(m, in); });
        run.seq_len = in.seq_len, run.batch = in.batch, run.seed = in.seed, run.token_lo = lo, run.token_hi = hi;
    } else {
        run.n_sequences = n_seqs, run.source_file = o.tokens_file.empty() ? o.text_file : o.tokens_file;
    }
    run.error_measure = o.error_measure;
    run.exclude_bos = o.exclude_bos, run.exclude_current_token = o.exclude_current_token;
    return run;
}

static std::vector<Result> compute(const DetectOptions& o, const Model& m, const std::vector<std::string>& probes,
                                   const at::Tensor& stripe_tokens, const std::vector<std::vector<int64_t>>& seqs,
                                   int64_t n) {
    const bool stripe = stripe_tokens.defined();
    ProbeInput in_p;
    in_p.stripe_tokens = stripe_tokens, in_p.n = n, in_p.seqs = seqs, in_p.max_rows = o.max_rows;
    in_p.sink_epsilon = o.sink_epsilon;
    in_p.detector = {o.error_measure == "abs" ? ErrorMeasure::kAbs : ErrorMeasure::kMul, o.exclude_bos, o.exclude_current_token};
    const int64_t L = m.config.n_layers, H = m.config.n_heads;
    std::vector<Result> results;
    for (auto& s : run_head_probes(m, probes, in_p)) {
        const HeadProbe& p = find_head_probe(s.probe);
        schema::HeadProbeRecord r;
        r.probe = s.probe, r.description = probe_description(p, stripe), r.L = L, r.H = H;
        r.score = host_floats(s.score);
        if (o.samples) r.n_samples = s.samples.size(0), r.samples = host_floats(s.samples);
        r.baseline_loss = s.baseline_loss;
        r.detector_options = !stripe && p.pattern != StripeKind::kAttentionSink && p.pattern != StripeKind::kFirstToken;
        if (s.sink)
            r.sink = schema::HeadProbeRecord::SinkRates{s.sink->epsilon, s.sink->model_rate, host_floats(s.sink->head_rate),
                                                        host_floats(s.sink->layer_rate)};
        results.push_back({s, std::move(r)});
    }
    return results;
}

void run_detect(const DetectOptions& o) {
    const auto probes = parse_probes(o.probes);
    if (o.first_tokens > 0 && o.tokens_file.empty() && o.text_file.empty())
        throw UsageError("--first-tokens: cuts given sequences; give --tokens-file or --text-file");
    if (o.sink_epsilon_given && std::find(probes.begin(), probes.end(), "sink-rate") == probes.end())
        throw UsageError("--sink-epsilon: only the probe sink-rate reads it (add sink-rate to --probe)");
    const WriteMode mode = write_mode(o.out);
    const bool stripe = o.tokens_file.empty() && o.text_file.empty();
    for (const auto& p : probes)
        if (!stripe && find_head_probe(p).repeated_only)
            throw UsageError(fmt::format("--probe {} needs the stripe convention (no --tokens-file/--text-file)", p));
    if (o.error_measure != "mul" && o.error_measure != "abs")
        throw UsageError(fmt::format("--error-measure '{}': expected mul or abs", o.error_measure));
    StripeInput in = stripe_input(o);
    auto l = open_model(o.model, !o.text_file.empty());
    const Model& m = *l.model;
    // The default n = 50 needs 2n + 1 = 101 positions; a model with a shorter context (the toy
    // models have 64) gets the longest n that fits, and the user is told. An explicit --seq-len is
    // never changed (too long: exit 5 with the context named).
    if (stripe && !o.seq_len_given && 2 * in.seq_len + 1 > m.config.max_seq_len) {
        const int64_t n = (m.config.max_seq_len - 1) / 2;
        if (n < 1) throw DataError(fmt::format("{}: context of {} is too short for [BOS, R, R]", o.model.model, m.config.max_seq_len));
        log_info("--seq-len: the default {} makes {} tokens, more than the model's context of {}; using {} "
                             "(give --seq-len to choose)", in.seq_len, 2 * in.seq_len + 1, m.config.max_seq_len, n);
        in.seq_len = n;
    }
    std::vector<std::vector<int64_t>> seqs;
    at::Tensor stripe_tokens;  // [B, 1 + 2n]; undefined in the detector convention
    if (stripe) {
        stripe_tokens = with_flag({{"--seq-len", "seq_len"}, {"--batch", "batch"}, {"--token-range", "token_range"}},
                                   [&] { return repeated_random_tokens(m, in, l.tokenizer.get()); });
        for (int64_t b = 0; b < in.batch; ++b) {
            auto row = stripe_tokens[b].contiguous();
            seqs.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
        }
    } else {
        seqs = read_sequences(o, l);
    }
    ResultWriter w = open_result(o.out.out, mode);  // fails now (unwritable folder) rather than after the forwards
    const auto run = probe_run(o, m, in, stripe, static_cast<int64_t>(seqs.size()));
    auto results = compute(o, m, probes, stripe_tokens, seqs, in.seq_len);
    int64_t T = 0;
    for (const auto& s : seqs) T = std::max<int64_t>(T, s.size());
    const bool ragged = std::any_of(seqs.begin(), seqs.end(), [&](const auto& s) { return int64_t(s.size()) != T; });
    write_results(w, m, o, run, results, padded(seqs, T), static_cast<int64_t>(seqs.size()), T, ragged);
    for (const auto& r : results) print_top(r.scores, 5);
    log_info("wrote {} ({} probes)", o.out.out, results.size());
}

void setup_detect(CLI::App& app) {
    auto o = std::make_shared<DetectOptions>();
    auto* sub = app.add_subcommand(
        "detect",
        "score every head as induction, previous-token, duplicate-token or attention-sink head, and by the\n"
        "induction loss when it is zero-ablated (causal). Two conventions:\n"
        "  stripe (default): tokens [BOS, R, R], R uniform random ids of length n (--seq-len) from\n"
        "    --token-range minus special tokens, --batch rows, --seed. induction = mean over q in [n+1,2n]\n"
        "    of A[q,q-n+1]; previous-token = mean over q in [1,2n] of A[q,q-1]; duplicate-token = mean over\n"
        "    q in [n+1,2n] of A[q,q-n]; attention-sink = mean over q >= 1 of A[q,0]. induction-loss = mean\n"
        "    cross-entropy on tokens n+2..2n with one head's z zeroed (attribute baseline_loss: none).\n"
        "  sink-rate (either convention; Gu et al. 2025): alpha_0 = mean over every q (q = 0 counted) of A[q,0];\n"
        "    a head sinks in a sequence when alpha_0 > --sink-epsilon (0.3); the layer's and the model's sink\n"
        "    rate are the shares of (sequence, head) and (sequence, layer, head) above it. The reference runs it\n"
        "    on the first 64 tokens of natural text (--text-file).\n"
        "  detector (--tokens-file or --text-file, one sequence a line): TransformerLens head_detector\n"
        "    scores against a detection pattern D, --error-measure mul = sum(A*D)/sum(A) or\n"
        "    abs = 1 - mean_i |A_i - D_i|_1, averaged over sequences; --exclude-bos / --exclude-current-token\n"
        "    zero column 0 / the diagonal first. Top 5 heads per probe go to stdout (L5H1 = layer 5, head 1).\n"
        "Example: headscope detect ../shared/testdata/stories260K/stories260K.bin "
        "--probe induction,previous-token,induction-loss --out scores.h5\n"
        "Example: headscope detect ../shared/testdata/stories260K/stories260K.bin --probe sink-rate "
        "--text-file datasets/needles/haystack.txt --first-tokens 64 --out sinks.h5");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--probe", o->probes, "comma-separated: " + fmt::format("{}", fmt::join(detector_probe_names(), ",")))
        ->capture_default_str();
    auto* seq_len = sub->add_option("--seq-len", o->seq_len,
                                    "stripe: length n of the random sequence R (default 50, or the longest n with 2n + 1\n"
                                    "positions that fits a shorter context)");
    sub->add_option("--batch", o->batch, "stripe: rows of [BOS, R, R]")->capture_default_str();
    sub->add_option("--seed", o->seed, "stripe: seed of the token generator")->capture_default_str();
    sub->add_option("--token-range", o->token_range, "stripe: ids lo,hi to draw R from, [lo, hi) (default: whole vocabulary)");
    auto* tokens_file = sub->add_option("--tokens-file", o->tokens_file, "detector: one sequence of comma-separated token ids a line");
    sub->add_option("--text-file", o->text_file, "detector: one text a line, encoded with the model's tokenizer")->excludes(tokens_file);
    sub->add_option("--first-tokens", o->first_tokens,
                    "detector: keep each sequence's first N tokens; a shorter one is an error (sink-rate's reference: 64)")
        ->check(at_least(1));
    sub->add_option("--error-measure", o->error_measure, "detector: mul or abs")->capture_default_str();
    sub->add_flag("--exclude-bos", o->exclude_bos, "detector: ignore attention to position 0");
    sub->add_flag("--exclude-current-token", o->exclude_current_token, "detector: ignore attention to the query itself");
    sub->add_flag("--samples", o->samples, "also write per-sequence scores /scores/<probe>/samples [N, L, H]");
    sub->add_option("--max-rows", o->max_rows, "batch rows per forward pass (memory)")->capture_default_str();
    auto* sink_eps = sub->add_option("--sink-epsilon", o->sink_epsilon,
                                     "sink-rate: a head is a sink in a sequence when its alpha_0 exceeds this (Gu et al.'s epsilon)")
                         ->check(in_range(0, 1))
                         ->capture_default_str();
    sub->callback([o, seq_len, sink_eps] {
        o->seq_len_given = seq_len->count() > 0;
        o->sink_epsilon_given = sink_eps->count() > 0;
        run_detect(*o);
    });
}

}  // namespace hs::cli
