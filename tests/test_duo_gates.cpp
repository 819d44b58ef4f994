// DuoAttention's learned gates (probes/ablation/duo_gates.h) and the YAML sweep duo-gates. References: the
// unchanged model (alpha = 1 must reproduce its final hidden states), central finite differences for
// the gradient, and the CI toy recall model's training_log.json "ground_truth" (its retrieval heads,
// the ones that need the whole context).
#include <doctest/doctest.h>

#include "ablation.h"
#include "blocks.h"
#include "ci_toy.h"
#include "duo_data.h"
#include "duo_gates.h"
#include "heads.h"
#include "hooks.h"
#include "model.h"
#include "store.h"
#include "test_util.h"
#include "testdata.h"
#include "tokenizer.h"
#include "toy_recall_data.h"
#include "tmpdir.h"
#include "toy_tasks.h"
#include "util.h"
#include "yaml_errors.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

using namespace hs;
using nlohmann::json;

namespace {

// DuoAttention trains with block_sparse_attn's block_streaming_attn_func (duo_attn/train.py l. 280,
// duo_attn/patch/streaming_attn.py streaming_attn_blocksparse_flash_attn), num_sink_blocks =
// (sink_size + 127) // 128 and num_recent_blocks = (recent_size + 127) // 128
// (duo_attn/patch/llama.py l. 450-452). Its mask, transcribed from mit-han-lab/Block-Sparse-Attention
// block_sparse_tests/fwd_bwd/test_correctness/utils.py (generate_streaming_mask, prepare_mixed_mask,
// attention_blocksparse_ref with causal = True), with the block size a parameter (the kernel's is 128):
// the block mask row by row, repeated to tokens, cut to the lengths, and the causal mask
// (construct_local_mask with window (-1, 0): col > row + sk - sq hidden). visible[q * k_len + s].
std::vector<char> reference_block_streaming_mask(int64_t q_len, int64_t k_len, int64_t sink_size, int64_t recent_size, int64_t blk) {
    const int64_t sink_block_num = (sink_size + blk - 1) / blk, local_block_num = (recent_size + blk - 1) / blk;
    auto round_to_multiple = [](int64_t x, int64_t base) { return (x + base - 1) / base * base; };
    auto ceil_div = [](int64_t x, int64_t y) { return (x + y - 1) / y; };
    const int64_t nrow = round_to_multiple(q_len, blk) / blk, ncol = round_to_multiple(k_len, blk) / blk;
    std::vector<char> base(static_cast<size_t>(nrow * ncol), 0);
    const int64_t start_row_idx = std::max<int64_t>((q_len - k_len) / blk, 0);
    for (int64_t i = start_row_idx; i < nrow; ++i) {
        const int64_t max_row_block_num = ceil_div(std::max<int64_t>(k_len - q_len, 0), blk) + 1 + i - start_row_idx;
        for (int64_t c = std::min(std::max<int64_t>(max_row_block_num - local_block_num, 0), ncol); c < std::min(max_row_block_num, ncol); ++c)
            base[static_cast<size_t>(i * ncol + c)] = 1;
        for (int64_t c = 0; c < std::min(sink_block_num, ncol); ++c) base[static_cast<size_t>(i * ncol + c)] = 1;  // [:sink_block_num]
    }
    std::vector<char> vis(static_cast<size_t>(q_len * k_len), 0);
    for (int64_t r = 0; r < q_len; ++r)
        for (int64_t c = 0; c < k_len; ++c)
            vis[static_cast<size_t>(r * k_len + c)] = base[static_cast<size_t>((r / blk) * ncol + c / blk)] && !(c > r + k_len - q_len);
    return vis;
}

// The same file's construct_exact_streaming_mask (the token window; DuoAttention's generate_streaming_mask
// keeps the same keys): col > min(row + sk - sq, sk), or sink_size <= col < row + sk - sq - (local_size - 1), hidden.
std::vector<char> reference_exact_streaming_mask(int64_t q_len, int64_t k_len, int64_t sink_size, int64_t local_size) {
    std::vector<char> vis(static_cast<size_t>(q_len * k_len), 0);
    for (int64_t r = 0; r < q_len; ++r)
        for (int64_t c = 0; c < k_len; ++c) {
            const bool hidden = c > std::min(r + k_len - q_len, k_len) || (c < r + k_len - q_len - (local_size - 1) && c >= sink_size);
            vis[static_cast<size_t>(r * k_len + c)] = !hidden;
        }
    return vis;
}

// headscope's pattern under a window on every head: the entries of attn.scores that are not -inf, per
// head [H][T * T], read through the row-block observer (blocks of `attn_block` query rows) or whole.
std::vector<std::vector<char>> headscope_visible(const Model& m, const at::Tensor& tokens, const StreamWindow& w, int64_t attn_block,
                                                 bool whole, at::Tensor* z_out = nullptr) {
    const int64_t H = m.config.n_heads, T = tokens.size(1);
    Hooks h;
    for (int l = 0; l < m.config.n_layers; ++l)
        for (int hh = 0; hh < H; ++hh) h.window(HeadWindow{l, hh, -1, w, {}});
    auto scores = torch::zeros({H, T, T});
    if (whole) {
        h.capture(Point::kAttnScores, [&](int l, const at::Tensor& x) { if (l == 0) scores.copy_(x[0]); });
    } else {
        h.capture_rows(Point::kAttnScores, [&](int l, int64_t q0, const at::Tensor& rows) {
            if (l == 0) scores.narrow(1, q0, rows.size(2)).copy_(rows[0]);
        });
    }
    if (z_out) h.capture(Point::kAttnZ, [&](int l, const at::Tensor& x) { if (l == 0) *z_out = x.clone(); });
    ForwardOptions fo;
    fo.attn_block = attn_block;
    fo.compute_logits = false;
    torch::NoGradGuard ng;
    m.forward(tokens, &h, nullptr, fo);
    auto fin = torch::isfinite(scores).to(torch::kUInt8).contiguous();
    std::vector<std::vector<char>> out;
    for (int64_t hh = 0; hh < H; ++hh) out.emplace_back(fin[hh].data_ptr<uint8_t>(), fin[hh].data_ptr<uint8_t>() + T * T);
    return out;
}

}  // namespace

