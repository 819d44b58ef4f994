// The needle test's inputs and trials: needles, haystacks, templates, and how a trial's prompt is
// built and its decode stopped: headscope's own way and the two reference codes' ways
// (`headscope retrieval --protocol headscope|wu|locos`). Each choice is an enum with
// one name table (the words of its own flag); a protocol is a set of defaults for them, and any
// choice can be overridden alone. docs/needle-protocols.md cites the reference lines each
// choice follows:
//   wu    nightdessert/Retrieval_Head retrieval_head_detection.py (the scan) and
//         needle_in_haystack_with_mask.py (the masked runs);
//   locos aryopg/locos locos/detectors/logit_contrib.py with locos/utils/needle_utils.py (the
//         scan), locos/analysis/nolima_ablation.py (the ablation runs and their calibration).
#pragma once

#include "names.h"
#include "tokenizer.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hs {

enum class Protocol { kHeadscope, kWu, kLocos };
const NameTable<Protocol>& protocol_names();  // headscope, wu, locos

// How a prompt is assembled from the haystack, the needle and the template.
enum class Assembly {
    kTokens,   // headscope: in token space ([BOS] + template prefix + the haystack's tokens cycled to fill
               // the length, the needle's tokens at a sentence end + template suffix); spans exact
    kText,     // Wu: text round trips (encode with specials, trim by decoding the first ids, the needle
               // encoded with specials, the context decoded, the prompt re-encoded with specials); spans searched
    kTracked,  // LOCOS's scan: token space, pieces encoded without specials, BOS when the tokenizer adds
               // one (build_tracked_prompt); spans exact
    kJoined,   // LOCOS's ablation runs: the tracked context decoded without specials, "\n\n", the
               // question, encoded without specials (generate_for_trial); spans searched
};
const NameTable<Assembly>& assembly_names();  // tokens, text, tracked, joined

// Where the needle may go: after a token whose text ends a sentence (. ! ? or a newline), after a
// period token ("." with or without a word-start mark: Wu's hard-coded Llama-2 ids 29889 and 869
// on any tokenizer), or after a token of encode(".") (LOCOS's get_period_tokens fallback).
enum class Insertion { kSentenceEnd, kPeriod, kEncodedPeriod };
const NameTable<Insertion>& insertion_names();  // sentence-end, period, encoded-period

// The answer span the retrieval score credits: found in the needle's decoded tokens (exact); the
// first prompt window whose token set overlaps the answer's by > 90% (Wu's find_needle_idx: windows
// may run past the prompt's end; none found = the trial credits nothing); the same search over whole
// windows, else the needle span (LOCOS's behavioral.py).
enum class AnswerSearch { kDecoded, kWu, kLocos };
const NameTable<AnswerSearch>& answer_search_names();  // decoded, wu, locos

// Which tokens end a response: newline = any token decoding to exactly "\n", and EOS (the
// tokenizer's and config.json's); eos = EOS only; none; wu = the newline token as Wu's rule means it
// (a "<0x0A>" byte token, or a token decoding to exactly "\n": GPT-2's "Ċ"), never EOS; locos =
// "<0x0A>", encode("\n")'s last token, the tokenizer's EOS and generation_config.json's eos ids.
enum class StopRule { kNewline, kEos, kNone, kWu, kLocos };
const NameTable<StopRule>& stop_rule_names();  // newline, eos, none, wu, locos
inline const char* stop_rule_name(StopRule r) { return name_in(stop_rule_names(), r); }

// before: a stop token ends the response unkept and unscored; after: it is kept and scored, then
// the response ends (Wu: output.append, retrieval_calculate, then the stop test).
enum class StopOrder { kBefore, kAfter };
const NameTable<StopOrder>& stop_order_names();  // before, after

