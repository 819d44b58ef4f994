#include "ablation.h"

#include "attention_detectors.h"
#include "errors.h"
#include "guard.h"
#include "hooks.h"
#include "lines.h"
#include "progress.h"
#include "store.h"
#include "tokenizer.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace hs {

using namespace torch::indexing;

// ---------------------------------------------------------------- data

std::vector<int64_t> AblationData::file_tokens() const {
    const int64_t N = tokens.size(0), T = tokens.size(1);
    auto t = tokens.to(torch::kCPU).contiguous();
    const int64_t* p = t.data_ptr<int64_t>();
    std::vector<int64_t> out(N * T, -1);
    for (int64_t i = 0; i < N; ++i) std::copy(p + i * T, p + i * T + lengths[i], out.begin() + i * T);
    return out;
}

static AblationData from_seqs(const std::string& name, DataKind kind,
                              const std::vector<std::vector<int64_t>>& seqs) {
    AblationData d;
    d.name = name, d.kind = kind;
    int64_t T = 0;
    for (const auto& s : seqs) T = std::max<int64_t>(T, s.size());
    d.tokens = torch::zeros({static_cast<int64_t>(seqs.size()), T}, torch::kLong);
    auto acc = d.tokens.accessor<int64_t, 2>();
    for (size_t i = 0; i < seqs.size(); ++i) {
        for (size_t j = 0; j < seqs[i].size(); ++j) acc[i][j] = seqs[i][j];
        d.lengths.push_back(static_cast<int64_t>(seqs[i].size()));
    }
    return d;
}

AblationData sequence_data(const std::string& name, const std::vector<std::vector<int64_t>>& seqs) {
    if (seqs.empty()) throw DataError(fmt::format("data '{}': no sequences", name));
    return from_seqs(name, DataKind::kTokens, seqs);
}

AblationData repeated_data(const Model& m, int64_t n, int64_t count, int64_t seed, int64_t lo, int64_t hi,
                           const Tokenizer* tok) {
    StripeInput in;
    in.seq_len = n, in.batch = count, in.seed = seed, in.token_lo = lo, in.token_hi = hi;
    AblationData d;
    d.kind = DataKind::kRepeated;
    d.tokens = repeated_random_tokens(m, in, tok);
    d.lengths.assign(count, d.tokens.size(1));
    d.n = n;
    return d;
}

static void check_ids(const Experiment& e, const DataSpec& d, const Model& m, const std::vector<int64_t>& ids,
                      const std::string& where) {
    for (auto id : ids)
        if (id < 0 || id >= m.config.vocab_size)
            throw DataError(fmt::format("{}: token id {} out of range [0, {})", where, id, m.config.vocab_size));
    if (static_cast<int64_t>(ids.size()) > m.config.max_seq_len)
        throw DataError(fmt::format("{}: sequence of {} tokens exceeds the model's context of {}", where, ids.size(),
                                    m.config.max_seq_len));
    if (ids.empty()) throw DataError(fmt::format("{}: empty sequence", where));
}

// The token that follows `prompt` when prompt + prefix + answer is encoded as one text (what the model
// would emit next; JUICE's get_tokenized_first_word adds the space by hand per model family instead).
static int64_t continuation_token(const Tokenizer& t, const std::string& prompt, const std::vector<int64_t>& prompt_ids,
                                  const std::string& prefix, const std::string& answer, const std::string& where,
                                  const char* key, bool alone) {
    if (alone) {
        auto a = t.encode(prefix + answer, false);
        if (a.empty()) throw DataError(fmt::format("{}: \"{}\" encodes to no tokens", where, key));
        return a[0];
    }
    auto full32 = t.encode(prompt + prefix + answer, true);
    std::vector<int64_t> full(full32.begin(), full32.end());
    if (full.size() <= prompt_ids.size() || !std::equal(prompt_ids.begin(), prompt_ids.end(), full.begin()))
        throw DataError(fmt::format("{}: \"{}\" does not start a new token after the prompt (the prompt's last token "
                                    "merges with it; check answer_prefix, or take the answer's own first token with answer_token: alone)", where, key));
    return full[prompt_ids.size()];
}

static const Tokenizer& need_tokenizer(const Experiment& e, const DataSpec& d, const Tokenizer* tok) {
    if (!tok) e.fail(d.mark, fmt::format("data '{}' ({}) needs a tokenizer: none found next to the model (set tokenizer:)",
                                         d.name, name_of(d.kind)));
    return *tok;
}

