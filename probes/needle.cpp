#include "needle.h"

#include "errors.h"
#include "guard.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>

namespace hs {

using torch::indexing::None;
using torch::indexing::Slice;

const char* const kDefaultTemplate = "{context}Based on the content of the book, Question: {question}\nAnswer:";

// ---- needles file ----

std::vector<Needle> read_needles(const std::string& path) {
    const std::string text = read_utf8_text_file(path);
    std::vector<Needle> out;
    int line_no = 0;
    for (const auto& raw : split(text, '\n')) {
        ++line_no;
        const std::string line = trim(raw);
        if (line.empty()) continue;
        const std::string where = fmt::format("{}:{}", path, line_no);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const std::exception&) {
            throw DataError(fmt::format("{}: not a JSON object (expected {{\"needle\": ..., \"question\": ..., \"answer\": ...}})", where));
        }
        if (!j.is_object()) throw DataError(fmt::format("{}: not a JSON object", where));
        Needle n;
        n.line = line_no;
        for (const char* key : {"needle", "question", "answer"}) {
            if (!j.contains(key) || !j[key].is_string())
                throw DataError(fmt::format("{}: missing string field \"{}\"", where, key));
            const std::string v = j[key].get<std::string>();
            if (trim(v).empty()) throw DataError(fmt::format("{}: field \"{}\" is empty", where, key));
            (key[0] == 'n' ? n.needle : key[0] == 'q' ? n.question : n.answer) = v;
        }
        // Every word of the answer must occur in the needle's text (case-insensitive).
        std::string low;
        for (unsigned char c : n.needle) low += static_cast<char>(std::tolower(c));
        for (const auto& w : rouge_tokens(n.answer, false))
            if (low.find(w) == std::string::npos)
                throw DataError(fmt::format("{}: the answer \"{}\" is not in the needle (word \"{}\" missing)", where,
                                            n.answer, w));
        if (rouge_tokens(n.answer, false).empty())
            throw DataError(fmt::format("{}: the answer \"{}\" has no word (letters or digits)", where, n.answer));
        out.push_back(std::move(n));
    }
    if (out.empty()) throw DataError(fmt::format("{}: no needles (the file is empty)", path));
    return out;
}

// ---- template ----

PromptTemplate parse_template(const std::string& text) {
    const auto c = text.find("{context}");
    if (c == std::string::npos || text.find("{context}", c + 1) != std::string::npos)
        throw UsageError(fmt::format("needs {{context}} exactly once (got \"{}\")", text));
    if (text.find("{question}") == std::string::npos)
        throw UsageError(fmt::format("has no {{question}} placeholder (got \"{}\")", text));
    return PromptTemplate{text};
}

static std::string substitute(std::string s, const std::string& question) {
    const std::string key = "{question}";
    for (size_t p = s.find(key); p != std::string::npos; p = s.find(key, p + question.size()))
        s.replace(p, key.size(), question);
    return s;
}

std::string PromptTemplate::prefix(const std::string& q) const { return substitute(text.substr(0, text.find("{context}")), q); }
std::string PromptTemplate::suffix(const std::string& q) const {
    return substitute(text.substr(text.find("{context}") + 9), q);
}

// ---- tokens ----

const NameTable<StopRule>& stop_rule_names() {
    static const NameTable<StopRule> t = {{StopRule::kNewline, "newline"}, {StopRule::kEos, "eos"}, {StopRule::kNone, "none"}};
    return t;
}

bool TokenFacts::stop(int64_t id) const {
    if (stop_rule == StopRule::kNone) return false;
    if (std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end()) return true;
    return stop_rule == StopRule::kNewline && std::find(newline_ids.begin(), newline_ids.end(), id) != newline_ids.end();
}

TokenFacts token_facts(const Tokenizer& tok, StopRule rule) {
    TokenFacts f;
    f.stop_rule = rule;
    const auto with = tok.encode("a", true), without = tok.encode("a", false);
    // The specials before the text: what `with` has before `without` begins.
    for (size_t i = 0; i + without.size() <= with.size(); ++i)
        if (std::equal(without.begin(), without.end(), with.begin() + i)) {
            f.bos_prefix.assign(with.begin(), with.begin() + i);
            break;
        }
    const Tokenizer* t = &tok;
    auto cache = std::make_shared<std::map<int64_t, std::string>>();
    auto text_of = [t, cache](int64_t id) -> const std::string& {
        auto it = cache->find(id);
        if (it != cache->end()) return it->second;
        return (*cache)[id] = t->decode({static_cast<int32_t>(id)}, true);
    };
    f.sentence_end = [text_of](int64_t id) {
        const std::string& s = text_of(id);
        return !s.empty() && (s.back() == '.' || s.back() == '!' || s.back() == '?' || s.back() == '\n');
    };
    if (const auto eos = tok.eos_id()) f.eos_ids.push_back(*eos);
    // Every token that decodes to exactly "\n" (a byte-fallback <0x0A>, GPT-2's "\u010a", ...), not
    // tokens that merely contain one (".\n", "\n\n"): those are text and do not end a response.
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (!tok.is_special(id) && tok.decode({id}, false) == "\n") f.newline_ids.push_back(id);
    return f;
}