// How a haystack folder's .txt files are read: raw = the files' text as is, concatenated in name
// order (Wu reads haystack_for_detect/part*/p1.txt, which is JSON, as raw text); rows = p1.plain.txt
// when present, else the JSON's rows[].row.text joined by "\n\n" (LOCOS's datasets.py).
enum class HaystackFormat { kRaw, kRows };
const NameTable<HaystackFormat>& haystack_format_names();  // raw, rows

// How a haystack text is lengthened: tokens = its tokens cycled to fill each length (headscope);
// concat = the text appended to itself until it has >= max length whitespace-separated words (Wu's
// read_context_files); double = text += "\n\n" + text until then (LOCOS's load_haystack_texts).
enum class HaystackRepeat { kTokens, kConcat, kDouble };
const NameTable<HaystackRepeat>& haystack_repeat_names();  // tokens, concat, double

// Which random streams the seeded choices use: headscope = std::mt19937_64; reference = LOCOS's
// (numpy's RandomState(seed) for the bootstrap, Python's random.Random(seed).shuffle for the
// calibration sample).
enum class RngKind { kHeadscope, kReference };
const NameTable<RngKind>& rng_kind_names();  // headscope, reference

// Which forwards an ablation acts in: kAll = the prefill and every decode step (LOCOS,
// nolima_ablation.py: hooks on q_proj during generate); kDecode = decode steps only (Wu et al.,
// needle_in_haystack_with_mask.py: block_list is passed to the decode loop, not to the prefill).
enum class AblationScope { kAll, kDecode };
const NameTable<AblationScope>& ablation_scope_names();  // all, decode
inline const char* ablation_scope_name(AblationScope s) { return name_in(ablation_scope_names(), s); }

// Every choice, resolved (protocol_defaults, then the flags given).
struct NeedleProtocol {
    Protocol protocol = Protocol::kHeadscope;
    int64_t buffer = 0;                        // context tokens left free: the context is length - buffer
    Assembly assembly = Assembly::kTokens;     // the scan's prompts
    Assembly ablation_assembly = Assembly::kTokens;  // the ablated and decoding passes' prompts
    Insertion insertion = Insertion::kSentenceEnd;
    AnswerSearch answer = AnswerSearch::kDecoded;
    StopRule stop = StopRule::kNewline;
    StopOrder stop_order = StopOrder::kBefore;
    HaystackFormat haystack_format = HaystackFormat::kRaw;
    HaystackRepeat repeat = HaystackRepeat::kTokens;
    RngKind rng = RngKind::kHeadscope;
    AblationScope scope = AblationScope::kAll;
    int64_t max_new_tokens = 50;
    int64_t ablation_max_new_tokens = 50;
    int64_t seed = 0;
};
NeedleProtocol protocol_defaults(Protocol p);

// ---- needles and templates ----

struct Needle {
    std::string needle, question, answer;
    int line = 0;  // 1-based line in the needles file
};

// One JSON object a line with string fields needle, question and answer (or real_needle, the
// reference repositories' name for it); blank lines skipped. DataError naming "file:line" on a bad
// line, an answer whose words are not all in the needle, or an empty file.
std::vector<Needle> read_needles(const std::string& path);

// The prompt template split at {context}, {question} substituted. UsageError when {context} is not
// there exactly once or {question} is missing.
struct PromptTemplate {
    std::string text;
    std::string prefix(const std::string& question) const;
    std::string suffix(const std::string& question) const;
};
PromptTemplate parse_template(const std::string& text);
extern const char* const kDefaultTemplate;