TEST_CASE("block windows: the pattern is block_streaming_attn_func's mask; block 1 is the token window") {
    auto m = load_model(ci_toy_model("induction"));
    // The toy trained on 64 tokens (its config's context); its RoPE has no position table, and the mask
    // is what is checked here, at lengths past one 128-token block.
    m->config.max_seq_len = 512;
    const int64_t H = m->config.n_heads;
    struct Case {
        int64_t T, sink, recent, block;
    };
    // The reference's training window (128, 256 in 128-token blocks) with partial blocks (T = 300 = 2 x
    // 128 + 44, 77 < 128), T a multiple of 128, sinks and recents that are not multiples of the block,
    // no sink, and small blocks.
    for (const Case c : {Case{300, 128, 256, 128}, Case{300, 64, 200, 128}, Case{256, 200, 130, 128}, Case{300, 0, 1, 128},
                         Case{77, 1, 4, 128}, Case{45, 5, 7, 4}, Case{46, 0, 9, 3}, Case{45, 3, 5, 1}}) {
        CAPTURE(c.T);
        CAPTURE(c.sink);
        CAPTURE(c.recent);
        CAPTURE(c.block);
        torch::manual_seed(c.T + c.block);
        auto tokens = torch::randint(6, 68, {1, c.T}, torch::kLong);
        const StreamWindow w{c.sink, c.recent, false, 0, c.block};
        const auto ref = reference_block_streaming_mask(c.T, c.T, c.sink, c.recent, c.block);
        at::Tensor z;
        const auto rows = headscope_visible(*m, tokens, w, 7, false, &z);
        const auto whole = headscope_visible(*m, tokens, w, 0, true);
        for (int64_t hh = 0; hh < H; ++hh) {
            CHECK(rows[static_cast<size_t>(hh)] == ref);
            CHECK(whole[static_cast<size_t>(hh)] == ref);
        }
        // The whole reference attention (blocks::attention_reference) reads the same window.
        std::vector<at::Tensor> qkv(3);
        Hooks cap;
        for (int hh = 0; hh < H; ++hh) cap.window(HeadWindow{0, hh, -1, w, {}});
        cap.capture(Point::kAttnQ, [&](int l, const at::Tensor& x) { if (l == 0) qkv[0] = x.clone(); });
        cap.capture(Point::kAttnK, [&](int l, const at::Tensor& x) { if (l == 0) qkv[1] = x.clone(); });
        cap.capture(Point::kAttnV, [&](int l, const at::Tensor& x) { if (l == 0) qkv[2] = x.clone(); });
        ForwardOptions fo;
        fo.compute_logits = false, fo.stop_after_layer = 0;
        {
            torch::NoGradGuard ng;
            m->forward(tokens, &cap, nullptr, fo);
        }
        const auto lw = cap.windows(0, 1, H, torch::kCPU);
        const auto zr = blocks::attention_reference(m->config, 0, qkv[0], qkv[1], qkv[2], &lw);
        CHECK((z - zr).abs().max().item<double>() <= 1e-5 * std::max(1.0, zr.abs().max().item<double>()));
        if (c.block == 1) {  // the token window: the exact streaming mask, and the window without a block, bit for bit
            CHECK(ref == reference_exact_streaming_mask(c.T, c.T, c.sink, c.recent));
            at::Tensor zt;
            const auto token = headscope_visible(*m, tokens, StreamWindow{c.sink, c.recent, false, 0}, 7, false, &zt);
            CHECK(token == rows);
            CHECK(torch::equal(zt, z));
        }
    }
    // The reference's training window on a 300-token row: a query in block 2 sees block 0 (the sink)
    // and blocks 1 and 2 up to itself, 128 + 129..256 keys; the token window 128 + 256 would show more.
    const auto ref = reference_block_streaming_mask(300, 300, 128, 256, 128);
    int64_t seen_299 = 0, seen_256 = 0;
    for (int64_t s = 0; s < 300; ++s) seen_299 += ref[static_cast<size_t>(299 * 300 + s)], seen_256 += ref[static_cast<size_t>(256 * 300 + s)];
    CHECK(seen_256 == 128 + 129);
    CHECK(seen_299 == 300);
    // Bad blocks: one line each.
    Hooks h;
    CHECK_THROWS_WITH_AS(h.window(HeadWindow{0, 0, -1, StreamWindow{4, 8, false, 0, 0}, {}}), "attention window: block 0 must be at least 1", ConfigError);
    CHECK_THROWS_WITH_AS(h.window(HeadWindow{0, 0, -1, StreamWindow{4, 8, true, 0, 4}, {}}),
                         "attention window: a block window (block 4) does not compensate", ConfigError);
}

TEST_CASE("duo-gates: alpha = 1 reproduces the model; the gradient equals central differences") {
    auto m = load_model(ci_toy_model("induction"));
    const int L = m->config.n_layers, K = m->config.n_kv_heads;
    auto data = repeated_data(*m, 10, 4, 5, 6, 68);
    AblationSetup s;
    s.positions = Positions::kRepeatedHalf;
    Ablator ab(*m, data, s);
    DuoGateOptions o;
    o.window = {1, 3, false};
    CHECK(duo_distillation_loss(*m, ab, o, torch::ones({L, K})) <= 1e-12);
    const double stream = duo_distillation_loss(*m, ab, o, torch::zeros({L, K}));
    MESSAGE("distillation loss with every head streaming (sink 1, recent 3): " << stream);
    CHECK(stream > 1e-3);
    torch::manual_seed(4);
    auto a = torch::rand({L, K}) * 0.8 + 0.1;  // inside (0, 1): clamp passes the gradient
    auto g = duo_distillation_grad(*m, ab, o, a);
    const double eps = 1e-3;
    for (auto [l, k] : std::vector<std::array<int64_t, 2>>{{0, 0}, {0, K - 1}, {L - 1, 1}, {L - 1, K - 1}}) {
        auto up = a.clone(), dn = a.clone();
        up[l][k] += eps;
        dn[l][k] -= eps;
        const double fd = (duo_distillation_loss(*m, ab, o, up) - duo_distillation_loss(*m, ab, o, dn)) / (2 * eps);
        const double an = g[l][k].item<double>();
        CAPTURE(l);
        CAPTURE(k);
        CAPTURE(fd);
        CHECK(std::abs(an - fd) <= 2e-3 * std::max(1.0, std::abs(fd)) + 1e-4 * stream);
    }
}