std::optional<std::pair<int64_t, int64_t>> answer_span(const Tokenizer& tok, const std::vector<int64_t>& needle,
                                                       const std::string& answer) {
    // ends[i] = length of the decoded text of needle[0, i]: token i adds chars [ends[i-1], ends[i]).
    const int64_t n = static_cast<int64_t>(needle.size());
    std::vector<int32_t> ids;
    std::vector<size_t> ends;
    std::string text;
    for (int64_t i = 0; i < n; ++i) {
        ids.push_back(static_cast<int32_t>(needle[i]));
        text = tok.decode(ids, true);
        ends.push_back(text.size());
    }
    auto lower = [](std::string s) {
        for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    const std::string a = lower(trim(answer));
    if (a.empty()) return std::nullopt;
    const size_t at = lower(text).find(a);
    if (at == std::string::npos) return std::nullopt;
    int64_t first = -1, last = -1;
    for (int64_t i = 0; i < n; ++i) {
        const size_t b = i == 0 ? 0 : ends[i - 1], e = ends[i];
        if (e > at && b < at + a.size()) {
            if (first < 0) first = i;
            last = i;
        }
    }
    if (first < 0) return std::nullopt;
    return std::make_pair(first, last + 1);
}

Trial build_trial(const TokenFacts& facts, const std::vector<int64_t>& haystack, const std::vector<int64_t>& prefix,
                  const std::vector<int64_t>& needle, const std::vector<int64_t>& suffix, int64_t length, double depth,
                  int needle_index, std::pair<int64_t, int64_t> answer) {
    const int64_t n = static_cast<int64_t>(needle.size());
    HS_REQUIRE(answer.first >= 0 && answer.second <= n && answer.first < answer.second,
               "build_trial: the answer span lies outside the needle");
    if (n >= length)
        throw DataError(fmt::format("needle {} has {} tokens, no shorter than the context length {}", needle_index, n, length));
    if (haystack.empty()) throw DataError("the haystack has no tokens");
    const int64_t n_hay = length - n;
    std::vector<int64_t> hay(n_hay);
    for (int64_t i = 0; i < n_hay; ++i) hay[i] = haystack[i % haystack.size()];
    int64_t at = depth >= 100.0 ? n_hay : static_cast<int64_t>(static_cast<double>(n_hay) * depth / 100.0);
    if (depth < 100.0)
        while (at > 0 && !facts.sentence_end(hay[at - 1])) --at;  // back to the previous sentence end
    Trial t;
    t.length = length, t.depth = depth, t.needle = needle_index;
    t.prompt = prefix;
    t.prompt.insert(t.prompt.end(), hay.begin(), hay.begin() + at);
    t.needle_start = static_cast<int64_t>(t.prompt.size());
    t.prompt.insert(t.prompt.end(), needle.begin(), needle.end());
    t.needle_end = static_cast<int64_t>(t.prompt.size());
    t.answer_start = t.needle_start + answer.first, t.answer_end = t.needle_start + answer.second;
    t.prompt.insert(t.prompt.end(), hay.begin() + at, hay.end());
    t.prompt.insert(t.prompt.end(), suffix.begin(), suffix.end());
    return t;
}

// ---- ablation ----

const std::vector<Intervention>& needle_ablations() {
    static const std::vector<Intervention> v = {Intervention::kZeroQuery, Intervention::kMeanQuery, Intervention::kZero,
                                                Intervention::kStream};
    return v;
}

const NameTable<AblationScope>& ablation_scope_names() {
    static const NameTable<AblationScope> t = {{AblationScope::kAll, "all"}, {AblationScope::kDecode, "decode"}};
    return t;
}

void HeadSet::apply(Hooks& hooks, int64_t row) const {
    for (auto [l, h] : heads) {
        switch (mode) {
            case Intervention::kZeroQuery: hooks.intervene_q(HeadIntervention{l, h, row, HeadOp::kZero, 0.0, {}}); break;
            case Intervention::kMeanQuery:
                hooks.intervene_q_pre_rope(HeadIntervention{l, h, row, HeadOp::kReplace, 0.0, q_mean[l][h]});
                break;
            case Intervention::kZero: hooks.intervene_z(HeadIntervention{l, h, row, HeadOp::kZero, 0.0, {}}); break;
            case Intervention::kStream:
                hooks.window(HeadWindow{l, h, row, window, {}});
                break;
            case Intervention::kNone: break;
            default:
                HS_REQUIRE(false, std::string("HeadSet: the needle test does not run ") + intervention_name(mode));
        }
    }
}

at::Tensor calibrate_query_mean(const Model& m, const std::vector<std::vector<int64_t>>& prompts, int64_t prefill_chunk,
                                const std::function<void()>& after_each) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    HS_REQUIRE(!prompts.empty(), "calibrate_query_mean: no prompt");
    auto total = torch::zeros({cfg.n_layers, cfg.n_heads, cfg.d_head}, torch::kDouble);
    at::Tensor sum;  // this prompt's per-position sum, on the model's device, in double
    Hooks hooks;
    hooks.capture(Point::kAttnQPreRope, [&sum](int l, const at::Tensor& q) {  // q [1, T, H, d]
        sum[l].add_(q.to(torch::kDouble).sum(at::IntArrayRef{0, 1}));
    });
    ForwardOptions no_logits;
    no_logits.compute_logits = false;
    const int64_t chunk = std::max<int64_t>(1, prefill_chunk);
    for (const auto& p : prompts) {
        const int64_t P = static_cast<int64_t>(p.size());
        HS_REQUIRE(P > 0, "calibrate_query_mean: empty prompt");
        sum = torch::zeros({cfg.n_layers, cfg.n_heads, cfg.d_head}, torch::TensorOptions(torch::kDouble).device(m.options.device));
        auto ids = torch::tensor(p, torch::kLong).view({1, P}).to(m.options.device);
        KVCache cache;
        for (int64_t p0 = 0; p0 < P; p0 += chunk)
            m.forward(ids.index({Slice(), Slice(p0, std::min(P, p0 + chunk))}), &hooks, &cache, no_logits);
        total.add_(sum.to(torch::kCPU) / static_cast<double>(P));  // this prompt's mean, weight 1
        if (after_each) after_each();
    }
    return (total / static_cast<double>(prompts.size())).to(torch::kFloat);
}

