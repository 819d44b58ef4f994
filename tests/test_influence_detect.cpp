// AttentionInfluence's head detection (probes/ablation/influence_detect.h, probes/needle/key_value_trials.h):
// the key -> value trials put the answer where the prompt says (the value's tokens in the queried
// pair, after the query key at the prompt's end, on a SentencePiece and a byte-level BPE tokenizer and
// on the toy vocabulary), fit their length, and are seeded; the top share's count; on the CI toy
// recall model the detection ranks the proven recall heads (its training log's ground truth) first.
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "errors.h"
#include "influence_detect.h"
#include "model.h"
#include "testdata.h"
#include "tokenizer.h"
#include "toy_tasks.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

using namespace hs;

namespace {

std::string text(const Tokenizer& tok, const std::vector<int64_t>& ids, int64_t a, int64_t b) {
    return tok.decode(std::vector<int32_t>(ids.begin() + a, ids.begin() + b), true);
}

// Every trial: the answer span inside the needle span, the span's text the value, the queried key the
// last thing the prompt asks for, the value nowhere else in the context, the length kept.
void check_json_trials(const Tokenizer& tok, const KeyValueTask& task) {
    const auto kv = key_value_trials(tok, task);
    REQUIRE(kv.format == KeyValueFormat::kJson);
    REQUIRE(kv.trials.size() == static_cast<size_t>(task.samples));
    REQUIRE(kv.needles.size() == kv.trials.size());
    for (size_t i = 0; i < kv.trials.size(); ++i) {
        const Trial& t = kv.trials[i];
        const Needle& nd = kv.needles[static_cast<size_t>(t.needle)];
        CAPTURE(i);
        CHECK(t.needle == static_cast<int>(i));
        CHECK((t.needle_start <= t.answer_start && t.answer_start < t.answer_end && t.answer_end <= t.needle_end));
        CHECK(text(tok, t.prompt, t.needle_start, t.needle_end).find("\"" + nd.question + "\": \"" + nd.answer + "\"") != std::string::npos);
        const std::string span = text(tok, t.prompt, t.answer_start, t.answer_end);
        CHECK(span.find(nd.answer) != std::string::npos);          // the span covers the value
        CHECK(span.size() <= nd.answer.size() + 8);                // and little else (quotes, a colon, a space)
        const std::string whole = tok.decode(std::vector<int32_t>(t.prompt.begin(), t.prompt.end()), true);
        const std::string tail = "Question: \"" + nd.question + "\"\nAnswer:";
        REQUIRE(whole.size() >= tail.size());
        CHECK(whole.substr(whole.size() - tail.size()) == tail);  // the query key at the end
        CHECK(whole.find("\"" + nd.question + "\": \"" + nd.answer + "\"") != std::string::npos);
        CHECK(static_cast<int64_t>(t.prompt.size()) + kv.max_new_tokens <= task.length);
        CHECK(kv.pairs[i] >= task.shots + 1);
        int64_t count = 0;  // the value appears twice in the whole prompt only if a demonstration asked for it: never
        for (size_t at = whole.find(nd.answer); at != std::string::npos; at = whole.find(nd.answer, at + 1)) ++count;
        CHECK(count == 1);
    }
    // Seeded: the same seed, the same trials; another seed, others.
    const auto again = key_value_trials(tok, task);
    CHECK(again.trials[0].prompt == kv.trials[0].prompt);
    KeyValueTask other = task;
    other.seed = task.seed + 1;
    CHECK(key_value_trials(tok, other).trials[0].prompt != kv.trials[0].prompt);
}

}  // namespace

TEST_CASE("influence detect: the top share's head count") {
    CHECK(top_share_count(0.05, 320) == 16);  // the paper's 1.3B model: 16 layers x 20 heads
    CHECK(top_share_count(0.05, 8) == 1);     // at least one head
    CHECK(top_share_count(0.375, 8) == 3);
    CHECK(top_share_count(0.3, 10) == 3);     // 0.3 x 10 = 3.0000000000000004 in doubles: 3, not 4
    CHECK(top_share_count(0.31, 10) == 4);
    CHECK(top_share_count(1.0, 8) == 8);
}

