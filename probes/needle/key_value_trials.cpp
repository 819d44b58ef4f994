// AttentionInfluence's key -> value retrieval trials (see key_value_trials.h).
#include "key_value_trials.h"

#include "errors.h"
#include "toy_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace hs {

namespace {

// Appendix A's instruction, word for word; "{" opens the JSON object the pairs fill.
constexpr const char* kInstruction =
    "Please extract the value corresponding to the specified key from the following JSON object. Output only the value "
    "of the corresponding key and nothing else. The JSON data is as follows: {";

std::vector<int64_t> encode_piece(const Tokenizer& tok, const std::string& s) {
    const auto e = s.empty() ? std::vector<int32_t>{} : tok.encode(s, false);
    return std::vector<int64_t>(e.begin(), e.end());
}

// The tokenizer's own whole words: pieces that are a word-start mark (SentencePiece's U+2581, byte-level
// BPE's U+0120) followed by 3 to 10 lower-case ASCII letters, as the text they decode to.
std::vector<std::string> vocabulary_words(const Tokenizer& tok) {
    std::vector<std::string> words;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        if (tok.is_special(id)) continue;
        const std::string t = tok.token_text(id);
        size_t mark = 0;
        if (t.rfind("\u2581", 0) == 0) mark = 3;
        else if (t.rfind("\u0120", 0) == 0) mark = 2;
        else continue;
        const std::string w = t.substr(mark);
        if (w.size() < 3 || w.size() > 10 || !std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
            continue;
        words.push_back(w);
    }
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    return words;
}

struct Pair {
    std::string key, value;
};

std::string pair_line(const Pair& p, bool comma) { return fmt::format("\n\"{}\": \"{}\"{}", p.key, p.value, comma ? "," : ""); }

KeyValueTrials toy_trials(const Tokenizer& tok, const KeyValueTask& t) {
    if (t.length < 8) throw DataError(fmt::format("key-value task: length {} is below the toy recall rows' 8 tokens", t.length));
    KeyValueTrials out;
    out.format = KeyValueFormat::kToyRecall;
    out.values = "toy recall: one upper-case letter a value (datasets/toy_tasks.h recall_batch, evaluation rows)";
    out.max_new_tokens = 1;
    out.stop = StopRule::kNone;
    toy::Rng rng(t.seed);
    const auto rb = toy::recall_batch(rng, t.samples, t.length, true);
    const auto rows = rb.batch.tokens.contiguous();
    const int64_t* p = rows.data_ptr<int64_t>();
    for (int64_t b = 0; b < t.samples; ++b) {
        Trial tr;
        tr.prompt.assign(p + b * t.length, p + (b + 1) * t.length);
        const int64_t v = rb.value_pos[static_cast<size_t>(b)], q = rb.query_pos[static_cast<size_t>(b)];
        const int64_t key = tr.prompt[static_cast<size_t>(v - 1)], value = tr.prompt[static_cast<size_t>(v)];
        tr.length = t.length, tr.depth = 100.0 * static_cast<double>(v) / static_cast<double>(t.length);
        tr.needle = static_cast<int>(b);
        tr.needle_start = v - 1, tr.needle_end = v + 1, tr.answer_start = v, tr.answer_end = v + 1;
        int64_t pairs = 0;
        for (int64_t i = 1; i + 1 < q; ++i) pairs += tr.prompt[static_cast<size_t>(i)] >= toy::kLower0 && tr.prompt[static_cast<size_t>(i)] < toy::kUpper0;
        out.pairs.push_back(pairs);
        out.needles.push_back({tok.token_text(static_cast<int32_t>(key)) + tok.token_text(static_cast<int32_t>(value)),
                               tok.token_text(static_cast<int32_t>(key)), tok.token_text(static_cast<int32_t>(value)),
                               static_cast<int>(b + 1)});
        out.trials.push_back(std::move(tr));
    }
    return out;
}

}  // namespace

const char* key_value_format_name(KeyValueFormat f) { return f == KeyValueFormat::kJson ? "json" : "toy-recall"; }

bool toy_vocabulary(const Tokenizer& tok) {
    if (tok.vocab_size() != toy::kVocabSize) return false;
    for (int32_t id = 0; id < toy::kVocabSize; ++id)
        if (tok.token_text(id) != toy::token_text(id)) return false;
    return true;
}