// ---- scoring ----

StepScores score_step(const at::Tensor& pattern, const at::Tensor& v, const at::Tensor& wo, const at::Tensor& u,
                      const std::vector<int64_t>& prompt, const StepSpans& sp, int64_t y) {
    const int64_t H = pattern.size(0), S = pattern.size(1), K = v.size(1), d = v.size(2), g = H / K;
    const int64_t ns = sp.needle_start, ne = sp.needle_end, as = sp.answer_start, ae = sp.answer_end;
    auto a = pattern.to(torch::kDouble);
    // Retrieval: argmax key (first of ties) in the answer's span holding the generated token.
    auto jstar = a.argmax(1).to(torch::kCPU);
    auto credit = torch::zeros({H}, torch::kDouble);
    auto js = jstar.accessor<int64_t, 1>();
    for (int64_t h = 0; h < H; ++h) {
        const int64_t j = js[h];
        if (j >= as && j < ae && j < static_cast<int64_t>(prompt.size()) && prompt[j] == y)
            credit[h] = 1.0 / static_cast<double>(ae - as);
    }
    const double n = static_cast<double>(ne - ns);
    // LOCOS: phi[h, j] = a[h, j] * (W_O^h^T u) . v[j, h / g], in float32 (or wider) without
    // expanding v to H heads: [K, S, d] x [K, d, g] -> [K, S, g] -> [H, S]. O(H x S) memory.
    const auto ct = v.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
    auto uproj = u.to(ct).matmul(wo.to(ct)).view({K, g, d});                             // [K, g, d]
    auto contrib = torch::bmm(v.to(ct).permute({1, 0, 2}), uproj.transpose(1, 2))        // [K, S, g]
                       .permute({0, 2, 1})
                       .reshape({H, S})
                       .to(torch::kDouble);
    auto phi = a * contrib;
    auto lplus = phi.index({Slice(), Slice(ns, ne)}).sum(1);
    // The other keys the heads can see: all S, or the sliding window's; 0 when there are none.
    const int64_t lo = std::max<int64_t>(0, sp.first_visible);
    const int64_t others = (S - lo) - std::max<int64_t>(0, std::min(ne, S) - std::max(ns, lo));
    auto lminus = others > 0 ? (phi.sum(1) - lplus) * (n / static_cast<double>(others)) : torch::zeros({H}, torch::kDouble);
    return {credit, lplus.to(torch::kCPU), lminus.to(torch::kCPU)};
}

// decode_batch and decode_batch_sets: `ablate` acts on every row, or `per_row[b]` on row b alone.
static int64_t common_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b, int64_t limit) {
    int64_t n = 0;
    const int64_t end = std::min({limit, static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size())});
    while (n < end && a[static_cast<size_t>(n)] == b[static_cast<size_t>(n)]) ++n;
    return n;
}

