// The needle test's inputs and trials (needle_trials.h): needles, templates, haystacks, stop rules,
// and the trials each protocol builds. Reference lines: docs/needle-protocols.md.
#include "needle_trials.h"

#include "errors.h"
#include "guard.h"
#include "lines.h"
#include "rouge.h"
#include "util.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

namespace hs {

// ---- names ----

const NameTable<Protocol>& protocol_names() {
    static const NameTable<Protocol> t = {{Protocol::kHeadscope, "headscope"}, {Protocol::kWu, "wu"}, {Protocol::kLocos, "locos"}};
    return t;
}
const NameTable<Assembly>& assembly_names() {
    static const NameTable<Assembly> t = {
        {Assembly::kTokens, "tokens"}, {Assembly::kText, "text"}, {Assembly::kTracked, "tracked"}, {Assembly::kJoined, "joined"}};
    return t;
}
const NameTable<Insertion>& insertion_names() {
    static const NameTable<Insertion> t = {
        {Insertion::kSentenceEnd, "sentence-end"}, {Insertion::kPeriod, "period"}, {Insertion::kEncodedPeriod, "encoded-period"}};
    return t;
}
const NameTable<AnswerSearch>& answer_search_names() {
    static const NameTable<AnswerSearch> t = {{AnswerSearch::kDecoded, "decoded"}, {AnswerSearch::kWu, "wu"}, {AnswerSearch::kLocos, "locos"}};
    return t;
}
const NameTable<StopRule>& stop_rule_names() {
    static const NameTable<StopRule> t = {{StopRule::kNewline, "newline"}, {StopRule::kEos, "eos"}, {StopRule::kNone, "none"},
                                          {StopRule::kWu, "wu"}, {StopRule::kLocos, "locos"}};
    return t;
}
const NameTable<StopOrder>& stop_order_names() {
    static const NameTable<StopOrder> t = {{StopOrder::kBefore, "before"}, {StopOrder::kAfter, "after"}};
    return t;
}
const NameTable<HaystackFormat>& haystack_format_names() {
    static const NameTable<HaystackFormat> t = {{HaystackFormat::kRaw, "raw"}, {HaystackFormat::kRows, "rows"}};
    return t;
}
const NameTable<HaystackRepeat>& haystack_repeat_names() {
    static const NameTable<HaystackRepeat> t = {
        {HaystackRepeat::kTokens, "tokens"}, {HaystackRepeat::kConcat, "concat"}, {HaystackRepeat::kDouble, "double"}};
    return t;
}
const NameTable<RngKind>& rng_kind_names() {
    static const NameTable<RngKind> t = {{RngKind::kHeadscope, "headscope"}, {RngKind::kReference, "reference"}};
    return t;
}
const NameTable<AblationScope>& ablation_scope_names() {
    static const NameTable<AblationScope> t = {{AblationScope::kAll, "all"}, {AblationScope::kDecode, "decode"}};
    return t;
}

NeedleProtocol protocol_defaults(Protocol p) {
    NeedleProtocol r;
    r.protocol = p;
    if (p == Protocol::kWu) {
        // retrieval_head_detection.py: final_context_length_buffer 200, insert_needle's period loop,
        // find_needle_idx, decode()'s append-score-stop order and its 50 steps; the masked runs pass
        // block_list to the decode steps only (needle_in_haystack_with_mask.py).
        r.buffer = 200;
        r.assembly = r.ablation_assembly = Assembly::kText;
        r.insertion = Insertion::kPeriod;
        r.answer = AnswerSearch::kWu;
        r.stop = StopRule::kWu;
        r.stop_order = StopOrder::kAfter;
        r.haystack_format = HaystackFormat::kRaw;
        r.repeat = HaystackRepeat::kConcat;
        r.scope = AblationScope::kDecode;
    } else if (p == Protocol::kLocos) {
        // logit_contrib.py (scan: build_tracked_prompt, buffer 200, get_period_tokens' encode(".")
        // fallback, stop before appending, 50 steps, seed 42); nolima_ablation.py (ablation runs:
        // generate_for_trial's joined prompt, max_tokens 100, hooks in every forward).
        r.buffer = 200;
        r.assembly = Assembly::kTracked;
        r.ablation_assembly = Assembly::kJoined;
        r.insertion = Insertion::kEncodedPeriod;
        r.answer = AnswerSearch::kLocos;
        r.stop = StopRule::kLocos;
        r.stop_order = StopOrder::kBefore;
        r.haystack_format = HaystackFormat::kRows;
        r.repeat = HaystackRepeat::kDouble;
        r.rng = RngKind::kReference;
        r.scope = AblationScope::kAll;
        r.ablation_max_new_tokens = 100;
        r.seed = 42;
    }
    return r;
}

// ---- the haystack ----

std::vector<std::string> read_haystack_dir(const std::string& dir, size_t n_needles, HaystackFormat format) {
    namespace fs = std::filesystem;
    if (!is_directory(dir)) throw DataError(fmt::format("{}: no such folder (the haystack folder)", dir));
    std::vector<std::string> out;
    for (size_t i = 0; i < n_needles; ++i) {
        const std::string part = path_join(dir, fmt::format("part{}", i + 1));
        if (!is_directory(part))
            throw DataError(fmt::format("{}: no such folder (the haystack of needle {} of {}: the reference layout holds "
                                        "part1/, part2/, ... one per needle)",
                                        part, i + 1, n_needles));
        if (format == HaystackFormat::kRows) {
            const std::string plain = path_join(part, "p1.plain.txt"), rows = path_join(part, "p1.txt");
            if (file_exists(plain)) {
                out.push_back(read_utf8_text_file(plain));
                continue;
            }
            if (!file_exists(rows)) throw DataError(fmt::format("{}: neither p1.plain.txt nor p1.txt (the rows format)", part));
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(read_utf8_text_file(rows));
            } catch (const nlohmann::json::exception&) {
                throw DataError(fmt::format("{}: not JSON (the rows format reads {{\"rows\": [{{\"row\": {{\"text\": ...}}}}]}}; "
                                            "the haystack format `raw` reads it as text)",
                                            rows));
            }
            if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array())
                throw DataError(fmt::format("{}: no \"rows\" list (the rows format)", rows));
            std::string text;
            bool first = true;
            for (const auto& r : j["rows"]) {
                // datasets.py: "\n\n".join(r["row"]["text"] for r in data["rows"] if r["row"].get("text"))
                if (!r.is_object() || !r.contains("row") || !r["row"].is_object())
                    throw DataError(fmt::format("{}: a rows entry without a \"row\" object", rows));
                const auto& row = r["row"];
                if (!row.contains("text") || row["text"].is_null()) continue;
                if (!row["text"].is_string()) throw DataError(fmt::format("{}: a row's \"text\" is not a string", rows));
                const std::string t = row["text"].get<std::string>();
                if (t.empty()) continue;
                text += (first ? "" : "\n\n") + t;
                first = false;
            }
            out.push_back(std::move(text));
            continue;
        }
        std::vector<std::string> files;
        for (const auto& e : fs::directory_iterator(part))
            if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
        if (files.empty()) throw DataError(fmt::format("{}: no .txt file (the haystack of needle {})", part, i + 1));
        std::sort(files.begin(), files.end());  // Wu's glob order is the file system's; headscope's is by name
        std::string text;
        for (const auto& f : files) text += read_utf8_text_file(f);
        out.push_back(std::move(text));
    }
    return out;
}