namespace {

// The rows a data file gives: token sequences, and for prompts and conflicts each row's answer and
// counterfactual first tokens (conflicts: the row's variant too).
struct FileRows {
    std::vector<std::vector<int64_t>> seqs;
    std::vector<int64_t> answers, cfs, variants;
};

// text: the whole file tokenised and cut into rows of seq_len tokens (BOS first when there is one).
void add_text_rows(FileRows& r, const Experiment& e, const DataSpec& d, const Model& m, const Tokenizer& t,
                   const std::string& text) {
    auto ids32 = t.encode(text, false);
    std::vector<int64_t> ids(ids32.begin(), ids32.end());
    const bool bos = t.bos_id().has_value();
    const int64_t body = d.seq_len - (bos ? 1 : 0);
    if (body < 1) e.fail(d.mark, fmt::format("data '{}': seq_len {} leaves no room after BOS", d.name, d.seq_len));
    for (size_t i = 0; i + body <= ids.size(); i += body) {
        if (d.count > 0 && static_cast<int64_t>(r.seqs.size()) >= d.count) break;
        std::vector<int64_t> s;
        if (bos) s.push_back(*t.bos_id());
        s.insert(s.end(), ids.begin() + i, ids.begin() + i + body);
        check_ids(e, d, m, s, d.file);
        r.seqs.push_back(std::move(s));
    }
    if (r.seqs.empty())
        throw DataError(fmt::format("{}: {} tokens, fewer than one sequence of {}", d.file, ids.size(), d.seq_len));
}

// conflicts: {"question", "context" | "contexts", "parametric_answer", "context_answer"}, one row per
// prompt variant (the question alone unless clean: false, then each context before it).
void add_conflicts_line(FileRows& r, const Experiment& e, const DataSpec& d, const Model& m, const Tokenizer& t,
                        const nlohmann::json& j, const std::string& where) {
    const char* shape = "expected {\"question\": TEXT, \"context\": TEXT (or \"contexts\": [TEXT, ...]), "
                        "\"parametric_answer\": TEXT, \"context_answer\": TEXT}";
    auto text = [&](const nlohmann::json& o, const char* key) {
        if (!o.contains(key) || !o[key].is_string()) throw DataError(fmt::format("{}: {}", where, shape));
        return o[key].get<std::string>();
    };
    if (!j.is_object()) throw DataError(fmt::format("{}: {}", where, shape));
    const std::string q = text(j, "question"), pa = text(j, "parametric_answer"), ca = text(j, "context_answer");
    std::vector<std::string> contexts;
    if (j.contains("context") && j.contains("contexts"))
        throw DataError(fmt::format("{}: give \"context\" or \"contexts\", not both", where));
    if (j.contains("context")) contexts.push_back(text(j, "context"));
    if (j.contains("contexts")) {
        if (!j["contexts"].is_array()) throw DataError(fmt::format("{}: {}", where, shape));
        for (const auto& c : j["contexts"]) {
            if (!c.is_string()) throw DataError(fmt::format("{}: {}", where, shape));
            contexts.push_back(c.get<std::string>());
        }
    }
    std::vector<std::string> prompts;
    if (d.clean) prompts.push_back(q);
    for (const auto& c : contexts) prompts.push_back(c + d.separator + q);
    if (prompts.empty())
        throw DataError(fmt::format("{}: no rows (no context, and clean: false drops the question alone)", where));
    for (size_t v = 0; v < prompts.size(); ++v) {
        auto p32 = t.encode(prompts[v], true);
        std::vector<int64_t> ids(p32.begin(), p32.end());
        check_ids(e, d, m, ids, where);
        r.answers.push_back(continuation_token(t, prompts[v], ids, d.answer_prefix, pa, where, "parametric_answer", d.answer_alone));
        r.cfs.push_back(continuation_token(t, prompts[v], ids, d.answer_prefix, ca, where, "context_answer", d.answer_alone));
        r.variants.push_back(static_cast<int64_t>(v) + (d.clean ? 0 : 1));
        r.seqs.push_back(std::move(ids));
    }
}

// prompts: {"prompt": ..., "answer": ..., "counterfactual": ...}, one row.
void add_prompt_line(FileRows& r, const Experiment& e, const DataSpec& d, const Model& m, const Tokenizer& t,
                     const nlohmann::json& j, const std::string& where) {
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string() || !j.contains("answer") ||
        !j["answer"].is_string())
        throw DataError(fmt::format("{}: expected {{\"prompt\": TEXT, \"answer\": TEXT[, \"counterfactual\": TEXT]}}", where));
    auto p32 = t.encode(j["prompt"].get<std::string>(), true);
    std::vector<int64_t> ids(p32.begin(), p32.end());
    check_ids(e, d, m, ids, where);
    auto first = [&](const std::string& key) -> int64_t {
        auto a = t.encode(j[key].get<std::string>(), false);
        if (a.empty()) throw DataError(fmt::format("{}: \"{}\" encodes to no tokens", where, key));
        return a[0];
    };
    r.answers.push_back(first("answer"));
    r.cfs.push_back(j.contains("counterfactual") && j["counterfactual"].is_string() ? first("counterfactual") : -1);
    r.seqs.push_back(std::move(ids));
}

// tokens, conflicts, prompts: one line each (blank lines skipped), `count` lines at most.
void add_line_rows(FileRows& r, const Experiment& e, const DataSpec& d, const Model& m, const Tokenizer* tok,
                   const std::string& text) {
    int64_t lines = 0;  // conflicts: lines read (count limits lines, not rows)
    for_each_line(text, d.file, [&](const std::string& line, const std::string& where, int) {
        if (d.count > 0 && (d.kind == DataKind::kConflicts ? lines : static_cast<int64_t>(r.seqs.size())) >= d.count) return false;
        if (d.kind == DataKind::kTokens) {
            std::vector<int64_t> ids = parse_token_list(line, where);
            check_ids(e, d, m, ids, where);
            r.seqs.push_back(std::move(ids));
        } else if (d.kind == DataKind::kConflicts) {
            const Tokenizer& t = need_tokenizer(e, d, tok);
            add_conflicts_line(r, e, d, m, t, parse_json_line(line, where), where);
            ++lines;
        } else {
            const Tokenizer& t = need_tokenizer(e, d, tok);
            add_prompt_line(r, e, d, m, t, parse_json_line(line, where), where);
        }
        return true;
    });
    if (r.seqs.empty()) throw DataError(fmt::format("{}: no sequences (the file is empty)", d.file));
}

}  // namespace

