// AttentionInfluence (probes/ablation/influence.h): each sample's loss and masked loss equal an independent
// recomputation (one unbatched forward per sample and head set, the heads masked through hand-made
// hooks: for zero-query their attention pattern replaced by the uniform one over the causal prefix,
// for zero their z zeroed; the mean next-token NLL from log_softmax in float64) within 1e-5, and the
// score within what those bound, on the toy recall model and tinystories-656k; on a planted model the
// zero-query head's pattern is 1/(t+1) over the prefix and its masked loss equals a forward whose head
// output is the prefix mean of its values computed by hand; on the toy, masking its known recall heads
// ranks the rows that need recall first (last-token loss, both maskings); selection by a share of
// tokens and of samples picks the hand-worked sets; bad corpora are one line naming file and line.
#include <doctest/doctest.h>

#include "ci_toy.h"
#include "errors.h"
#include "heads.h"
#include "hooks.h"
#include "influence.h"
#include "intervention.h"
#include "model.h"
#include "planted_model.h"
#include "testdata.h"
#include "tmpdir.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <fstream>

using namespace hs;

namespace {

// The mean next-token NLL (float64) of `seq` under the forward with hooks h.
double nll(const Model& m, const std::vector<int64_t>& seq, Hooks& h, bool last_only) {
    auto ids = torch::tensor(seq, torch::kLong).view({1, -1});
    auto lp = torch::log_softmax(m.forward(ids, &h).to(torch::kDouble)[0], -1);  // [T, V]
    const auto T = static_cast<int64_t>(seq.size());
    double sum = 0;
    int64_t n = 0;
    for (int64_t p = last_only ? T - 2 : 0; p + 1 < T; ++p, ++n) sum -= lp[p][seq[static_cast<size_t>(p + 1)]].item<double>();
    return sum / static_cast<double>(n);
}

// The reference: sample alone, heads masked by hand, loss from log_softmax (float64). zero: z zeroed;
// zero-query: the heads' attention pattern replaced by the uniform one over the causal prefix (row t
// 1/(t+1) on keys 0..t): what pre-softmax scores of 0 under the causal mask give (HeadKV's masking),
// computed without touching the query.
double reference_loss(const Model& m, const std::vector<int64_t>& seq, const std::vector<Head>& heads, bool last_only,
                      Intervention masking = Intervention::kZero) {
    torch::NoGradGuard ng;
    Hooks h;
    if (masking == Intervention::kZero) {
        for (auto [l, hd] : heads) h.intervene_z({l, hd, -1, HeadOp::kZero, 0.0, {}});
    } else {
        REQUIRE(masking == Intervention::kZeroQuery);
        h.edit(Point::kAttnPattern, [&](int layer, const at::Tensor& p) -> std::optional<at::Tensor> {  // [B, H, T, S]
            auto out = p.clone();
            const int64_t T = p.size(2), S = p.size(3);
            auto uniform = torch::tril(torch::ones({T, S}, torch::kDouble)) /
                           torch::arange(1, T + 1, torch::kDouble).view({T, 1});
            for (auto [l, hd] : heads)
                if (l == layer) out.select(1, hd).copy_(uniform.to(p.scalar_type()).unsqueeze(0).expand({p.size(0), T, S}));
            return out;
        });
    }
    return nll(m, seq, h, last_only);
}

void check_against_reference(const Model& m, const std::vector<CorpusSample>& corpus, const std::vector<std::vector<Head>>& sets,
                             bool last_only, Intervention masking = Intervention::kZero) {
    const auto r = attention_influence(m, corpus, sets, {5, last_only, masking});  // 5 rows a forward: several batches
    REQUIRE(r.masked_loss.size(0) == static_cast<int64_t>(sets.size()));
    double worst = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
        const auto k = static_cast<int64_t>(i);
        const double base = reference_loss(m, corpus[i].tokens, {}, last_only);
        worst = std::max(worst, std::abs(r.loss[k].item<double>() - base));
        for (size_t s = 0; s < sets.size(); ++s) {
            const double masked = reference_loss(m, corpus[i].tokens, sets[s], last_only, masking);
            const auto ks = static_cast<int64_t>(s);
            worst = std::max(worst, std::abs(r.masked_loss[ks][k].item<double>() - masked));
            // The score is a ratio: losses within 1e-5 bound it by 1e-5 (2 + |score|) / loss (a near-0
            // loss, a confident answer, makes it large; float32 logits cannot do better).
            const double ref = (masked - base) / base;
            CHECK(std::abs(r.score[ks][k].item<double>() - ref) <= 1e-5 * (2 + std::abs(ref)) / base);
        }
    }
    MESSAGE("largest loss difference from the per-sample recomputation (" << std::string(intervention_name(masking)) << "): " << worst);
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
    for (auto masking : influence_maskings()) {
        check_against_reference(*m, corpus, sets, false, masking);
        check_against_reference(*m, corpus, sets, true, masking);
        // Ground truth: even rows end in a recall answer, odd rows in filler. Masking the recall heads
        // raises the answer's loss: the top half of the last-token ranking is the recall rows.
        const auto r = attention_influence(*m, corpus, sets, {64, true, masking});
        auto order = std::get<1>(r.score[0].sort(0, true));
        int64_t recall_in_top = 0;
        for (int64_t i = 0; i < 16; ++i) recall_in_top += order[i].item<int64_t>() % 2 == 0;
        MESSAGE(std::string(intervention_name(masking)) << ": recall rows in the top half of the ranking: " << recall_in_top << " of 16");
        CHECK(recall_in_top >= 14);
    }
}