// Python's str.isspace() for one code point: categories Zs and the bidirectional classes WS, B, S.
static bool python_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int64_t python_word_count(const std::string& text) {
    int64_t words = 0;
    bool in_word = false;
    for (size_t i = 0; i < text.size();) {
        const unsigned char b = static_cast<unsigned char>(text[i]);
        uint32_t c = b;
        size_t n = 1;
        if (b >= 0xF0) c = b & 0x07, n = 4;
        else if (b >= 0xE0) c = b & 0x0F, n = 3;
        else if (b >= 0xC0) c = b & 0x1F, n = 2;
        for (size_t k = 1; k < n && i + k < text.size(); ++k) c = (c << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
        i += n;
        const bool space = python_space(c);
        if (!space && !in_word) ++words;
        in_word = !space;
    }
    return words;
}

std::string repeat_haystack(const std::string& text, int64_t max_words, HaystackRepeat repeat) {
    if (repeat == HaystackRepeat::kTokens) return text;
    const int64_t words = python_word_count(text);
    if (words == 0) throw DataError("the haystack has no words");
    if (repeat == HaystackRepeat::kConcat) {  // read_context_files: context += f.read() until words >= max
        // Each copy adds the same number of words (its first word may join the last one before it),
        // so the copies are counted rather than the growing text recounted.
        const int64_t adds = python_word_count(text + text) - words;
        if (adds <= 0 && words < max_words)
            throw DataError(fmt::format("the haystack is one word ({} words after two copies): the reference's concatenation "
                                        "to {} words (len(text.split())) never ends; the haystack repeat `tokens` repeats it by tokens",
                                        words + adds, max_words));
        int64_t have = words, copies = 1;
        while (have < max_words) have += adds, ++copies;
        std::string out;
        out.reserve(text.size() * static_cast<size_t>(copies));
        for (int64_t i = 0; i < copies; ++i) out += text;
        return out;
    }
    std::string out = text;  // load_haystack_texts: while len(text.split()) < max_tokens: text += "\n\n" + text
    for (int64_t have = words; have < max_words; have *= 2) out += "\n\n" + std::string(out);  // "\n\n" splits: words double
    return out;
}

// ---- spans ----

std::optional<std::pair<int64_t, int64_t>> overlap_search(const std::vector<int64_t>& prompt,
                                                          const std::vector<int64_t>& target, bool partial_windows) {
    const std::set<int64_t> want(target.begin(), target.end());
    if (want.empty()) return std::nullopt;
    const int64_t P = static_cast<int64_t>(prompt.size()), n = static_cast<int64_t>(target.size());
    const int64_t last = partial_windows ? P - 1 : P - n;
    std::set<int64_t> seen;
    for (int64_t i = 0; i <= last; ++i) {
        seen.clear();
        for (int64_t j = i; j < std::min(P, i + n); ++j)
            if (want.count(prompt[static_cast<size_t>(j)])) seen.insert(prompt[static_cast<size_t>(j)]);
        // float(len(span & needle)) / len(set(needle)) > 0.9, in double as Python computes it
        if (static_cast<double>(seen.size()) / static_cast<double>(want.size()) > 0.9) return std::make_pair(i, i + n);
    }
    return std::nullopt;
}

// ---- stopping ----

void set_stop_rule(TokenFacts& f, const Tokenizer& tok, StopRule rule, const std::vector<int64_t>& config_eos,
                   const std::vector<int64_t>& generation_eos, const std::vector<int64_t>& extra) {
    f.stop_rule = rule;
    std::vector<int64_t> ids = extra;
    auto add = [&ids](const std::vector<int64_t>& v) { ids.insert(ids.end(), v.begin(), v.end()); };
    auto byte_newline = [&] {  // the byte-fallback piece "<0x0A>" (Wu's and LOCOS's step_token test)
        if (const auto id = tok.token_to_id("<0x0A>")) ids.push_back(*id);
    };
    switch (rule) {
        case StopRule::kNewline: add(f.newline_ids), add(f.eos_ids), add(config_eos); break;
        case StopRule::kEos: add(f.eos_ids), add(config_eos); break;
        case StopRule::kNone: break;
        case StopRule::kWu: byte_newline(), add(f.newline_ids); break;
        case StopRule::kLocos: {
            byte_newline();
            const auto nl = tok.encode("\n", false, true);  // newline_token_id = encode("\n")[-1]
            if (!nl.empty()) ids.push_back(nl.back());
            add(f.eos_ids), add(generation_eos);
            break;
        }
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    f.rule_ids = std::move(ids);
}

// ---- needles and templates ----

const char* const kDefaultTemplate = "{context}Based on the content of the book, Question: {question}\nAnswer:";

// ---- needles file ----

std::vector<Needle> read_needles(const std::string& path) {
    const std::string text = read_utf8_text_file(path);
    std::vector<Needle> out;
    for_each_line(text, path, [&](const std::string& line, const std::string& where, int line_no) {
        const nlohmann::json j = parse_json_line(
            line, where, " (expected {\"needle\": ..., \"question\": ..., \"answer\": ...}; \"real_needle\" may name the answer)");
        if (!j.is_object()) throw DataError(fmt::format("{}: not a JSON object", where));
        Needle n;
        n.line = line_no;
        // The reference repositories' needles.jsonl name the answer "real_needle".
        const char* const answer_key = j.contains("answer") || !j.contains("real_needle") ? "answer" : "real_needle";
        for (const char* key : {"needle", "question", answer_key}) {
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
        return true;
    });
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

bool TokenFacts::stop(int64_t id) const { return std::binary_search(rule_ids.begin(), rule_ids.end(), id); }

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
    set_stop_rule(f, tok, rule, {}, {}, {});
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



// ---- trials as a protocol builds them ----

TrialBuilder::TrialBuilder(const Tokenizer& tok, NeedleProtocol proto, TokenFacts facts, std::vector<Needle> needles,
                           std::string needles_path, std::vector<std::string> haystacks)
    : tok_(tok), p_(std::move(proto)), facts_(std::move(facts)), needles_(std::move(needles)),
      needles_path_(std::move(needles_path)), haystacks_(std::move(haystacks)) {
    HS_REQUIRE(haystacks_.size() == needles_.size(), "TrialBuilder: one haystack per needle");
    const auto bos = tok_.bos_id();
    const auto test = tok_.encode("test", true, false);  // model_utils.py tokenizer_adds_bos
    adds_bos_ = bos && !test.empty() && test.front() == *bos;
    const bool period_rule = p_.insertion == Insertion::kPeriod;
    if (period_rule) {
        // Wu hard-codes Llama-2's ids of "." and "▁." (retrieval_head_detection.py line 420): the pieces
        // "." and the word-start "." of the tokenizer at hand (SentencePiece "▁", byte-level BPE "Ġ").
        for (int32_t id = 0; id < tok_.vocab_size(); ++id) {
            const std::string t = tok_.token_text(id);
            if (t == "." || t == "\u2581." || t == "\u0120.") periods_.push_back(id);
        }
        if (periods_.empty())
            throw ConfigError(fmt::format("{}: no period piece (\".\", \"\u2581.\" or \"\u0120.\") in the vocabulary, so "
                                          "the insertion `period` has nowhere to put a needle (insertion `encoded-period` or "
                                          "`sentence-end` can)",
                                          tok_.source_path()));
    } else if (p_.insertion == Insertion::kEncodedPeriod) {
        periods_ = enc(".", false);  // needle_utils.py get_period_tokens: set(encode(".", add_special_tokens=False))
    }
    std::sort(periods_.begin(), periods_.end());
    periods_.erase(std::unique(periods_.begin(), periods_.end()), periods_.end());
    for (size_t i = 0; i < needles_.size(); ++i) {
        const auto& nd = needles_[i];
        const std::string where = fmt::format("{}:{}", needles_path_, nd.line);
        // The decoded span (headscope's), inside the needle's tokens as the scan's assembly encodes them.
        const auto nt = p_.assembly == Assembly::kTokens ? enc_headscope(nd.needle) : enc(nd.needle, false);
        const auto span = answer_span(tok_, nt, nd.answer);
        if (p_.answer == AnswerSearch::kDecoded && !span)
            throw DataError(fmt::format("{}: the answer \"{}\" is not in the needle's decoded tokens (\"{}\"); the retrieval "
                                        "score credits copies of the answer's tokens",
                                        where, nd.answer, tok_.decode(std::vector<int32_t>(nt.begin(), nt.end()), true)));
        if (p_.answer == AnswerSearch::kWu && !overlap_search(nt, enc(nd.answer, false), true))
            throw DataError(fmt::format("{}: Wu's answer search (find_needle_idx: a window whose token set overlaps the "
                                        "answer's by more than 90%) finds the answer \"{}\" nowhere in the needle's own tokens",
                                        where, nd.answer));
        decoded_spans_.push_back(span.value_or(std::make_pair(int64_t{-1}, int64_t{-1})));
    }
}

std::vector<int64_t> TrialBuilder::enc(const std::string& s, bool specials) const {
    const auto e = tok_.encode(s, specials, true);  // HF's encode parses added tokens written in the text
    return std::vector<int64_t>(e.begin(), e.end());
}

std::vector<int64_t> TrialBuilder::enc_headscope(const std::string& s) const {
    const auto e = s.empty() ? std::vector<int32_t>{} : tok_.encode(s, false);
    return std::vector<int64_t>(e.begin(), e.end());
}

bool TrialBuilder::is_period(int64_t id) const { return std::binary_search(periods_.begin(), periods_.end(), id); }

std::vector<int64_t> TrialBuilder::insert_needle(const std::vector<int64_t>& ctx, const std::vector<int64_t>& needle,
                                                 double depth, int64_t* at) const {
    int64_t ip = static_cast<int64_t>(ctx.size());
    if (depth != 100.0) {
        // int(len(tokens_context) * (depth_percent / 100)), then back to just after a period token
        // (retrieval_head_detection.py lines 413-428; needle_utils.py insert_needle_tokens' bisect).
        ip = static_cast<int64_t>(static_cast<double>(ctx.size()) * (depth / 100.0));
        while (ip > 0 && !(p_.insertion == Insertion::kSentenceEnd ? facts_.sentence_end(ctx[static_cast<size_t>(ip - 1)])
                                                                  : is_period(ctx[static_cast<size_t>(ip - 1)])))
            --ip;
    }
    std::vector<int64_t> out(ctx.begin(), ctx.begin() + ip);
    out.insert(out.end(), needle.begin(), needle.end());
    out.insert(out.end(), ctx.begin() + ip, ctx.end());
    *at = ip;
    return out;
}

// The context tokens as the reference trims them: `needle` plus the first length - buffer - |needle|
// of `ctx` (DataError when the needle alone does not fit).
std::vector<int64_t> TrialBuilder::fit(std::vector<int64_t> ctx, const std::vector<int64_t>& needle, int64_t length,
                                       int ni) const {
    const int64_t budget = length - p_.buffer, n = static_cast<int64_t>(needle.size());
    if (n >= budget)
        throw DataError(fmt::format("{}:{}: the needle has {} tokens, no fewer than the {} context tokens of length {}{}",
                                    needles_path_, needles_[static_cast<size_t>(ni)].line, n, budget, length,
                                    p_.buffer > 0 ? fmt::format(" less the buffer of {}", p_.buffer) : std::string()));
    if (static_cast<int64_t>(ctx.size()) + n > budget) ctx.resize(static_cast<size_t>(budget - n));
    return ctx;
}

Trial TrialBuilder::build(int64_t length, double depth, int ni, Assembly a, const PromptTemplate& tmpl) const {
    Trial t;
    switch (a) {
        case Assembly::kTokens: t = tokens_trial(length, depth, ni, tmpl); break;
        case Assembly::kText: t = text_trial(length, depth, ni, tmpl); break;
        case Assembly::kTracked: t = tracked_trial(length, depth, ni, tmpl, false); break;
        case Assembly::kJoined: t = tracked_trial(length, depth, ni, tmpl, true); break;
    }
    t.length = length, t.depth = depth, t.needle = ni;
    return t;
}

std::optional<std::vector<int64_t>> TrialBuilder::suffix_tokens(const std::string& question, Assembly a,
                                                                const PromptTemplate& tmpl) const {
    if (a == Assembly::kTokens) return enc_headscope(tmpl.suffix(question));
    if (a == Assembly::kTracked) return enc(tmpl.suffix(question), false);
    return std::nullopt;
}

Trial TrialBuilder::tokens_trial(int64_t length, double depth, int ni, const PromptTemplate& tmpl) const {
    const auto& nd = needles_[static_cast<size_t>(ni)];
    const std::string& hay = haystacks_[static_cast<size_t>(ni)];
    auto it = hay_plain_.find(hay);
    if (it == hay_plain_.end()) {
        auto toks = enc_headscope(hay);
        if (toks.empty()) throw DataError("the haystack is empty");
        it = hay_plain_.emplace(hay, std::move(toks)).first;
    }
    std::vector<int64_t> prefix = facts_.bos_prefix, body = enc_headscope(tmpl.prefix(nd.question));
    prefix.insert(prefix.end(), body.begin(), body.end());
    const auto needle = enc_headscope(nd.needle);
    const int64_t n = static_cast<int64_t>(needle.size());
    if (n >= length - p_.buffer)
        throw DataError(fmt::format("{}:{}: the needle has {} tokens, no shorter than the context length {}", needles_path_,
                                    nd.line, n, length - p_.buffer));
    auto span = decoded_spans_[static_cast<size_t>(ni)];
    const bool decoded = span.first >= 0;
    Trial t = build_trial(facts_, it->second, prefix, needle, enc_headscope(tmpl.suffix(nd.question)), length - p_.buffer,
                          depth, ni, decoded ? span : std::make_pair(int64_t{0}, n));
    if (p_.answer != AnswerSearch::kDecoded || !decoded) search_answer(t, ni);
    return t;
}

Trial TrialBuilder::text_trial(int64_t length, double depth, int ni, const PromptTemplate& tmpl) const {
    // retrieval_head_detection.py: generate_context (lines 374-386), encode_and_trim (478-482),
    // insert_needle (397-437), evaluate_and_log (265-280): every encode adds the tokenizer's specials
    // and parses special-token text, every decode keeps special tokens as text.
    const auto& nd = needles_[static_cast<size_t>(ni)];
    const std::string& hay = haystacks_[static_cast<size_t>(ni)];
    auto key = std::make_pair(ni, length);
    auto it = trimmed_.find(key);
    if (it == trimmed_.end()) {
        auto full = hay_special_.find(hay);
        if (full == hay_special_.end()) full = hay_special_.emplace(hay, enc(hay, true)).first;
        const auto& toks = full->second;
        std::string context = hay;
        if (static_cast<int64_t>(toks.size()) > length)  // decode(tokens[:context_length])
            context = tok_.decode(std::vector<int32_t>(toks.begin(), toks.begin() + length), false);
        // Needles sharing a haystack share its trimmed tokens.
        for (const auto& [k, v] : trimmed_)
            if (k.second == length && haystacks_[static_cast<size_t>(k.first)] == hay) {
                it = trimmed_.emplace(key, v).first;
                break;
            }
        if (it == trimmed_.end()) it = trimmed_.emplace(key, enc(context, true)).first;
    }
    const auto needle = enc(nd.needle, true);
    int64_t at = 0;
    const auto ctx = insert_needle(fit(it->second, needle, length, ni), needle, depth, &at);
    const std::string context = tok_.decode(std::vector<int32_t>(ctx.begin(), ctx.end()), false);
    Trial t;
    t.prompt = enc(tmpl.prefix(nd.question) + context + tmpl.suffix(nd.question), true);
    search_needle(t, ni, true);
    search_answer(t, ni);
    return t;
}

Trial TrialBuilder::tracked_trial(int64_t length, double depth, int ni, const PromptTemplate& tmpl, bool joined) const {
    const auto& nd = needles_[static_cast<size_t>(ni)];
    const std::string& hay = haystacks_[static_cast<size_t>(ni)];
    auto it = hay_nospecial_.find(hay);
    if (it == hay_nospecial_.end()) it = hay_nospecial_.emplace(hay, enc(hay, false)).first;
    const auto needle = enc(nd.needle, false);
    int64_t at = 0;
    const auto ctx = insert_needle(fit(it->second, needle, length, ni), needle, depth, &at);
    Trial t;
    if (!joined) {
        // needle_utils.py build_tracked_prompt (lines 327-406): template prefix + context + template
        // suffix (the question), each encoded alone without specials; BOS first when the tokenizer adds
        // one (logit_contrib.py line 1270 add_bos=tokenizer_has_bos) and the template does not begin with it.
        t.prompt = enc(tmpl.prefix(nd.question), false);
        t.needle_start = static_cast<int64_t>(t.prompt.size()) + at;
        t.prompt.insert(t.prompt.end(), ctx.begin(), ctx.end());
        const auto suffix = enc(tmpl.suffix(nd.question), false);
        t.prompt.insert(t.prompt.end(), suffix.begin(), suffix.end());
        const auto bos = tok_.bos_id();
        if (adds_bos_ && (t.prompt.empty() || t.prompt.front() != *bos)) {
            t.prompt.insert(t.prompt.begin(), *bos);
            ++t.needle_start;
        }
        t.needle_end = t.needle_start + static_cast<int64_t>(needle.size());
    } else {
        // nolima_ablation.py generate_for_trial (lines 520-548): the context decoded without specials,
        // f"{context_text}\n\n{question}" (in a chat format: the template), encoded without specials.
        const std::string context = tok_.decode(std::vector<int32_t>(ctx.begin(), ctx.end()), true);
        t.prompt = enc(tmpl.prefix(nd.question) + context + "\n\n" + tmpl.suffix(nd.question), false);
        search_needle(t, ni, false);
    }
    search_answer(t, ni);
    return t;
}

void TrialBuilder::search_needle(Trial& t, int ni, bool partial) const {
    const auto& nd = needles_[static_cast<size_t>(ni)];
    const auto span = overlap_search(t.prompt, enc(nd.needle, false), partial);
    t.needle_start = span ? span->first : -1;
    t.needle_end = span ? span->second : -1;
}

// The answer span by the protocol's rule, given the trial's needle span (exact or searched).
void TrialBuilder::search_answer(Trial& t, int ni) const {
    const auto& nd = needles_[static_cast<size_t>(ni)];
    const auto dec = decoded_spans_[static_cast<size_t>(ni)];
    std::optional<std::pair<int64_t, int64_t>> span;
    switch (p_.answer) {
        case AnswerSearch::kDecoded:
            if (t.needle_start >= 0 && dec.first >= 0) span = std::make_pair(t.needle_start + dec.first, t.needle_start + dec.second);
            break;
        case AnswerSearch::kWu: span = overlap_search(t.prompt, enc(nd.answer, false), true); break;
        case AnswerSearch::kLocos:
            // behavioral.py lines 751-758: the first whole window, else the needle span
            span = overlap_search(t.prompt, enc(nd.answer, false), false);
            if (!span && t.needle_start >= 0) span = std::make_pair(t.needle_start, t.needle_end);
            break;
    }
    t.answer_start = span ? span->first : -1;
    t.answer_end = span ? span->second : -1;
}

}  // namespace hs