AblationData make_data(const Experiment& e, const DataSpec& d, const Model& m, const Tokenizer* tok) {
    if (d.kind == DataKind::kRepeated) {
        AblationData out;
        try {
            out = repeated_data(m, d.length, d.count, d.seed >= 0 ? d.seed : e.seed, d.token_lo, d.token_hi, tok);
        } catch (const Error& ex) {  // range or context problems: point at the spec
            e.fail(d.mark, fmt::format("data '{}': {}", d.name, ex.what()));
        }
        out.name = d.name;
        return out;
    }
    const std::string text = read_utf8_text_file(d.file);
    FileRows r;
    if (d.kind == DataKind::kText) add_text_rows(r, e, d, m, need_tokenizer(e, d, tok), text);
    else add_line_rows(r, e, d, m, tok, text);
    auto out = from_seqs(d.name, d.kind, r.seqs);
    out.answers = r.answers;
    out.counterfactuals = r.cfs;
    out.variants = r.variants;
    return out;
}

// ---------------------------------------------------------------- engine

namespace {
// The scored positions of one chunk of dataset rows, flattened: row (in chunk), position, target.
struct Chunk {
    int64_t r0 = 0, b = 0;
    at::Tensor tokens;             // [b, T] on the model's device
    at::Tensor prow, ppos, ptgt, pcf;  // [P] int64 on device
    at::Tensor counts;             // [b] float on device
    at::Tensor clean_lp;           // kl: [P, V] float clean log-probs
};
// Positions unembedded at once: [512, V] logits (100 MiB at V = 50257). Larger pieces run the
// GEMM ~5 % faster (docs/performance.md) at the cost of memory that grows with V.
constexpr int64_t kPiece = 512;
}  // namespace

struct Ablator::Impl {
    std::vector<Chunk> chunks;
    std::vector<at::Tensor> ref;   // per layer: mean [T, H, d] / [H, d], or resample source [N_ref, T_ref, H, d]
    at::Tensor resample_src;       // [N] int64
    int64_t L = 0, H = 0;
};

// Final residual [B, T, D] of a forward (no logits).
static at::Tensor final_resid(const Model& m, const at::Tensor& tokens, Hooks& hooks, ForwardOptions fo) {
    at::Tensor out;
    hooks.capture(Point::kResidPost, [&](int, const at::Tensor& x) { out = x; }, m.config.n_layers - 1);
    fo.compute_logits = false;
    m.forward(tokens, &hooks, nullptr, fo);
    return out;
}

