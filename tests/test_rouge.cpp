// ROUGE as the reference codes compute it (src/rouge.*, docs/methods.md "ROUGE as the references
// compute it"): NLTK's default-mode Porter stems, rouge_score's tokens and its rouge1 / rougeL
// precision, recall and F, checked against tests/data/rouge_table.json (made by
// scripts/make_rouge_table.py from NLTK and rouge_score themselves) and against a few cases worked
// by hand. No torch here.
#include <doctest/doctest.h>

#include "rouge.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace hs;

namespace {

const double kTol = 1e-12;

nlohmann::json rouge_table() {
    const std::string path = std::string(HS_SOURCE_DIR) + "/tests/data/rouge_table.json";
    std::ifstream f(path, std::ios::binary);
    REQUIRE_MESSAGE(f.good(), "cannot open " << path);
    std::stringstream ss;
    ss << f.rdbuf();
    return nlohmann::json::parse(ss.str());
}

void check_score(const RougeScore& got, const nlohmann::json& want) {
    CHECK(std::abs(got.precision - want.at("precision").get<double>()) <= kTol);
    CHECK(std::abs(got.recall - want.at("recall").get<double>()) <= kTol);
    CHECK(std::abs(got.fmeasure - want.at("fmeasure").get<double>()) <= kTol);
}

void check_score(const RougeScore& got, double p, double r, double f) {
    CHECK(std::abs(got.precision - p) <= kTol);
    CHECK(std::abs(got.recall - r) <= kTol);
    CHECK(std::abs(got.fmeasure - f) <= kTol);
}

using Tokens = std::vector<std::string>;

}  // namespace

TEST_CASE("rouge: porter_stem gives NLTK's default-mode stem for every word of the table") {
    const auto table = rouge_table();
    const auto& stems = table.at("stems");
    CHECK(stems.size() >= 80);
    for (const auto& e : stems) {
        const std::string word = e.at(0).get<std::string>(), want = e.at(1).get<std::string>();
        CAPTURE(word);
        CHECK(porter_stem(word) == want);
    }
}

TEST_CASE("rouge: rouge_tokens, rouge1 and rougeL match rouge_score on every pair of the table") {
    const auto table = rouge_table();
    const auto& pairs = table.at("pairs");
    std::set<std::pair<std::string, std::string>> distinct;
    for (const auto& p : pairs) {
        const std::string ref = p.at("reference").get<std::string>(), cand = p.at("candidate").get<std::string>();
        const bool stem = p.at("use_stemmer").get<bool>();
        distinct.insert({ref, cand});
        CAPTURE(ref);
        CAPTURE(cand);
        CAPTURE(stem);
        const Tokens rt = rouge_tokens(ref, stem), ct = rouge_tokens(cand, stem);
        CHECK(rt == p.at("reference_tokens").get<Tokens>());
        CHECK(ct == p.at("candidate_tokens").get<Tokens>());
        check_score(rouge1(ref, cand, stem), p.at("rouge1"));
        check_score(rougeL(ref, cand, stem), p.at("rougeL"));
        check_score(rouge1_tokens(rt, ct), p.at("rouge1"));
        check_score(rougeL_tokens(rt, ct), p.at("rougeL"));
    }
    CHECK(distinct.size() >= 30);
}

TEST_CASE("rouge: hand-worked stems") {
    // runs: step 1a S -> "run". running: step 1b ING -> "runn" (has a vowel), *d and not L/S/Z ->
    // "run".
    CHECK(porter_stem("runs") == "run");
    CHECK(porter_stem("running") == "run");
    // NLTK's irregular forms and its four-letter -ies rule; the original algorithm gives dy, ski, di.
    CHECK(porter_stem("dying") == "die");
    CHECK(porter_stem("skies") == "sky");
    CHECK(porter_stem("dies") == "die");
    // flies: step 1a IES -> I gives "fli"; fly: step 1c Y -> I after a consonant gives "fli" too.
    CHECK(porter_stem("flies") == "fli");
    CHECK(porter_stem("fly") == "fli");
    // NLTK's step 1c keeps y after a vowel (the original gives "enjoi").
    CHECK(porter_stem("enjoy") == "enjoy");
    // Upper case is lowered first, and words of one or two letters are left alone.
    CHECK(porter_stem("Running") == "run");
    CHECK(porter_stem("DYING") == "die");
    CHECK(porter_stem("is") == "is");
}

