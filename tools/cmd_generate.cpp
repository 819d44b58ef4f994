// headscope generate: greedy (default) or sampled continuation with a KV cache; with --rows,
// --contrast (DeCoRe) or --enhance/--suppress (JUICE), several intervention rows decode in lockstep
// (probes/decoding/decoding.h).
#include "commands.h"
#include "common.h"
#include "decoding.h"
#include "decoding_args.h"
#include "errors.h"
#include "progress.h"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <cstdio>

namespace hs::cli {

struct GenerateOptions {
    ModelArgs model;
    std::string prompt;
    std::string tokens;
    int steps = 64;
    double temperature = 0.0;
    double top_p = 1.0;
    int64_t seed = 0;
    bool no_stop = false;
    // intervention rows
    std::vector<std::string> rows;
    DecodingArgs decoding;
    bool json = false;
    bool exact_rows = false;
};

// Next token from logits [V]: argmax at temperature 0, else nucleus sampling.
static int64_t pick(const at::Tensor& logits, double temperature, double top_p, torch::Generator& gen) {
    if (temperature <= 0) return logits.argmax().item<int64_t>();
    auto probs = torch::softmax(logits.to(torch::kDouble) / temperature, -1);
    if (top_p < 1.0) {
        auto sorted = probs.sort(-1, true);
        auto vals = std::get<0>(sorted), idx = std::get<1>(sorted);
        auto keep = (vals.cumsum(-1) - vals) < top_p;  // smallest prefix reaching top_p
        vals = vals * keep;
        auto choice = torch::multinomial(vals / vals.sum(), 1, false, gen).item<int64_t>();
        return idx[choice].item<int64_t>();
    }
    return torch::multinomial(probs, 1, false, gen).item<int64_t>();
}

// The decoding rows the options ask for (none: plain generation).
static std::optional<DecodingSpec> decoding_from_options(const GenerateOptions& o, int L, int H) {
    const bool contrast = o.decoding.decore(), juice = o.decoding.juice();
    if (int(contrast) + int(juice) + int(!o.rows.empty()) > 1)
        throw UsageError("give one of --rows, --contrast and --enhance/--suppress");
    if (!contrast && !juice && o.rows.empty()) return std::nullopt;
    if (o.temperature > 0) throw UsageError("intervention rows decode greedily: --temperature must be 0");
    DecodingSpec spec;
    if (contrast) {
        spec = decore_from(o.decoding, L, H);
    } else if (juice) {
        spec = juice_from(o.decoding, L, H);
    } else {
        spec.rows.push_back(DecodingRow{});  // row 0: the plain model
        for (const auto& r : o.rows) spec.rows.push_back(with_flag("--rows", [&] { return parse_decoding_row(r, L, H); }));
    }
    spec.max_new_tokens = o.steps;
    spec.exact_rows = o.exact_rows;
    return spec;
}

// Several rows in lockstep: the combined text on stdout (or JSON with every row).
static void generate_rows(const GenerateOptions& o, const Loaded& l, const std::vector<int64_t>& ids, const DecodingSpec& spec) {
    const auto& tok = l.tokenizer;
    auto stop = [&](int64_t id) {
        return !o.no_stop && tok && ((tok->bos_id() && id == *tok->bos_id()) || (tok->eos_id() && id == *tok->eos_id()));
    };
    const auto t0 = std::chrono::steady_clock::now();
    const DecodingOut out = decode_rows(*l.model, ids, spec, stop);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto text = [&](const std::vector<int64_t>& t) {
        return tok ? tok->decode(std::vector<int32_t>(t.begin(), t.end())) : std::string();
    };
    if (o.json) {
        nlohmann::json rows = nlohmann::json::array();
        for (size_t r = 0; r < spec.rows.size(); ++r) {
            nlohmann::json row = {{"row", r}, {"tokens", out.row_tokens[r]}, {"text", text(out.row_tokens[r])}};
            if (spec.rule == CombineRule::kIndependent) row["interventions"] = format_decoding_row(spec.rows[r]);
            rows.push_back(row);
        }
        nlohmann::json j = {{"rule", std::string(name_in(combine_rule_names(), spec.rule))}, {"tokens", out.tokens}, {"text", text(out.tokens)},
                            {"margins", out.margins}, {"rows", rows}};
        if (spec.rule == CombineRule::kDecore) {
            j["contrast_heads"] = format_heads(spec.rows[1].heads);
            j["alphas"] = out.alphas;
        }
        if (spec.rule == CombineRule::kJuice) {
            j["enhance"] = format_heads(spec.enhance), j["alpha_enhance"] = spec.alpha_enhance;
            j["suppress"] = format_heads(spec.suppress), j["alpha_suppress"] = spec.alpha_suppress;
        }
        std::printf("%s\n", j.dump(2).c_str());
    } else if (spec.rule == CombineRule::kIndependent) {
        for (size_t r = 0; r < spec.rows.size(); ++r)
            std::printf("row %zu %-24s %s\n", r, format_decoding_row(spec.rows[r]).c_str(),
                        tok ? text(out.row_tokens[r]).c_str() : fmt::format("{}", fmt::join(out.row_tokens[r], " ")).c_str());
    } else {
        std::printf("%s\n", tok ? text(out.tokens).c_str() : fmt::format("{}", fmt::join(out.tokens, " ")).c_str());
    }
    log_verbose("{} steps x {} rows in {:.2f} s ({:.1f} steps/s)", out.row_tokens[0].size(), spec.rows.size(), dt,
                            out.row_tokens[0].size() / std::max(dt, 1e-9));
}

// Plain decoding as JSON: the keys of the rows' JSON, for the one row of the plain model.
static void print_plain_json(const Loaded& l, const std::vector<int64_t>& out, const std::vector<double>& margins) {
    const std::string text = l.tokenizer ? l.tokenizer->decode(std::vector<int32_t>(out.begin(), out.end())) : std::string();
    nlohmann::json row = {{"row", 0}, {"tokens", out}, {"text", text}, {"interventions", "none"}};
    nlohmann::json j = {{"rule", std::string(name_in(combine_rule_names(), CombineRule::kIndependent))},
                        {"tokens", out},
                        {"text", text},
                        {"margins", margins},
                        {"rows", nlohmann::json::array({row})}};
    std::printf("%s\n", j.dump(2).c_str());
}

void run_generate(const GenerateOptions& o) {
    auto l = open_model(o.model, o.tokens.empty());
    const auto& cfg = l.model->config;
    std::vector<int64_t> ids;
    if (!o.tokens.empty()) {
        ids = with_flag({{"--tokens", "token_list"}}, [&] { return parse_token_list(o.tokens); });
    } else {
        for (auto id : l.tokenizer->encode(o.prompt, true)) ids.push_back(id);
    }
    if (ids.empty()) throw DataError("the prompt encodes to no tokens (the tokenizer adds no BOS): give a prompt");
    if (auto spec = decoding_from_options(o, cfg.n_layers, cfg.n_heads)) return generate_rows(o, l, ids, *spec);
    torch::NoGradGuard ng;
    c10::InferenceMode im;
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
    KVCache cache;
    cache.reserve(static_cast<int64_t>(ids.size()) + o.steps);
    std::vector<int64_t> seq = ids;
    auto emit = [&](int64_t prev, int64_t id) {
        if (l.tokenizer) {
            std::string piece = l.tokenizer->decode_piece(static_cast<int32_t>(prev), static_cast<int32_t>(id));
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
        } else {
            std::printf("%lld ", static_cast<long long>(id));
        }
    };
    std::vector<int64_t> out;     // the new tokens (--json)
    std::vector<double> margins;  // per step: the chosen token's logit minus the best other's (--json)
    if (!o.json)
        for (size_t i = 1; i < ids.size(); ++i) emit(ids[i - 1], ids[i]);
    auto t0 = std::chrono::steady_clock::now();
    auto input = torch::tensor(ids, torch::kLong).unsqueeze(0);
    int generated = 0;
    for (int s = 0; s < o.steps; ++s) {
        if (static_cast<int64_t>(seq.size()) >= cfg.max_seq_len) {
            log_warn(fmt::format("stopped at the model's context of {} tokens", cfg.max_seq_len));
            break;
        }
        auto logits = l.model->forward(input, nullptr, &cache);  // [1, t, V]
        const auto last = logits[0][-1].to(torch::kFloat).cpu();
        int64_t next = pick(last, o.temperature, o.top_p, gen);
        // llama2.c convention: a BOS (or EOS) ends the story.
        if (!o.no_stop && l.tokenizer &&
            ((l.tokenizer->bos_id() && next == *l.tokenizer->bos_id()) ||
             (l.tokenizer->eos_id() && next == *l.tokenizer->eos_id())))
            break;
        if (o.json) out.push_back(next), margins.push_back(token_margin(last.to(torch::kDouble), next));
        else emit(seq.back(), next);
        seq.push_back(next);
        ++generated;
        input = torch::tensor({next}, torch::kLong).unsqueeze(0);
    }
    if (o.json) print_plain_json(l, out, margins);
    else std::printf("\n");
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_verbose("{} tokens in {:.2f} s ({:.1f} tok/s)", generated, dt, generated / std::max(dt, 1e-9));
}

void setup_generate(CLI::App& app) {
    auto o = std::make_shared<GenerateOptions>();
    auto* sub = app.add_subcommand("generate", "continue a prompt, greedy by default (KV cache)\n"
                                               "Example: headscope generate ../shared/testdata/stories260K/stories260K.bin "
                                               "--prompt 'Once upon a time' --steps 50\n"
                                               "Example: headscope generate ../shared/testdata/stories260K/stories260K.bin "
                                               "--prompt 'Once upon a time' --steps 20 --contrast L1H0,L2H3 --json");
    add_model_args(sub, o->model);
    sub->add_option("--prompt", o->prompt, "prompt text (BOS added as the tokenizer says)");
    sub->add_option("--tokens", o->tokens, "prompt as comma-separated token ids instead of text");
    sub->add_option("--steps", o->steps, "new tokens to generate")->check(at_least(0))->capture_default_str();
    sub->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
    sub->add_option("--top-p", o->top_p, "nucleus sampling mass")->capture_default_str();
    sub->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
    sub->add_flag("--no-stop", o->no_stop, "do not stop at BOS/EOS");
    sub->add_option("--rows", o->rows,
                    "more rows decoding the same prompt in one batched forward, each with its head interventions: "
                    "MODE:HEADS with MODE zero, zero-query or scale=F (e.g. --rows zero-query:L1H0,L1H1 --rows "
                    "scale=2:L0H1); row 0 is the plain model; each row decodes greedily on its own");
    add_decoding_args(sub, o->decoding);
    sub->add_flag("--exact-rows", o->exact_rows,
                  "rows: one GEMM per row, each row bit-identical to its unbatched run (default: one folded GEMM for "
                  "all rows, the weights read once a step; rows equal up to rounding)");
    sub->add_flag("--json", o->json, "print the new token ids and text as JSON (key tokens: the combined output; with rows, "
                                     "also each row's; plain decoding is the one row 0)");
    sub->callback([o] { run_generate(*o); });
}

}  // namespace hs::cli
