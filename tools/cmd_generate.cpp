// headscope generate: greedy (default) or sampled continuation with a KV cache.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "progress.h"

#include <torch/torch.h>

#include <chrono>
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

int run_generate(const GenerateOptions& o) {
    auto l = open_model(o.model, o.tokens.empty());
    const auto& cfg = l.model->config;
    std::vector<int64_t> ids;
    if (!o.tokens.empty()) {
        ids = parse_token_list(o.tokens, "--tokens");
    } else {
        for (auto id : l.tokenizer->encode(o.prompt, true)) ids.push_back(id);
    }
    if (ids.empty()) throw DataError("the prompt encodes to no tokens (the tokenizer adds no BOS): give a prompt");
    if (o.steps < 0) throw UsageError("--steps must be >= 0");
    torch::NoGradGuard ng;
    c10::InferenceMode im;
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
    KVCache cache;
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
        int64_t next = pick(logits[0][-1].to(torch::kFloat).cpu(), o.temperature, o.top_p, gen);
        // llama2.c convention: a BOS (or EOS) ends the story.
        if (!o.no_stop && l.tokenizer &&
            ((l.tokenizer->bos_id() && next == *l.tokenizer->bos_id()) ||
             (l.tokenizer->eos_id() && next == *l.tokenizer->eos_id())))
            break;
        emit(seq.back(), next);
        seq.push_back(next);
        ++generated;
        input = torch::tensor({next}, torch::kLong).unsqueeze(0);
    }
    std::printf("\n");
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log_verbose(fmt::format("{} tokens in {:.2f} s ({:.1f} tok/s)", generated, dt, generated / std::max(dt, 1e-9)));
    return 0;
}

void setup_generate(CLI::App& app) {
    auto o = std::make_shared<GenerateOptions>();
    auto* sub = app.add_subcommand("generate", "continue a prompt, greedy by default (KV cache)\n"
                                               "Example: headscope generate ../shared/testdata/stories260K/stories260K.bin "
                                               "--prompt 'Once upon a time' --steps 50");
    add_model_args(sub, o->model);
    sub->add_option("--prompt", o->prompt, "prompt text (BOS added as the tokenizer says)");
    sub->add_option("--tokens", o->tokens, "prompt as comma-separated token ids instead of text");
    sub->add_option("--steps", o->steps, "new tokens to generate")->capture_default_str();
    sub->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
    sub->add_option("--top-p", o->top_p, "nucleus sampling mass")->capture_default_str();
    sub->add_option("--seed", o->seed, "sampling seed")->capture_default_str();
    sub->add_flag("--no-stop", o->no_stop, "do not stop at BOS/EOS");
    sub->callback([o] { set_exit_code(run_generate(*o)); });
}

}  // namespace hs::cli