TEST_CASE("rouge: hand-worked tokens") {
    // Lower case; every run outside [a-z0-9] separates; only tokens longer than 3 are stemmed
    // ("the" stays, "runs" -> "run", "cats" -> "cat", "was" stays although NLTK would give "wa").
    CHECK(rouge_tokens("The RUNS, the cats; was 1990s!", true) == Tokens{"the", "run", "the", "cat", "was", "1990"});
    CHECK(rouge_tokens("The RUNS, the cats; was 1990s!", false) ==
          Tokens{"the", "runs", "the", "cats", "was", "1990s"});
    CHECK(rouge_tokens("don't snake_case 3.14", false) == Tokens{"don", "t", "snake", "case", "3", "14"});
    CHECK(rouge_tokens("", true).empty());
    CHECK(rouge_tokens(" !!! ... ", true).empty());
    // Non-ASCII letters separate, as in rouge_score: "café" -> "caf", "Straße" -> "stra", "e".
    const std::string e_acute = "\xc3\xa9", sharp_s = "\xc3\x9f";
    CHECK(rouge_tokens("caf" + e_acute + " Stra" + sharp_s + "e", false) == Tokens{"caf", "stra", "e"});
    // The two characters Python lower-cases into ASCII: U+0130 -> "i" + U+0307 (a separator) and
    // U+212A KELVIN SIGN -> "k".
    const std::string dotted_I = "\xc4\xb0", kelvin = "\xe2\x84\xaa";
    CHECK(rouge_tokens(dotted_I + "stanbul", false) == Tokens{"i", "stanbul"});
    CHECK(rouge_tokens(kelvin + "elvin 5" + kelvin, false) == Tokens{"kelvin", "5k"});
    // A byte that is not valid UTF-8 separates too.
    CHECK(rouge_tokens(std::string("ab") + '\xff' + "cd", false) == Tokens{"ab", "cd"});
}

TEST_CASE("rouge: hand-worked scores") {
    // "the runs" vs "running", stemmed: reference [the, run], candidate [run]. Overlap 1:
    // P = 1/1, R = 1/2, F = 2 * 1 * 0.5 / 1.5 = 2/3. LCS = 1 gives the same for rougeL.
    check_score(rouge1("the runs", "running"), 1.0, 0.5, 2.0 / 3.0);
    check_score(rougeL("the runs", "running"), 1.0, 0.5, 2.0 / 3.0);
    // Unstemmed: [the, runs] vs [running] share nothing.
    check_score(rouge1("the runs", "running", false), 0.0, 0.0, 0.0);

    // Clipped counts: reference {the: 2, cat: 1}, candidate {the: 3, cat: 1}; overlap
    // min(2,3) + min(1,1) = 3; P = 3/4, R = 3/3, F = 2 * 0.75 / 1.75 = 6/7.
    check_score(rouge1("the the cat", "the cat the the"), 0.75, 1.0, 6.0 / 7.0);
    // LCS of [the, the, cat] and [the, cat, the, the] is 2 ("the cat" or "the the"):
    // P = 2/4, R = 2/3, F = 2 * (1/2)(2/3) / (1/2 + 2/3) = (2/3) / (7/6) = 4/7.
    check_score(rougeL("the the cat", "the cat the the"), 0.5, 2.0 / 3.0, 4.0 / 7.0);

    // Order matters to rougeL only: every unigram matches, the LCS is 1 of 4.
    check_score(rouge1("a b c d", "d c b a"), 1.0, 1.0, 1.0);
    check_score(rougeL("a b c d", "d c b a"), 0.25, 0.25, 0.25);

    // "eat a sandwich" vs "eating sandwiches": [eat, a, sandwich] vs [eat, sandwich] (eating: ING
    // off, AT -> ATE, step 5a drops the e; sandwiches: S off, step 5a drops the e). Overlap 2:
    // P = 2/2, R = 2/3, F = 2 * (2/3) / (5/3) = 4/5.
    check_score(rouge1("eat a sandwich", "eating sandwiches"), 1.0, 2.0 / 3.0, 0.8);

    // Empty sides: rouge1 divides by max(count, 1), rougeL returns zeros; F is 0 when P + R = 0.
    check_score(rouge1("answer", ""), 0.0, 0.0, 0.0);
    check_score(rougeL("answer", ""), 0.0, 0.0, 0.0);
    check_score(rouge1("", "something"), 0.0, 0.0, 0.0);
    check_score(rougeL("", ""), 0.0, 0.0, 0.0);
    CHECK(rouge_fmeasure(0.0, 0.0) == 0.0);
    CHECK(std::abs(rouge_fmeasure(1.0, 0.5) - 2.0 / 3.0) <= kTol);
}