TEST_CASE("duo-gates fit (small): it starts at the full model, lowers the gates and keeps the distillation below streaming") {
    auto m = load_model(ci_toy_model("induction"));
    auto data = repeated_data(*m, 10, 4, 5, 6, 68);
    AblationSetup s;
    s.positions = Positions::kRepeatedHalf;
    Ablator ab(*m, data, s);
    DuoGateOptions o;
    o.window = {1, 3, false};
    o.steps = 20;
    auto r = fit_duo_gates(*m, ab, o);
    MESSAGE("alpha:\n" << r.alpha << "\ndistillation loss: full " << r.distill_full << ", all streaming " << r.distill_stream
                       << ", fitted " << r.distill_final);
    REQUIRE(r.history.sizes() == at::IntArrayRef({20, 2}));
    CHECK(r.history[0][0].item<double>() <= 1e-9);                 // step 0: alpha = 1, the model itself
    CHECK(r.history[0][1].item<double>() == doctest::Approx(1.0));  // mean |alpha| from the initial value
    CHECK(r.history[19][1].item<double>() < r.history[0][1].item<double>() - 0.05);  // lambda pulls the gates down
    CHECK(r.distill_full <= 1e-12);
    CHECK(r.distill_final < r.distill_stream);
    CHECK(r.alpha.min().item<double>() >= 0.0);
    CHECK(r.alpha.max().item<double>() <= 1.0);
    // A kv head's gate on each of its query heads.
    const int64_t g = m->config.n_heads / m->config.n_kv_heads;
    CHECK(torch::equal(r.alpha, r.alpha_kv.clamp(0, 1).repeat_interleave(g, 1).to(r.alpha.scalar_type())));
}

// The ground truth of the toy recall model (a 150-step fit on 48 prompts, minutes on 2 cores): ctest
// long_duo_gates, scripts/test.sh --long.
TEST_CASE("duo-gates on the toy recall model: the retrieval heads keep full attention" * doctest::test_suite("long")) {
    const std::string dir = ci_toy_model("recall");
    auto m = load_model(dir);
    const auto gt = json::parse(read_text_file(path_join(dir, "training_log.json")))["ground_truth"];
    const int L = m->config.n_layers, H = m->config.n_heads;
    std::vector<Head> causal;
    for (const auto& x : gt["retrieval_heads"]) {
        int l = -1, h = -1;
        REQUIRE(parse_head_name(x.get<std::string>(), l, h));
        causal.push_back({l, h});
    }
    REQUIRE(causal.size() == 3);
    auto data = toy_recall_prompts(48, 64, 21);
    AblationSetup s;
    s.mode = Intervention::kStream;
    s.window = {1, 4, false};
    s.metric = MetricKind::kAccuracy;
    s.positions = Positions::kAnswer;
    s.max_rows = 512;
    Ablator ab(*m, data, s);
    DuoGateOptions o;
    o.window = s.window;
    o.steps = 150;
    auto r = fit_duo_gates(*m, ab, o);
    MESSAGE("alpha:\n" << r.alpha << "\ndistillation loss: full " << r.distill_full << ", all streaming " << r.distill_stream
                       << ", fitted " << r.distill_final);
    CHECK(r.distill_final < 0.5 * r.distill_stream);
    // The retrieval heads keep full attention. The objective is the whole final hidden state, not the
    // answer: L1H3, which attends to the value as well (0.23 in the training log's retrieval
    // attention) though ablating it costs no accuracy, keeps a high alpha too; so the check is
    // "retrieval heads high", not "only they".
    for (auto [l, h] : causal) {
        CAPTURE(format_head(l, h));
        CHECK(r.alpha[l][h].item<double>() >= 0.9);
    }
    // The previous-token head needs only the previous key, which the window (recent 4) holds: it streams.
    int pl = -1, ph = -1;
    REQUIRE(parse_head_name(gt["previous_token_head"].get<std::string>(), pl, ph));
    CHECK(r.alpha[pl][ph].item<double>() < 0.5);
    // Causal check: streaming the heads the gates close keeps recall; random sets of that size do not.
    DuoDeploy by_threshold;
    by_threshold.sparsity = false, by_threshold.value = 0.5;  // the heads with alpha < 0.5, as measured in docs/methods.md
    auto cfg = duo_configs(r, duo_deploy(r, by_threshold), 5, 7);
    REQUIRE(cfg.kinds[1] == "duo");
    auto acc = ab.evaluate(torch::stack(cfg.masks)).mean(1);
    double ctl = 0;
    for (size_t i = 2; i < cfg.masks.size(); ++i) ctl += acc[static_cast<int64_t>(i)].item<double>() / 5.0;
    MESSAGE("recall accuracy: baseline " << acc[0].item<double>() << ", " << cfg.labels[1] << " " << acc[1].item<double>()
                                         << ", random sets of the same size (mean of 5) " << ctl);
    CHECK(cfg.k[1] >= 2);
    CHECK(acc[1].item<double>() >= acc[0].item<double>() - 0.05);
    CHECK(ctl < acc[1].item<double>() - 0.1);
}

