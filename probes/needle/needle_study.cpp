// The needle study (needle_study.h): its inputs, the resume check and the passes it runs. Its file
// writes and the stream sweep are needle_study_write.cpp.
#include "needle_study.h"

#include "errors.h"
#include "guard.h"
#include "heads.h"
#include "needle_records.h"
#include "progress.h"
#include "schema.h"
#include "system.h"
#include "util.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <limits>

namespace hs {

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

std::vector<int64_t> parse_needle_int_list(const std::string& s, const std::string& param) {
    std::string bad;
    auto out = split_ints(s, &bad);
    if (!out) throw UsageError(fmt::format("'{}' is not an integer", bad), param);
    if (out->empty()) throw UsageError("no value given", param);
    return *out;
}

void check_needle_lengths(const std::vector<int64_t>& lengths) {
    for (auto v : lengths)
        if (v < 2) throw UsageError(fmt::format("{} is too short (at least 2 context tokens)", v), "lengths");
}

std::vector<double> parse_needle_depths(const std::string& s) {
    std::vector<double> out;
    for (const auto& part : split(s, ',')) {
        const auto p = trim(part);
        if (p.empty()) continue;
        const auto d = parse_double(p);
        if (!d) throw UsageError(fmt::format("'{}' is not a number", p), "depths");
        const double v = *d;
        if (v < 0 || v > 100) throw UsageError(fmt::format("{} is outside [0, 100] (percent)", p), "depths");
        out.push_back(v);
    }
    if (out.empty()) throw UsageError("no value given", "depths");
    return out;
}

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

NeedleInputs read_needle_inputs(const NeedleStudySpec& s, const Model& m, const Tokenizer& tok) {
    // A length whose context alone exceeds the model's positions is refused before any haystack is
    // lengthened to it or trial built.
    for (auto len : s.cfg.lengths)
        if (m.config.max_seq_len > 0 && len - s.proto.buffer > m.config.max_seq_len)
            throw UsageError(fmt::format("length {}: {} context tokens in the prompt are beyond the model's context of {}", len,
                                         len - s.proto.buffer, m.config.max_seq_len),
                             "lengths");
    NeedleInputs in;
    in.needles_path = !s.needles.empty()      ? s.needles
                      : !s.haystack_dir.empty() ? path_join(s.haystack_dir, "needles.jsonl")
                                                : shipped_file("datasets/needles/needles.jsonl");
    in.needles = read_needles(in.needles_path);
    std::vector<std::string> texts;
    if (!s.haystack_dir.empty()) {
        in.hay_path = s.haystack_dir;
        texts = read_haystack_dir(s.haystack_dir, in.needles.size(), s.proto.haystack_format);
        for (size_t i = 0; i < texts.size(); ++i)
            if (trim(texts[i]).empty())
                throw DataError(fmt::format("{}: the haystack of needle {} (part{}) is empty", s.haystack_dir, i + 1, i + 1));
    } else {
        in.hay_path = s.haystack.empty() ? shipped_file("datasets/needles/haystack.txt") : s.haystack;
        const std::string text = read_utf8_text_file(in.hay_path);
        if (trim(text).empty() || tok.encode(text, false).empty())
            throw DataError(fmt::format("{}: the haystack is empty", in.hay_path));
        texts.assign(in.needles.size(), text);
    }
    std::string all;
    for (const auto& t : texts) all += t + '\0';
    in.hay_sha256 = s.haystack_dir.empty() ? sha256_bytes(texts[0].data(), texts[0].size()) : sha256_bytes(all.data(), all.size());
    const int64_t max_len = *std::max_element(s.cfg.lengths.begin(), s.cfg.lengths.end());
    for (auto& t : texts) {
        try {
            t = repeat_haystack(t, max_len, s.proto.repeat);
        } catch (const DataError& e) {
            throw DataError(fmt::format("{}: {}", in.hay_path, e.what()));
        }
    }
    in.haystacks = std::move(texts);
    in.facts = token_facts(tok, s.proto.stop);
    in.facts.stop_order = s.proto.stop_order;
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
    for (auto id : s.extra_stop_ids)
        if (id < 0 || id >= tok.vocab_size())
            throw UsageError(fmt::format("{} is outside the vocabulary (0..{})", id, tok.vocab_size() - 1), "stop_ids");
    set_stop_rule(in.facts, tok, s.proto.stop, config_eos, generation_eos, s.extra_stop_ids);
    return in;
}

int64_t free_cache_memory(const Model& m) {
    if (!m.options.device.is_cuda()) return available_memory_bytes();
    const auto devs = cuda_devices();
    const auto i = static_cast<size_t>(std::max<int>(0, m.options.device.index()));
    return i < devs.size() ? devs[i].total_bytes - m.n_params() * static_cast<int64_t>(c10::elementSize(m.options.dtype)) : -1;
}

// --sweep-rows auto's most rows a forward: a whole batch of the auto batch's most trials (16) times the
// study's 6 head sets (top-k and 5 random controls) decodes in one forward, each trial's prompt read once
// for its 6 rows (64 split the 12 trials x 6 sets of the bench grid's lengths in two).
constexpr int64_t kAutoSweepRows = 96;
// --batch auto's most trials a forward for a scan without head sets whose rows read their prompts in place:
// the bench grid's 48 trials in 2 forwards of 24 rows a step (the memory cap allowing 45) decode in
// 6.5 s against 7.3 s for 4 forwards of 12 (one length's trials), the weights streamed half as often.
constexpr int64_t kAutoScanRows = 64;

NeedleBatching auto_needle_batching(const NeedleStudySpec& s, const Model& m, const NeedleInputs& in, bool batch_auto,
                                    bool rows_auto, int64_t available_bytes) {
    NeedleBatching b;
    b.batch = s.cfg.batch, b.sweep_rows = s.sweep_rows;
    if (!batch_auto && !rows_auto) return b;
    const ModelConfig& c = m.config;
    const int64_t longest = s.cfg.lengths.empty() ? 0 : *std::max_element(s.cfg.lengths.begin(), s.cfg.lengths.end());
    // A context length's prompt adds the template and the question: a margin of the model's
    // positions' worth at most (the cap only needs the order of magnitude).
    const int64_t steps = std::max(s.cfg.decode.max_new_tokens, s.cfg.ablation_max_new_tokens);
    const int64_t positions = std::min<int64_t>(longest + 256 + steps, std::max<int64_t>(c.max_seq_len, longest + steps));
    const int64_t row_bytes = 2 * int64_t{c.n_layers} * c.n_kv_heads * c.d_head * positions *
                              static_cast<int64_t>(c10::elementSize(m.options.dtype));
    // Set rows that read their trial's kept prefill in place (KVCache::shared: an unablated prefill and
    // no windows, DecodeSettings::share_prompt) hold only the tokens they decode.
    const bool shared_rows = s.ablating && s.cfg.decode.share_prompt && s.cfg.decode.scope == AblationScope::kDecode &&
                             s.ablation != Intervention::kStream && s.full_fractions.empty();
    const int64_t own_bytes = row_bytes / positions * (steps + 1);
    int64_t cap = -1, set_cap = -1;  // rows the memory holds (scan rows; set rows)
    std::string mem;
    if (available_bytes >= 0) {
        const int64_t prefix = s.cfg.decode.reuse_prefix ? s.cfg.prefix_max_bytes : 0;
        const int64_t budget = std::max<int64_t>(0, available_bytes / 2 - prefix);
        cap = std::max<int64_t>(1, budget / std::max<int64_t>(1, row_bytes));
        set_cap = shared_rows ? std::max<int64_t>(1, budget / std::max<int64_t>(1, own_bytes)) : cap;
        mem = fmt::format("half of {:.1f} GiB free, {:.1f} MiB of KV cache a row: at most {} rows",
                          static_cast<double>(available_bytes) / (1 << 30), static_cast<double>(row_bytes) / (1 << 20), cap);
        if (shared_rows)
            mem += fmt::format("; a set row reads its trial's prompt cache and holds its {} decoded tokens, {:.2f} MiB: at most {}",
                               steps + 1, static_cast<double>(own_bytes) / (1 << 20), set_cap);
    } else {
        mem = "free memory unknown: no memory cap";
    }
    auto capped = [&](int64_t v) { return cap > 0 ? std::min(v, cap) : v; };
    int64_t sets = 0;
    if (s.ablating) sets = 1 + s.random_controls;
    if (!s.full_fractions.empty())
        sets = std::max<int64_t>(sets, static_cast<int64_t>(s.full_fractions.size()) * (1 + s.random_orders));
    // Rows that read their prompts in place decode together whatever their lengths (ragged rows): a
    // batch takes trials of every length, as many as keep a step's rows within kAutoSweepRows with
    // the head sets' rows (each trial's prompt then read once a step for all its sets), or
    // kAutoScanRows for a scan alone. Other rows take one prompt length: a length's trials, at most 16.
    DecodeSettings scan_decode = s.cfg.decode;
    scan_decode.scores = s.scores;
    const bool ragged = reads_prompts_in_place(scan_decode);
    const int64_t per_length = static_cast<int64_t>(s.cfg.depths.size()) * std::max<int64_t>(1, in.needles.size());
    const int64_t n_trials = per_length * static_cast<int64_t>(s.cfg.lengths.size());
    const int64_t most = !ragged ? 16 : sets > 0 ? std::max<int64_t>(1, kAutoSweepRows / sets) : kAutoScanRows;
    std::string batch_why = !ragged ? "a length's trials, at most 16"
                            : sets > 0
                                ? fmt::format("the grid's trials, ragged rows, at most {} / {} head sets", kAutoSweepRows, sets)
                                : fmt::format("the grid's trials, ragged rows, at most {}", kAutoScanRows);
    if (batch_auto) b.batch = std::max<int64_t>(1, capped(std::min<int64_t>(ragged ? n_trials : per_length, most)));
    // A resumed scan keeps the batches its file was cut into (the work items are batches), whatever
    // the memory free now.
    std::string from_file;
    if (batch_auto && s.resume && file_exists(s.out)) {
        ResultReader r(s.out);
        if (r.exists(schema::retrieval())) {
            const Attrs a = r.attrs(schema::retrieval());
            if (auto it = a.find("batch"); it != a.end())
                if (const auto* v = std::get_if<int64_t>(&it->second); v && *v >= 1)
                    b.batch = *v, from_file = " (auto: the resumed file's)";
        }
    }
    if (rows_auto)
        b.sweep_rows = std::max<int64_t>(1, std::min<int64_t>(set_cap > 0 ? set_cap : std::numeric_limits<int64_t>::max(),
                                                          std::min<int64_t>(kAutoSweepRows, sets > 0 ? b.batch * sets : std::max<int64_t>(8, b.batch))));
    b.note = fmt::format("batching: --batch {}{}, --sweep-rows {}{} ({})", b.batch,
                         !from_file.empty() ? from_file : batch_auto ? fmt::format(" (auto: {})", batch_why) : std::string(),
                         b.sweep_rows,
                         !rows_auto ? std::string()
                         : sets > 0 ? fmt::format(" (auto: {} x {} head sets, at most {})", b.batch, sets, kAutoSweepRows)
                                    : std::string(" (auto: no head sets here, 8 or --batch)"),
                         mem);
    return b;
}

std::unique_ptr<NeedleTest> make_needle_test(const NeedleStudySpec& s, const Model& m, const Tokenizer& tok,
                                             const NeedleInputs& in) {
    NeedleConfig cfg = s.cfg;
    cfg.max_positions = m.config.max_seq_len;
    cfg.qrhead = s.scores.has(NeedleScore::kQrhead);
    cfg.decode.scores = s.scores;  // a step computes the scores the run names, no others
    return std::make_unique<NeedleTest>(m, tok, TrialBuilder(tok, s.proto, in.facts, in.needles, in.needles_path, in.haystacks),
                                        cfg);
}

// The scan's parameters as /retrieval records them (and --resume compares).
static Attrs needle_params(const NeedleStudySpec& s, const NeedleInputs& in, int64_t n_trials) {
    const NeedleProtocol& pr = s.proto;
    schema::NeedleParamsRecord r;
    r.haystack_file = in.hay_path, r.needles_file = in.needles_path;
    r.haystack_sha256 = in.hay_sha256, r.needles_sha256 = sha256_file(in.needles_path);
    r.tmpl = s.tmpl;
    r.lengths = s.cfg.lengths, r.depths = s.cfg.depths;
    r.max_new_tokens = pr.max_new_tokens;
    r.pass_threshold = s.cfg.pass_threshold;
    r.stop = stop_rule_name(pr.stop);
    r.ablation_scope = ablation_scope_name(pr.scope);
    r.prefill_chunk = s.cfg.decode.prefill_chunk, r.batch = s.cfg.batch;
    r.prefix_reuse = s.cfg.decode.reuse_prefix;
    r.scores = s.scores_text;
    r.flag_threshold = s.flag_threshold, r.bootstrap = s.bootstrap;
    r.seed = pr.seed, r.n_trials = n_trials;
    r.with_protocol = s.record_protocol;
    r.protocol = name_in(protocol_names(), pr.protocol);
    r.buffer = pr.buffer;
    r.assembly = name_in(assembly_names(), pr.assembly);
    r.ablation_assembly = name_in(assembly_names(), pr.ablation_assembly);
    r.ablation_template = s.cfg.ablation_tmpl.text;
    r.ablation_max_new_tokens = pr.ablation_max_new_tokens;
    r.insertion = name_in(insertion_names(), pr.insertion);
    r.answer_span = name_in(answer_search_names(), pr.answer);
    r.stop_order = name_in(stop_order_names(), pr.stop_order);
    r.haystack_format = name_in(haystack_format_names(), pr.haystack_format);
    r.haystack_repeat = name_in(haystack_repeat_names(), pr.repeat);
    r.rng = name_in(rng_kind_names(), pr.rng);
    r.stop_ids = in.facts.rule_ids;
    return schema::needle_params(r);
}

// What a previous run of the same scan (same parameters, model and shard) finished; nullptr when the
// file holds no needle results yet. The identity check is the job runner's (jobs::compare_file).
static std::unique_ptr<NeedleResults> load_needle_resume(const std::string& path, const Attrs& params,
                                                         const jobs::Shard& shard, const Model& m) {
    ResultReader r(path);
    if (!r.exists(schema::retrieval())) return nullptr;
    jobs::Identity id;
    id.weights_sha256 = m.weights_sha256();
    id.params = params;
    id.ignore = {"haystack_file", "needles_file"};  // the contents' sha256 is compared
    id.shard = shard.str();
    const jobs::Difference d = jobs::compare_file(r, schema::retrieval(), id);
    auto cut = [](const std::string& s) { return s.size() > 80 ? s.substr(0, 77) + "..." : s; };
    switch (d.kind) {
        case jobs::Difference::Kind::kNone: break;
        case jobs::Difference::Kind::kModel:
            throw StorageError(fmt::format("{}: holds results of another model; refusing to resume", path));
        case jobs::Difference::Kind::kParam:  // the command adds how to start over
            throw StorageError(
                fmt::format("{}: was run with {} {}, not {}; refusing to resume", path, d.key, cut(d.was), cut(d.now)), "resume");
        case jobs::Difference::Kind::kShard:
            throw StorageError(fmt::format("{}: was run as shard {}, not {}; refusing to resume", path,
                                           d.was.empty() ? "(none)" : d.was, d.now));
    }
    return std::make_unique<NeedleResults>(read_needle_results(r));
}

// random_head_sets's error (too few heads left) is about the number of controls asked.
static std::vector<std::vector<Head>> control_sets(int L, int H, const std::vector<Head>& heads, int64_t n, uint64_t seed,
                                                   int64_t* possible = nullptr) {
    try {
        return random_head_sets(L, H, heads, n, seed, possible);
    } catch (const UsageError& e) {
        if (!e.param().empty()) throw;
        throw UsageError(e.what(), "random_controls");
    }
}

NeedleStudy::NeedleStudy(const NeedleStudySpec& spec, const Model& m, const NeedleTest& test, const NeedleInputs& in,
                         std::function<void(ResultWriter&)> write_meta)
    : spec_(spec), m_(m), test_(test), work_(test, spec.cfg.decode.scope == AblationScope::kDecode && spec.sweep_rows > 1),
      params_(needle_params(spec, in, static_cast<int64_t>(test.trials().size()))), write_meta_(std::move(write_meta)),
      checkpoint_(spec.checkpoint_seconds, [this] { write(n_sets_planned()); }, spec.pause_ms) {
    resuming_ = spec.resume && file_exists(spec.out);
    if (resuming_) prev_ = load_needle_resume(spec.out, params_, spec.shard, m);
    if (prev_) {
        int64_t had = 0;
        for (auto d : prev_->done) had += d;
        for (auto d : prev_->abl_done) had += d;
        log_info(fmt::format("resuming {}: {} decodes already done", spec.out, had));
    }
    const int64_t N = static_cast<int64_t>(test.trials().size());
    res_.init(N, m.config.n_layers, m.config.n_heads, spec.proto.max_new_tokens, spec.proto.ablation_max_new_tokens,
              spec.cfg.keep_steps);
    if (prev_)
        for (int64_t i = 0; i < N; ++i)
            if (prev_->done[i]) res_.copy_trial(*prev_, i);
}

NeedleSummary NeedleStudy::summary() const {
    return summarize(res_, spec_.bootstrap, static_cast<uint64_t>(spec_.proto.seed), spec_.flag_threshold, spec_.proto.rng);
}

// Set 0 = `heads` (from --ablate, --ablate-top K --from, or this run's scores), sets 1.. the
// random controls (distinct; fewer when the other heads hold fewer distinct sets), then, when
// the ablation passes have prompts of their own (LOCOS), the unablated set (no heads): their
// baseline. A resumed file's ablated trials are kept where it ablated the same heads.
void NeedleStudy::choose_sets(std::vector<Head> heads, std::string source) {
    const int L = m_.config.n_layers, H = m_.config.n_heads;
    const int64_t n_controls = spec_.random_controls;
    ablate_source_ = std::move(source);
    sets_ = {heads};
    if (n_controls > 0)  // (none asked: a set of more than half the heads needs no room for controls)
        for (auto& s : control_sets(L, H, heads, n_controls, static_cast<uint64_t>(spec_.proto.seed) + 1, &possible_controls_))
            sets_.push_back(s);
    if (n_controls > 0 && possible_controls_ <= n_controls)
        log_warn(fmt::format("--random-controls {}: the {} heads outside {} hold only {} distinct sets of {}; all {} run",
                             n_controls, L * H - static_cast<int64_t>(heads.size()), format_heads(heads),
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

// The named heads, the top K of the --from score, or (scored_here) of this run's score: LOCOS when
// computed, else retrieval, else R2, else QRHead.
void NeedleStudy::choose_sets(const NeedleSummary* scored_here) {
    if (spec_.ablate_top == 0) return choose_sets(spec_.ablate_heads, "--ablate");
    const NeedleScore own = spec_.scores.has(NeedleScore::kLocos)       ? NeedleScore::kLocos
                            : spec_.scores.has(NeedleScore::kRetrieval) ? NeedleScore::kRetrieval
                            : spec_.scores.has(NeedleScore::kR2)        ? NeedleScore::kR2
                                                                        : NeedleScore::kQrhead;
    const at::Tensor& src = spec_.from_score.defined() ? spec_.from_score : scored_here->score(own);
    choose_sets(top_heads(src, spec_.ablate_top),
                !spec_.from.empty() ? spec_.from : "this run: scores/" + std::string(needle_score_name(own)) + "/score");
}

// Decodes this shard's batches of one pass (set -1 = the scored baseline), skipping the done
// ones; tick() per trial, a checkpoint after each batch that ran.
void NeedleStudy::run_pass(int64_t set, const HeadSet* ablate, const std::function<void()>& tick) {
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
        checkpoint_.item_finished();
    }
}

// Every set's pass at once (rows mode): each owned ablation batch with its sets as rows.
void NeedleStudy::run_sets_pass(const std::vector<HeadSet>& sets, const std::function<void()>& tick) {
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
        const auto rs = test_.run_ablated_sets_batch(ptrs, g, spec_.sweep_rows);
        for (size_t si = 0; si < sets.size(); ++si)
            for (size_t k = 0; k < batches[g].size(); ++k) {
                res_.set_ablated(static_cast<int64_t>(si), batches[g][k], rs[si][k]);
                tick();
            }
        checkpoint_.item_finished();
    }
}

// --decoding decore|juice: every trial decoded under the rule (DeCoRe: the named heads, then
// --random-controls random sets of the same size drawn by --seed + 3 from the other heads).
void NeedleStudy::run_decoding_pass(const std::function<void()>& tick) {
    const int L = m_.config.n_layers, H = m_.config.n_heads;
    NeedleDecodingPass d;
    d.control_seed = spec_.proto.seed + 3;
    d.spec = spec_.decoding_spec;
    if (spec_.decoding == CombineRule::kDecore) {
        const auto& heads = d.spec.rows[1].heads;
        d.sets = {heads};
        for (auto& s : control_sets(L, H, heads, spec_.random_controls, static_cast<uint64_t>(d.control_seed)))
            d.sets.push_back(s);
    } else {
        d.sets = {d.spec.enhance};
    }
    for (const auto& set : d.sets) {
        DecodingSpec spec = d.spec;
        if (spec.rule == CombineRule::kDecore) spec.rows[1].heads = set;
        d.trials.push_back(test_.run_decoding(spec, tick));
    }
    decoding_ = std::move(d);
}

// headscope: seed + 2 (its own stream); the reference's: LOCOS's --seed itself.
uint64_t NeedleStudy::calibration_seed() const {
    return static_cast<uint64_t>(spec_.proto.seed) + (spec_.proto.rng == RngKind::kReference ? 0 : 2);
}

// Every item this shard owns is done (the planned sets included).
bool NeedleStudy::complete(int64_t n_sets_planned) const {
    return work_.complete(res_, n_sets_planned, spec_.shard.index, spec_.shard.count);
}

// The sets an ablating run decodes: the named heads, the controls, the ablation trials' baseline.
int64_t NeedleStudy::n_sets_planned() const {
    if (!spec_.ablating) return 0;
    const int64_t controls = res_.S > 0 ? static_cast<int64_t>(sets_.size()) - 1 - (test_.separate_ablation_trials() ? 1 : 0)
                                        : spec_.random_controls;
    return 1 + controls + (test_.separate_ablation_trials() ? 1 : 0);
}

// With the sets decoding as rows of the scan's forwards, the scan keeps the prefills of the trials
// whose ablation batches this shard owns (the ablation rows decode from them).
void NeedleStudy::keep_owned_prefills() {
    const int64_t N = res_.N;
    std::vector<char> owned(static_cast<size_t>(N), 0);
    const auto& batches = test_.ablation_batches();
    for (int64_t g = 0; g < static_cast<int64_t>(batches.size()); ++g)
        if (owns(0, g))
            for (auto i : batches[static_cast<size_t>(g)]) owned[static_cast<size_t>(i)] = 1;
    test_.keep_scan_prefills([&owned](int64_t i) { return owned[static_cast<size_t>(i)] != 0; });
}

void NeedleStudy::run() {
    const int64_t N = res_.N;
    // Ablation sets known before the trials (--ablate, --ablate-top K --from FILE); else chosen by
    // this run's scores after the baseline pass.
    const bool sets_first = spec_.ablating && !(spec_.ablate_top > 0 && spec_.from.empty());
    if (sets_first) choose_sets(nullptr);

    const int64_t n_planned = n_sets_planned();
    const bool calibrate = spec_.ablating && spec_.ablation == Intervention::kMeanQuery;
    const int64_t n_calib = calibrate ? std::min(spec_.calibration_trials, N) : 0;
    int64_t planned = n_calib + work_.owned_decodes(n_planned, spec_.shard.index, spec_.shard.count);
    if (spec_.decoding != CombineRule::kIndependent)
        planned += N * (spec_.decoding == CombineRule::kDecore ? 1 + spec_.random_controls : 1);
    Progress prog("needle trials", planned);
    auto tick = [&prog] { prog.tick(); };

    // ---- the baseline pass: every score from one decode per trial ----
    if (spec_.ablating && work_.rows() && !test_.separate_ablation_trials()) keep_owned_prefills();
    run_pass(-1, nullptr, tick);
    const NeedleSummary sum = summary();
    if (spec_.shard.count == 1) {
        if (sum.n_pass == 0)
            log_warn(fmt::format("no trial passed (ROUGE-1 recall > {}): the head scores are NaN", spec_.cfg.pass_threshold));
        else if (spec_.scores.has(NeedleScore::kLocos) && sum.n_locos == 0)
            log_warn("no passing trial generated the answer's tokens: the LOCOS scores are NaN");
    }

    // ---- ablation: mean-query calibration (over the whole grid, the same in every shard), then the sets ----
    if (calibrate) {
        n_calib_ = n_calib;
        q_mean_ = test_.calibrate(n_calib, calibration_seed(), kCalibrationMaxTokens, &calib_idx_, tick);
    }
    if (spec_.ablating && !sets_first) choose_sets(&sum);
    std::vector<HeadSet> sets;
    for (const auto& heads : sets_) {
        HeadSet hs;
        hs.heads = heads, hs.mode = spec_.ablation, hs.q_mean = q_mean_, hs.window = spec_.window;
        sets.push_back(std::move(hs));
    }
    if (work_.rows()) {
        run_sets_pass(sets, tick);
    } else {
        for (size_t si = 0; si < sets.size(); ++si) run_pass(static_cast<int64_t>(si), &sets[si], tick);
    }
    if (spec_.decoding != CombineRule::kIndependent) run_decoding_pass(tick);
    prog.finish();
    if (const auto [reused, computed] = test_.prefix_stats(); reused > 0)
        log_info(fmt::format("prefill: {} of {} prompt positions ({:.0f}%) taken from kept prefills "
                             "(--no-prefix-reuse prefills every trial whole)",
                             reused, reused + computed, 100.0 * static_cast<double>(reused) / static_cast<double>(reused + computed)));
    {
        const auto& t = test_.times();
        const auto [forwards, rows] = test_.decode_forwards();
        log_info(fmt::format("time: prefill {:.2f} s, decode steps {:.2f} s ({} forwards of {:.1f} rows on average{}), "
                             "scoring {:.2f} s{}",
                             t.prefill, t.decode, forwards, forwards ? static_cast<double>(rows) / static_cast<double>(forwards) : 0.0,
                             forwards ? fmt::format(", {:.1f} ms a forward", 1e3 * t.decode / static_cast<double>(forwards)) : std::string(),
                             t.score, t.query > 0 ? fmt::format(", QRHead's query passes {:.2f} s", t.query) : std::string()));
    }
    write(n_sets_planned());
}

}  // namespace hs