// Per-position metric values for resid rows [B, T, D] where B = g * b, summed per row and divided
// by the row's count: [B] float.
static at::Tensor metric_rows(const Model& m, const AblationSetup& s, const Chunk& ch, const at::Tensor& resid, int64_t g) {
    const int64_t P = ch.prow.size(0), b = ch.b;
    auto dev = resid.device();
    auto offs = torch::arange(g, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(1) * b;
    auto rows = (ch.prow.unsqueeze(0) + offs).reshape(-1);  // [g*P]
    auto pos = ch.ppos.repeat({g});
    auto tgt = ch.ptgt.repeat({g});
    auto x = resid.index({rows, pos});  // [g*P, D]
    std::vector<at::Tensor> vals;
    for (int64_t i = 0; i < g * P; i += kPiece) {
        const int64_t n = std::min(kPiece, g * P - i);
        auto logits = m.unembed(x.narrow(0, i, n)).to(torch::kFloat);  // [n, V]
        auto t = tgt.narrow(0, i, n).unsqueeze(1);
        switch (s.metric) {
            case MetricKind::kLoss: vals.push_back((torch::logsumexp(logits, -1, true) - logits.gather(1, t)).squeeze(1)); break;
            case MetricKind::kAccuracy: vals.push_back(logits.argmax(-1).eq(t.squeeze(1)).to(torch::kFloat)); break;
            case MetricKind::kProb: vals.push_back((logits.gather(1, t) - torch::logsumexp(logits, -1, true)).exp().squeeze(1)); break;
            case MetricKind::kLogitDiff: {
                auto cf = ch.pcf.repeat({g}).narrow(0, i, n).unsqueeze(1);
                vals.push_back((logits.gather(1, t) - logits.gather(1, cf)).squeeze(1));
                break;
            }
            case MetricKind::kKl: {
                auto lp = torch::log_softmax(logits, -1);
                auto idx = torch::arange(i, i + n, torch::TensorOptions().dtype(torch::kLong).device(dev)).remainder(P);
                auto lpc = ch.clean_lp.index_select(0, idx);
                vals.push_back((lpc.exp() * (lpc - lp)).sum(-1));
                break;
            }
        }
    }
    auto v = torch::cat(vals);
    auto sum = torch::zeros({g * b}, v.options()).index_add(0, rows, v);
    return sum / ch.counts.repeat({g});
}

namespace {

// The metric reads each row's answer position (prompts and conflicts data).
bool reads_answer(const AblationSetup& s) {
    return s.metric == MetricKind::kAccuracy || s.metric == MetricKind::kLogitDiff || s.metric == MetricKind::kProb ||
           s.positions == Positions::kAnswer;
}

// The setup against the data: ConfigError or DataError naming the dataset.
void check_setup(const AblationSetup& s, const AblationData& data) {
    const int64_t N = data.rows();
    if (N == 0) throw DataError(fmt::format("data '{}': no rows", data.name));
    const auto& modes = study_interventions();
    if (std::find(modes.begin(), modes.end(), s.mode) == modes.end())
        throw ConfigError(fmt::format("mode {}: an ablation study runs {}", intervention_name(s.mode),
                                      or_list(intervention_name_list(modes))));
    if (reads_answer(s) && data.answers.size() != static_cast<size_t>(N))
        throw ConfigError(fmt::format("data '{}': the metric needs prompt/answer pairs (a prompts or conflicts dataset)", data.name));
    if (s.counterfactual && s.metric != MetricKind::kProb) throw ConfigError("target counterfactual applies to metric prob only");
    if (s.counterfactual)
        for (int64_t i = 0; i < N; ++i)
            if (data.counterfactuals[i] < 0)
                throw DataError(fmt::format("data '{}': row {} has no counterfactual answer (prob of the counterfactual needs one)", data.name, i));
    if (s.positions == Positions::kRepeatedHalf && data.n < 2)
        throw ConfigError(fmt::format("data '{}': positions repeated-half needs a repeated dataset", data.name));
    if (s.metric == MetricKind::kLogitDiff)
        for (int64_t i = 0; i < N; ++i)
            if (data.counterfactuals[i] < 0)
                throw DataError(fmt::format("data '{}': row {} has no counterfactual answer (logit-diff needs one)", data.name, i));
}

// Rows [r0, r0 + b) of the data: their tokens on the device, the positions the metric scores and,
// for kl, the clean log-probs there.
Chunk make_chunk(const Model& m, const AblationSetup& s, const AblationData& data, const at::Tensor& tok_cpu, int64_t r0,
                 int64_t b) {
    const auto dev = m.options.device;
    const auto lopt = torch::TensorOptions().dtype(torch::kLong);
    const bool answer = reads_answer(s);
    Chunk ch;
    ch.r0 = r0, ch.b = b;
    ch.tokens = tok_cpu.narrow(0, r0, ch.b).to(dev);
    std::vector<int64_t> pr, pp, pt, pc;
    std::vector<float> cnt(ch.b, 0.f);
    auto acc = tok_cpu.accessor<int64_t, 2>();
    for (int64_t r = 0; r < ch.b; ++r) {
        const int64_t i = r0 + r, len = data.lengths[i];
        auto add = [&](int64_t p, int64_t t, int64_t c) {
            pr.push_back(r), pp.push_back(p), pt.push_back(t), pc.push_back(c), cnt[r] += 1;
        };
        if (answer) {
            const int64_t cf = data.counterfactuals.empty() ? 0 : std::max<int64_t>(0, data.counterfactuals[i]);
            add(len - 1, s.counterfactual ? cf : data.answers[i], s.counterfactual ? data.answers[i] : cf);
        } else if (s.positions == Positions::kRepeatedHalf) {
            for (int64_t p = data.n + 1; p <= 2 * data.n - 1; ++p) add(p, acc[i][p + 1], 0);
        } else {
            for (int64_t p = 0; p + 1 < len; ++p) add(p, acc[i][p + 1], 0);
        }
        if (cnt[r] == 0) throw DataError(fmt::format("data '{}': row {} has no scored position (length {})", data.name, i, len));
    }
    ch.prow = torch::tensor(pr, lopt).to(dev);
    ch.ppos = torch::tensor(pp, lopt).to(dev);
    ch.ptgt = torch::tensor(pt, lopt).to(dev);
    ch.pcf = torch::tensor(pc, lopt).to(dev);
    ch.counts = torch::tensor(cnt).to(dev);
    if (s.metric == MetricKind::kKl) {  // clean log-probs at the scored positions
        Hooks h;
        auto resid = final_resid(m, ch.tokens, h, {});
        auto x = resid.index({ch.prow, ch.ppos});
        std::vector<at::Tensor> lps;
        for (int64_t i = 0; i < x.size(0); i += kPiece)
            lps.push_back(torch::log_softmax(m.unembed(x.narrow(0, i, std::min(kPiece, x.size(0) - i))).to(torch::kFloat), -1));
        ch.clean_lp = torch::cat(lps);
    }
    return ch;
}

// References for mean / resample: z (or q) of the clean model on the reference data, run in
// chunks of b rows: per layer the mean ([T_ref, H, d] per position or [H, d] pooled, valid
// positions only) or every row's activation (resample, with each data row's source row).
void make_references(Ablator::Impl& I, const Model& m, const AblationSetup& s, const AblationData& data, int64_t b) {
    const auto mode = s.mode;
    const auto dev = m.options.device;
    const int64_t N = data.rows(), T = data.tokens.size(1);
    const AblationData* ref = s.reference ? s.reference : &data;
    const int64_t Nr = ref->rows(), Tr = ref->tokens.size(1);
    const int64_t min_len = *std::min_element(ref->lengths.begin(), ref->lengths.end());
    if (mode == Intervention::kResample && min_len < T)
        throw ConfigError(fmt::format("mode resample: reference '{}' has rows of {} tokens, shorter than the {} of '{}'",
                                      ref->name, min_len, T, data.name));
    if (mode != Intervention::kResample && s.per_position && Tr < T)
        throw ConfigError(fmt::format("mode {}: per-position means over '{}' ({} positions) cannot cover '{}' ({} positions); "
                                      "use per_position: false", intervention_name(mode),
                                      ref->name, Tr, data.name, T));
    const Point p = intervention_point(mode);
    std::vector<at::Tensor> sum(I.L), full(I.L);
    auto valid = torch::zeros({Nr, Tr});
    for (int64_t i = 0; i < Nr; ++i) valid[i].narrow(0, 0, ref->lengths[i]).fill_(1.0);
    auto ref_tok = ref->tokens.to(dev);
    for (int64_t r0 = 0; r0 < Nr; r0 += b) {
        const int64_t rb = std::min(b, Nr - r0);
        auto vmask = valid.narrow(0, r0, rb).to(dev).view({rb, Tr, 1, 1});
        Hooks h;
        h.capture(p, [&](int l, const at::Tensor& x) {  // x [rb, Tr, H, d]
            if (mode == Intervention::kResample) {
                full[l] = full[l].defined() ? torch::cat({full[l], x}) : x.clone();
            } else {
                auto xs = (x.to(torch::kFloat) * vmask);
                auto red = s.per_position ? xs.sum(0) : xs.sum(std::vector<int64_t>{0, 1});
                sum[l] = sum[l].defined() ? sum[l] + red : red;
            }
        });
        ForwardOptions fo;
        fo.compute_logits = false;
        m.forward(ref_tok.narrow(0, r0, rb), &h, nullptr, fo);
    }
    I.ref.resize(I.L);
    for (int64_t l = 0; l < I.L; ++l) {
        if (mode == Intervention::kResample) {
            I.ref[l] = full[l];
        } else {
            auto count = s.per_position ? valid.sum(0).view({Tr, 1, 1}) : valid.sum().view({1, 1});
            I.ref[l] = (sum[l] / count.to(dev)).to(m.options.dtype);  // [Tr, H, d] or [H, d]
        }
    }
    if (mode != Intervention::kResample) return;
    // Row i reads reference row (i + shift) mod N_ref; shift != 0 when the reference is the
    // data itself, so no row reads its own activations.
    const bool self = ref == &data || ref->name == data.name;
    if (self && Nr < 2) throw ConfigError(fmt::format("mode resample: '{}' needs at least 2 rows", ref->name));
    std::mt19937_64 rng(static_cast<uint64_t>(s.resample_seed));
    const int64_t shift = self ? 1 + static_cast<int64_t>(rng() % (Nr - 1)) : static_cast<int64_t>(rng() % Nr);
    I.resample_src = (torch::arange(N, torch::TensorOptions().dtype(torch::kLong)) + shift).remainder(Nr);
}

}  // namespace

Ablator::Ablator(const Model& m, const AblationData& data, const AblationSetup& setup)
    : m_(m), data_(data), s_(setup), impl_(std::make_unique<Impl>()) {
    torch::NoGradGuard ng;
    auto& I = *impl_;
    I.L = m.config.n_layers, I.H = m.config.n_heads;
    check_setup(s_, data);
    // Chunks of rows; scored positions per chunk.
    const int64_t N = data.rows(), b = std::min<int64_t>(N, std::max<int64_t>(1, s_.max_rows));
    auto tok_cpu = data.tokens.to(torch::kCPU);
    for (int64_t r0 = 0; r0 < N; r0 += b) I.chunks.push_back(make_chunk(m, s_, data, tok_cpu, r0, std::min(b, N - r0)));
    if (needs_reference(s_.mode)) make_references(I, m, s_, data, b);
}

Ablator::~Ablator() = default;

int64_t Ablator::resample_source(int64_t i) const {
    return impl_->resample_src.defined() ? impl_->resample_src[i].item<int64_t>() : -1;
}

namespace {
// The per-row edits of one batch: masks [g, L, H] float (1 = ablated) on device.
// factors: [g] per-configuration scale factors (scale mode), undefined = s.factor for every one.
void add_edits(Hooks& hooks, const AblationSetup& s, const Ablator::Impl& I, const at::Tensor& M, const Chunk& ch,
               int64_t first_layer, const at::Tensor& factors) {
    const int64_t g = M.size(0), b = ch.b;
    InterventionSpec iv;
    iv.mode = s.mode, iv.window = s.window;
    LayerRows rows;
    rows.per_position = s.per_position;
    if (s.mode == Intervention::kScale)  // configuration j's factor on its b rows
        rows.row_factors = (factors.defined() ? factors.to(M.device(), torch::kDouble)
                                              : torch::full({g}, s.factor, M.options().dtype(torch::kDouble)))
                               .repeat_interleave(b, 0);
    for (int64_t l = first_layer; l < I.L; ++l) {
        auto ml = M.select(1, l);  // [g, H]
        if (!ml.any().item<bool>()) continue;
        rows.layer = static_cast<int>(l);
        rows.mask = ml.repeat_interleave(b, 0);  // [g*b, H]
        if (s.mode == Intervention::kMean || s.mode == Intervention::kMeanQuery) {
            iv.value = I.ref[l];
        } else if (s.mode == Intervention::kResample) {
            auto src = I.resample_src.narrow(0, ch.r0, b).to(I.ref[l].device());
            iv.value = I.ref[l].index_select(0, src).repeat({g, 1, 1, 1});  // [g*b, T_ref, H, d]
        }
        apply_intervention(hooks, iv, rows, study_interventions());
    }
}
}  // namespace

namespace {
// masks_in [C, L, H] checked and as bool on the CPU; first[c] = the first layer configuration c
// ablates (L when none).
at::Tensor checked_masks(const at::Tensor& masks_in, int64_t L, int64_t H) {
    if (masks_in.dim() != 3 || masks_in.size(1) != L || masks_in.size(2) != H)
        throw ConfigError(fmt::format("ablation masks must be [C, {}, {}]", L, H));
    return masks_in.to(torch::kCPU).ne(0);
}
std::vector<int64_t> first_layers(const at::Tensor& masks, int64_t L) {
    const int64_t C = masks.size(0);
    auto layer_any = masks.any(2);  // [C, L]
    std::vector<int64_t> first(C, L);
    for (int64_t c = 0; c < C; ++c)
        for (int64_t l = 0; l < L; ++l)
            if (layer_any[c][l].item<bool>()) {
                first[c] = l;
                break;
            }
    return first;
}
}  // namespace

std::vector<std::vector<int64_t>> Ablator::plan(const at::Tensor& masks_in) const {
    const auto& I = *impl_;
    const auto masks = checked_masks(masks_in, I.L, I.H);
    const int64_t C = masks.size(0);
    // Configurations sorted by their first ablated layer, so a batch shares a long prefix.
    const auto first = first_layers(masks, I.L);
    std::vector<int64_t> order(C);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return first[a] < first[b]; });
    const int64_t per = std::max<int64_t>(1, s_.max_rows / I.chunks.front().b);
    std::vector<std::vector<int64_t>> out;
    for (int64_t i = 0; i < C; i += per) out.emplace_back(order.begin() + i, order.begin() + std::min(C, i + per));
    return out;
}