static std::vector<DecodeOut> decode_rows_impl(const Model& m, const std::vector<const Trial*>& trials,
                                               const DecodeSettings& s, const std::function<bool(int64_t)>& stop,
                                               const HeadSet* ablate, const std::vector<const HeadSet*>* per_row,
                                               PrefixCache* prefix) {
    torch::NoGradGuard ng;
    const auto& cfg = m.config;
    const int L = cfg.n_layers;
    const int64_t B = static_cast<int64_t>(trials.size());
    if (B == 0) return {};
    const int64_t P = static_cast<int64_t>(trials[0]->prompt.size());
    std::vector<int64_t> flat;
    for (const Trial* t : trials) {
        HS_REQUIRE(static_cast<int64_t>(t->prompt.size()) == P, "decode_batch: every trial of a batch needs the same prompt length");
        flat.insert(flat.end(), t->prompt.begin(), t->prompt.end());
    }
    auto dev = m.options.device;
    auto ids = torch::tensor(flat, torch::kLong).view({B, P}).to(dev);

    Hooks prefill, step;
    if (ablate) {
        if (s.scope == AblationScope::kAll) ablate->apply(prefill);
        ablate->apply(step);
    }
    ForwardOptions fold;  // rows with their own head sets still share each GEMM (decode steps are weight-bound)
    if (per_row) {
        HS_REQUIRE(static_cast<int64_t>(per_row->size()) == B, "decode_batch_sets: one head set (or none) per row");
        for (int64_t b = 0; b < B; ++b)
            if (const HeadSet* hs = (*per_row)[static_cast<size_t>(b)]) {
                if (s.scope == AblationScope::kAll) hs->apply(prefill, b);
                hs->apply(step, b);
            }
        fold.gemm = GemmMode::kFolded;
    }
    std::vector<at::Tensor> rows(L), vals(L);
    if (s.score) {
        step.capture(Point::kAttnPattern, [&rows](int l, const at::Tensor& a) { rows[l] = a.select(2, 0); });  // [B, H, S]
        step.capture(Point::kAttnV, [&vals](int l, const at::Tensor& v) { vals[l] = v; });                     // [B, S, K, d]
    }

    KVCache cache;
    cache.reserve(P - 1 + s.max_new_tokens);
    ForwardOptions no_logits = fold;
    no_logits.compute_logits = false;
    const int64_t chunk = std::max<int64_t>(1, s.prefill_chunk);
    // An unablated prefill (scope decode) with rows sharing a trial: each distinct trial is prefilled
    // once and its cache copied to its rows.
    std::vector<int64_t> row_of;  // row -> index of its trial among the distinct ones
    std::vector<int64_t> firsts;  // distinct trials' first rows
    if (per_row && s.scope == AblationScope::kDecode) {
        std::map<const Trial*, int64_t> seen;
        for (int64_t b = 0; b < B; ++b) {
            auto [it, fresh] = seen.emplace(trials[static_cast<size_t>(b)], static_cast<int64_t>(firsts.size()));
            if (fresh) firsts.push_back(b);
            row_of.push_back(it->second);
        }
    }
    if (!firsts.empty() && static_cast<int64_t>(firsts.size()) < B) {
        auto uids = ids.index_select(0, torch::tensor(firsts, torch::kLong).to(dev));
        for (int64_t p0 = 0; p0 < P - 1; p0 += chunk)
            m.forward(uids.index({Slice(), Slice(p0, std::min(P - 1, p0 + chunk))}), nullptr, &cache, no_logits);
        auto expand = torch::tensor(row_of, torch::kLong).to(dev);
        for (size_t l = 0; l < cache.k.size(); ++l)
            if (cache.k[l].defined())
                cache.k[l] = cache.k[l].index_select(0, expand), cache.v[l] = cache.v[l].index_select(0, expand);
    } else if (prefix && !per_row) {
        // The whole prefill chunks [0, shared) that every row shares are computed in row 0 alone, as a
        // batch-1 prefill from position 0 computes them: those already in the kept cache (same
        // tokens) are taken from it, the rest computed and kept for the next decode. The keys and
        // values of a chunk depend only on the tokens up to its end, so a kept chunk holds the bits
        // this prefill would compute. Then the cache is copied to every row and the rows prefill
        // from `shared` on, in chunks as before.
        const auto& p0v = trials[0]->prompt;
        int64_t c = P - 1;
        for (int64_t b = 1; b < B; ++b) c = common_prefix(p0v, trials[static_cast<size_t>(b)]->prompt, c);
        const int64_t shared = c / chunk * chunk;
        const int64_t u = common_prefix(prefix->tokens, p0v, shared) / chunk * chunk;
        if (u > 0) {
            cache.k.assign(prefix->cache.k.size(), at::Tensor());
            cache.v.assign(prefix->cache.v.size(), at::Tensor());
            for (size_t l = 0; l < prefix->cache.k.size(); ++l)
                if (prefix->cache.k[l].defined())
                    cache.k[l] = prefix->cache.k[l].narrow(1, 0, u), cache.v[l] = prefix->cache.v[l].narrow(1, 0, u);
        }
        auto row0 = ids.narrow(0, 0, 1);
        for (int64_t q0 = u; q0 < shared; q0 += chunk)
            m.forward(row0.index({Slice(), Slice(q0, q0 + chunk)}), &prefill, &cache, no_logits);
        if (shared > u) {
            prefix->tokens.assign(p0v.begin(), p0v.begin() + shared);
            prefix->cache = cache;  // the forwards below replace the cache's tensors, they do not write into them
        }
        if (B > 1)
            for (size_t l = 0; l < cache.k.size(); ++l)
                if (cache.k[l].defined())
                    cache.k[l] = cache.k[l].expand({B, -1, -1, -1}), cache.v[l] = cache.v[l].expand({B, -1, -1, -1});
        for (int64_t q0 = shared; q0 < P - 1; q0 += chunk)
            m.forward(ids.index({Slice(), Slice(q0, std::min(P - 1, q0 + chunk))}), &prefill, &cache, no_logits);
        prefix->reused += u + (B - 1) * shared;
        prefix->computed += (shared - u) + B * (P - 1 - shared);
    } else {
        for (int64_t p0 = 0; p0 < P - 1; p0 += chunk)
            m.forward(ids.index({Slice(), Slice(p0, std::min(P - 1, p0 + chunk))}), &prefill, &cache, no_logits);
    }

    std::vector<DecodeOut> out(B);
    std::vector<std::vector<at::Tensor>> credit(B), lplus(B), lminus(B);
    std::vector<char> done(B, 0);
    std::vector<int64_t> next(B);
    for (int64_t b = 0; b < B; ++b) next[b] = trials[b]->prompt[P - 1];
    int64_t active = B;
    for (int64_t t = 0; t < s.max_new_tokens && active > 0; ++t) {
        auto in = torch::tensor(next, torch::kLong).view({B, 1}).to(dev);
        auto logits = m.forward(in, &step, &cache, fold);  // [B, 1, V]
        auto ys = logits.select(1, 0).argmax(-1).to(torch::kCPU);
        const int64_t keys = cache.length();
        for (int64_t b = 0; b < B; ++b) {
            if (done[b]) continue;  // a finished row keeps feeding its last token, unscored
            const int64_t y = ys[b].item<int64_t>();
            out[b].peak_keys = keys;
            if (stop(y)) {
                done[b] = 1, --active;
                continue;
            }
            out[b].generated.push_back(y);
            next[b] = y;
            if (!s.score) continue;
            const Trial& tr = *trials[b];
            auto c = torch::zeros({L, cfg.n_heads}, torch::kDouble), lp = c.clone(), lm = c.clone();
            auto u = m.weights.unembed[y];
            for (int l = 0; l < L; ++l) {
                StepSpans sp{tr.needle_start, tr.needle_end, tr.answer_start, tr.answer_end, 0};
                if (cfg.is_sliding(l)) sp.first_visible = std::max<int64_t>(0, keys - cfg.sliding_window);
                auto sc = score_step(rows[l][b], vals[l][b], m.weights.layers[l].wo, u, tr.prompt, sp, y);
                c[l] = sc.credit, lp[l] = sc.lplus, lm[l] = sc.lminus;
            }
            credit[b].push_back(c), lplus[b].push_back(lp), lminus[b].push_back(lm);
        }
        std::fill(rows.begin(), rows.end(), at::Tensor());
        std::fill(vals.begin(), vals.end(), at::Tensor());
    }
    auto stack = [&](const std::vector<at::Tensor>& v) {
        return v.empty() ? torch::zeros({0, L, cfg.n_heads}, torch::kDouble) : torch::stack(v);
    };
    for (int64_t b = 0; b < B; ++b) out[b].credit = stack(credit[b]), out[b].lplus = stack(lplus[b]), out[b].lminus = stack(lminus[b]);
    return out;
}

