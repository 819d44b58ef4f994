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

// fit_data {kind: passkey}: MultiplePasskeyRetrievalDataset (mit-han-lab/duo-attention@fe93c31
// `duo_attn/data.py`) for a model with a real tokenizer, with the arguments `train.py` passes it (l.
// 324-336). The reference's defaults: passkeys 10 (num_passkeys, l. 77), 32 words a passkey
// (passkey_length, l. 76), buffer 300 (buffer_size, l. 82); the context lengths and the depths as
// scripts/train.sh runs them: `--context_lengths_num_intervals 50` between its min and max (1000 and
// 32000 in scripts/run_train.sh), `--min_needle_depth_ratio 0.05 --max_needle_depth_ratio 0.95
// --depth_ratio_num_intervals 1000` (the class's own defaults, 0.1, 0.9 and 20 at l. 84-87, and
// utils.py's argparse defaults, 0, 1 and 10, are not what it runs). One length: min = max (l. 104-105).
struct DuoPasskeyOptions {
    int64_t context_length_min = 0, context_length_max = 0;
    int64_t context_lengths_num_intervals = 1;  // the lengths: torch.linspace(min, max, n, dtype=torch.int) (l. 110-115)
    int64_t passkeys = 10;        // 1..20 (ORDINAL_NUMBERS), at most depth_intervals
    int64_t passkey_length = 32;  // words of PASSKEY_ALPHABET a passkey
    int64_t buffer = 300;
    double depth_min = 0.05, depth_max = 0.95;  // the depths: torch.linspace(min, max, n) in float32 (l. 117-119)
    int64_t depth_intervals = 1000;
};

// What __init__ computes once (l. 93-180): the context lengths (l. 110-115) and depth ratios (l.
// 117-119); every fixed piece encoded on its own as the reference encodes it (prompt1 WITH the special
// tokens, everything else without; added tokens in the text matched as HF's encode does), the haystack:
// the text repeated until it has context_length_max tokens (the reference concatenates its dataset's
// samples, l. 127-131) and cut to context_length_max tokens (the reference cuts the text by a
// decode/encode round trip of its first context_length_max tokens, `_trim` l. 210-214; here the token
// prefix, no round trip) and then, if it does not fit, to context_length_max - buffer - other_input_len
// tokens (l. 175-180), other_input_len counted with the first ordinal's needle and question and one
// passkey drawn for it (the reference's `passkey = self._generate_passkey()` at l. 159; here the first
// passkey_length draws of std::mt19937_64(seed)). Every item cuts that haystack to its own length (l. 220).
struct DuoPasskeyData {
    DuoPasskeyOptions options;
    const Tokenizer* tok = nullptr;                   // encodes each sample's passkeys; must outlive this
    std::vector<int64_t> lengths;                     // context_length_intervals (the dataset's items)
    std::vector<float> depth_ratios;                  // depth_ratio_intervals
    std::vector<int64_t> haystack;                    // trimmed
    std::vector<std::vector<int64_t>> needle, question;  // per ordinal (first .. options.passkeys-th)
    std::vector<int64_t> separator, prompt1, prompt2;
    std::vector<int64_t> init_words;                  // the passkey drawn for the trim (alphabet indices)
};

// Throws ConfigError naming the problem when the pieces leave no haystack (context_length_max too
// short for the passkeys: fewer than 16 haystack tokens, which the reference's pad needs), passkeys
// outside 1..20 or above depth_intervals, lengths below 1 or min above max, intervals below 1, depths
// outside [0, 1] or min above max.
DuoPasskeyData duo_passkey_data(const Tokenizer& tok, const std::string& haystack_text, const DuoPasskeyOptions& o,
                                uint64_t seed);

// The item step `step` trains on (which of the n context lengths): train.py iterates a DataLoader
// with shuffle=True and batch size 1 (l. 85-88, 340-342; data.py `get_supervised_dataloader` l. 301-313)
// over the dataset's n = context_lengths_num_intervals items (`__len__`, l. 190-191), epoch after
// epoch: torch's RandomSampler yields a fresh permutation of 0..n-1 each epoch, so every length is
// trained on once in each n steps, in a new order. Here epoch e = step / n is a Fisher-Yates
// permutation from std::mt19937_64(seed + 2^40 + e) (a stream apart from the samples' seed + step;
// not torch's generator) and the step takes its (step % n)-th entry.
int64_t duo_passkey_item(int64_t n, uint64_t seed, int64_t step);

// The draws of one sample, for checking it against the reference's lines (tests/duo_passkey_check.py).
struct DuoPasskeyDraws {
    int64_t item = 0, context_length = 0;       // duo_passkey_item and lengths[item]
    std::vector<int64_t> depth_index;           // chosen of the depth_intervals ratios, sorted
    std::vector<std::vector<int64_t>> words;    // per passkey, its passkey_length alphabet indices
    std::vector<int64_t> labels;                // the reference's labels: -100 for the context, then qa
};

// Step `step`'s sample (`__getitem__` of item duo_passkey_item(n, seed, step), l. 193-208): its context
// length lengths[item]; std::mt19937_64(seed + step) (not torch's RNG) draws a randperm of the
// depth_intervals ratios (Fisher-Yates), keeps the first `passkeys` sorted, then `passkeys` passkeys of
// passkey_length words (each word index: draw % 26); `_insert_needle` and `_construct_input` (l.
// 219-270) as the reference: the haystack cut to the item's context length (l. 220; an item below
// context_length_max holds that many haystack tokens plus the needles, more than its length), the pad to
// 16 from the whole haystack's last tokens (l. 261), the pad's quirk included (the condition's
// precedence makes it always true: a total already a multiple of 16 gets 16 more). tokens [1, T]; the
// labelled positions are the qa tokens' own positions (as duo_recall_sample: the tokens the reference's
// labels keep, not shifted).
Ablator::ScoredRows duo_passkey_sample(const DuoPasskeyData& d, uint64_t seed, int64_t step, c10::Device device,
                                       DuoPasskeyDraws* draws = nullptr);

// The alphabet and ordinals (data.py l. 19-69).
const std::vector<std::string>& duo_passkey_alphabet();

}  // namespace hs
