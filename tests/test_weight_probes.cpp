// Weight probes (MAPS, copy suppression, DLA): planted heads in constructed checkpoints must come
// out first with exact scores; blocked computation equals a dense reference; DLA terms add up to
// the real logit difference; the shipped relation files survive GPT-2 tokenisation.
#include <doctest/doctest.h>

#include "blocks.h"
#include "copy_suppression.h"
#include "dla.h"
#include "errors.h"
#include "maps.h"
#include "planted_model.h"
#include "store.h"
#include "testdata.h"
#include "tmpdir.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>

using namespace hs;
using namespace torch::indexing;

namespace {

using planted::kD, planted::kH, planted::kHd, planted::kK, planted::kV;

// The planted two-layer model (tests/planted_model.h) with every head's OV at 0.
std::unique_ptr<Model> planted_model(uint64_t seed) { return planted::model(seed, 0.0, 0.3); }

// Sets head (l, h)'s OV so that x -> x @ ov (row vectors), given v = x.
void set_ov(Model& m, int l, int h, const at::Tensor& ov) {
    m.weights.layers[l].wo.index_put_({Slice(), Slice(h * kHd, (h + 1) * kHd)}, ov.t());
}

// The OV matrix that maps token s's embedding to token pi[s]'s: Q^T P Q.
at::Tensor perm_ov(const Model& m, const at::Tensor& pi) {
    auto p = torch::zeros({kV, kV});
    p.index_put_({torch::arange(kV), pi}, 1.0);
    const auto& q = m.weights.embed;
    return q.t().matmul(p).matmul(q);
}

TokenizedRelation relation_of(const at::Tensor& src, const at::Tensor& dst, const std::string& name) {
    TokenizedRelation r;
    r.rel.name = name;
    r.n_total = src.size(0);
    for (int64_t i = 0; i < src.size(0); ++i) {
        r.src.push_back(src[i].item<int64_t>());
        r.dst.push_back(dst[i].item<int64_t>());
    }
    return r;
}

// (l, h) of the maximum, and whether it is the only entry at that maximum.
std::pair<std::pair<int, int>, bool> argmax_unique(const at::Tensor& s) {
    auto flat = s.reshape(-1);
    const int64_t i = flat.argmax().item<int64_t>();
    const bool unique = (flat == flat[i]).sum().item<int64_t>() == 1;
    return {{static_cast<int>(i / s.size(1)), static_cast<int>(i % s.size(1))}, unique};
}

// Dense reference for one head: ranks from the full [N, V] matrix (ties against the target).
at::Tensor dense_desc_ranks(const at::Tensor& p, const at::Tensor& tgt) {
    auto t = p.gather(1, tgt.view({-1, 1}));
    return (p >= t).sum(1) - 1;
}

}  // namespace

TEST_CASE("maps: planted copying, permutation and suppression heads come out first with score 1") {
    auto m = planted_model(1);
    auto pi = torch::randperm(kV, torch::kLong);
    set_ov(*m, 0, 0, torch::eye(kD));             // copying
    set_ov(*m, 0, 1, perm_ov(*m, pi));            // relation s -> pi[s]
    set_ov(*m, 0, 2, -torch::eye(kD));            // suppresses the source
    set_ov(*m, 0, 3, torch::randn({kD, kD}) * 0.2);
    for (int h = 0; h < kH; ++h) set_ov(*m, 1, h, torch::randn({kD, kD}) * 0.2);
    auto src = torch::arange(kV, torch::kLong);
    MapsOptions o;
    o.k = 1;
    o.suppression = true;
    o.block_size = 7;
    auto copy = maps_static(*m, relation_of(src, src, "copying"), o);
    auto rel = maps_static(*m, relation_of(src, pi, "perm"), o);
    CHECK(copy.score[0][0].item<float>() == 1.0f);
    CHECK(argmax_unique(copy.score) == std::pair{std::pair{0, 0}, true});
    CHECK(rel.score[0][1].item<float>() == 1.0f);
    CHECK(argmax_unique(rel.score) == std::pair{std::pair{0, 1}, true});
    CHECK(copy.suppression[0][2].item<float>() == 1.0f);
    CHECK(argmax_unique(copy.suppression) == std::pair{std::pair{0, 2}, true});
    // Default k (10) for a non-copying relation still ranks the planted head first.
    o.k = 0;
    auto rel10 = maps_static(*m, relation_of(src, pi, "perm"), o);
    CHECK(rel10.k == 10);
    CHECK(rel10.score[0][1].item<float>() == 1.0f);
}