at::Tensor Ablator::evaluate_batch(const at::Tensor& masks_in, const std::vector<int64_t>& idx,
                                   const std::vector<double>& factors) const {
    torch::NoGradGuard ng;
    const auto& I = *impl_;
    const auto masks = checked_masks(masks_in, I.L, I.H);
    const int64_t N = data_.rows(), g = static_cast<int64_t>(idx.size());
    const auto first = first_layers(masks, I.L);
    const auto dev = m_.options.device;
    auto out = torch::full({g, N}, std::numeric_limits<float>::quiet_NaN());
    auto idx_t = torch::tensor(idx, torch::kLong);
    auto M = masks.index_select(0, idx_t).to(dev, torch::kFloat);  // [g, L, H]
    at::Tensor F;  // [g] per-configuration factors (scale mode)
    if (!factors.empty()) {
        if (s_.mode != Intervention::kScale) throw ConfigError("per-configuration factors need mode scale");
        if (static_cast<int64_t>(factors.size()) != masks.size(0))
            throw ConfigError(fmt::format("{} factors for {} configurations", factors.size(), masks.size(0)));
        F = torch::tensor(factors, torch::kDouble).index_select(0, idx_t);
    }
    int64_t lmin = I.L;
    for (auto c : idx) lmin = std::min(lmin, first[c]);
    for (const auto& ch : I.chunks) {
        auto tokens = ch.tokens.repeat({g, 1});
        ForwardOptions fo;
        at::Tensor resid;
        if (s_.prefix_reuse && lmin > 0) {
            // Layers 0..lmin-1 once for the b rows, then expanded over the g configurations.
            Hooks hp;
            at::Tensor pre;
            hp.capture(Point::kResidPost, [&](int, const at::Tensor& x) { pre = x; }, static_cast<int>(lmin - 1));
            ForwardOptions fp;
            fp.compute_logits = false;
            fp.stop_after_layer = static_cast<int>(lmin - 1);
            m_.forward(ch.tokens, &hp, nullptr, fp);
            ++forwards_;
            if (lmin == I.L) resid = pre.repeat({g, 1, 1});
            else fo.start_layer = static_cast<int>(lmin), fo.start_resid = pre.repeat({g, 1, 1});
        }
        if (!resid.defined()) {
            Hooks h;
            add_edits(h, s_, I, M, ch, fo.start_layer, F);
            resid = final_resid(m_, tokens, h, fo);
            ++forwards_;
        }
        out.narrow(1, ch.r0, ch.b).copy_(metric_rows(m_, s_, ch, resid, g).view({g, ch.b}).to(torch::kCPU));
    }
    return out;
}