std::vector<DecodeOut> decode_batch(const Model& m, const std::vector<const Trial*>& trials, const DecodeSettings& s,
                                    const std::function<bool(int64_t)>& stop, const HeadSet* ablate, PrefixCache* prefix) {
    return decode_rows_impl(m, trials, s, stop, ablate, nullptr, prefix);
}

std::vector<DecodeOut> decode_batch_sets(const Model& m, const std::vector<const Trial*>& trials,
                                         const std::vector<const HeadSet*>& sets, const DecodeSettings& s,
                                         const std::function<bool(int64_t)>& stop) {
    return decode_rows_impl(m, trials, s, stop, nullptr, &sets, nullptr);
}

DecodeOut decode_trial(const Model& m, const Trial& trial, const DecodeSettings& s, const std::function<bool(int64_t)>& stop,
                       const HeadSet* ablate) {
    return std::move(decode_batch(m, {&trial}, s, stop, ablate).front());
}

std::vector<int64_t> answer_steps(const Tokenizer& tok, const std::vector<int64_t>& gen, const std::string& answer) {
    std::vector<int64_t> out;
    const auto enc = tok.encode(answer, false);
    const std::vector<int64_t> a(enc.begin(), enc.end());
    const int64_t n = static_cast<int64_t>(gen.size()), k = static_cast<int64_t>(a.size());
    if (k > 0)
        for (int64_t i = 0; i + k <= n; ++i)
            if (std::equal(a.begin(), a.end(), gen.begin() + i)) {
                for (int64_t j = i; j < i + k; ++j) out.push_back(j);
                return out;
            }
    std::string all;
    std::vector<std::pair<size_t, size_t>> range;
    for (auto id : gen) {
        const size_t b = all.size();
        all += tok.decode({static_cast<int32_t>(id)}, true);
        range.push_back({b, all.size()});
    }
    auto lower = [](std::string s) {
        for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    const std::string al = lower(answer);
    const size_t at = lower(all).find(al);
    if (at == std::string::npos || al.empty()) return out;
    for (int64_t i = 0; i < n; ++i)
        if (range[i].second > at && range[i].first < at + al.size()) out.push_back(i);
    return out;
}

// ---- the experiment ----

NeedleTest::NeedleTest(const Model& m, const Tokenizer& tok, std::vector<Needle> needles, const std::string& needles_path,
                       std::vector<int64_t> haystack, TokenFacts facts, NeedleConfig config)
    : m_(m), tok_(tok), needles_(std::move(needles)), haystack_(std::move(haystack)), facts_(std::move(facts)),
      c_(std::move(config)) {
    // The answer's tokens inside each needle's tokens (Wu et al.'s real_needle span), found once.
    for (const auto& nd : needles_) {
        const auto nt = encode(nd.needle);
        const auto span = answer_span(tok_, nt, nd.answer);
        if (!span)
            throw DataError(fmt::format("{}:{}: the answer \"{}\" is not in the needle's decoded tokens (\"{}\"); "
                                        "the retrieval score credits copies of the answer's tokens",
                                        needles_path, nd.line, nd.answer,
                                        tok_.decode(std::vector<int32_t>(nt.begin(), nt.end()), true)));
        answer_spans_.push_back(*span);
    }
    for (auto len : c_.lengths)
        for (auto dep : c_.depths)
            for (size_t ni = 0; ni < needles_.size(); ++ni) {
                const auto& nd = needles_[ni];
                const int64_t n = static_cast<int64_t>(encode(nd.needle).size());
                if (n >= len)
                    throw DataError(fmt::format("{}:{}: the needle has {} tokens, no shorter than the context length {}",
                                                needles_path, nd.line, n, len));
                const int64_t tmpl_tokens = static_cast<int64_t>(facts_.bos_prefix.size() + encode(c_.tmpl.prefix(nd.question)).size() +
                                                                 encode(c_.tmpl.suffix(nd.question)).size());
                const int64_t positions = tmpl_tokens + len + c_.decode.max_new_tokens - 1;
                if (c_.max_positions > 0 && positions > c_.max_positions)
                    throw UsageError(fmt::format("length {}: the prompt ({} template + {} context tokens) plus {} new tokens "
                                                 "needs {} positions, beyond the model's context of {}",
                                                 len, tmpl_tokens, len, c_.decode.max_new_tokens, positions, c_.max_positions));
                trials_.push_back(make_trial(len, dep, ni));
            }
    // Batches of up to config.batch trials with equal prompt lengths (rows of one forward).
    std::map<size_t, std::vector<int64_t>> open;
    for (int64_t i = 0; i < static_cast<int64_t>(trials_.size()); ++i) {
        auto& g = open[trials_[i].prompt.size()];
        g.push_back(i);
        if (static_cast<int64_t>(g.size()) == std::max<int64_t>(1, c_.batch)) groups_.push_back(std::move(g)), g.clear();
    }
    for (auto& [len, g] : open)
        if (!g.empty()) groups_.push_back(g);
}

std::vector<int64_t> NeedleTest::encode(const std::string& s) const {
    const auto e = s.empty() ? std::vector<int32_t>{} : tok_.encode(s, false);
    return std::vector<int64_t>(e.begin(), e.end());
}

Trial NeedleTest::make_trial(int64_t length, double depth, size_t ni) const {
    const auto& nd = needles_[ni];
    std::vector<int64_t> prefix = facts_.bos_prefix, body = encode(c_.tmpl.prefix(nd.question));
    prefix.insert(prefix.end(), body.begin(), body.end());
    return build_trial(facts_, haystack_, prefix, encode(nd.needle), encode(c_.tmpl.suffix(nd.question)), length, depth,
                       static_cast<int>(ni), answer_spans_[ni]);
}

PrefixCache* NeedleTest::prefix_for(const HeadSet* ablate) const {
    if (!c_.decode.reuse_prefix) return nullptr;
    // What the prefill runs under: nothing (the baseline, or any pass with scope decode), or the set.
    std::string key = "none";
    if (ablate && c_.decode.scope == AblationScope::kAll) {
        key = fmt::format("{} {} {} {} {} {}", intervention_name(ablate->mode), ablate->window.sink, ablate->window.recent,
                          ablate->window.compensate, ablate->q_mean.defined() ? ablate->q_mean.data_ptr() : nullptr,
                          ablate->heads.size());
        for (auto [l, h] : ablate->heads) key += fmt::format(" {}.{}", l, h);
    }
    if (key != prefix_key_) {
        prefix_reused_ += prefix_.reused, prefix_computed_ += prefix_.computed;
        prefix_ = PrefixCache{};
        prefix_key_ = key;
    }
    return &prefix_;
}

std::pair<int64_t, int64_t> NeedleTest::prefix_stats() const {
    return {prefix_reused_ + prefix_.reused, prefix_computed_ + prefix_.computed};
}

void NeedleTest::run(const DecodeSettings& s, const HeadSet* ablate,
                     const std::function<void(int64_t, const DecodeOut&)>& f) const {
    const std::function<bool(int64_t)> stop = [this](int64_t id) { return facts_.stop(id); };
    for (const auto& g : groups_) {
        std::vector<const Trial*> ptrs;
        for (auto i : g) ptrs.push_back(&trials_[i]);
        auto outs = decode_batch(m_, ptrs, s, stop, ablate, prefix_for(ablate));
        for (size_t k = 0; k < g.size(); ++k) f(g[k], outs[k]);
    }
}

TrialResult NeedleTest::judge(int64_t i, const std::vector<int64_t>& generated) const {
    TrialResult r;
    r.generated = generated;
    r.response = trim(tok_.decode(std::vector<int32_t>(generated.begin(), generated.end()), true));
    const std::string& answer = needles_[trials_[i].needle].answer;
    r.rouge1_recall = rouge1(answer, r.response).recall;
    r.rougeL_f = rougeL(answer, r.response).fmeasure;
    r.passed = r.rouge1_recall > c_.pass_threshold;
    return r;
}

std::vector<TrialResult> NeedleTest::run_baseline(const std::function<void()>& tick) const {
    std::vector<TrialResult> out(trials_.size());
    DecodeSettings s = c_.decode;
    s.score = true;
    run(s, nullptr, [&](int64_t i, const DecodeOut& d) {
        out[i] = scored(i, d);
        if (tick) tick();
    });
    return out;
}

TrialResult NeedleTest::scored(int64_t i, const DecodeOut& d) const {
    const int L = m_.config.n_layers, H = m_.config.n_heads;
    TrialResult r = judge(i, d.generated);
    r.retrieval = d.credit.sum(0);
    const auto steps = answer_steps(tok_, d.generated, needles_[trials_[i].needle].answer);
    r.answer_steps = static_cast<int64_t>(steps.size());
    r.locos = steps.empty() ? torch::full({L, H}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble)
                            : (d.lplus - d.lminus).index_select(0, torch::tensor(steps, torch::kLong)).mean(0);
    return r;
}

std::vector<TrialResult> NeedleTest::run_baseline_batch(int64_t batch) const {
    const auto& g = groups_.at(static_cast<size_t>(batch));
    std::vector<const Trial*> ptrs;
    for (auto i : g) ptrs.push_back(&trials_[i]);
    DecodeSettings s = c_.decode;
    s.score = true;
    const auto outs = decode_batch(m_, ptrs, s, [this](int64_t id) { return facts_.stop(id); }, nullptr, prefix_for(nullptr));
    std::vector<TrialResult> res;
    for (size_t k = 0; k < g.size(); ++k) res.push_back(scored(g[k], outs[k]));
    return res;
}

std::vector<TrialResult> NeedleTest::run_ablated_batch(const HeadSet& ablate, int64_t batch) const {
    const auto& g = groups_.at(static_cast<size_t>(batch));
    std::vector<const Trial*> ptrs;
    for (auto i : g) ptrs.push_back(&trials_[i]);
    DecodeSettings s = c_.decode;
    s.score = false;
    const auto outs = decode_batch(m_, ptrs, s, [this](int64_t id) { return facts_.stop(id); }, &ablate, prefix_for(&ablate));
    std::vector<TrialResult> res;
    for (size_t k = 0; k < g.size(); ++k) res.push_back(judge(g[k], outs[k].generated));
    return res;
}

std::vector<TrialResult> NeedleTest::run_ablated(const HeadSet& ablate, const std::function<void()>& tick) const {
    std::vector<TrialResult> out(trials_.size());
    DecodeSettings s = c_.decode;
    s.score = false;
    run(s, &ablate, [&](int64_t i, const DecodeOut& d) {
        out[i] = judge(i, d.generated);
        if (tick) tick();
    });
    return out;
}

std::vector<std::vector<TrialResult>> NeedleTest::run_ablated_sets(const std::vector<HeadSet>& sets, int64_t max_rows,
                                                                   const std::function<void()>& tick) const {
    const int64_t S = static_cast<int64_t>(sets.size());
    std::vector<std::vector<TrialResult>> out(static_cast<size_t>(S), std::vector<TrialResult>(trials_.size()));
    DecodeSettings s = c_.decode;
    s.score = false;
    const std::function<bool(int64_t)> stop = [this](int64_t id) { return facts_.stop(id); };
    for (const auto& g : groups_) {
        const int64_t n = static_cast<int64_t>(g.size());
        const int64_t per = std::max<int64_t>(1, max_rows / n);  // sets per forward
        for (int64_t s0 = 0; s0 < S; s0 += per) {
            const int64_t s1 = std::min(S, s0 + per);
            std::vector<const Trial*> ptrs;
            std::vector<const HeadSet*> hs;
            for (int64_t j = s0; j < s1; ++j)
                for (auto i : g) ptrs.push_back(&trials_[static_cast<size_t>(i)]), hs.push_back(&sets[static_cast<size_t>(j)]);
            const auto outs = decode_batch_sets(m_, ptrs, hs, s, stop);
            for (int64_t j = s0; j < s1; ++j)
                for (int64_t k = 0; k < n; ++k) {
                    const int64_t i = g[static_cast<size_t>(k)];
                    out[static_cast<size_t>(j)][static_cast<size_t>(i)] = judge(i, outs[static_cast<size_t>((j - s0) * n + k)].generated);
                    if (tick) tick();
                }
        }
    }
    return out;
}

std::vector<NeedleTest::Decoded> NeedleTest::run_decoding(DecodingSpec spec, const std::function<void()>& tick) const {
    spec.max_new_tokens = c_.decode.max_new_tokens;
    const std::function<bool(int64_t)> stop = [this](int64_t id) { return facts_.stop(id); };
    std::vector<Decoded> out;
    out.reserve(trials_.size());
    for (size_t i = 0; i < trials_.size(); ++i) {
        const Trial& t = trials_[i];
        const DecodingOut d = decode_rows(m_, t.prompt, spec, stop, c_.decode.prefill_chunk);
        Decoded r;
        r.result = judge(static_cast<int64_t>(i), d.tokens);
        const int64_t first = t.prompt[static_cast<size_t>(t.answer_start)];  // the answer's first token
        r.answer_margin = token_margin(d.first_scores, first);
        r.base_margin = token_margin(d.first_base, first);
        out.push_back(std::move(r));
        if (tick) tick();
    }
    return out;
}

at::Tensor NeedleTest::calibrate(int64_t n, uint64_t seed, int64_t max_tokens, std::vector<int64_t>* chosen,
                                 const std::function<void()>& tick) const {
    const int64_t N = static_cast<int64_t>(trials_.size());
    n = std::min(n, N);
    std::vector<int64_t> order(N);
    for (int64_t i = 0; i < N; ++i) order[i] = i;
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < n; ++i) {  // partial Fisher-Yates
        std::uniform_int_distribution<int64_t> pick(i, N - 1);
        std::swap(order[i], order[pick(rng)]);
    }
    order.resize(n);
    std::vector<std::vector<int64_t>> prompts;
    for (auto i : order) {
        const Trial& t = trials_[i];
        auto p = t.length > max_tokens ? make_trial(max_tokens, t.depth, t.needle).prompt : t.prompt;
        if (static_cast<int64_t>(p.size()) > max_tokens) p.resize(max_tokens);
        prompts.push_back(std::move(p));
    }
    if (chosen) *chosen = order;
    return calibrate_query_mean(m_, prompts, c_.decode.prefill_chunk, tick);
}