TEST_CASE("influence: zero-query masking is uniform attention over the causal prefix, equal to a hand-computed head output") {
    torch::NoGradGuard ng;
    // The planted model (tests/planted_model.h): v = norm(x) for every kv head (W_V the identity, norm
    // weights 1), so a head attending uniformly over the prefix outputs z_t = mean_{s <= t} norm(x_s),
    // x the layer's resid_pre. Head L1H2 reads kv head 1 (GQA, 4 query heads on 2).
    auto m = planted::model(7, 0.05, 0.1);
    const Head head{1, 2};
    const std::vector<std::vector<int64_t>> seqs = {{3, 17, 5, 40, 22, 9, 61, 8, 30, 12}, {50, 2, 33, 7, 19}, {11, 11, 45, 6, 27, 38, 1}};
    std::vector<CorpusSample> corpus;
    for (const auto& q : seqs) corpus.push_back({q, static_cast<int64_t>(q.size()), "", 0, false});
    // The pattern under the masking as the engine applies it: row t is 1/(t+1) on keys 0..t, 0 after.
    {
        Hooks h;
        apply_intervention(h, {Intervention::kZeroQuery}, {head}, -1, influence_maskings());
        at::Tensor pattern;
        h.capture(Point::kAttnPattern, [&](int, const at::Tensor& p) { pattern = p.to(torch::kDouble).clone(); }, 1);
        m->forward(torch::tensor(seqs[0], torch::kLong).view({1, -1}), &h);
        const int64_t T = static_cast<int64_t>(seqs[0].size());
        auto uniform = torch::tril(torch::ones({T, T}, torch::kDouble)) / torch::arange(1, T + 1, torch::kDouble).view({T, 1});
        const double diff = (pattern[0][head.second] - uniform).abs().max().item<double>();
        MESSAGE("zero-query pattern vs 1/(t+1) over the prefix: largest difference " << diff);
        CHECK(diff < 1e-6);
        CHECK((pattern[0][0] - uniform).abs().max().item<double>() > 1e-2);  // an unmasked head is not uniform
    }
    // The masked loss equals a forward whose head output z is the hand-computed prefix mean.
    const auto r = attention_influence(*m, corpus, {{head}}, {2, false, Intervention::kZeroQuery});  // 2 rows: padded batches
    for (size_t i = 0; i < seqs.size(); ++i) {
        const auto T = static_cast<int64_t>(seqs[i].size());
        Hooks cap;
        at::Tensor x;
        cap.capture(Point::kResidPre, [&](int, const at::Tensor& t) { x = t[0].to(torch::kDouble).clone(); }, 1);
        m->forward(torch::tensor(seqs[i], torch::kLong).view({1, -1}), &cap);  // layer 1's input: unchanged by masking layer 1
        auto n = x / torch::sqrt(x.pow(2).mean(-1, true) + m->config.norm_eps);  // RMSNorm, weight 1
        auto z = n.cumsum(0) / torch::arange(1, T + 1, torch::kDouble).view({T, 1});  // [T, d]: the prefix means
        Hooks h;
        h.intervene_z({head.first, head.second, -1, HeadOp::kReplace, 0.0, z.to(torch::kFloat)});
        const double hand = nll(*m, seqs[i], h, false);
        const double got = r.masked_loss[0][static_cast<int64_t>(i)].item<double>();
        MESSAGE("sample " << i << ": masked loss " << got << ", hand-computed head output " << hand);
        CHECK(std::abs(got - hand) < 1e-5);
        CHECK(std::abs(got - r.loss[static_cast<int64_t>(i)].item<double>()) > 1e-4);  // the masking changes the loss
    }
}