TEST_CASE("influence detect: key -> value trials put the value where the prompt says (SentencePiece and byte-level BPE)") {
    HS_REQUIRE_TESTDATA(td);
    KeyValueTask task;
    task.samples = 6, task.length = 1500, task.seed = 3;
    auto sp = load_tokenizer(td + "/tinystories-656k/tokenizer.json");
    check_json_trials(*sp, task);
    auto gpt2 = load_tokenizer(td + "/gpt2-tokenizer");
    check_json_trials(*gpt2, task);
    // A length that cannot hold the demonstrations and the query is refused, naming it.
    task.length = 60;
    CHECK_THROWS_WITH_AS(key_value_trials(*gpt2, task), doctest::Contains("length 60 cannot hold"), DataError);
}

TEST_CASE("influence detect: on the toy vocabulary the trials are the toy recall task's rows") {
    const std::string dir = ci_toy_model("recall");
    auto tok = load_tokenizer(dir);
    REQUIRE(toy_vocabulary(*tok));
    KeyValueTask task;
    task.samples = 20, task.length = 64, task.seed = 5;
    const auto kv = key_value_trials(*tok, task);
    CHECK(kv.format == KeyValueFormat::kToyRecall);
    CHECK(kv.max_new_tokens == 1);
    CHECK(kv.stop == StopRule::kNone);
    for (const auto& t : kv.trials) {
        REQUIRE(t.prompt.size() == 64);
        const int64_t key = t.prompt[static_cast<size_t>(t.needle_start)], value = t.prompt[static_cast<size_t>(t.answer_start)];
        CHECK(t.answer_end == t.answer_start + 1);
        CHECK(t.needle_start == t.answer_start - 1);
        CHECK((key >= toy::kLower0 && key < toy::kUpper0));
        CHECK((value >= toy::kUpper0 && value < toy::kVocabSize));
        CHECK(t.prompt[t.prompt.size() - 2] == toy::kQuery);  // "? k" at the end asks for this pair's value
        CHECK(t.prompt.back() == key);
        CHECK(kv.needles[static_cast<size_t>(t.needle)].answer == toy::token_text(value));
    }
}

TEST_CASE("influence detect: the CI toy recall model's proven recall heads rank first (CI model)") {
    const std::string dir = ci_toy_model("recall");
    const auto log = nlohmann::json::parse(read_text_file(path_join(dir, "training_log.json")));
    std::set<std::string> truth;
    for (const auto& h : log["ground_truth"]["retrieval_heads"]) truth.insert(h.get<std::string>());
    REQUIRE(truth == std::set<std::string>{"L1H0", "L1H1", "L1H2"});
    auto m = load_model(dir);
    auto tok = load_tokenizer(dir);
    KeyValueTask task;
    task.samples = 200, task.length = 0, task.seed = 0;
    task.length = m->config.max_seq_len;
    const auto d = detect_retrieval_heads(*m, *tok, task, 0.375);
    MESSAGE("passed " << d.passed << " of " << d.trials << "; score " << d.score);
    CHECK(d.passed > 0.9 * static_cast<double>(d.trials));
    const auto order = rank_heads(d.score);
    std::set<std::string> top;
    for (int i = 0; i < 3; ++i) top.insert(format_head(static_cast<int>(order[static_cast<size_t>(i)] / 4), static_cast<int>(order[static_cast<size_t>(i)] % 4)));
    CHECK(top == truth);
    REQUIRE(d.heads.size() == 3);  // ceil(0.375 x 8)
    std::set<std::string> kept;
    for (auto [l, h] : d.heads) kept.insert(format_head(l, h));
    CHECK(kept == truth);
    // The paper's 5% of 8 heads is one head: the best copier.
    const auto one = detect_retrieval_heads(*m, *tok, task, kInfluenceTopShare);
    REQUIRE(one.heads.size() == 1);
    CHECK(truth.count(format_head(one.heads[0].first, one.heads[0].second)) == 1);
    CHECK(torch::equal(one.score, d.score));  // seeded: the same trials, the same score
}