// ---- bootstrap ----

std::vector<std::vector<int64_t>> bootstrap_indices(int64_t n, int64_t resamples, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int64_t>> out(resamples, std::vector<int64_t>(n));
    for (auto& draw : out)
        for (auto& i : draw) {
            const double u = std::generate_canonical<double, 53>(rng);
            i = std::min<int64_t>(n - 1, static_cast<int64_t>(u * static_cast<double>(n)));
        }
    return out;
}

double percentile_linear(std::vector<double> v, double q) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::sort(v.begin(), v.end());
    const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
    return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

std::pair<at::Tensor, at::Tensor> bootstrap_ci(const at::Tensor& samples, int64_t resamples, uint64_t seed) {
    const int64_t N = samples.size(0);
    int64_t C = 1;
    for (int64_t i = 1; i < samples.dim(); ++i) C *= samples.size(i);
    auto flat = samples.to(torch::kDouble).reshape({N, C}).contiguous();
    auto low = torch::full({C}, std::numeric_limits<double>::quiet_NaN(), torch::kDouble), high = low.clone();
    if (N > 0 && resamples > 0) {
        const auto idx = bootstrap_indices(N, resamples, seed);
        auto means = torch::empty({resamples, C}, torch::kDouble);
        for (int64_t r = 0; r < resamples; ++r)
            means[r] = flat.index_select(0, torch::tensor(idx[r], torch::kLong)).mean(0);
        auto acc = means.accessor<double, 2>();
        for (int64_t c = 0; c < C; ++c) {
            std::vector<double> col(resamples);
            for (int64_t r = 0; r < resamples; ++r) col[r] = acc[r][c];
            low[c] = percentile_linear(col, 2.5);
            high[c] = percentile_linear(col, 97.5);
        }
    }
    auto shape = samples.sizes().slice(1).vec();
    return {low.view(shape), high.view(shape)};
}

}  // namespace hs