TEST_CASE("maps: blocked ranks equal a dense reference of E_s W_VO W_U^T") {
    auto m = planted_model(2);
    for (int l = 0; l < 2; ++l)
        for (int h = 0; h < kH; ++h) set_ov(*m, l, h, torch::randn({kD, kD}));
    auto src = torch::randint(0, kV, {40}, torch::kLong), dst = torch::randint(0, kV, {40}, torch::kLong);
    MapsOptions o;
    o.block_size = 3;
    auto s = maps_static(*m, relation_of(src, dst, "r"), o);
    auto e_raw = m->weights.embed.index_select(0, src);
    auto e_mlp = mlp_output(*m, 0, e_raw);
    for (int l = 0; l < 2; ++l)
        for (int h = 0; h < kH; ++h) {
            auto v = m->weights.layers[l].wv.index({Slice((h / 2) * kHd, (h / 2 + 1) * kHd)});
            auto wo = m->weights.layers[l].wo.index({Slice(), Slice(h * kHd, (h + 1) * kHd)});
            auto p = (l == 0 ? e_raw : e_mlp).matmul(v.t()).matmul(wo.t()).matmul(m->weights.unembed.t());  // [N, V]
            auto want = dense_desc_ranks(p, dst);
            CHECK(torch::equal(s.target_rank[l][h], want));
            // The top-k criterion agrees with torch::topk on the dense matrix (no ties in random data).
            auto topk = std::get<1>(p.topk(10, 1));
            auto in_topk = (topk == dst.view({-1, 1})).any(1).to(torch::kFloat).mean().item<float>();
            CHECK(s.score[l][h].item<float>() == doctest::Approx(in_topk).epsilon(1e-6));
        }
}

TEST_CASE("copy suppression: planted -I head ranks every token 0 in OV; Wq = Wk head in QK") {
    auto m = planted_model(3);
    // Layer 0 writes nothing, so W_EE = W_E exactly.
    m->weights.layers[0].w_down.zero_();
    set_ov(*m, 1, 0, -torch::eye(kD));
    set_ov(*m, 1, 1, torch::eye(kD));
    set_ov(*m, 1, 2, torch::randn({kD, kD}) * 0.3);
    set_ov(*m, 1, 3, torch::randn({kD, kD}) * 0.3);
    auto& l1 = m->weights.layers[1];
    l1.wq.index_put_({Slice(0, kHd)}, torch::eye(kD));  // head 0 query = x
    l1.wk.index_put_({Slice(0, kHd)}, torch::eye(kD));  // kv head 0 key = x: attends to its own token
    CHECK((effective_embedding(*m, 5) - m->weights.embed).abs().max().item<double>() < 1e-6);
    auto s = copy_suppression_weights(*m, {5, 0, 0});
    CHECK(s.ov.frac_rank0[1][0].item<float>() == 1.0f);
    CHECK(s.ov.median[1][0].item<float>() == 0.0f);
    CHECK(argmax_unique(s.ov.frac_rank0) == std::pair{std::pair{1, 0}, true});
    CHECK(s.ov.frac_rank0[0].abs().max().item<float>() == 0.0f);  // zero output: ties rank nothing first
    CHECK(s.ov.median[1][1].item<float>() == kV - 1);               // copying is the opposite
    CHECK(s.ov.summary[1][0].item<float>() == doctest::Approx(-(std::log(double(kV)) - 1.0)).epsilon(1e-6));
    CHECK(s.qk.frac_rank0[1][0].item<float>() == 1.0f);
    CHECK(s.qk.frac_lt10[1][0].item<float>() == 1.0f);
    // Dynamic: the -I head suppresses whatever it attends to.
    std::vector<int64_t> win;
    for (int i = 0; i < 40; ++i) win.push_back((i * 37 + 5) % kV);
    auto d = copy_suppression_dynamic(*m, {win}, 0.1);
    REQUIRE(d.n_pairs[1][0].item<float>() > 0);
    CHECK(d.frac_rank0[1][0].item<float>() == 1.0f);
    CHECK(d.mean_effect[1][0].item<float>() < 0);
    CHECK(d.frac_rank0[1][1].item<float>() == 0.0f);
}