struct Trial {
    int64_t length = 0;  // context tokens: haystack + needle
    double depth = 0;    // percent
    int needle = 0;      // index into the needles
    std::vector<int64_t> prompt;
    // [start, end) in prompt positions; -1, -1 where a searched span was not found.
    int64_t needle_start = 0, needle_end = 0;  // the needle: LOCOS's L+ keys
    int64_t answer_start = 0, answer_end = 0;  // the answer's tokens: Wu's span (may end past the prompt)
    // Where this prompt parts from another trial's of its grid (the longest common prefix with each,
    // sorted, distinct; NeedleTest sets them): prefill chunk boundaries, so that every trial sharing a
    // prefix computes it in the same chunks (docs/methods.md, "Prefix reuse").
    std::vector<int64_t> cuts;
    // QRHead's query (NeedleTest sets them when the scan computes qrhead): the template's suffix (the
    // question and what follows the context) starts at query_start (-1: not set), and null_query is
    // that suffix with the question replaced by QRHead's null query, as the assembly encodes it.
    int64_t query_start = -1;
    std::vector<int64_t> null_query;
};

// Token-level facts about the tokenizer the trials need, computed once.
struct TokenFacts {
    std::vector<int64_t> bos_prefix;  // specials encode() puts before text (BOS), possibly empty
    std::vector<int64_t> newline_ids;  // tokens that decode to exactly "\n"
    std::vector<int64_t> eos_ids;      // the tokenizer's EOS (callers may add config.json's)
    StopRule stop_rule = StopRule::kNewline;
    StopOrder stop_order = StopOrder::kBefore;
    std::vector<int64_t> rule_ids;     // the wu and locos rules' ids (stop_ids_for); extra ids (any rule)
    std::function<bool(int64_t)> sentence_end;  // token text ends in . ! ? or a newline
    bool stop(int64_t id) const;                 // by stop_rule
};
TokenFacts token_facts(const Tokenizer& tok, StopRule rule = StopRule::kNewline);

// The answer's tokens inside the needle's tokens: the shortest run of needle tokens whose decoded
// text covers the first case-insensitive occurrence of the answer in the decoded needle (offsets
// from decoding growing prefixes, so a token's text is what it adds in context). [start, end)
// relative to the needle's first token; nullopt when the decoded needle does not contain the answer.
std::optional<std::pair<int64_t, int64_t>> answer_span(const Tokenizer& tok, const std::vector<int64_t>& needle,
                                                       const std::string& answer);

// Builds one trial in token space (Assembly::kTokens). haystack: the haystack file's tokens (repeated
// to fill); answer: the answer's span inside the needle (answer_span). Throws DataError when the
// needle does not fit the length.
Trial build_trial(const TokenFacts& facts, const std::vector<int64_t>& haystack, const std::vector<int64_t>& prefix,
                  const std::vector<int64_t>& needle, const std::vector<int64_t>& suffix, int64_t length, double depth,
                  int needle_index, std::pair<int64_t, int64_t> answer);

// ---- the haystack ----

// The text of part{i+1}/ for each of n needles of a reference-layout folder (haystack_for_detect/:
// needles.jsonl beside part1/, part2/, ...). DataError naming the folder when a part is missing or
// holds no .txt file, or a rows file is not the JSON the format expects.
std::vector<std::string> read_haystack_dir(const std::string& dir, size_t n_needles, HaystackFormat format);
// Whitespace-separated words as Python's str.split() counts them (Unicode whitespace).
int64_t python_word_count(const std::string& text);
// The text lengthened as `repeat` says to at least max_words words (tokens: unchanged).
std::string repeat_haystack(const std::string& text, int64_t max_words, HaystackRepeat repeat);

// ---- spans ----

// The first window of `prompt` whose token set overlaps `target`'s by more than 90%: [i, i + |target|).
// Wu's find_needle_idx (every start i, windows may be cut by the prompt's end) when `partial_windows`,
// LOCOS's find_needle_idx_from_tokens (whole windows only) otherwise. nullopt when none.
std::optional<std::pair<int64_t, int64_t>> overlap_search(const std::vector<int64_t>& prompt,
                                                          const std::vector<int64_t>& target, bool partial_windows);

// ---- stopping ----