TEST_CASE("duo-gates: a fresh recall sample per step has the reference's multi-passkey shape") {
    const auto cpu = c10::Device(c10::kCPU);
    auto a = duo_recall_sample(5, 0, 4, 64, cpu), b = duo_recall_sample(5, 0, 4, 64, cpu), c = duo_recall_sample(5, 1, 4, 64, cpu);
    CHECK(torch::equal(a.tokens, b.tokens));
    CHECK(torch::equal(a.pos, b.pos));
    CHECK(!torch::equal(a.tokens, c.tokens));  // the next step draws a new sample
    CHECK(a.tokens.sizes() == at::IntArrayRef({4, 64}));
    // Labelled: every token from the first '?' on (questions and answers), never the context.
    for (int64_t b0 = 0; b0 < 4; ++b0) {
        auto mine = a.pos.index({a.row.eq(b0)});
        REQUIRE(mine.numel() >= 3);  // at least one "? k V"
        const int64_t first = mine.min().item<int64_t>();
        CHECK(a.tokens[b0][first].item<int64_t>() == toy::kQuery);
        for (int64_t q = 1; q < first; ++q) CHECK(a.tokens[b0][q].item<int64_t>() != toy::kQuery);
        for (int64_t i = 0; i < mine.numel(); ++i) {
            const int64_t t = a.tokens[b0][mine[i].item<int64_t>()].item<int64_t>();
            CHECK((t == toy::kQuery || (t >= toy::kLower0 && t < toy::kUpper0 + 26)));
        }
    }
    CHECK_THROWS_AS(duo_recall_sample(5, 0, 4, 4, cpu), ConfigError);
}

// The fit on a fresh sample every step (150 steps of 8 rows of 64 tokens, seconds; in the long suite
// beside the fixed-data fit): ctest long_duo_gates.
TEST_CASE("duo-gates with a fresh sample per step: the retrieval heads keep full attention" * doctest::test_suite("long")) {
    const std::string dir = ci_toy_model("recall");
    auto m = load_model(dir);
    const auto gt = json::parse(read_text_file(path_join(dir, "training_log.json")))["ground_truth"];
    auto data = toy_recall_prompts(48, 64, 21);
    AblationSetup s;
    s.mode = Intervention::kStream;
    s.window = {1, 4, false};
    s.metric = MetricKind::kAccuracy;
    s.positions = Positions::kAnswer;
    s.max_rows = 512;
    Ablator ab(*m, data, s);
    DuoGateOptions o;
    o.window = s.window;
    o.steps = 150;
    const auto dev = m->options.device;
    o.sample = [dev](int64_t step) { return duo_recall_sample(77, step, 8, 64, dev); };
    auto r = fit_duo_gates(*m, ab, o);
    MESSAGE("alpha (fresh sample per step):\n" << r.alpha << "\ndistillation loss on the study's prompts: full " << r.distill_full
                                               << ", all streaming " << r.distill_stream << ", fitted " << r.distill_final);
    CHECK(r.distill_final < 0.5 * r.distill_stream);
    for (const auto& x : gt["retrieval_heads"]) {
        int l = -1, h = -1;
        REQUIRE(parse_head_name(x.get<std::string>(), l, h));
        CAPTURE(x.get<std::string>());
        CHECK(r.alpha[l][h].item<double>() >= 0.9);
    }
    // Unlike the fit on the study's answer positions, the previous-token head keeps full attention here
    // (0.80; measured, not a target): the reference labels every question-and-answer token, and on
    // those positions the layer-0 heads matter (labelling only the query keys, the positions that
    // predict the answer, it streams at 0.00, as in the fixed-data fit). docs/methods.md gives the alphas.
    int pl = -1, ph = -1;
    REQUIRE(parse_head_name(gt["previous_token_head"].get<std::string>(), pl, ph));
    MESSAGE("previous-token head " << gt["previous_token_head"].get<std::string>() << ": alpha " << r.alpha[pl][ph].item<double>());
}

TEST_CASE("duo-gates YAML: a run writes alpha in the order format; schema errors name the line") {
    const std::string head = "model: m\ndata:\n  r: {kind: repeated, length: 5, count: 2}\n";
    auto study = [](const std::string& body) { return "studies:\n  - name: s\n" + body; };
    const std::string win = "    mode: {kind: stream, sink: 1, recent: 2}\n";
    CHECK(cfg_error(head + study("    sweep: duo-gates\n" + win + "    fit_steps: 5\n    metric: {kind: loss, data: r}\n")) == "(no error)");
    CHECK(cfg_error(head + study("    sweep: duo-gates\n    metric: {kind: loss, data: r}\n"))
              .find("duo-gates mixes full attention with a window: it needs mode: {kind: stream") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: duo-gates\n" + win + "    heads: all\n    metric: {kind: loss, data: r}\n"))
              .find("exp.yaml:8:12: duo-gates fits a gate on every head") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: duo-gates\n" + win + "    starts: 2\n    metric: {kind: loss, data: r}\n"))
              .find("exp.yaml:8:13: 'starts' belongs to sweep: gating") != std::string::npos);
    CHECK(cfg_error(head + study("    sweep: single\n    lr: 0.1\n    metric: {kind: loss, data: r}\n"))
              .find("'lr' belongs to sweep: gating or duo-gates") != std::string::npos);
    TempDir dir;
    const std::string exp = dir.file("d.yaml"), out = dir.file("d.h5");
    std::ofstream(exp) << fmt::format("model: {}\nseed: 2\ndata:\n  r: {{kind: repeated, length: 8, count: 4, token_range: [6, 68]}}\n"
                                      "studies:\n  - name: duo\n    sweep: duo-gates\n    mode: {{kind: stream, sink: 1, recent: 3}}\n"
                                      "    train_window: {{sink: 1, recent: 3, block: 1}}\n"
                                      "    fit_steps: 6\n    controls: {{random: 2}}\n"
                                      "    metric: {{kind: loss, data: r, positions: repeated-half}}\n",
                                      ci_toy_model("induction"));
    REQUIRE(run_cli(fmt::format("run '{}' --out '{}'", exp, out)) == 0);
    ResultReader rd(out);
    auto alpha = rd.read_numbers("/ablation/duo/duo/alpha");
    CHECK(alpha.shape == std::vector<int64_t>{2, 4});
    for (double v : alpha.values) CHECK((v >= 0 && v <= 1));
    CHECK(rd.read_numbers("/ablation/duo/duo/history").shape == std::vector<int64_t>{6, 2});
    auto masks = rd.read_numbers("/ablation/duo/masks");
    CHECK(masks.shape[0] == 4);  // baseline, alpha < 0.5 streamed, 2 controls
    // The learned alphas serve as a head order anywhere a score file is read.
    auto sc = read_head_score(split_head_score_ref(out + ":/ablation/duo/duo/alpha"), 2, 4);
    CHECK(sc.sizes() == at::IntArrayRef({2, 4}));
    // The report draws the gates.
    const std::string html = dir.file("d.html");
    REQUIRE(run_cli(fmt::format("report '{}' --out '{}'", out, html)) == 0);
    CHECK(read_text_file(html).find("DuoAttention's gates: alpha") != std::string::npos);
}