at::Tensor Ablator::evaluate(const at::Tensor& masks_in, const BatchFn& on_batch, const std::vector<double>& factors) const {
    const auto& I = *impl_;
    const auto masks = checked_masks(masks_in, I.L, I.H);
    const int64_t C = masks.size(0), N = data_.rows();
    auto out = torch::full({C, N}, std::numeric_limits<float>::quiet_NaN());
    Progress prog("ablation configurations", C);
    int64_t done = 0;
    for (const auto& idx : plan(masks)) {
        auto idx_t = torch::tensor(idx, torch::kLong);
        out.index_copy_(0, idx_t, evaluate_batch(masks, idx, factors));
        if (on_batch) on_batch(idx, out.index_select(0, idx_t));
        done += static_cast<int64_t>(idx.size());
        prog.update(done);
    }
    prog.finish();
    return out;
}

// Metric rows with continuous gates xi_rows [g*b, L, H] on z (autograd flows through them): g copies
// of the chunk's b rows, copy j gated by xi_rows[j*b .. j*b+b-1].
static at::Tensor gated_rows(const Model& m, const AblationSetup& s, const Chunk& ch, const at::Tensor& xi_rows,
                             int64_t g = 1) {
    Hooks h;
    const int64_t rows = g * ch.b, H = m.config.n_heads;
    h.edit(Point::kAttnZ, [xi_rows, rows, H](int l, const at::Tensor& x) -> std::optional<at::Tensor> {
        return x * xi_rows.select(1, l).view({rows, 1, H, 1}).to(x.scalar_type());
    });
    auto resid = final_resid(m, g == 1 ? ch.tokens : ch.tokens.repeat({g, 1}), h, {});
    return metric_rows(m, s, ch, resid, g);
}

at::Tensor Ablator::gated_metric(const at::Tensor& xi) const {
    const auto& I = *impl_;
    if (xi.dim() != 3 || xi.size(1) != I.L || xi.size(2) != I.H)
        throw ConfigError(fmt::format("gates must be [G, {}, {}]", I.L, I.H));
    const int64_t G = xi.size(0);
    at::Tensor total;
    for (const auto& ch : I.chunks) {
        auto x = xi.to(m_.options.device, torch::kFloat).repeat_interleave(ch.b, 0);  // [G*b, L, H]
        auto part = gated_rows(m_, s_, ch, x, G).view({G, ch.b}).sum(1);
        total = total.defined() ? total + part : part;
        ++forwards_;
    }
    return total / static_cast<double>(data_.rows());
}

std::vector<Ablator::ScoredRows> Ablator::scored_rows() const {
    std::vector<ScoredRows> out;
    for (const auto& ch : impl_->chunks) out.push_back({ch.tokens, ch.prow, ch.ppos});
    return out;
}

