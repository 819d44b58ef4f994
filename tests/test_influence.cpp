// AttentionInfluence (probes/ablation/influence.h): each sample's loss and masked loss equal an independent
// recomputation (one unbatched forward per sample and head set, zeroed heads through hand-made hooks,
// the mean next-token NLL from log_softmax in float64) within 1e-5, and the score within what those
// bound, on the toy recall model
// and tinystories-656k; on the toy, masking its known recall heads ranks the rows that need recall
// first (last-token loss); bad corpora are one line naming file and line.
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "errors.h"
#include "heads.h"
#include "hooks.h"
#include "influence.h"
#include "model.h"
#include "testdata.h"
#include "tmpdir.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <fstream>

using namespace hs;

namespace {

// The reference: sample alone, heads zeroed by hand, loss from log_softmax (float64).
double reference_loss(const Model& m, const std::vector<int64_t>& seq, const std::vector<Head>& heads, bool last_only) {
    torch::NoGradGuard ng;
    Hooks h;
    for (auto [l, hd] : heads) h.intervene_z({l, hd, -1, HeadOp::kZero, 0.0, {}});
    auto ids = torch::tensor(seq, torch::kLong).view({1, -1});
    auto lp = torch::log_softmax(m.forward(ids, &h).to(torch::kDouble)[0], -1);  // [T, V]
    const auto T = static_cast<int64_t>(seq.size());
    double sum = 0;
    int64_t n = 0;
    for (int64_t p = last_only ? T - 2 : 0; p + 1 < T; ++p, ++n) sum -= lp[p][seq[static_cast<size_t>(p + 1)]].item<double>();
    return sum / static_cast<double>(n);
}

void check_against_reference(const Model& m, const std::vector<CorpusSample>& corpus, const std::vector<std::vector<Head>>& sets,
                             bool last_only) {
    const auto r = attention_influence(m, corpus, sets, {5, last_only});  // 5 rows a forward: several batches
    REQUIRE(r.masked_loss.size(0) == static_cast<int64_t>(sets.size()));
    double worst = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
        const auto k = static_cast<int64_t>(i);
        const double base = reference_loss(m, corpus[i].tokens, {}, last_only);
        worst = std::max(worst, std::abs(r.loss[k].item<double>() - base));
        for (size_t s = 0; s < sets.size(); ++s) {
            const double masked = reference_loss(m, corpus[i].tokens, sets[s], last_only);
            const auto ks = static_cast<int64_t>(s);
            worst = std::max(worst, std::abs(r.masked_loss[ks][k].item<double>() - masked));
            // The score is a ratio: losses within 1e-5 bound it by 1e-5 (2 + |score|) / loss (a near-0
            // loss, a confident answer, makes it large; float32 logits cannot do better).
            const double ref = (masked - base) / base;
            CHECK(std::abs(r.score[ks][k].item<double>() - ref) <= 1e-5 * (2 + std::abs(ref)) / base);
        }
    }
    MESSAGE("largest loss difference from the per-sample recomputation: " << worst);
    CHECK(worst < 1e-5);
}

}  // namespace

TEST_CASE("influence: toy recall model - equal to a per-sample recomputation; its recall heads rank recall rows first") {
    const std::string dir = ci_toy_model("recall");
    auto m = load_model(dir);
    auto tok = load_tokenizer(dir);
    const std::string corpus_path = std::string(HS_SOURCE_DIR) + "/datasets/examples/toy-recall-influence.jsonl";
    const auto corpus = read_corpus(corpus_path, tok.get(), m->config.vocab_size, m->config.max_seq_len);
    REQUIRE(corpus.size() == 32);
    const std::vector<std::vector<Head>> sets = {{{1, 0}, {1, 1}, {1, 2}}, {{0, 0}, {0, 2}, {1, 3}}};
    check_against_reference(*m, corpus, sets, false);
    check_against_reference(*m, corpus, sets, true);
    // Ground truth: even rows end in a recall answer, odd rows in filler. Masking the recall heads
    // raises the answer's loss: the top half of the last-token ranking is the recall rows.
    const auto r = attention_influence(*m, corpus, sets, {64, true});
    auto order = std::get<1>(r.score[0].sort(0, true));
    int64_t recall_in_top = 0;
    for (int64_t i = 0; i < 16; ++i) recall_in_top += order[i].item<int64_t>() % 2 == 0;
    MESSAGE("recall rows in the top half of the ranking: " << recall_in_top << " of 16");
    CHECK(recall_in_top >= 14);
}

TEST_CASE("influence: tinystories-656k - equal to a per-sample recomputation (text corpus, BOS, GQA)") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/tinystories-656k");
    auto tok = load_tokenizer(td + "/tinystories-656k");
    auto corpus = read_corpus(std::string(HS_SOURCE_DIR) + "/datasets/examples/influence-corpus.jsonl", tok.get(),
                              m->config.vocab_size, 48);  // cut: the reference's float64 copies stay small
    corpus.resize(9);
    CHECK(corpus[0].tokens[0] == *tok->bos_id());
    check_against_reference(*m, corpus, {{{1, 1}, {1, 6}}, {{0, 3}}}, false);
}

TEST_CASE("influence: bad corpora are one line naming the file and line") {
    TempDir tmp;
    const std::string f = tmp.file("c.jsonl");
    auto bad = [&](const std::string& text, const std::string& what) {
        std::ofstream(f) << text;
        try {
            read_corpus(f, nullptr, 100, 512);
            FAIL("accepted: " << text);
        } catch (const DataError& e) {
            const std::string msg = e.what();
            CHECK(msg.rfind(f, 0) == 0);
            CHECK(msg.find(what) != std::string::npos);
            CHECK(msg.find('\n') == std::string::npos);
        }
    };
    bad("{\"tokens\": [1, 2]}\nnot json\n", ":2: not a JSON object");
    bad("{\"tokens\": [1, 2]}\n{\"words\": 3}\n", ":2: has neither a string \"text\" nor a list \"tokens\"");
    bad("{\"tokens\": [1, 200]}\n", ":1: token id 200 out of range [0, 100)");
    bad("{\"tokens\": [1, 2.5]}\n", ":1: \"tokens\" holds a value that is not an integer");
    bad("{\"tokens\": [7]}\n", ":1: 1 token(s): a sample needs 2");
    bad("{\"text\": \"hello\"}\n", ":1: a text sample, but the model has no tokenizer");
    bad("\n\n", "no samples");
    std::ofstream(f) << "{\"tokens\": [1, 2, 3, 4, 5]}\n";
    const auto c = read_corpus(f, nullptr, 100, 3);
    CHECK((c[0].tokens == std::vector<int64_t>{1, 2, 3} && c[0].truncated && c[0].line == 1));
}
