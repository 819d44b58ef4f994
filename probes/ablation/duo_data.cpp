// A fresh sample per step for DuoAttention's gates (duo_data.h): toy recall rows, or the reference's
// multi-passkey retrieval sample for a real tokenizer.
#include "duo_data.h"

#include "errors.h"
#include "tokenizer.h"
#include "toy_tasks.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <vector>

namespace hs {

Ablator::ScoredRows duo_recall_sample(uint64_t seed, int64_t step, int64_t rows, int64_t T, c10::Device device) {
    if (T < 8 || rows < 1) throw ConfigError(fmt::format("duo-gates sample: {} rows of {} tokens (at least 1 row of 8)", rows, T));
    toy::Rng rng(seed + static_cast<uint64_t>(step));
    auto rb = toy::recall_batch(rng, rows, T, false);
    auto tok = rb.batch.tokens.contiguous();
    const int64_t* t = tok.data_ptr<int64_t>();
    std::vector<int64_t> row, pos;
    for (int64_t b = 0; b < rows; ++b)
        for (int64_t q = rb.query_pos[static_cast<size_t>(b)] - 1; q < T; ++q)
            if (t[b * T + q] != toy::kFillerDot) row.push_back(b), pos.push_back(q);  // the questions and answers, not the pad
    Ablator::ScoredRows r;
    r.tokens = tok.to(device);
    r.row = torch::tensor(row, torch::kLong).to(device);
    r.pos = torch::tensor(pos, torch::kLong).to(device);
    return r;
}

}  // namespace hs