// The YAML study as the reference trains and deploys, on the CI toy recall model in seconds: a fresh toy
// recall sample every step (fit_data fresh), the block training window (blocks of 4 here: the toy's
// rows are shorter than the reference's 128-token blocks) and the deployment by the reference's
// sparsity quantile, which tests/duo_sparsity_check.py recomputes from the file's gates (numpy, the
// reference's lines and headscope's seeded tie noise).
TEST_CASE("duo-gates YAML: fresh samples, the block training window, the deployment by sparsity; defaults and bad values") {
    const std::string head = "model: m\ndata:\n  r: {kind: repeated, length: 5, count: 2}\n";
    auto study = [](const std::string& body) { return "studies:\n  - name: s\n    sweep: duo-gates\n    mode: {kind: stream, sink: 1, recent: 2}\n" + body + "    metric: {kind: loss, data: r}\n"; };
    auto parsed = [&](const std::string& body) {
        return parse_experiment_text(head + study(body), "exp.yaml", {}).studies.at(0);
    };
    // The reference's defaults where the study does not say (scripts/train.sh; run_niah.sh's sparsity 0.5).
    const auto d = parsed("");
    CHECK(d.fit_steps == 2000);
    CHECK(d.lr == doctest::Approx(0.02));
    CHECK(d.lambda == doctest::Approx(0.05));
    CHECK(d.train_window.sink == 128);
    CHECK(d.train_window.recent == 256);
    CHECK(d.train_window.block == 128);
    CHECK(!d.fit_fresh);
    CHECK(d.deploy_sparsity);
    CHECK(d.deploy_value == 0.5);
    CHECK(d.mode.window.block == 1);  // the deployment window stays token-exact
    const auto t = parsed("    train_window: {block: 1}\n    fit_data: fresh\n    deploy: {select: threshold, threshold: 0.3}\n");
    CHECK(t.train_window.block == 1);
    CHECK(t.train_window.sink == 128);
    CHECK(t.fit_fresh);
    CHECK(t.fresh_rows == 8);
    CHECK(t.fresh_length == 64);
    CHECK(!t.deploy_sparsity);
    CHECK(t.deploy_value == doctest::Approx(0.3));
    // Bad values: one line naming the place.
    CHECK(cfg_error(head + study("    train_window: {sink: 1, recent: 4, block: 0}\n")) == "exp.yaml:8:47: 'block': expected a positive integer, got 0");
    CHECK(cfg_error(head + study("    deploy: {select: sparsity, sparsity: 1.5}\n")) == "exp.yaml:8:42: 'sparsity': expected a number in [0, 1], got 1.5");
    CHECK(cfg_error(head + study("    deploy: {select: threshold, threshold: -1}\n")) == "exp.yaml:8:44: 'threshold': expected a number in [0, 1], got -1");
    CHECK(cfg_error(head + study("    deploy: {select: count}\n")) == "exp.yaml:8:22: 'select': unknown value 'count' (expected one of: sparsity, threshold)");
    CHECK(cfg_error(head + study("    deploy: {select: threshold, sparsity: 0.5}\n")) == "exp.yaml:8:43: deploy: 'sparsity' applies to select sparsity only");
    CHECK(cfg_error(head + study("    fit_data: {kind: study, rows: 4}\n")) == "exp.yaml:8:35: fit_data: 'rows' applies to kind fresh only");
    CHECK(cfg_error(head + study("    fit_data: {kind: fresh, length: 4}\n")) == "exp.yaml:8:37: 'length': expected at least 8 tokens, got 4");
    CHECK(cfg_error(head + "studies:\n  - name: s\n    sweep: single\n    deploy: {select: sparsity}\n    metric: {kind: loss, data: r}\n") ==
          "exp.yaml:7:13: 'deploy' belongs to sweep: duo-gates");
    CHECK(cfg_error(head + "studies:\n  - name: s\n    sweep: single\n    mode: {kind: stream, sink: 1, recent: 2, block: 0}\n    metric: {kind: loss, data: r}\n")
              .find("exp.yaml:7:53: 'block': expected a positive integer, got 0") != std::string::npos);

    TempDir dir;
    const std::string exp = dir.file("f.yaml"), out = dir.file("f.h5");
    std::ofstream(exp) << fmt::format(
        "model: {}\nseed: 3\ndata:\n  recall: {{kind: prompts, file: {}/datasets/experiments/toy-recall-prompts.jsonl, count: 16}}\n"
        "studies:\n  - name: duo\n    sweep: duo-gates\n    mode: {{kind: stream, sink: 1, recent: 4}}\n"
        "    train_window: {{sink: 4, recent: 8, block: 4}}\n    fit_data: {{kind: fresh, rows: 4, length: 48}}\n"
        "    fit_steps: 15\n    deploy: {{select: sparsity, sparsity: 0.5}}\n    controls: {{random: 1}}\n"
        "    metric: {{kind: accuracy, data: recall}}\n",
        ci_toy_model("recall"), HS_SOURCE_DIR);
    REQUIRE(run_cli(fmt::format("-q run '{}' --out '{}'", exp, out)) == 0);
    ResultReader rd(out);
    const Attrs a = rd.attrs("/ablation/duo/duo");
    CHECK(attr_to_string(a.at("fit_data")) == "fresh");
    CHECK(attr_to_string(a.at("train_block")) == "4");
    CHECK(attr_to_string(a.at("deploy_select")) == "sparsity");
    CHECK(attr_to_string(a.at("deploy_sparsity")) == "0.5");
    CHECK(a.count("deploy_noise_seed") == 1);
    CHECK(a.count("fresh_seed") == 1);
    CHECK(rd.read_numbers("/ablation/duo/duo/history").shape == std::vector<int64_t>{15, 2});
    CHECK(rd.read_numbers("/ablation/duo/masks").shape[0] == 3);  // baseline, duo, 1 control
    // The reference's sparsity (half of the 8 KV heads) from these gates, recomputed in numpy.
    const int rc = std::system(fmt::format("PY=$(bash '{0}/scripts/find_python.sh' h5py numpy) && \"$PY\" '{0}/tests/duo_sparsity_check.py' "
                                           "--file '{1}' --study duo",
                                           HS_SOURCE_DIR, out)
                                   .c_str());
    CHECK(rc == 0);
}