// Sets f's stop rule and the ids it stops on (f.rule_ids): the rule's own (from f.newline_ids and
// f.eos_ids, the tokenizer's) with config_eos (config.json's eos ids: the newline and eos rules),
// generation_eos (generation_config.json's, else config.json's: the locos rule) and `extra` (any rule).
void set_stop_rule(TokenFacts& f, const Tokenizer& tok, StopRule rule, const std::vector<int64_t>& config_eos,
                   const std::vector<int64_t>& generation_eos, const std::vector<int64_t>& extra);

// ---- trials as a protocol builds them ----

// The trials of one needle test: the needles, one haystack text per needle (already lengthened by
// repeat_haystack), the templates, and the protocol's choices. Tokenizations shared by many trials
// (haystacks, needles, trimmed contexts) are computed once.
class TrialBuilder {
public:
    // DataError naming "needles_path:line" for a needle whose answer the protocol's search cannot find
    // in the needle's own tokens; ConfigError naming the tokenizer when the insertion rule has no
    // token to insert after (Insertion::kPeriod on a vocabulary without "." pieces).
    TrialBuilder(const Tokenizer& tok, NeedleProtocol proto, TokenFacts facts, std::vector<Needle> needles,
                 std::string needles_path, std::vector<std::string> haystacks);
    // One trial of `length` context tokens with needle `needle` at `depth` percent, assembled as `a`
    // says with template `tmpl`. DataError ("needles_path:line: ...") when the needle does not fit.
    Trial build(int64_t length, double depth, int needle, Assembly a, const PromptTemplate& tmpl) const;

    // The template's suffix with `question` as assembly `a` encodes it after the context (tokens:
    // headscope's encode; tracked: without specials); nullopt for the assemblies that re-encode the
    // whole prompt (text, joined), whose suffix has no exact token span.
    std::optional<std::vector<int64_t>> suffix_tokens(const std::string& question, Assembly a, const PromptTemplate& tmpl) const;

    const NeedleProtocol& protocol() const { return p_; }
    const TokenFacts& facts() const { return facts_; }
    const std::vector<Needle>& needles() const { return needles_; }
    const std::vector<int64_t>& period_ids() const { return periods_; }
    const std::string& needles_path() const { return needles_path_; }

private:
    std::vector<int64_t> enc(const std::string& s, bool specials) const;  // the references' encode (specials parsed)
    std::vector<int64_t> enc_headscope(const std::string& s) const;      // headscope's (specials as text)
    std::vector<int64_t> fit(std::vector<int64_t> ctx, const std::vector<int64_t>& needle, int64_t length, int ni) const;
    std::vector<int64_t> insert_needle(const std::vector<int64_t>& ctx, const std::vector<int64_t>& needle, double depth,
                                       int64_t* at) const;
    Trial tokens_trial(int64_t length, double depth, int ni, const PromptTemplate& tmpl) const;
    Trial text_trial(int64_t length, double depth, int ni, const PromptTemplate& tmpl) const;
    Trial tracked_trial(int64_t length, double depth, int ni, const PromptTemplate& tmpl, bool joined) const;
    void search_needle(Trial& t, int ni, bool partial) const;
    void search_answer(Trial& t, int ni) const;
    bool is_period(int64_t id) const;

    const Tokenizer& tok_;
    NeedleProtocol p_;
    TokenFacts facts_;
    std::vector<Needle> needles_;
    std::string needles_path_;
    std::vector<std::string> haystacks_;       // per needle
    std::vector<int64_t> periods_;             // sorted
    std::vector<std::pair<int64_t, int64_t>> decoded_spans_;  // per needle (kTokens)
    bool adds_bos_ = false;                    // encode(text, add_special) starts with BOS
    // Tokenizations kept between trials, keyed by the text (haystacks) or (needle, length).
    mutable std::map<std::string, std::vector<int64_t>> hay_plain_, hay_nospecial_, hay_special_;
    mutable std::map<std::pair<int, int64_t>, std::vector<int64_t>> trimmed_;  // Wu: encode(decode(first length ids))
};

}  // namespace hs