// ---- fit_data {kind: passkey}: MultiplePasskeyRetrievalDataset (duo_attn/data.py) ----
namespace hs {
namespace {

const char* const kOrdinals[20] = {"first",      "second",     "third",      "fourth",      "fifth",
                                   "sixth",      "seventh",    "eighth",     "ninth",       "tenth",
                                   "eleventh",   "twelfth",    "thirteenth", "fourteenth",  "fifteenth",
                                   "sixteenth",  "seventeenth", "eighteenth", "nineteenth", "twentieth"};
constexpr int64_t kDepthIntervals = 20;  // depth_ratio_num_intervals (l. 86)

std::vector<int64_t> enc(const Tokenizer& tok, const std::string& text, bool special) {
    const auto ids = tok.encode(text, special, /*parse_special=*/true);  // HF encode matches added tokens
    return std::vector<int64_t>(ids.begin(), ids.end());
}

// _generate_passkey (l. 182-187): passkey_length words joined by single spaces.
std::vector<int64_t> draw_words(std::mt19937_64& rng, int64_t n) {
    std::vector<int64_t> w(static_cast<size_t>(n));
    for (auto& x : w) x = static_cast<int64_t>(rng() % 26);
    return w;
}

std::string passkey_text(const std::vector<int64_t>& words) {
    std::string s;
    for (size_t i = 0; i < words.size(); ++i) s += (i ? " " : "") + duo_passkey_alphabet()[static_cast<size_t>(words[i])];
    return s;
}

void append(std::vector<int64_t>& a, const std::vector<int64_t>& b) { a.insert(a.end(), b.begin(), b.end()); }

}  // namespace

const std::vector<std::string>& duo_passkey_alphabet() {
    static const std::vector<std::string> a = {"alpha",   "bravo",  "charlie", "delta",  "echo",    "foxtrot", "golf",
                                               "hotel",   "india",  "juliett", "kilo",   "lima",    "mike",    "november",
                                               "oscar",   "papa",   "quebec",  "romeo",  "sierra",  "tango",   "uniform",
                                               "victor",  "whiskey", "xray",   "yankee", "zulu"};
    return a;
}

DuoPasskeyData duo_passkey_data(const Tokenizer& tok, const std::string& haystack_text, const DuoPasskeyOptions& o,
                                uint64_t seed) {
    if (o.passkeys < 1 || o.passkeys > 20)
        throw ConfigError(fmt::format("passkeys: expected 1..20 (the reference's 20 ordinals and depths), got {}", o.passkeys));
    if (o.passkey_length < 1) throw ConfigError(fmt::format("words: expected at least 1, got {}", o.passkey_length));
    DuoPasskeyData d;
    d.options = o;
    d.tok = &tok;
    for (int64_t i = 0; i < o.passkeys; ++i) {
        const std::string ord = kOrdinals[i];
        d.needle.push_back(enc(tok, "Remeber this sequence of words, it's the " + ord + " passkey to the vault: ", false));
        d.question.push_back(enc(tok, "Based on the content of the book, what is the " + ord + " passkey to the vault?\nPasskey: ", false));
    }
    // l. 127-133: samples concatenated until context_length tokens; here copies of the one text.
    d.haystack = enc(tok, haystack_text, false);
    if (d.haystack.empty()) throw ConfigError("the haystack has no tokens");
    const int64_t one = static_cast<int64_t>(d.haystack.size());
    for (int64_t copies = (o.context_length + one - 1) / one; static_cast<int64_t>(d.haystack.size()) < o.context_length; ++copies) {
        std::string hay;
        for (int64_t c = 0; c < copies; ++c) hay += haystack_text;
        d.haystack = enc(tok, hay, false);
    }
    d.haystack.resize(static_cast<size_t>(o.context_length));
    d.separator = enc(tok, "\n\n", false);
    d.prompt1 = enc(tok, "<|im_start|> This is a very long story book: <book> ", true);
    d.prompt2 = enc(tok, " </book>.\n\n", false);
    std::mt19937_64 rng(seed);
    d.init_words = draw_words(rng, o.passkey_length);
    const auto pk = static_cast<int64_t>(enc(tok, passkey_text(d.init_words), false).size());
    const int64_t sep = static_cast<int64_t>(d.separator.size());
    const int64_t other = static_cast<int64_t>(d.prompt1.size() + d.prompt2.size()) +
                          (sep + static_cast<int64_t>(d.needle[0].size()) + pk + sep + static_cast<int64_t>(d.question[0].size()) + pk) *
                              o.passkeys;
    const int64_t room = o.context_length - o.buffer - other;
    if (static_cast<int64_t>(d.haystack.size()) + other > o.context_length - o.buffer) {
        if (room < 16)
            throw ConfigError(fmt::format("length {} leaves {} haystack tokens after the buffer ({}) and {} passkeys' prompts, "
                                          "questions and passkeys ({} tokens); at least 16 needed (the reference pads from "
                                          "the haystack's last 16): raise length or lower passkeys/words",
                                          o.context_length, std::max<int64_t>(room, 0), o.buffer, o.passkeys, other));
        d.haystack.resize(static_cast<size_t>(room));
    }
    if (d.haystack.size() < 16)
        throw ConfigError(fmt::format("the haystack has {} tokens; at least 16 needed (the reference pads from its last 16)",
                                      d.haystack.size()));
    return d;
}

Ablator::ScoredRows duo_passkey_sample(const DuoPasskeyData& d, uint64_t seed, int64_t step, c10::Device device,
                                       DuoPasskeyDraws* draws) {
    const auto& o = d.options;
    std::mt19937_64 rng(seed + static_cast<uint64_t>(step));
    // torch.randperm(20)[:num_passkeys] then .sort() of the ratios (l. 195-201): Fisher-Yates here.
    std::vector<int64_t> perm(kDepthIntervals);
    for (int64_t i = 0; i < kDepthIntervals; ++i) perm[static_cast<size_t>(i)] = i;
    for (int64_t i = kDepthIntervals - 1; i > 0; --i)
        std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
    std::vector<int64_t> depth(perm.begin(), perm.begin() + o.passkeys);
    std::sort(depth.begin(), depth.end());  // linspace is increasing: sorted indices = sorted ratios
    std::vector<std::vector<int64_t>> words, passkey;
    for (int64_t i = 0; i < o.passkeys; ++i) {
        words.push_back(draw_words(rng, o.passkey_length));
        passkey.push_back(enc(*d.tok, passkey_text(words.back()), false));
    }
    // torch.linspace(0.1, 0.9, 20) in float32; int(len(haystack_tokens) * depth_ratio) in float32 (l. 224).
    const auto ratios = torch::linspace(0.1, 0.9, kDepthIntervals, torch::kFloat).contiguous();
    const float* rp = ratios.data_ptr<float>();
    const auto& h = d.haystack;
    std::vector<int64_t> context = d.prompt1;  // context_tokens = prompt1_tokens + context (l. 254)
    size_t last = 0;
    for (int64_t i = 0; i < o.passkeys; ++i) {
        const float prod = static_cast<float>(h.size()) * rp[depth[static_cast<size_t>(i)]];
        const auto at = static_cast<size_t>(static_cast<int64_t>(prod));
        context.insert(context.end(), h.begin() + static_cast<std::ptrdiff_t>(last), h.begin() + static_cast<std::ptrdiff_t>(at));
        append(context, d.separator);
        append(context, d.needle[static_cast<size_t>(i)]);
        append(context, passkey[static_cast<size_t>(i)]);
        append(context, d.separator);
        last = at;
    }
    context.insert(context.end(), h.begin() + static_cast<std::ptrdiff_t>(last), h.end());
    std::vector<int64_t> qa;  // l. 245-251
    for (int64_t i = 0; i < o.passkeys; ++i) {
        append(qa, d.question[static_cast<size_t>(i)]);
        append(qa, passkey[static_cast<size_t>(i)]);
        append(qa, d.separator);
    }
    // l. 256-262: `len(context) + len(qa) + len(prompt2) % 16 != 0` holds for any non-empty context, so
    // pad_len = 16 - total % 16 (16 when total is already a multiple) of the haystack's last tokens.
    const size_t pad = 16 - (context.size() + qa.size() + d.prompt2.size()) % 16;
    context.insert(context.end(), h.end() - static_cast<std::ptrdiff_t>(pad), h.end());
    append(context, d.prompt2);
    const int64_t C = static_cast<int64_t>(context.size());
    std::vector<int64_t> all = context;
    append(all, qa);
    const int64_t T = static_cast<int64_t>(all.size());
    std::vector<int64_t> row, pos;
    for (int64_t p = C; p < T; ++p) row.push_back(0), pos.push_back(p);
    if (draws) {
        draws->depth_index = depth;
        draws->words = words;
        draws->labels.assign(static_cast<size_t>(C), -100);
        append(draws->labels, qa);
    }
    Ablator::ScoredRows r;
    r.tokens = torch::tensor(all, torch::kLong).view({1, T}).to(device);
    r.row = torch::tensor(row, torch::kLong).to(device);
    r.pos = torch::tensor(pos, torch::kLong).to(device);
    return r;
}

}  // namespace hs