// fit_data {kind: passkey}: duo_attn/data.py MultiplePasskeyRetrievalDataset on a real tokenizer
// (probes/ablation/duo_data.h duo_passkey_sample). Here: the sample's shape and labels; then
// tests/duo_passkey_check.py (the peers' venv: the tokenizers library on the same tokenizer.json, torch)
// rebuilds every sample from its recorded draws with the reference's lines and compares the token ids
// and labels exactly (tolerance: none).
static std::vector<int64_t> ids_of(const at::Tensor& t) {
    const auto c = t.contiguous().to(torch::kCPU);
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// train.py's DataLoader(shuffle=True) over the dataset's n context lengths: every epoch of n steps a
// permutation of the n items, a new one each epoch, the same for the same seed.
TEST_CASE("duo-gates: the passkey sample's context lengths, an epoch of items per n steps in a shuffled order") {
    for (const int64_t n : {1, 2, 7, 50}) {
        std::vector<int64_t> first, second;
        for (int64_t step = 0; step < 2 * n; ++step) (step < n ? first : second).push_back(duo_passkey_item(n, 5, step));
        for (auto* epoch : {&first, &second}) {
            auto sorted = *epoch;
            std::sort(sorted.begin(), sorted.end());
            for (int64_t i = 0; i < n; ++i) CHECK(sorted[static_cast<size_t>(i)] == i);
        }
        if (n == 50) CHECK(first != second);  // a fresh order each epoch (RandomSampler.__iter__)
        CHECK(duo_passkey_item(n, 5, 2 * n - 1) == second.back());  // the same seed and step, the same item
    }
    std::vector<int64_t> a, b;
    for (int64_t step = 0; step < 50; ++step) a.push_back(duo_passkey_item(50, 5, step)), b.push_back(duo_passkey_item(50, 6, step));
    CHECK(a != b);  // another seed, another order
}

TEST_CASE("duo-gates: the reference's passkey sample on a real tokenizer equals data.py's lines (tinystories-656k)") {
    HS_REQUIRE_TESTDATA(td);
    const std::string tok_dir = td + "/tinystories-656k", hay_file = std::string(HS_SOURCE_DIR) + "/datasets/needles/tinystories_haystack.txt";
    auto tok = load_tokenizer(tok_dir);
    std::ifstream in(hay_file);
    std::stringstream text;
    text << in.rdbuf();
    struct Case {
        int64_t length_min, length_max, intervals, passkeys, words, steps;
        double depth_min = 0.05, depth_max = 0.95;
        int64_t depth_intervals = 1000;
    };
    json dump = json::array();
    // One length (the class's own depths, then scripts/train.sh's), then ranges of lengths over two
    // epochs of items; the last: scripts/train.sh's whole setting (1000..32000 in 50 lengths, 10
    // passkeys of 32 words, linspace(0.05, 0.95, 1000) depths), a few steps.
    for (const Case c : {Case{640, 640, 1, 2, 4, 3, 0.1, 0.9, 20}, Case{1200, 1200, 1, 3, 5, 3}, Case{4000, 4000, 1, 10, 32, 3, 0.1, 0.9, 20},
                         Case{640, 1200, 5, 2, 4, 10}, Case{700, 4000, 7, 10, 32, 14, 0.1, 0.9, 20}, Case{1000, 32000, 50, 10, 32, 4}}) {
        DuoPasskeyOptions o;
        o.context_length_min = c.length_min, o.context_length_max = c.length_max, o.context_lengths_num_intervals = c.intervals;
        o.passkeys = c.passkeys, o.passkey_length = c.words;
        o.depth_min = c.depth_min, o.depth_max = c.depth_max, o.depth_intervals = c.depth_intervals;
        const uint64_t seed = 11 + static_cast<uint64_t>(c.length_max + c.intervals);
        const auto d = duo_passkey_data(*tok, text.str(), o, seed);
        REQUIRE(static_cast<int64_t>(d.lengths.size()) == c.intervals);
        CHECK(d.lengths.front() == c.length_min);
        CHECK(d.lengths.back() == c.length_max);
        // torch >= 2.0's integer linspace (duo_data.cpp torch_linspace_int); libtorch 1.13's gives 7958 at [11].
        if (c.intervals == 50) CHECK(d.lengths[11] == 7959);
        json jc = {{"length_min", c.length_min}, {"length_max", c.length_max}, {"length_intervals", c.intervals},
                   {"passkeys", c.passkeys}, {"words", c.words}, {"buffer", o.buffer}, {"depth_min", c.depth_min},
                   {"depth_max", c.depth_max}, {"depth_intervals", c.depth_intervals}, {"lengths", d.lengths},
                   {"init_words", d.init_words}, {"haystack", d.haystack}, {"samples", json::array()}};
        std::set<int64_t> lengths_seen;
        for (int64_t step = 0; step < c.steps; ++step) {
            DuoPasskeyDraws dr;
            const auto r = duo_passkey_sample(d, seed, step, torch::kCPU, &dr);
            const int64_t T = r.tokens.size(1);
            CHECK(T % 16 == 0);  // the reference asserts it
            CHECK(dr.context_length == d.lengths[static_cast<size_t>(dr.item)]);
            // The trim fits the prompts with __init__'s one passkey in length_max - 300; each sample's own passkeys
            // tokenize to other lengths (up to 3808 tokens at 4000 here), which the 300-token buffer absorbs.
            CHECK(T <= c.length_max);
            lengths_seen.insert(dr.context_length);
            REQUIRE(static_cast<int64_t>(dr.labels.size()) == T);
            CHECK(dr.depth_index.size() == static_cast<size_t>(c.passkeys));
            CHECK(std::is_sorted(dr.depth_index.begin(), dr.depth_index.end()));
            CHECK(std::adjacent_find(dr.depth_index.begin(), dr.depth_index.end()) == dr.depth_index.end());
            const auto tv = ids_of(r.tokens);
            std::vector<int64_t> labelled;
            for (int64_t t = 0; t < T; ++t)
                if (dr.labels[static_cast<size_t>(t)] != -100) {
                    labelled.push_back(t);
                    CHECK(tv[static_cast<size_t>(t)] == dr.labels[static_cast<size_t>(t)]);
                }
            CHECK(ids_of(r.pos) == labelled);  // the scored positions: the tokens the labels keep
            CHECK(r.row.numel() == static_cast<int64_t>(labelled.size()));
            jc["samples"].push_back({{"step", step}, {"item", dr.item}, {"context_length", dr.context_length},
                                     {"depth_index", dr.depth_index}, {"words", dr.words}, {"tokens", tv}, {"labels", dr.labels}});
        }
        CHECK(static_cast<int64_t>(lengths_seen.size()) == std::min(c.intervals, c.steps));  // distinct lengths within an epoch
        // The same seed and step draw the same sample; the next step another.
        CHECK(duo_passkey_sample(d, seed, 1, torch::kCPU).tokens.equal(duo_passkey_sample(d, seed, 1, torch::kCPU).tokens));
        dump.push_back(jc);
    }
    DuoPasskeyOptions bad;
    bad.context_length_min = bad.context_length_max = 600;  // 10 passkeys of 32 words do not fit 600 - 300 tokens
    CHECK_THROWS_AS(duo_passkey_data(*tok, text.str(), bad, 1), ConfigError);
    bad.context_length_min = 100, bad.context_length_max = 4000;  // the trim is the max's: a min of 100 is fine
    CHECK_NOTHROW(duo_passkey_data(*tok, text.str(), bad, 1));
    bad.context_length_min = 4001;  // min above max
    CHECK_THROWS_AS(duo_passkey_data(*tok, text.str(), bad, 1), ConfigError);
    bad.context_length_min = 4000, bad.passkeys = 21;
    CHECK_THROWS_AS(duo_passkey_data(*tok, text.str(), bad, 1), ConfigError);
    bad.passkeys = 10, bad.depth_intervals = 9;  // randperm(9)[:10] would leave a passkey without a depth
    CHECK_THROWS_AS(duo_passkey_data(*tok, text.str(), bad, 1), ConfigError);

    TempDir dir;
    const std::string dump_file = dir.file("passkey.json");
    std::ofstream(dump_file) << dump.dump();
    const char* venv = std::getenv("HEADSCOPE_PEERS_VENV");
    const std::string py = (venv && *venv ? std::string(venv) : std::string(HS_SOURCE_DIR) + "/.venv-peers") + "/bin/python";
    if (std::system(fmt::format("'{}' -c 'import torch, tokenizers' 2>/dev/null", py).c_str()) != 0) {
        MESSAGE("skipped the reference check: no peers' venv with torch and tokenizers at " << py << " (scripts/setup_peers.sh)");
        return;
    }
    const int rc = std::system(fmt::format("'{}' '{}/tests/duo_passkey_check.py' --dump '{}' --tokenizer '{}' --haystack '{}'", py,
                                           HS_SOURCE_DIR, dump_file, tok_dir, hay_file)
                                   .c_str());
    CHECK(rc == 0);
}

TEST_CASE("duo-gates YAML: fit_data kind passkey fits on tinystories-656k; its bad values name the line") {
    const std::string head = "model: m\ndata:\n  r: {kind: repeated, length: 5, count: 2}\n";
    auto study = [](const std::string& body) { return "studies:\n  - name: s\n    sweep: duo-gates\n    mode: {kind: stream, sink: 1, recent: 2}\n" + body + "    metric: {kind: loss, data: r}\n"; };
    const std::string hay = std::string(HS_SOURCE_DIR) + "/datasets/needles/tinystories_haystack.txt";
    const auto p = parse_experiment_text(head + study("    fit_data: {kind: passkey, haystack: " + hay + ", length: 512}\n"), "exp.yaml", {}).studies.at(0);
    CHECK(p.fit_fresh);
    CHECK(p.fit_passkey);
    CHECK(p.passkey_length_min == 512);
    CHECK(p.passkey_length_max == 512);
    CHECK(p.passkey_length_intervals == 1);
    CHECK(p.passkey_count == 10);  // the reference's num_passkeys and passkey_length
    CHECK(p.passkey_words == 32);
    CHECK(p.passkey_depth_min == 0.05);  // scripts/train.sh's depths
    CHECK(p.passkey_depth_max == 0.95);
    CHECK(p.passkey_depth_intervals == 1000);
    // A range of lengths: scripts/train.sh's 50 intervals unless the study says.
    const auto q = parse_experiment_text(head + study("    fit_data: {kind: passkey, haystack: " + hay + ", length_min: 1000, length_max: 32000}\n"),
                                         "exp.yaml", {}).studies.at(0);
    CHECK(q.passkey_length_min == 1000);
    CHECK(q.passkey_length_max == 32000);
    CHECK(q.passkey_length_intervals == 50);
    const auto q2 = parse_experiment_text(head + study("    fit_data: {kind: passkey, haystack: " + hay +
                                                       ", length_min: 600, length_max: 900, length_intervals: 4, depth_min: 0.1, "
                                                       "depth_max: 0.9, depth_intervals: 20}\n"),
                                          "exp.yaml", {}).studies.at(0);
    CHECK(q2.passkey_length_intervals == 4);
    CHECK(q2.passkey_depth_min == 0.1);
    CHECK(q2.passkey_depth_max == 0.9);
    CHECK(q2.passkey_depth_intervals == 20);
    const std::string pk = "    fit_data: {kind: passkey, haystack: " + hay;
    CHECK(cfg_error(head + study(pk + ", length: 512, length_max: 900}\n")).find("'length_max' and 'length' exclude each other") != std::string::npos);
    CHECK(cfg_error(head + study(pk + ", length_min: 512}\n")).find("needs both 'length_min' and 'length_max' ('length_max' is missing)") !=
          std::string::npos);
    CHECK(cfg_error(head + study(pk + ", length_min: 900, length_max: 600}\n")).find("'length_min' 900 is above 'length_max' 600") !=
          std::string::npos);
    CHECK(cfg_error(head + study(pk + ", length: 512, depth_max: 1.5}\n")).find("'depth_max': expected a number in [0, 1], got 1.5") !=
          std::string::npos);
    CHECK(cfg_error(head + study(pk + ", length: 512, depth_min: 0.6, depth_max: 0.5}\n")).find("'depth_min' 0.6 is above 'depth_max' 0.5") !=
          std::string::npos);
    CHECK(cfg_error(head + study(pk + ", length: 512, depth_intervals: 5}\n")).find("'passkeys' 10 is above 'depth_intervals' 5") !=
          std::string::npos);
    CHECK(cfg_error(head + study("    fit_data: {kind: fresh, length_min: 64}\n")) == "exp.yaml:8:41: fit_data: 'length_min' applies to kind passkey only");
    CHECK(cfg_error(head + study("    fit_data: {kind: passkey, haystack: nofile.txt, length: 512}\n")) == "exp.yaml:8:41: haystack: cannot read nofile.txt");
    CHECK(cfg_error(head + study("    fit_data: {kind: passkey, haystack: " + hay + ", length: 512, passkeys: 21}\n"))
              .find("'passkeys': expected 1..20 (the reference's 20 ordinals), got 21") != std::string::npos);
    CHECK(cfg_error(head + study("    fit_data: {kind: passkey, length: 512}\n")) == "exp.yaml:8:15: fit_data: kind passkey needs 'haystack' (a text file)");
    CHECK(cfg_error(head + study("    fit_data: {kind: fresh, words: 4}\n")) == "exp.yaml:8:36: fit_data: 'words' applies to kind passkey only");
    CHECK(cfg_error(head + study("    fit_data: {kind: passkey, rows: 2}\n")) == "exp.yaml:8:37: fit_data: 'rows' applies to kind fresh only");

    HS_REQUIRE_TESTDATA(td);
    TempDir dir;
    const std::string exp = dir.file("p.yaml"), out = dir.file("p.h5");
    const std::string body = "model: {}\nseed: 3\ndata:\n  r: {{kind: repeated, length: 8, count: 2}}\n"
                             "studies:\n  - name: duo\n    sweep: duo-gates\n    mode: {{kind: stream, sink: 2, recent: 8}}\n"
                             "    train_window: {{sink: 4, recent: 16, block: 1}}\n"
                             "    fit_data: {{kind: passkey, haystack: {}, length: {}, passkeys: 2, words: 4}}\n"
                             "    fit_steps: 3\n    metric: {{kind: loss, data: r}}\n";
    std::ofstream(exp) << fmt::format(fmt::runtime(body), td + "/tinystories-656k", hay, 640);
    REQUIRE(run_cli(fmt::format("-q run '{}' --out '{}'", exp, out)) == 0);
    ResultReader rd(out);
    const Attrs a = rd.attrs("/ablation/duo/duo");
    CHECK(attr_to_string(a.at("fit_data")) == "passkey");
    CHECK(attr_to_string(a.at("passkeys")) == "2");
    CHECK(attr_to_string(a.at("passkey_words")) == "4");
    CHECK(rd.read_numbers("/ablation/duo/duo/history").shape == std::vector<int64_t>{3, 2});
    // A range of lengths (train.py's items): 40, 340 and 640 tokens of context; below the trimmed
    // haystack's 116 tokens the first is shorter, so the fit's steps change length.
    const std::string range_body = "model: {}\nseed: 3\ndata:\n  r: {{kind: repeated, length: 8, count: 2}}\n"
                                   "studies:\n  - name: duo\n    sweep: duo-gates\n    mode: {{kind: stream, sink: 2, recent: 8}}\n"
                                   "    train_window: {{sink: 4, recent: 16, block: 1}}\n"
                                   "    fit_data: {{kind: passkey, haystack: {}, length_min: 40, length_max: 640, length_intervals: 3, "
                                   "passkeys: 2, words: 4}}\n"
                                   "    fit_steps: 6\n    metric: {{kind: loss, data: r}}\n";
    std::ofstream(exp) << fmt::format(fmt::runtime(range_body), td + "/tinystories-656k", hay);
    REQUIRE(run_cli(fmt::format("-q run '{}' --out '{}'", exp, dir.file("r.h5"))) == 0);
    ResultReader rr(dir.file("r.h5"));
    const Attrs ra = rr.attrs("/ablation/duo/duo");
    CHECK(attr_to_string(ra.at("passkey_length_min")) == "40");
    CHECK(attr_to_string(ra.at("passkey_length_max")) == "640");
    CHECK(attr_to_string(ra.at("passkey_length_intervals")) == "3");
    CHECK(attr_to_string(ra.at("passkey_depth_intervals")) == "1000");
    CHECK(rr.read_numbers("/ablation/duo/duo/history").shape == std::vector<int64_t>{6, 2});
    // 2 passkeys of 4 words (224 tokens of pieces with this tokenizer) leave no haystack in 320 - 300 tokens: refused at the length's place.
    std::ofstream(exp) << fmt::format(fmt::runtime(body), td + "/tinystories-656k", hay, 320);
    CHECK(run_cli(fmt::format("-q run '{}' --out '{}'", exp, dir.file("q.h5"))) == 3);
}
