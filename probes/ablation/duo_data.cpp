// A fresh sample per step for DuoAttention's gates (duo_data.h): toy recall rows, or the reference's
// multi-passkey retrieval sample for a real tokenizer.
#include "duo_data.h"

#include "errors.h"
#include "tokenizer.h"
#include "toy_tasks.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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

// torch.linspace on the CPU as torch >= 2.0 computes it, the torch the reference runs (its README installs
// pytorch with CUDA 12.4 and flashinfer for torch 2.4): aten/src/ATen/native/cpu/RangeFactoriesKernel.cpp
// `linspace_kernel`, scalar for every dtype since pytorch/pytorch#89048 ("Remove vectorization
// implementation, due to the precision issue between integer and double"): step = (end - start) /
// (steps - 1) (double for an integer dtype, float for float32), index i below steps / 2 is start + step * i,
// the others end - step * (steps - i - 1), the kernel's multiply-add contracted to one rounding (an FMA
// in torch's AVX2/AVX512 kernels: std::fma here); one step is [start] (linspace_out's fill). Not
// libtorch's own linspace: Debian's libtorch 1.13, which headscope builds against, still vectorises and
// gives other values (linspace(1000, 32000, 50, dtype=int)[11] is 7958 there, 7959 in torch 2.x; 213 of
// linspace(0.05, 0.95, 1000)'s float32 values differ in the last bit).
std::vector<int64_t> torch_linspace_int(int64_t start, int64_t end, int64_t steps) {
    if (steps == 1) return {start};
    const double step = (static_cast<double>(end) - static_cast<double>(start)) / static_cast<double>(steps - 1);
    std::vector<int64_t> v(static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i)  // scalar_t int32: the double truncated toward zero
        v[static_cast<size_t>(i)] = static_cast<int32_t>(i < steps / 2 ? std::fma(step, static_cast<double>(i), static_cast<double>(start))
                                                                      : std::fma(-step, static_cast<double>(steps - i - 1), static_cast<double>(end)));
    return v;
}

std::vector<float> torch_linspace_float(double start_d, double end_d, int64_t steps) {
    const float start = static_cast<float>(start_d), end = static_cast<float>(end_d);
    if (steps == 1) return {start};
    const float step = (end - start) / static_cast<float>(steps - 1);
    std::vector<float> v(static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i)
        v[static_cast<size_t>(i)] = i < steps / 2 ? std::fma(step, static_cast<float>(i), start)
                                                  : std::fma(-step, static_cast<float>(steps - i - 1), end);
    return v;
}

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
        throw ConfigError(fmt::format("passkeys: expected 1..20 (the reference's 20 ordinals), got {}", o.passkeys));
    if (o.passkey_length < 1) throw ConfigError(fmt::format("words: expected at least 1, got {}", o.passkey_length));
    if (o.context_length_min < 1 || o.context_length_min > o.context_length_max)
        throw ConfigError(fmt::format("context lengths: expected 1 <= min <= max, got {} and {}", o.context_length_min,
                                      o.context_length_max));
    if (o.context_lengths_num_intervals < 1 || o.depth_intervals < 1)
        throw ConfigError(fmt::format("intervals: expected at least 1 length and 1 depth, got {} and {}",
                                      o.context_lengths_num_intervals, o.depth_intervals));
    if (!(o.depth_min >= 0 && o.depth_min <= o.depth_max && o.depth_max <= 1))
        throw ConfigError(fmt::format("depths: expected 0 <= min <= max <= 1, got {} and {}", o.depth_min, o.depth_max));
    // randperm(depth_ratio_num_intervals)[:num_passkeys] (l. 198): fewer depths than passkeys would
    // leave passkeys without a needle (zip stops at the shorter, l. 225-227) while every one is asked for.
    if (o.passkeys > o.depth_intervals)
        throw ConfigError(fmt::format("passkeys: {} passkeys need at least as many depths, got depth_intervals {}", o.passkeys,
                                      o.depth_intervals));
    DuoPasskeyData d;
    d.options = o;
    d.tok = &tok;
    // l. 110-115: torch.linspace(min, max, n, dtype=torch.int); l. 117-119: linspace(min, max, n) (float32).
    d.lengths = torch_linspace_int(o.context_length_min, o.context_length_max, o.context_lengths_num_intervals);
    d.depth_ratios = torch_linspace_float(o.depth_min, o.depth_max, o.depth_intervals);
    for (int64_t i = 0; i < o.passkeys; ++i) {
        const std::string ord = kOrdinals[i];
        d.needle.push_back(enc(tok, "Remeber this sequence of words, it's the " + ord + " passkey to the vault: ", false));
        d.question.push_back(enc(tok, "Based on the content of the book, what is the " + ord + " passkey to the vault?\nPasskey: ", false));
    }
    // l. 127-133: samples concatenated until context_length_max tokens; here copies of the one text.
    const int64_t max_len = o.context_length_max;
    d.haystack = enc(tok, haystack_text, false);
    if (d.haystack.empty()) throw ConfigError("the haystack has no tokens");
    const int64_t one = static_cast<int64_t>(d.haystack.size());
    for (int64_t copies = (max_len + one - 1) / one; static_cast<int64_t>(d.haystack.size()) < max_len; ++copies) {
        std::string hay;
        for (int64_t c = 0; c < copies; ++c) hay += haystack_text;
        d.haystack = enc(tok, hay, false);
    }
    d.haystack.resize(static_cast<size_t>(max_len));
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
    const int64_t room = max_len - o.buffer - other;
    if (static_cast<int64_t>(d.haystack.size()) + other > max_len - o.buffer) {
        const char* name = o.context_length_min == max_len ? "length" : "length_max";
        if (room < 16)
            throw ConfigError(fmt::format("{0} {1} leaves {2} haystack tokens after the buffer ({3}) and {4} passkeys' prompts, "
                                          "questions and passkeys ({5} tokens); at least 16 needed (the reference pads from "
                                          "the haystack's last 16): raise {0} or lower passkeys/words",
                                          name, max_len, std::max<int64_t>(room, 0), o.buffer, o.passkeys, other));
        d.haystack.resize(static_cast<size_t>(room));
    }
    if (d.haystack.size() < 16)
        throw ConfigError(fmt::format("the haystack has {} tokens; at least 16 needed (the reference pads from its last 16)",
                                      d.haystack.size()));
    return d;
}