TEST_CASE("ranks: the fused CPU count equals the tensor-op path, ties included") {
    torch::manual_seed(3);
    // Integer-valued factors make many exact ties in S = left @ right^T.
    auto left = torch::randint(-2, 3, {70, 4}).to(torch::kFloat), right = torch::randint(-2, 3, {53, 4}).to(torch::kFloat);
    auto tgt = torch::randint(0, 53, {70}, torch::kLong);
    auto s = left.matmul(right.t());
    auto tv = s.gather(1, tgt.unsqueeze(1));
    CHECK(((s == tv).sum(1) > 1).sum().item<int64_t>() > 30);  // the data really has ties
    for (int64_t block : {1, 7, 70}) {
        CAPTURE(block);
        auto [d1, a1] = blocked_target_ranks(left, right, tgt, block, RankSide::kBoth, true);
        auto [d0, a0] = blocked_target_ranks(left, right, tgt, block, RankSide::kBoth, false);
        CHECK(torch::equal(d1, d0));
        CHECK(torch::equal(a1, a0));
        CHECK(torch::equal(d1, (s >= tv).sum(1) - 1));
        CHECK(torch::equal(a1, (s <= tv).sum(1) - 1));
    }
    CHECK_THROWS_AS(blocked_target_ranks(left, right, tgt + 53, 7), UsageError);
}

TEST_CASE("copy suppression: blocked ranks equal a dense [V, V] reference") {
    auto m = planted_model(4);
    for (int l = 0; l < 2; ++l)
        for (int h = 0; h < kH; ++h) set_ov(*m, l, h, torch::randn({kD, kD}) * 0.3);
    auto w_ee = effective_embedding(*m, 64);
    // Row blocks change GEMM shapes (and BLAS kernels), so W_EE agrees to float rounding; the
    // ranks computed from it must agree exactly.
    CHECK((effective_embedding(*m, 3) - w_ee).abs().max().item<double>() < 1e-6 * w_ee.abs().max().item<double>());
    auto u_f = folded_unembed(*m);
    auto tokens = torch::arange(kV, torch::kLong);
    auto small = copy_suppression_layer_ranks(*m, 1, w_ee, u_f, tokens, 5);
    auto whole = copy_suppression_layer_ranks(*m, 1, w_ee, u_f, tokens, kV);
    CHECK(torch::equal(small.ov, whole.ov));
    CHECK(torch::equal(small.qk, whole.qk));
    // Independent dense reference: M = norm1(W_EE) W_V W_O W_U_f^T, ranks ascending.
    const auto& lw = m->weights.layers[1];
    auto x = w_ee * torch::rsqrt(w_ee.pow(2).mean(-1, true) + 1e-6);
    for (int h = 0; h < kH; ++h) {
        auto v = lw.wv.index({Slice((h / 2) * kHd, (h / 2 + 1) * kHd)});
        auto wo = lw.wo.index({Slice(), Slice(h * kHd, (h + 1) * kHd)});
        auto M = x.matmul(v.t()).matmul(wo.t()).matmul(u_f.t());  // [V, V]
        auto diag = M.diagonal().unsqueeze(1);
        CHECK(torch::equal(whole.ov[h], (M <= diag).sum(1) - 1));
    }
}

