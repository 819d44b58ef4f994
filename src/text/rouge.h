// ROUGE-1 and ROUGE-L exactly as Google's rouge_score package computes them with
// `rouge_scorer.RougeScorer(['rouge1', 'rougeL'], use_stemmer=True)`, the call both reference
// codes make (nightdessert/Retrieval_Head, aryopg/locos). No torch; standard library only.
// docs/methods.md, "ROUGE as the references compute it", has the formulas and the sources followed;
// tests/test_rouge.cpp checks every function against a table made by scripts/make_rouge_table.py.
#pragma once

#include <string>
#include <vector>

namespace hs {

// NLTK's `nltk.stem.porter.PorterStemmer()` in its default mode (NLTK_EXTENSIONS), the stemmer
// rouge_score's DefaultTokenizer builds (rouge_score/tokenizers.py): a line-by-line port of
// nltk/stem/porter.py (NLTK 3.8 and 3.10 agree on lower-case input), including NLTK's
// irregular-forms pool (dying -> die, skies -> sky, news -> news, ...), its step 1a/1b/1c/2
// extensions and its cvc rule for two-letter stems. A port, not Snowball's libstemmer "porter":
// that is the original 1980 algorithm and differs from NLTK on ~1% of words (rouge.cpp says where).
// Like NLTK's stem(word), A-Z are lower-cased first and words of one or two characters are
// returned as they are. Meant for [a-z0-9] tokens as rouge_tokens makes them (digits are
// consonants, as in NLTK); any other byte also counts as a consonant, and length is in bytes.
std::string porter_stem(const std::string& word);

// rouge_score's tokenize (rouge_score/tokenize.py): lower-case, every run of characters outside
// [a-z0-9] becomes a space, split on spaces, stem (porter_stem) the tokens longer than 3 characters
// when `stem` is set, drop empty tokens.
// Input is UTF-8 bytes where Python sees code points. The two agree on all valid UTF-8: Python's
// str.lower() turns only A-Z and two non-ASCII characters into [a-z0-9], and both are handled here:
// U+212A KELVIN SIGN -> "k" (a letter inside a word) and U+0130 LATIN CAPITAL LETTER I WITH DOT
// ABOVE -> "i" followed by a separator (Python gives "i" + U+0307 COMBINING DOT ABOVE). Every other
// non-ASCII character (é, ß, Cyrillic, CJK, ...) separates words, as in rouge_score: "café" -> "caf".
// Bytes that are not valid UTF-8 (which Python would never have decoded) are separators too.
std::vector<std::string> rouge_tokens(const std::string& text, bool stem);

struct RougeScore {
    double precision = 0.0, recall = 0.0, fmeasure = 0.0;
};

// F = 2PR / (P + R), 0 when P + R == 0 (rouge_score/scoring.py fmeasure).
double rouge_fmeasure(double precision, double recall);

// rouge_score's `scorer.score(target, prediction)['rouge1']` with target = reference (the expected
// answer) and prediction = candidate (the model's response). overlap = sum over reference unigrams
// of min(count in reference, count in candidate); P = overlap / max(|candidate|, 1),
// R = overlap / max(|reference|, 1), F as rouge_fmeasure (rouge_scorer.py _score_ngrams), so an
// empty side gives 0s.
RougeScore rouge1(const std::string& reference, const std::string& candidate, bool stem = true);

// rouge_score's `scorer.score(target, prediction)['rougeL']`: L = length of the longest common
// subsequence of the two token lists; P = L / |candidate|, R = L / |reference|, F as rouge_fmeasure;
// all three 0 when either side has no token (rouge_scorer.py _score_lcs).
RougeScore rougeL(const std::string& reference, const std::string& candidate, bool stem = true);

// The same two scores on token lists already made by rouge_tokens (one tokenisation for both).
RougeScore rouge1_tokens(const std::vector<std::string>& reference, const std::vector<std::string>& candidate);
RougeScore rougeL_tokens(const std::vector<std::string>& reference, const std::vector<std::string>& candidate);

}  // namespace hs
