#include "rouge.h"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>

namespace hs {

// ---- NLTK's Porter stemmer, default mode (NLTK_EXTENSIONS) ----
//
// A port of nltk/stem/porter.py (PorterStemmer.stem and its _step* helpers; NLTK 3.10.4, which
// gives the same stems as Debian's 3.8 on lower-case words), one function a Python method and in
// the same order, so the two can be read side by side.
//
// Why not Debian's libstemmer (Snowball, algorithm "porter"), which the project would rather link:
// Snowball's "porter" is Porter's original algorithm, and NLTK's default mode departs from it in
// steps 1a, 1b, 1c and 2 and in the *d and *o conditions (see below). Measured on 227,282 distinct
// tokens longer than 3 characters (rouge_score stems only those) from the needles, /usr/share/dict
// /words, Python's standard library and /usr/share/doc, libstemmer's "porter" differs from NLTK on
// 2,275 (1.0%): y -> i after a vowel (annoying -> annoi, monday -> mondai; NLTK: annoy, monday),
// -logi/-bli (mythology -> mythologi, illegibly -> illegibli; NLTK: mytholog, illeg), -ies/-ied of
// four letters (dies -> di; NLTK: die), the irregular forms (dying -> dy, skies -> ski; NLTK: die,
// sky), prying -> pry (NLTK: pri), and doubles other than bb dd ff gg mm nn pp rr tt (revved ->
// revv; NLTK: rev). libstemmer stems whole words only, and the step-1c difference changes what
// every later step sees, so no pre- or post-correction around it can close the gap: the
// corrections would be the whole algorithm. Hence this port, checked against NLTK on the same
// 227,282 tokens with no mismatch (tests/data/rouge_table.json keeps a sample of them).

namespace {

bool is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// _is_consonant: a 'y' is a consonant at the start of a word or after a vowel, else a vowel.
bool is_consonant(const std::string& w, size_t i) {
    if (is_vowel(w[i])) return false;
    if (w[i] != 'y') return true;
    bool negate = false;
    while (i > 0 && w[i] == 'y') {
        negate = !negate;
        --i;
    }
    return !is_vowel(w[i]) != negate;
}

// _consonant_flags: is_consonant for every position in one pass.
std::vector<bool> consonant_flags(const std::string& w) {
    std::vector<bool> f(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
        if (is_vowel(w[i]))
            f[i] = false;
        else if (w[i] == 'y')
            f[i] = i == 0 ? true : !f[i - 1];
        else
            f[i] = true;
    }
    return f;
}

// _measure: m in [C](VC){m}[V], counted as the "vc" pairs of the consonant/vowel string.
int measure(const std::string& stem) {
    const auto f = consonant_flags(stem);
    int m = 0;
    for (size_t i = 1; i < f.size(); ++i)
        if (!f[i - 1] && f[i]) ++m;
    return m;
}

bool has_positive_measure(const std::string& stem) { return measure(stem) > 0; }

// _contains_vowel (*v*).
bool contains_vowel(const std::string& stem) {
    const auto f = consonant_flags(stem);
    return std::find(f.begin(), f.end(), false) != f.end();
}

// _ends_double_consonant (*d): any doubled consonant, digits included.
bool ends_double_consonant(const std::string& w) {
    const size_t n = w.size();
    return n >= 2 && w[n - 1] == w[n - 2] && is_consonant(w, n - 1);
}

// _ends_cvc (*o), with NLTK's extension: a two-letter stem vowel + consonant also counts (and
// there the last letter may be w, x or y).
bool ends_cvc(const std::string& w) {
    const size_t n = w.size();
    return (n >= 3 && is_consonant(w, n - 3) && !is_consonant(w, n - 2) && is_consonant(w, n - 1) && w[n - 1] != 'w' &&
            w[n - 1] != 'x' && w[n - 1] != 'y') ||
           (n == 2 && !is_consonant(w, 0) && is_consonant(w, 1));
}

bool ends_with(const std::string& w, const std::string& suffix) {
    return w.size() >= suffix.size() && w.compare(w.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// _replace_suffix (w must end with suffix).
std::string replace_suffix(const std::string& w, const std::string& suffix, const std::string& replacement) {
    return w.substr(0, w.size() - suffix.size()) + replacement;
}

using Condition = std::function<bool(const std::string& stem)>;  // empty: unconditional

struct Rule {
    std::string suffix;  // "*d": the word ends in a double consonant (two letters removed)
    std::string replacement;
    Condition condition;
};

// _apply_rule_list: the first rule whose suffix matches decides; if its condition fails the word
// is returned unchanged (no later rule is tried). Rules are tried in list order, not longest first.
std::string apply_rule_list(const std::string& w, const std::vector<Rule>& rules) {
    for (const auto& r : rules) {
        if (r.suffix == "*d" && ends_double_consonant(w)) {
            const std::string stem = w.substr(0, w.size() - 2);
            if (!r.condition || r.condition(stem)) return stem + r.replacement;
            return w;
        }
        if (ends_with(w, r.suffix)) {
            const std::string stem = replace_suffix(w, r.suffix, "");
            if (!r.condition || r.condition(stem)) return stem + r.replacement;
            return w;
        }
    }
    return w;
}

std::string step1a(const std::string& w) {
    // NLTK: 'flies' -> 'fli' but 'dies' -> 'die'.
    if (ends_with(w, "ies") && w.size() == 4) return replace_suffix(w, "ies", "ie");
    static const std::vector<Rule> rules = {
        {"sses", "ss", {}},
        {"ies", "i", {}},
        {"ss", "ss", {}},
        {"s", "", {}},
    };
    return apply_rule_list(w, rules);
}

std::string step1b(const std::string& w) {
    // NLTK: 'spied' -> 'spi' but 'died' -> 'die'.
    if (ends_with(w, "ied")) return replace_suffix(w, "ied", w.size() == 4 ? "ie" : "i");
    // (m>0) EED -> EE
    if (ends_with(w, "eed")) {
        const std::string stem = replace_suffix(w, "eed", "");
        return measure(stem) > 0 ? stem + "ee" : w;
    }
    // (*v*) ED -> , (*v*) ING ->
    std::string inter;
    bool ok = false;
    for (const char* suffix : {"ed", "ing"}) {
        if (ends_with(w, suffix)) {
            inter = replace_suffix(w, suffix, "");
            if (contains_vowel(inter)) {
                ok = true;
                break;
            }
        }
    }
    if (!ok) return w;
    const char last = inter.back();
    const std::vector<Rule> rules = {
        {"at", "ate", {}},
        {"bl", "ble", {}},
        {"iz", "ize", {}},
        // (*d and not (*L or *S or *Z)) -> single letter
        {"*d", std::string(1, last), [last](const std::string&) { return last != 'l' && last != 's' && last != 'z'; }},
        // (m=1 and *o) -> E
        {"", "e", [](const std::string& stem) { return measure(stem) == 1 && ends_cvc(stem); }},
    };
    return apply_rule_list(inter, rules);
}

std::string step1c(const std::string& w) {
    // NLTK: Y -> I only after a consonant that is not the whole stem ('happy' -> 'happi',
    // 'enjoy' -> 'enjoy', 'spy' -> 'spi'); the original's condition is (*v*).
    static const std::vector<Rule> rules = {
        {"y", "i", [](const std::string& stem) { return stem.size() > 1 && is_consonant(stem, stem.size() - 1); }},
    };
    return apply_rule_list(w, rules);
}

std::string step2(const std::string& w) {
    // NLTK: ALLI -> AL first, and the result goes through step 2 again.
    if (ends_with(w, "alli") && has_positive_measure(replace_suffix(w, "alli", "")))
        return step2(replace_suffix(w, "alli", "al"));
    const Condition pos = has_positive_measure;
    const std::vector<Rule> rules = {
        {"ational", "ate", pos},
        {"tional", "tion", pos},
        {"enci", "ence", pos},
        {"anci", "ance", pos},
        {"izer", "ize", pos},
        {"bli", "ble", pos},  // NLTK: BLI -> BLE (the original has ABLI -> ABLE)
        {"alli", "al", pos},
        {"entli", "ent", pos},
        {"eli", "e", pos},
        {"ousli", "ous", pos},
        {"ization", "ize", pos},
        {"ation", "ate", pos},
        {"ator", "ate", pos},
        {"alism", "al", pos},
        {"iveness", "ive", pos},
        {"fulness", "ful", pos},
        {"ousness", "ous", pos},
        {"aliti", "al", pos},
        {"iviti", "ive", pos},
        {"biliti", "ble", pos},
        {"fulli", "ful", pos},  // NLTK
        // NLTK: LOGI -> LOG with the 'l' counted in the stem, so 'geology' works like 'philology'.
        {"logi", "log", [&w](const std::string&) { return has_positive_measure(w.substr(0, w.size() - 3)); }},
    };
    return apply_rule_list(w, rules);
}

std::string step3(const std::string& w) {
    static const std::vector<Rule> rules = {
        {"icate", "ic", has_positive_measure}, {"ative", "", has_positive_measure},
        {"alize", "al", has_positive_measure}, {"iciti", "ic", has_positive_measure},
        {"ical", "ic", has_positive_measure},  {"ful", "", has_positive_measure},
        {"ness", "", has_positive_measure},
    };
    return apply_rule_list(w, rules);
}

std::string step4(const std::string& w) {
    static const Condition gt1 = [](const std::string& stem) { return measure(stem) > 1; };
    static const std::vector<Rule> rules = {
        {"al", "", gt1},
        {"ance", "", gt1},
        {"ence", "", gt1},
        {"er", "", gt1},
        {"ic", "", gt1},
        {"able", "", gt1},
        {"ible", "", gt1},
        {"ant", "", gt1},
        {"ement", "", gt1},
        {"ment", "", gt1},
        {"ent", "", gt1},
        // (m>1 and (*S or *T)) ION ->
        {"ion", "",
         [](const std::string& stem) { return measure(stem) > 1 && (stem.back() == 's' || stem.back() == 't'); }},
        {"ou", "", gt1},
        {"ism", "", gt1},
        {"ate", "", gt1},
        {"iti", "", gt1},
        {"ous", "", gt1},
        {"ive", "", gt1},
        {"ize", "", gt1},
    };
    return apply_rule_list(w, rules);
}

std::string step5a(const std::string& w) {
    // (m>1) E -> ; (m=1 and not *o) E ->   (both conditions tried, unlike _apply_rule_list)
    if (ends_with(w, "e")) {
        const std::string stem = replace_suffix(w, "e", "");
        const int m = measure(stem);
        if (m > 1) return stem;
        if (m == 1 && !ends_cvc(stem)) return stem;
    }
    return w;
}

std::string step5b(const std::string& w) {
    // (m>1 and *d and *L) -> single letter; the measure is of the word less its last 'l'.
    const std::vector<Rule> rules = {
        {"ll", "l", [&w](const std::string&) { return measure(w.substr(0, w.size() - 1)) > 1; }},
    };
    return apply_rule_list(w, rules);
}

// NLTK's irregular forms (PorterStemmer.__init__, NLTK_EXTENSIONS): form -> stem.
const std::map<std::string, std::string>& irregular_pool() {
    static const std::map<std::string, std::string> pool = {
        {"sky", "sky"},        {"skies", "sky"},       {"dying", "die"},        {"lying", "lie"},
        {"tying", "tie"},      {"news", "news"},       {"innings", "inning"},   {"inning", "inning"},
        {"outings", "outing"}, {"outing", "outing"},   {"cannings", "canning"}, {"canning", "canning"},
        {"howe", "howe"},      {"proceed", "proceed"}, {"exceed", "exceed"},    {"succeed", "succeed"},
    };
    return pool;
}

}  // namespace

std::string porter_stem(const std::string& word) {
    std::string stem = word;
    for (char& c : stem)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    // NLTK 3.10 looks the lower-cased word up (3.8 looked up the word as given; same on lower case).
    const auto& pool = irregular_pool();
    if (auto it = pool.find(stem); it != pool.end()) return it->second;
    if (word.size() <= 2) return stem;
    stem = step1a(stem);
    stem = step1b(stem);
    stem = step1c(stem);
    stem = step2(stem);
    stem = step3(stem);
    stem = step4(stem);
    stem = step5a(stem);
    stem = step5b(stem);
    return stem;
}

// ---- tokenisation (rouge_score/tokenize.py) ----

std::vector<std::string> rouge_tokens(const std::string& text, bool stem) {
    std::vector<std::string> out;
    std::string cur;
    auto flush = [&] {
        if (cur.empty()) return;
        out.push_back(stem && cur.size() > 3 ? porter_stem(cur) : cur);
        cur.clear();
    };
    const size_t n = text.size();
    for (size_t i = 0; i < n; ++i) {
        const unsigned char c = static_cast<unsigned char>(text[i]);
        if (c >= 'A' && c <= 'Z') {
            cur += static_cast<char>(c - 'A' + 'a');
        } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
            cur += static_cast<char>(c);
        } else if (c == 0xE2 && i + 2 < n && static_cast<unsigned char>(text[i + 1]) == 0x84 &&
                   static_cast<unsigned char>(text[i + 2]) == 0xAA) {
            cur += 'k';  // U+212A KELVIN SIGN: Python lower() gives ASCII 'k'
            i += 2;
        } else if (c == 0xC4 && i + 1 < n && static_cast<unsigned char>(text[i + 1]) == 0xB0) {
            cur += 'i';  // U+0130: Python lower() gives 'i' + U+0307, which then separates
            i += 1;
            flush();
        } else {
            flush();  // any other byte: ASCII punctuation/space or part of a non-ASCII character
        }
    }
    flush();
    return out;
}

// ---- scores (rouge_score/rouge_scorer.py, scoring.py) ----

double rouge_fmeasure(double precision, double recall) {
    if (precision + recall > 0) return 2 * precision * recall / (precision + recall);
    return 0.0;
}

RougeScore rouge1_tokens(const std::vector<std::string>& reference, const std::vector<std::string>& candidate) {
    std::map<std::string, long long> ref, cand;
    for (const auto& t : reference) ++ref[t];
    for (const auto& t : candidate) ++cand[t];
    long long overlap = 0;
    for (const auto& [t, k] : ref) {
        const auto it = cand.find(t);
        if (it != cand.end()) overlap += std::min(k, it->second);
    }
    RougeScore s;
    s.precision = static_cast<double>(overlap) / static_cast<double>(std::max<size_t>(candidate.size(), 1));
    s.recall = static_cast<double>(overlap) / static_cast<double>(std::max<size_t>(reference.size(), 1));
    s.fmeasure = rouge_fmeasure(s.precision, s.recall);
    return s;
}

RougeScore rougeL_tokens(const std::vector<std::string>& reference, const std::vector<std::string>& candidate) {
    if (reference.empty() || candidate.empty()) return RougeScore{};
    // LCS length by the same dynamic programme as _lcs_table, keeping one row.
    std::vector<size_t> prev(candidate.size() + 1, 0), row(candidate.size() + 1, 0);
    for (size_t i = 1; i <= reference.size(); ++i) {
        for (size_t j = 1; j <= candidate.size(); ++j)
            row[j] = reference[i - 1] == candidate[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], row[j - 1]);
        std::swap(prev, row);
    }
    const double lcs = static_cast<double>(prev[candidate.size()]);
    RougeScore s;
    s.precision = lcs / static_cast<double>(candidate.size());
    s.recall = lcs / static_cast<double>(reference.size());
    s.fmeasure = rouge_fmeasure(s.precision, s.recall);
    return s;
}

RougeScore rouge1(const std::string& reference, const std::string& candidate, bool stem) {
    return rouge1_tokens(rouge_tokens(reference, stem), rouge_tokens(candidate, stem));
}

RougeScore rougeL(const std::string& reference, const std::string& candidate, bool stem) {
    return rougeL_tokens(rouge_tokens(reference, stem), rouge_tokens(candidate, stem));
}

}  // namespace hs
