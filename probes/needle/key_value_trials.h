// AttentionInfluence's head-detection task as needle trials: Hua et al. 2025 ("AttentionInfluence:
// Adopting Attention Head Influence for Weak-to-Strong Pretraining Data Selection", arXiv 2505.07293v1)
// detect retrieval heads on "a synthetic test dataset consisting of 800 samples", each "a 3-shot
// retrieval task in natural language, consisting of a context, three in-context demonstrations, and a
// query hash_key"; the context "a JSON object with k key-value pairs", each key "a randomly generated
// 32-character alphanumeric string", each value "a natural language sentence sampled from a corpus of
// web documents" (at most 30 tokens); a sample, prompt and answer, "close to but not exceeding 4,096
// tokens" (section 4.1; the prompt's wording: appendix A). The trials are scored by the needle study's
// decode and Wu et al.'s retrieval score (needle.h NeedleTest on prebuilt trials); what headscope
// chooses where the paper is silent (the value's words, the separators): docs/methods.md,
// "AttentionInfluence".
//
// On the CI toy models' vocabulary (datasets/toy_tasks.h) the task is the toy recall model's own:
// toy::recall_batch's evaluation rows, pairs "kV" in filler and the query "?k", the answer V.
#pragma once

#include "needle_trials.h"
#include "tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hs {

struct KeyValueTask {
    int64_t samples = 800;    // trials (the paper's 800)
    int64_t length = 4096;    // tokens a trial's prompt and answer may take (the paper's 4,096)
    int64_t shots = 3;        // demonstrations (the paper's 3-shot)
    int64_t key_chars = 32;   // the key's random alphanumeric characters (the paper's 32)
    int64_t value_words = 8;  // the value's words (drawn from the tokenizer's word pieces)
    uint64_t seed = 0;
};

enum class KeyValueFormat {
    kJson,       // the paper's: an instruction, a JSON object of pairs, the demonstrations, the query key
    kToyRecall,  // the toy recall task's rows (the toy vocabulary only)
};
const char* key_value_format_name(KeyValueFormat f);  // "json", "toy-recall"

struct KeyValueTrials {
    KeyValueFormat format = KeyValueFormat::kJson;
    std::string values;            // where the values' words come from (an attribute)
    std::vector<Needle> needles;   // trial i's: needle = the queried pair's text, question = its key,
                                   // answer = its value
    std::vector<Trial> trials;     // trial i reads needles[i]; needle span = the queried pair, answer
                                   // span = its value's tokens in the context
    std::vector<int64_t> pairs;    // [samples] key-value pairs in each trial's context
    int64_t max_new_tokens = 1;    // the longest answer's tokens + 3 (its quotes and the newline): every
                                   // prompt plus these fits the task's length
    StopRule stop = StopRule::kNewline;  // json: the newline; toy-recall: none (one new token)
};

// True when `tok` is the toy models' one-character vocabulary (datasets/toy_tasks.h), token for token.
bool toy_vocabulary(const Tokenizer& tok);

// The task's trials, drawn from std::mt19937_64(t.seed). json: each trial's prompt is
// bos + encode(instruction + "{") + one encoded piece per pair line ("\n\"KEY\": \"VALUE\"," ; the
// last without the comma) + encode("\n}" + the demonstrations "\n\nQuestion: \"KEY\"\nAnswer:
// \"VALUE\"" + "\n\nQuestion: \"KEY\"\nAnswer:"), as many pairs as keep the prompt plus the longest answer's
// tokens + 3 within t.length (at least shots + 1), the queried pair at a uniformly drawn place and the
// demonstrations' keys drawn from the others; its answer span is the value's tokens in the queried
// pair's piece (needle_trials.h answer_span). toy-recall: toy::recall_batch(Rng(seed), samples,
// length, eval rows), answer span = the queried value's position, needle span = its key and value.
// DataError when t.length cannot hold shots + 1 pairs (naming the length and what one sample needs);
// ConfigError when the tokenizer cannot encode the pieces back to the value (naming the tokenizer).
KeyValueTrials key_value_trials(const Tokenizer& tok, const KeyValueTask& t);

}  // namespace hs