at::Tensor Ablator::evaluate_gates(const at::Tensor& xi) const {
    torch::NoGradGuard ng;
    const auto& I = *impl_;
    std::vector<at::Tensor> rows;
    for (const auto& ch : I.chunks) {
        auto x = xi.to(m_.options.device, torch::kFloat).unsqueeze(0).expand({ch.b, I.L, I.H});
        rows.push_back(gated_rows(m_, s_, ch, x).to(torch::kCPU));
        ++forwards_;
    }
    return torch::cat(rows);
}

at::Tensor Ablator::gate_gradient_importance(const at::Tensor& pruned) const {
    torch::AutoGradMode grad(true);
    const auto& I = *impl_;
    auto keep = (1 - pruned.to(torch::kCPU, torch::kFloat).ne(0).to(torch::kFloat)).to(m_.options.device);
    auto total = torch::zeros({I.L, I.H}, torch::kDouble);
    for (const auto& ch : I.chunks) {
        // One leaf per row: row r's metric depends only on xi_rows[r], so one backward of the sum
        // gives every row's own gradient.
        auto xi_rows = keep.unsqueeze(0).expand({ch.b, I.L, I.H}).clone().requires_grad_(true);
        auto rows = gated_rows(m_, s_, ch, xi_rows);
        rows.sum().backward();
        total += xi_rows.grad().abs().sum(0).to(torch::kCPU, torch::kDouble);
        ++forwards_;
    }
    return total / static_cast<double>(data_.rows());
}

at::Tensor normalise_per_layer(const at::Tensor& imp) {
    return imp / (imp.norm(2, {1}, true) + 1e-20);
}

// ---------------------------------------------------------------- head sets

void check_head_ranges(const Experiment& e, const HeadSpec& h, int L, int H) {
    for (size_t i = 0; i < h.heads.size(); ++i) {
        auto [l, hh] = h.heads[i];
        if (l >= L || hh >= H)
            e.fail(h.head_marks[i], fmt::format("head {} out of range: the model has {} layers (L0-L{}) and {} heads "
                                                "per layer (H0-H{})", format_head(l, hh), L, L - 1, H, H - 1));
    }
    for (int l : h.layers)
        if (l < 0 || l >= L) e.fail(h.by_mark, fmt::format("layer {} out of range: the model has {} layers (0-{})", l, L, L - 1));
    for (auto k : h.ks)
        if (k > int64_t(L) * H) e.fail(h.mark, fmt::format("top/bottom {}: the model has only {} heads", k, L * H));
    if (h.inner) check_head_ranges(e, *h.inner, L, H);
}

at::Tensor resolve_score(const Experiment& e, const HeadSpec& h, const std::vector<std::pair<std::string, at::Tensor>>& computed,
                         int L, int H) {
    if (h.by.find(':') != std::string::npos) {
        try {
            return read_head_score(split_head_score_ref(h.by), L, H);
        } catch (const UsageError& ex) {
            e.fail(h.by_mark, fmt::format("by: {}", ex.what()));
        } catch (const StorageError& ex) {
            e.fail(h.by_mark, fmt::format("by: {}", ex.what()));
        }
    }
    auto parts = split(h.by, '/');
    std::string probe;
    for (const auto& p : parts)
        if (!p.empty() && p != "scores" && p != "score") probe = p;
    for (const auto& [name, t] : computed)
        if (name == probe) return t.to(torch::kCPU, torch::kDouble);
    e.fail(h.by_mark, fmt::format("by: '{}': no such score in this run", h.by));
}

at::Tensor resolve_heads(const Experiment& e, const HeadSpec& h, const std::vector<std::pair<std::string, at::Tensor>>& computed,
                         int L, int H, size_t ki) {
    auto mask = torch::zeros({L, H}, torch::kUInt8);
    using K = HeadSpec::Kind;
    switch (h.kind) {
        case K::kAll: mask.fill_(1); break;
        case K::kList:
            for (auto [l, hh] : h.heads) mask[l][hh] = 1;
            break;
        case K::kLayers:
            for (int l : h.layers) mask[l].fill_(1);
            break;
        case K::kComplement: mask = 1 - resolve_heads(e, *h.inner, computed, L, H); break;
        case K::kTop:
        case K::kBottom: {
            // NaN scores rank last either way; ties keep head order.
            const auto idx = rank_heads(resolve_score(e, h, computed, L, H), h.kind == K::kTop);
            const int64_t k = h.ks.at(std::min(ki, h.ks.size() - 1));
            for (int64_t i = 0; i < k; ++i) mask[idx[i] / H][idx[i] % H] = 1;
            break;
        }
        case K::kThreshold: {
            auto score = resolve_score(e, h, computed, L, H);
            mask = (h.above ? score.ge(h.threshold) : score.le(h.threshold)).to(torch::kUInt8);
            break;
        }
    }
    return mask;
}

static int64_t count(const at::Tensor& m) { return m.ne(0).sum().item<int64_t>(); }