int64_t duo_passkey_item(int64_t n, uint64_t seed, int64_t step) {
    HS_REQUIRE(n >= 1 && step >= 0, "duo_passkey_item: n >= 1 items and step >= 0");
    if (n == 1) return 0;
    std::mt19937_64 rng(seed + (uint64_t{1} << 40) + static_cast<uint64_t>(step / n));
    std::vector<int64_t> perm(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
    return perm[static_cast<size_t>(step % n)];
}

Ablator::ScoredRows duo_passkey_sample(const DuoPasskeyData& d, uint64_t seed, int64_t step, c10::Device device,
                                       DuoPasskeyDraws* draws) {
    const auto& o = d.options;
    // __getitem__(i): context_length = self.context_length_intervals[i] (l. 194), i the DataLoader's.
    const int64_t item = duo_passkey_item(static_cast<int64_t>(d.lengths.size()), seed, step);
    const int64_t context_length = d.lengths[static_cast<size_t>(item)];
    std::mt19937_64 rng(seed + static_cast<uint64_t>(step));
    // torch.randperm(depth_ratio_num_intervals)[:num_passkeys] then .sort() of the ratios (l. 196-202): Fisher-Yates here.
    const int64_t n_depths = static_cast<int64_t>(d.depth_ratios.size());
    std::vector<int64_t> perm(static_cast<size_t>(n_depths));
    for (int64_t i = 0; i < n_depths; ++i) perm[static_cast<size_t>(i)] = i;
    for (int64_t i = n_depths - 1; i > 0; --i)
        std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
    std::vector<int64_t> depth(perm.begin(), perm.begin() + o.passkeys);
    std::sort(depth.begin(), depth.end());  // linspace is non-decreasing: sorted indices = sorted ratios
    std::vector<std::vector<int64_t>> words, passkey;
    for (int64_t i = 0; i < o.passkeys; ++i) {
        words.push_back(draw_words(rng, o.passkey_length));
        passkey.push_back(enc(*d.tok, passkey_text(words.back()), false));
    }
    // haystack_tokens = self.haystack_tokens[:context_length] (l. 220); int(len(haystack_tokens) *
    // depth_ratio), a float32 tensor product (l. 228).
    const auto& whole = d.haystack;
    const std::vector<int64_t> h(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(whole.size(), static_cast<size_t>(context_length))));
    std::vector<int64_t> context = d.prompt1;  // context_tokens = prompt1_tokens + context (l. 253)
    size_t last = 0;
    for (int64_t i = 0; i < o.passkeys; ++i) {
        const float prod = static_cast<float>(h.size()) * d.depth_ratios[static_cast<size_t>(depth[static_cast<size_t>(i)])];
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
    // l. 256-261: `len(context) + len(qa) + len(prompt2) % 16 != 0` holds for any non-empty context, so
    // pad_len = 16 - total % 16 (16 when total is already a multiple) of the WHOLE haystack's last tokens
    // (self.haystack_tokens[-pad_len:], not the item's cut).
    const size_t pad = 16 - (context.size() + qa.size() + d.prompt2.size()) % 16;
    context.insert(context.end(), whole.end() - static_cast<std::ptrdiff_t>(pad), whole.end());
    append(context, d.prompt2);
    const int64_t C = static_cast<int64_t>(context.size());
    std::vector<int64_t> all = context;
    append(all, qa);
    const int64_t T = static_cast<int64_t>(all.size());
    std::vector<int64_t> row, pos;
    for (int64_t p = C; p < T; ++p) row.push_back(0), pos.push_back(p);
    if (draws) {
        draws->item = item, draws->context_length = context_length;
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