TEST_CASE("dla: heads + MLPs + embedding + biases add up to the logit difference (stories260K, 656k)") {
    HS_REQUIRE_TESTDATA(td);
    for (const std::string path : {td + "/stories260K/stories260K.bin", td + "/tinystories-656k"}) {
        auto m = load_model(path);
        auto tok = find_tokenizer_for_model(path, m->config.vocab_size);
        REQUIRE(tok);
        DlaItem it;
        for (auto id : tok->encode("Tom and Sue went to the park. Tom gave the ball to", true)) it.tokens.push_back(id);
        torch::NoGradGuard ng;
        auto logits = m->forward(torch::tensor(it.tokens).unsqueeze(0))[0][-1];
        it.correct = logits.argmax().item<int64_t>();
        it.incorrect = (it.correct + 7) % m->config.vocab_size;
        auto r = dla_one(*m, it, true);
        const double total = r.heads.sum().item<double>() + r.mlp.sum().item<double>() +
                             r.attn_bias.sum().item<double>() + r.embed + r.final_bias;
        MESSAGE(path << ": logit diff " << r.logit_diff << ", sum of terms " << total);
        CHECK(std::abs(total - r.logit_diff) < 1e-4);
        CHECK(std::abs(r.logit_diff - (logits[it.correct] - logits[it.incorrect]).item<double>()) < 1e-4);
        CHECK((r.per_position.sum(2) - r.heads).abs().max().item<double>() < 1e-5);
        CHECK(r.heads.abs().max().item<double>() > 1e-3);  // not trivially zero
    }
}

TEST_CASE("dla: answers must be one token; prompts file must be a list of objects") {
    HS_REQUIRE_TESTDATA(td);
    auto tok = load_tokenizer(td + "/gpt2-tokenizer");
    std::vector<DlaPrompt> ok{{"The capital of France is", "Paris", "London"}};
    auto items = tokenize_dla_prompts(ok, *tok, "p.json");
    CHECK(items[0].correct == word_token(*tok, "Paris"));
    std::vector<DlaPrompt> bad{{"x", "Paris", "antidisestablishmentarianism"}};
    CHECK_THROWS_WITH_AS(tokenize_dla_prompts(bad, *tok, "p.json"), doctest::Contains("not a single token"), DataError);
}

TEST_CASE("relation datasets: every shipped file keeps >= 30 single-token pairs under GPT-2") {
    HS_REQUIRE_TESTDATA(td);
    auto tok = load_tokenizer(td + "/gpt2-tokenizer");
    auto rels = read_relations(std::string(HS_SOURCE_DIR) + "/datasets/relations");
    CHECK(rels.size() == 17);
    for (const auto& r : rels) {
        auto t = tokenize_relation(r, *tok);
        MESSAGE(r.name << " (" << r.category << "): " << t.src.size() << " of " << t.n_total << " pairs kept");
        CHECK_MESSAGE(t.src.size() >= 30, r.name);
        CHECK(r.category != "unknown");
    }
}