TEST_CASE("influence: selection by a share of tokens or of samples picks the hand-worked sets") {
    // Six samples, sample 5 not done; rank best first 3, 0, 4, 1, 2, 5; lengths 10, 50, 5, 30, 20, 40:
    // the done samples hold 115 tokens.
    const std::vector<int64_t> rank = {3, 0, 4, 1, 2, 5}, length = {10, 50, 5, 30, 20, 40};
    const std::vector<uint8_t> done = {1, 1, 1, 1, 1, 0};
    auto picked = [](const Selection& s) {
        std::vector<int64_t> v;
        for (size_t i = 0; i < s.selected.size(); ++i)
            if (s.selected[i]) v.push_back(static_cast<int64_t>(i));
        return v;
    };
    // Tokens, 0.6: the budget is 69; 3 (30), 0 (40), 4 (60) stay below it, 1 (110) reaches it and is kept whole.
    auto t = select_top_share(rank, done, length, 0.6, SelectBy::kTokens);
    CHECK(picked(t) == std::vector<int64_t>{0, 1, 3, 4});
    CHECK((t.n_selected == 4 && t.n_done == 5 && t.tokens_selected == 110 && t.tokens_done == 115));
    // Samples, 0.6: ceil(0.6 x 5) = 3, the first three of the ranking.
    auto s = select_top_share(rank, done, length, 0.6, SelectBy::kSamples);
    CHECK(picked(s) == std::vector<int64_t>{0, 3, 4});
    CHECK((s.n_selected == 3 && s.tokens_selected == 60));
    // Tokens, 0.2: the budget is 23; 3 alone (30) reaches it.
    CHECK(picked(select_top_share(rank, done, length, 0.2, SelectBy::kTokens)) == std::vector<int64_t>{3});
    // The ends: 0 selects nothing, 1 every done sample (never the one not done).
    CHECK(select_top_share(rank, done, length, 0.0, SelectBy::kTokens).n_selected == 0);
    CHECK(picked(select_top_share(rank, done, length, 1.0, SelectBy::kTokens)) == std::vector<int64_t>{0, 1, 2, 3, 4});
    // A budget met exactly (0.3 x 10 tokens, 3 in floating point a hair above 3) stops at 3 samples
    // of length 1; with equal lengths the two counts agree.
    const std::vector<int64_t> r10 = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0}, ones(10, 1);
    const std::vector<uint8_t> all(10, 1);
    for (double f : {0.1, 0.3, 0.55, 0.7}) {
        const auto a = select_top_share(r10, all, ones, f, SelectBy::kTokens), b = select_top_share(r10, all, ones, f, SelectBy::kSamples);
        CHECK(a.selected == b.selected);
    }
    CHECK(picked(select_top_share(r10, all, ones, 0.3, SelectBy::kTokens)) == std::vector<int64_t>{7, 8, 9});
}

TEST_CASE("influence: tinystories-656k - equal to a per-sample recomputation (text corpus, BOS, GQA)") {
    HS_REQUIRE_TESTDATA(td);
    auto m = load_model(td + "/tinystories-656k");
    auto tok = load_tokenizer(td + "/tinystories-656k");
    auto corpus = read_corpus(std::string(HS_SOURCE_DIR) + "/datasets/examples/influence-corpus.jsonl", tok.get(),
                              m->config.vocab_size, 48);  // cut: the reference's float64 copies stay small
    corpus.resize(9);
    CHECK(corpus[0].tokens[0] == *tok->bos_id());
    for (auto masking : influence_maskings()) check_against_reference(*m, corpus, {{{1, 1}, {1, 6}}, {{0, 3}}}, false, masking);
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
    CHECK((c[0].tokens == std::vector<int64_t>{1, 2, 3} && c[0].truncated && c[0].line == 1 && c[0].length == 5));
}
