// A fresh training sample per step for DuoAttention's gates (duo_gates.h DuoGateOptions::sample), the
// reference's data shape: mit-han-lab/duo-attention@fe93c31 `duo_attn/data.py`
// MultiplePasskeyRetrievalDataset draws, for every item, new passkeys at new depths in a haystack
// (l. 193-208), asks for each of them after the context and labels every token after the context,
// the questions with their passkeys (`labels = [-100] * len(context_tokens) + qa_tokens`, l. 244-270);
// `train.py` takes one such sample a step (batch size 1, l. 84-88, 340-342), so none repeats.
//
// On the CI toy models' vocabulary (datasets/toy_tasks.h) the generator is toy::recall_batch's
// training rows: 1..12 key -> value pairs spread in filler (the passkeys in their haystack), then
// 1..8 queries "? k V" (the retrieval questions with their answers); the labelled positions are every
// token from the first '?' on (the padding after the queries excepted). A passkey is one token here
// (the reference's: 32 words), and the rows are `rows` of T tokens, not one of 1000..32000.
#pragma once

#include "ablation.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

// Step `step`'s sample: toy::recall_batch(std::mt19937_64(seed + step), rows, T, training rows) on
// `device`, its tokens and labelled (row, position) pairs. T >= 8 (ConfigError otherwise).
Ablator::ScoredRows duo_recall_sample(uint64_t seed, int64_t step, int64_t rows, int64_t T, c10::Device device);

class Tokenizer;

// fit_data {kind: passkey}: MultiplePasskeyRetrievalDataset (mit-han-lab/duo-attention@03dca84
// `duo_attn/data.py`) for a model with a real tokenizer. The reference's defaults: passkeys 10
// (num_passkeys, l. 76), 32 words a passkey (passkey_length, l. 75), buffer 300 (buffer_size, l. 81);
// context_length is its max_length (the study's `length`; context_length_min = max, l. 104-105).
struct DuoPasskeyOptions {
    int64_t context_length = 0;
    int64_t passkeys = 10;        // 1..20 (ORDINAL_NUMBERS, depth_ratio_num_intervals)
    int64_t passkey_length = 32;  // words of PASSKEY_ALPHABET a passkey
    int64_t buffer = 300;
};

// What __init__ computes once (l. 93-180): every fixed piece encoded on its own as the reference
// encodes it (prompt1 WITH the special tokens, everything else without; added tokens in the text
// matched as HF's encode does), the haystack: the text repeated until it has context_length tokens
// (the reference concatenates its dataset's samples, l. 127-131) and cut to context_length tokens
// (the reference cuts the text by a decode/encode round trip of its first context_length tokens,
// `_trim` l. 210-214; here the token prefix, no round trip) and then, if it does not fit, to context_length - buffer - other_input_len
// tokens (l. 163-180), other_input_len counted with the first ordinal's needle and question and one
// passkey drawn for it (the reference's `passkey = self._generate_passkey()` at l. 160; here the first
// passkey_length draws of std::mt19937_64(seed)).
struct DuoPasskeyData {
    DuoPasskeyOptions options;
    const Tokenizer* tok = nullptr;                   // encodes each sample's passkeys; must outlive this
    std::vector<int64_t> haystack;                    // trimmed
    std::vector<std::vector<int64_t>> needle, question;  // per ordinal (first .. options.passkeys-th)
    std::vector<int64_t> separator, prompt1, prompt2;
    std::vector<int64_t> init_words;                  // the passkey drawn for the trim (alphabet indices)
};

// Throws ConfigError naming the problem when the pieces leave no haystack (context_length too short for
// the passkeys: fewer than 16 haystack tokens, which the reference's pad needs) or passkeys outside 1..20.
DuoPasskeyData duo_passkey_data(const Tokenizer& tok, const std::string& haystack_text, const DuoPasskeyOptions& o,
                                uint64_t seed);

// The draws of one sample, for checking it against the reference's lines (tests/duo_passkey_check.py).
struct DuoPasskeyDraws {
    std::vector<int64_t> depth_index;           // chosen of linspace(0.1, 0.9, 20), sorted
    std::vector<std::vector<int64_t>> words;    // per passkey, its passkey_length alphabet indices
    std::vector<int64_t> labels;                // the reference's labels: -100 for the context, then qa
};

// Step `step`'s sample (`__getitem__`, l. 193-208): std::mt19937_64(seed + step) (not torch's RNG)
// draws a randperm of the 20 depth ratios (Fisher-Yates), keeps the first `passkeys` sorted, then
// `passkeys` passkeys of passkey_length words (each word index: draw % 26); `_insert_needle` and
// `_construct_input` (l. 216-270) as the reference, the pad-to-16 quirk included (the condition's
// precedence makes it always true: a total already a multiple of 16 gets 16 more of the haystack's last
// tokens). tokens [1, T]; the labelled positions are the qa tokens' own positions (as duo_recall_sample:
// the tokens the reference's labels keep, not shifted).
Ablator::ScoredRows duo_passkey_sample(const DuoPasskeyData& d, uint64_t seed, int64_t step, c10::Device device,
                                       DuoPasskeyDraws* draws = nullptr);

// The alphabet and ordinals (data.py l. 19-66).
const std::vector<std::string>& duo_passkey_alphabet();

}  // namespace hs