TEST_CASE("weight probes run on stories260K and tinystories-656k and write valid results") {
    HS_REQUIRE_TESTDATA(td);
    TempDir tmp;
    const std::string hs = HS_BINARY, rel = tmp.file("copying.json");
    for (const std::string path : {td + "/stories260K/stories260K.bin", td + "/tinystories-656k"}) {
        auto m = load_model(path);
        // The shipped word lists are GPT-2-sized: copy 40 whole-word tokens of this small vocabulary.
        auto tok = find_tokenizer_for_model(path, m->config.vocab_size);
        std::string json = "[";
        int n = 0;
        for (int32_t id = 0; id < tok->vocab_size() && n < 40; ++id) {
            std::string w = tok->token_text(id);  // " cat" (llama2.c) or "\u2581cat" (SentencePiece)
            if (w.rfind("\u2581", 0) == 0) w = " " + w.substr(3);
            if (w.size() < 3 || w[0] != ' ' || !std::all_of(w.begin() + 1, w.end(), ::isalpha)) continue;
            w = w.substr(1);
            if (word_token(*tok, w) != id) continue;
            json += (n++ ? ", [\"" : "[\"") + w + "\", \"" + w + "\"]";
        }
        REQUIRE(n >= 10);
        std::FILE* f = std::fopen(rel.c_str(), "w");
        std::fputs((json + "]").c_str(), f);
        std::fclose(f);
        const int64_t L = m->config.n_layers, H = m->config.n_heads;
        const std::string out = tmp.file("w.h5");
        std::filesystem::remove(out);
        auto run = [&](const std::string& args) { return std::system((hs + " -q " + args).c_str()); };
        REQUIRE(run("copy-suppression " + path + " --out " + out + " --n-tokens 200") == 0);
        REQUIRE(run("maps " + path + " --relations " + rel + " --min-pairs 5 --dynamic --suppression --append --out " +
                    out) == 0);
        ResultReader rd(out);
        for (const char* ds : {"/scores/copy-suppression/score", "/scores/copy-suppression/qk_frac_rank0",
                               "/scores/maps/copying/score", "/scores/maps/copying/dynamic",
                               "/scores/maps/copying/suppression"}) {
            auto d = rd.read(ds);
            REQUIRE(d.shape == std::vector<int64_t>{L, H});
            for (double v : d.values) CHECK((v >= 0.0 && v <= 1.0));
        }
        auto a = rd.attrs("/scores/maps/copying");
        CHECK(std::get<int64_t>(a.at("n_pairs_kept")) >= 5);
        CHECK(std::get<std::string>(a.at("weight_processing")) == "raw");
        CHECK(a.count("static_dynamic_pearson") == 1);
    }
}

// Timing at GPT-2 scale (V = 50257, D = 768, 12 heads of d = 64, random weights): run with
// `headscope_tests -tc='*benchmark*' --no-skip`.
TEST_CASE("benchmark: copy suppression and MAPS per head at V = 50257" * doctest::skip()) {
    torch::manual_seed(0);
    auto m = std::make_unique<Model>();
    auto& c = m->config;
    c.n_layers = 1, c.n_heads = 12, c.n_kv_heads = 12, c.d_model = 768, c.d_head = 64, c.d_ff = 3072;
    c.vocab_size = 50257, c.max_seq_len = 1024;
    LayerWeights lw;
    lw.attn_norm_w = lw.mlp_norm_w = torch::ones({768});
    lw.wq = torch::randn({768, 768}) * 0.03, lw.wk = torch::randn({768, 768}) * 0.03;
    lw.wv = torch::randn({768, 768}) * 0.03, lw.wo = torch::randn({768, 768}) * 0.03;
    lw.w_gate = torch::randn({3072, 768}) * 0.03, lw.w_up = torch::randn({3072, 768}) * 0.03;
    lw.w_down = torch::randn({768, 3072}) * 0.03;
    m->weights.layers.push_back(lw);
    m->weights.embed = torch::randn({50257, 768}) * 0.1;
    m->weights.unembed = torch::randn({50257, 768}) * 0.1;
    m->weights.final_norm_w = torch::ones({768});
    // Cost is linear in the scored tokens: time 4096 of them for all 12 heads, then scale to V.
    const int64_t n = 4096;
    auto t0 = std::chrono::steady_clock::now();
    auto w_ee = effective_embedding(*m, 2048);
    auto u_f = folded_unembed(*m);
    auto t1 = std::chrono::steady_clock::now();
    auto r = copy_suppression_layer_ranks(*m, 0, w_ee, u_f, torch::arange(n, torch::kLong), 2048);
    auto t2 = std::chrono::steady_clock::now();
    auto src = torch::randint(0, 50257, {100}, torch::kLong);
    auto ms = maps_static(*m, relation_of(src, src, "copying"), {});
    auto t3 = std::chrono::steady_clock::now();
    auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    const double per_head = secs(t1, t2) / 12 * (50257.0 / n);
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    const double model_mb = static_cast<double>(m->n_params()) * 4 / 1048576.0;
    MESSAGE("peak RSS after W_EE, copy suppression and MAPS: " << ru.ru_maxrss / 1024.0 << " MiB (model weights "
            << model_mb << " MiB)");
    // The rank count alone, fused vs tensor ops, same inputs ([n, 64] x [V, 64], one side).
    auto left = torch::randn({n, 64}), right = torch::randn({50257, 64});
    auto tgt = torch::randint(0, 50257, {n}, torch::kLong);
    auto t4 = std::chrono::steady_clock::now();
    auto fused = blocked_target_ranks(left, right, tgt, 2048, RankSide::kAscending, true).second;
    auto t5 = std::chrono::steady_clock::now();
    auto plain = blocked_target_ranks(left, right, tgt, 2048, RankSide::kAscending, false).second;
    auto t6 = std::chrono::steady_clock::now();
    CHECK(torch::equal(fused, plain));
    MESSAGE("rank count [" << n << " x 50257]: fused " << secs(t4, t5) << " s, tensor ops " << secs(t5, t6)
            << " s (ratio " << secs(t5, t6) / secs(t4, t5) << ")");
    MESSAGE("W_EE + W_U_f: " << secs(t0, t1) << " s once; copy suppression OV + QK over all 50257 tokens: "
            << per_head << " s/head (extrapolated from " << n << " tokens); MAPS (100 pairs): " << secs(t2, t3) / 12
            << " s/head; threads " << torch::get_num_threads());
    CHECK(r.ov.max().item<int64_t>() < 50257);
    CHECK(ms.score.numel() == 12);
}