StudyConfigs build_study(const Experiment& e, const StudySpec& s,
                         const std::vector<std::pair<std::string, at::Tensor>>& computed, int L, int H) {
    StudyConfigs c;
    auto add = [&](at::Tensor m, const std::string& kind, const std::string& label, int64_t k, int64_t seed) {
        c.masks.push_back(std::move(m)), c.kinds.push_back(kind), c.labels.push_back(label), c.k.push_back(k);
        c.control_seed.push_back(seed), c.fraction.push_back(0.0);
    };
    add(torch::zeros({L, H}, torch::kUInt8), "baseline", "baseline", 0, -1);
    auto cand = s.has_heads && s.sweep != SweepKind::kCumulative ? resolve_heads(e, s.heads, computed, L, H)
                                                       : torch::ones({L, H}, torch::kUInt8);
    std::vector<at::Tensor> excluded;  // heads under test, per configuration (after the baseline)
    if (s.sweep == SweepKind::kSingle) {
        if (count(cand) == 0) e.fail(s.heads_mark, fmt::format("study '{}': the head set is empty", s.name));
        for (int l = 0; l < L; ++l)
            for (int h = 0; h < H; ++h)
                if (cand[l][h].item<int>()) {
                    auto m = torch::zeros({L, H}, torch::kUInt8);
                    m[l][h] = 1;
                    add(m, "single", format_head(l, h), 1, -1);
                }
    } else if (s.sweep == SweepKind::kLayer) {
        for (int l = 0; l < L; ++l)
            if (cand[l].any().item<bool>()) {
                auto m = torch::zeros({L, H}, torch::kUInt8);
                m[l].fill_(1);
                add(m, "layer", fmt::format("L{}", l), H, -1);
            }
    } else if (s.sweep == SweepKind::kSet) {
        for (const auto& [name, spec] : s.sets) {
            auto m = resolve_heads(e, spec, computed, L, H);
            if (count(m) == 0) e.fail(spec.mark, fmt::format("set '{}' is empty", name));
            add(m, "set", name, count(m), -1);
        }
    } else if (s.sweep == SweepKind::kScaleGrid) {
        // Head-major: every factor of a head, then the next head (layer, head order).
        if (count(cand) == 0) e.fail(s.heads_mark, fmt::format("study '{}': the head set is empty", s.name));
        c.factor.push_back(1.0);
        for (int l = 0; l < L; ++l)
            for (int h = 0; h < H; ++h)
                if (cand[l][h].item<int>())
                    for (double f : s.factors) {
                        auto m = torch::zeros({L, H}, torch::kUInt8);
                        m[l][h] = 1;
                        add(m, "scale", fmt::format("{} x{}", format_head(l, h), f), 1, -1);
                        c.factor.push_back(f);
                    }
    } else if (s.sweep == SweepKind::kCumulative) {
        for (size_t ki = 0; ki < s.heads.ks.size(); ++ki) {
            auto m = resolve_heads(e, s.heads, computed, L, H, ki);
            add(m, "cumulative", fmt::format("{}-{}", s.heads.kind == HeadSpec::Kind::kTop ? "top" : "bottom", s.heads.ks[ki]),
                s.heads.ks[ki], -1);
        }
    }
    if (s.controls == 0) return c;
    // Controls after each configuration: random sets of its size among the heads not under test.
    at::Tensor widest;  // cumulative: every head the sweep tests
    if (s.sweep == SweepKind::kCumulative)
        for (size_t i = 1; i < c.masks.size(); ++i) widest = widest.defined() ? widest.bitwise_or(c.masks[i]) : c.masks[i].clone();
    StudyConfigs out;
    for (size_t i = 0; i < c.masks.size(); ++i) {
        out.masks.push_back(c.masks[i]), out.kinds.push_back(c.kinds[i]), out.labels.push_back(c.labels[i]);
        out.k.push_back(c.k[i]), out.control_seed.push_back(-1), out.fraction.push_back(0.0);
        if (i == 0) continue;
        auto under_test = widest.defined() ? widest : c.masks[i];
        std::vector<int64_t> pool;
        for (int64_t j = 0; j < int64_t(L) * H; ++j)
            if (!under_test[j / H][j % H].item<int>()) pool.push_back(j);
        const int64_t k = count(c.masks[i]);
        if (static_cast<int64_t>(pool.size()) < k)
            e.fail(s.controls_mark, fmt::format("controls: configuration '{}' ablates {} heads but only {} others remain to draw from",
                                                c.labels[i], k, pool.size()));
        for (int64_t j = 0; j < s.controls; ++j) {
            const int64_t seed = e.seed * 1000003 + static_cast<int64_t>(i) * 1009 + j;
            auto m = torch::zeros({L, H}, torch::kUInt8);
            for (int64_t t : random_subset(pool, k, static_cast<uint64_t>(seed))) m[t / H][t % H] = 1;
            out.masks.push_back(m), out.kinds.push_back("control");
            out.labels.push_back(fmt::format("control {} of {}", j, c.labels[i]));
            out.k.push_back(k), out.control_seed.push_back(seed), out.fraction.push_back(0.0);
        }
    }
    return out;
}

PrunePlan plan_prune(const StudySpec& s, const Ablator& ab, int L, int H) {
    PrunePlan p;
    auto& c = p.configs;
    auto pruned = torch::zeros({L, H}, torch::kUInt8);
    auto push = [&](const std::string& kind, const std::string& label, double f) {
        c.masks.push_back(pruned.clone()), c.kinds.push_back(kind), c.labels.push_back(label);
        c.k.push_back(count(pruned)), c.control_seed.push_back(-1), c.fraction.push_back(f);
    };
    push("baseline", "baseline", 0.0);
    const int64_t total = int64_t(L) * H;
    auto imp = normalise_per_layer(ab.gate_gradient_importance(pruned));
    Progress prog("prune steps", static_cast<int64_t>(s.steps.size()));
    for (double f : s.steps) {
        if (s.recompute && count(pruned) > 0) imp = normalise_per_layer(ab.gate_gradient_importance(pruned));
        p.importance.push_back(imp.clone());
        const int64_t target = std::min<int64_t>(total, std::llround(f * total));
        while (count(pruned) < target) {
            auto masked = imp.flatten().clone();
            masked.masked_fill_(pruned.flatten().ne(0), std::numeric_limits<double>::infinity());
            const int64_t j = masked.argmin().item<int64_t>();
            pruned[j / H][j % H] = 1;
            p.order.push_back(j);
        }
        push("prune", fmt::format("{:g}% pruned", 100 * f), f);
        prog.tick();
    }
    prog.finish();
    return p;
}

}  // namespace hs