KeyValueTrials key_value_trials(const Tokenizer& tok, const KeyValueTask& t) {
    HS_REQUIRE(t.samples >= 1 && t.shots >= 0 && t.key_chars >= 1 && t.value_words >= 1, "key_value_trials: bad task");
    if (toy_vocabulary(tok)) return toy_trials(tok, t);
    KeyValueTrials out;
    const auto words = vocabulary_words(tok);
    const bool hex = words.size() < 64;
    out.values = hex ? fmt::format("{} groups of 4 random hex digits (the vocabulary has {} word pieces, under 64)", t.value_words, words.size())
                     : fmt::format("{} words drawn uniformly from the vocabulary's {} word pieces (a word-start mark and 3-10 "
                                   "lower-case letters)", t.value_words, words.size());
    std::mt19937_64 rng(t.seed);
    auto draw = [&](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); };
    static const std::string alnum = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    static const std::string hexd = "0123456789abcdef";
    auto make_pair = [&] {
        Pair p;
        for (int64_t i = 0; i < t.key_chars; ++i) p.key += alnum[static_cast<size_t>(draw(62))];
        for (int64_t w = 0; w < t.value_words; ++w) {
            if (w) p.value += ' ';
            if (hex)
                for (int k = 0; k < 4; ++k) p.value += hexd[static_cast<size_t>(draw(16))];
            else
                p.value += words[static_cast<size_t>(draw(static_cast<int64_t>(words.size())))];
        }
        return p;
    };
    std::vector<int64_t> prefix;
    {
        const auto with = tok.encode("a", true), without = tok.encode("a", false);
        for (size_t i = 0; i + without.size() <= with.size(); ++i)
            if (std::equal(without.begin(), without.end(), with.begin() + i)) {
                prefix.assign(with.begin(), with.begin() + static_cast<std::ptrdiff_t>(i));
                break;
            }
        const auto body = encode_piece(tok, kInstruction);
        prefix.insert(prefix.end(), body.begin(), body.end());
    }
    // Every sample's queried and demonstration pairs first: the answer budget (the longest answer's
    // tokens + 3) is one for all trials, so every prompt plus max_new_tokens fits the length.
    std::vector<std::vector<Pair>> samples(static_cast<size_t>(t.samples));
    int64_t answer_budget = 0;
    for (auto& pairs : samples) {
        // pairs[0] is the queried one, pairs[1..shots] the demonstrations', the rest distractors.
        for (int64_t i = 0; i <= t.shots; ++i) pairs.push_back(make_pair());
        answer_budget = std::max(answer_budget, static_cast<int64_t>(encode_piece(tok, " \"" + pairs[0].value + "\"").size()) + 3);
    }
    out.max_new_tokens = answer_budget;
    for (int64_t s = 0; s < t.samples; ++s) {
        auto& pairs = samples[static_cast<size_t>(s)];
        std::string suffix_text = "\n}";
        for (int64_t i = 1; i <= t.shots; ++i)
            suffix_text += fmt::format("\n\nQuestion: \"{}\"\nAnswer: \"{}\"", pairs[static_cast<size_t>(i)].key, pairs[static_cast<size_t>(i)].value);
        suffix_text += fmt::format("\n\nQuestion: \"{}\"\nAnswer:", pairs[0].key);
        const auto suffix = encode_piece(tok, suffix_text);
        int64_t used = static_cast<int64_t>(prefix.size() + suffix.size()) + answer_budget;
        for (const auto& p : pairs) used += static_cast<int64_t>(encode_piece(tok, pair_line(p, true)).size());
        if (used > t.length)
            throw DataError(fmt::format("key-value task: length {} cannot hold a sample of {} pairs ({} + 1 for the "
                                        "demonstrations and the query: {} tokens with the instruction and the answer)",
                                        t.length, t.shots + 1, t.shots, used));
        for (;;) {  // distractors while they fit
            Pair p = make_pair();
            const int64_t n = static_cast<int64_t>(encode_piece(tok, pair_line(p, true)).size());
            if (used + n > t.length) break;
            used += n, pairs.push_back(std::move(p));
        }
        // The object's order: a random permutation (the queried pair at a uniformly drawn place).
        std::vector<size_t> order(pairs.size());
        std::iota(order.begin(), order.end(), size_t{0});
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<std::vector<int64_t>> lines;
        auto encode_lines = [&] {
            lines.clear();
            int64_t total = static_cast<int64_t>(prefix.size() + suffix.size()) + answer_budget;
            for (size_t k = 0; k < order.size(); ++k) {
                lines.push_back(encode_piece(tok, pair_line(pairs[order[k]], k + 1 < order.size())));
                total += static_cast<int64_t>(lines.back().size());
            }
            return total;
        };
        // The last line has no comma; where that changes its tokens past the budget, drop a distractor.
        while (encode_lines() > t.length) {
            const auto it = std::find_if(order.rbegin(), order.rend(), [&](size_t k) { return k > static_cast<size_t>(t.shots); });
            HS_REQUIRE(it != order.rend(), "key_value_trials: no distractor to drop");
            order.erase(std::next(it).base());
        }
        Trial tr;
        tr.prompt = prefix;
        int64_t context = 0;
        for (size_t k = 0; k < order.size(); ++k) {
            if (order[k] == 0) {
                const auto span = answer_span(tok, lines[k], pairs[0].value);
                if (!span)
                    throw ConfigError(fmt::format("{}: the key-value task's value \"{}\" is not in its pair's decoded tokens; "
                                                  "this tokenizer does not decode what it encodes",
                                                  tok.source_path(), pairs[0].value));
                tr.needle_start = static_cast<int64_t>(tr.prompt.size());
                tr.needle_end = tr.needle_start + static_cast<int64_t>(lines[k].size());
                tr.answer_start = tr.needle_start + span->first, tr.answer_end = tr.needle_start + span->second;
                tr.depth = order.size() > 1 ? 100.0 * static_cast<double>(k) / static_cast<double>(order.size() - 1) : 0.0;
                out.needles.push_back({pair_line(pairs[0], k + 1 < order.size()), pairs[0].key, pairs[0].value, static_cast<int>(s + 1)});
            }
            tr.prompt.insert(tr.prompt.end(), lines[k].begin(), lines[k].end());
            context += static_cast<int64_t>(lines[k].size());
        }
        tr.prompt.insert(tr.prompt.end(), suffix.begin(), suffix.end());
        tr.length = context, tr.needle = static_cast<int>(s);
        out.pairs.push_back(static_cast<int64_t>(order.size()));
        out.trials.push_back(std::move(tr));
    }
    return out;
}

}  // namespace hs