TEST_CASE("copy suppression: its query and key projections equal the forward's, q/k norms included (Gemma 3's 1 + w)") {
    for (const std::string name : {"gemma3", "qwen3", "olmo2", "llama3_rope"}) {
        CAPTURE(name);
        auto m = load_model(std::string(HS_SOURCE_DIR) + "/tests/fixtures/families/" + name);
        const auto& c = m->config;
        const int layer = c.n_layers - 1;
        Hooks hooks;
        at::Tensor resid, q, k;
        hooks.capture(Point::kResidPre, [&](int, const at::Tensor& x) { resid = x.clone(); }, layer);
        hooks.capture(Point::kAttnQPreRope, [&](int, const at::Tensor& x) { q = x.clone(); }, layer);
        hooks.capture(Point::kAttnK, [&](int, const at::Tensor& x) { k = x.clone(); }, layer);
        torch::NoGradGuard ng;
        const auto tokens = torch::tensor(std::vector<int64_t>{1, 5, 9, 2, 7, 3}, torch::kLong).unsqueeze(0);
        m->forward(tokens, &hooks);
        const auto& lw = m->weights.layers[layer];
        const auto h = blocks::norm(c, resid, lw.attn_norm_w, lw.attn_norm_b)[0].to(torch::kFloat);  // [T, D]
        for (int64_t head = 0; head < c.n_heads; ++head) {
            const auto mine = copy_suppression_qk(*m, layer, h, false, head);
            CHECK(torch::allclose(mine, q[0].select(1, head).to(torch::kFloat), 1e-5, 1e-5));
        }
        // attn.k is after RoPE, which is the identity at position 0.
        for (int64_t kv = 0; kv < c.n_kv_heads; ++kv) {
            const auto mine = copy_suppression_qk(*m, layer, h.narrow(0, 0, 1), true, kv);
            CHECK(torch::allclose(mine[0], k[0][0][kv].to(torch::kFloat), 1e-5, 1e-5));
        }
    }
}
