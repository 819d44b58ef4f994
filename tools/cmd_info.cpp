// headscope info: what a checkpoint is (architecture, sizes, tokenizer, memory) and, with
// --system, what this machine gives libtorch (threads, BLAS, measured GEMM rate).
#include "commands.h"
#include "common.h"
#include "system.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace hs::cli {

struct InfoOptions {
    ModelArgs model;
    bool system = false;
    bool json = false;
};

static void print_system() {
    auto s = system_info();
    const double gf = measure_gemm_gflops(512, 5);
    fmt::print("libtorch      {}\n", s.torch_version);
    fmt::print("threads       {} (of {} cores)\n", s.threads, s.cores);
    fmt::print("BLAS          {}{}\n", s.blas_kind, s.blas_library.empty() ? "" : " (" + s.blas_library + ")");
    fmt::print("fp32 GEMM     {:.1f} GFLOP/s (512x512, best of 5)\n", gf);
    std::string why;
    const auto devs = cuda_devices(&why);
    fmt::print("CUDA          {}; libtorch {}\n", devs.empty() ? why : fmt::format("{} device(s)", devs.size()),
               s.cuda_available ? "uses CUDA" : "cannot use CUDA here (a CPU build, or no usable GPU)");
    for (const auto& d : devs) {
        const double tf = s.cuda_available ? measure_cuda_gemm_tflops(d.index) : -1;
        fmt::print("  cuda:{}      {} (compute {}.{}), {:.1f} GiB{}\n", d.index, d.name, d.cc_major, d.cc_minor,
                   static_cast<double>(d.total_bytes) / (1 << 30),
                   tf > 0 ? fmt::format(", bf16 GEMM {:.0f} TFLOP/s (8192x8192, best of 10)", tf) : "");
    }
}

void run_info(const InfoOptions& o) {
    if (o.model.model.empty()) {
        set_threads(o.model.threads);
        print_system();
        return;
    }
    auto l = open_model(o.model, false);
    const auto& c = l.model->config;
    const int64_t n = l.model->n_params();
    const double mb = static_cast<double>(n) * c10::elementSize(l.model->options.dtype) / (1 << 20);
    const ModelSource& src = l.model->source;
    if (o.json) {
        nlohmann::json j = {{"path", l.model->path},
                            {"source", {{"format", src.format}, {"hub_repo", src.hub_repo},
                                        {"hub_revision", src.hub_revision}, {"hub_commit", src.hub_commit},
                                        {"snapshot", src.snapshot}}},
                            {"architecture", c.architecture},
                            {"family", family_name(c.family)}, {"n_layers", c.n_layers}, {"n_heads", c.n_heads},
                            {"n_kv_heads", c.n_kv_heads}, {"d_model", c.d_model}, {"d_head", c.d_head},
                            {"d_ff", c.d_ff}, {"vocab_size", c.vocab_size}, {"max_seq_len", c.max_seq_len},
                            {"n_params", n}, {"dtype", std::string(c10::toString(l.model->options.dtype))},
                            {"tokenizer", l.tokenizer ? l.tokenizer->source_path() : ""}};
        fmt::print("{}\n", j.dump(2));
    } else {
        fmt::print("model         {}\n", l.model->path);
        // The format, and for a Hugging Face cache name what it resolved to (the snapshot is the model line).
        const std::string format = src.format.empty() ? std::string("unknown format") : src.format;
        if (src.hub_repo.empty())
            fmt::print("source        {}\n", format);
        else
            fmt::print("source        {}, Hugging Face cache {}@{} -> commit {}\n", format, src.hub_repo,
                       src.hub_revision, src.hub_commit);
        fmt::print("architecture  {} (family {})\n", c.architecture, family_name(c.family));
        fmt::print("layers        {}\n", c.n_layers);
        fmt::print("heads         {} query, {} key/value (query head h reads kv head h / {})\n", c.n_heads,
                   c.n_kv_heads, c.kv_group());
        fmt::print("d_model       {} (head dim {}, MLP {})\n", c.d_model, c.d_head, c.d_ff);
        fmt::print("vocab         {}\n", c.vocab_size);
        fmt::print("context       {}\n", c.max_seq_len);
        fmt::print("parameters    {} ({:.2f} MiB as {})\n", n, mb, c10::toString(l.model->options.dtype));
        fmt::print("tokenizer     {}\n",
                   l.tokenizer ? fmt::format("{} ({}, {} tokens)", l.tokenizer->source_path(), l.tokenizer->kind(),
                                             l.tokenizer->vocab_size())
                               : std::string("none found"));
    }
    if (o.system) print_system();
}

void setup_info(CLI::App& app) {
    auto opts = std::make_shared<InfoOptions>();
    auto* sub = app.add_subcommand("info", "describe a model checkpoint, or this machine with --system\n"
                                           "Example: headscope info ../shared/testdata/stories260K/stories260K.bin");
    sub->add_option("model", opts->model.model, "checkpoint folder or llama2.c .bin, or a Hugging Face cache name "
                                                "org/name[@revision] (omit with --system)");
    sub->add_option("--tokenizer", opts->model.tokenizer, "tokenizer path or Hugging Face cache name (default: found "
                                                          "next to the model)");
    sub->add_option("--dtype", opts->model.dtype, "compute dtype (auto: bfloat16 on CUDA, float32 on the CPU)")
        ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}));
    sub->add_option("--threads", opts->model.threads, "intra-op threads (default: every core)");
    sub->add_flag("--system", opts->system, "print threads, BLAS library, measured fp32 GEMM rate, and the CUDA devices with their memory and measured bf16 GEMM rate");
    sub->add_flag("--json", opts->json, "print the model description as JSON");
    sub->callback([opts, sub] {
        if (opts->model.model.empty() && !opts->system) throw CLI::RequiredError("MODEL (or --system)");
        run_info(*opts);
    });
}

}  // namespace hs::cli
