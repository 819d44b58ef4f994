#include "common.h"
#include "study_config.h"

#include "errors.h"
#include "hs_git_commit.h"
#include "hub.h"
#include "jobs.h"
#include "progress.h"
#include "score_records.h"
#include "torch_compat.h"
#include "system.h"
#include "util.h"

#include <torch/torch.h>

namespace hs::cli {

std::vector<float> host_floats(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kFloat).contiguous();
    return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

static std::string g_cmdline;

void set_command_line(int argc, char** argv) {
    g_cmdline.clear();
    for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        bool quote = a.find_first_of(" \t\"'") != std::string::npos || a.empty();
        g_cmdline += (i ? " " : "") + (quote ? "'" + a + "'" : a);
    }
}
const std::string& command_line() { return g_cmdline; }

static std::string number_text(double v) { return fmt::format("{}", v); }

CLI::Validator at_least(double lo) {
    return CLI::Validator(
        [lo](std::string& s) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(s, v)) return fmt::format("'{}' is not a number", s);
            return v < lo ? fmt::format("{} is below {}", s, number_text(lo)) : std::string();
        },
        fmt::format(">= {}", number_text(lo)));
}

CLI::Validator in_range(double lo, double hi) {
    return CLI::Validator(
        [lo, hi](std::string& s) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(s, v)) return fmt::format("'{}' is not a number", s);
            return v < lo || v > hi ? fmt::format("{} is outside [{}, {}]", s, number_text(lo), number_text(hi)) : std::string();
        },
        fmt::format("in [{}, {}]", number_text(lo), number_text(hi)));
}

void add_model_args(CLI::App* app, ModelArgs& a) {
    app->add_option("model", a.model, "checkpoint folder (config.json + safetensors) or llama2.c .bin, or a Hugging "
                                      "Face cache name org/name[@revision] (offline: the local cache only)")->required();
    app->add_option("--tokenizer", a.tokenizer, "tokenizer.json, vocab.json+merges.txt folder or llama2.c tok.bin, or a "
                                                "Hugging Face cache name org/name[@revision] (default: found next to the model)");
    app->add_option("--dtype", a.dtype, "compute dtype: auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16, float16")
        ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}))
        ->capture_default_str();
    app->add_option("--device", a.device, "cpu, cuda or cuda:N")->capture_default_str();
    app->add_option("--attention", a.attention,
                    "attention kernel where no pattern is observed: auto (on an AVX2 or AVX-512 CPU in float32 headscope's lane "
                    "kernel for 20+ queries; else libtorch's fused kernel where it has one: libtorch >= 2.1, CUDA or CPU; "
                    "else blocked), blocked, fused (libtorch >= 2.1); docs/forward.md")
        ->check(CLI::IsMember({"auto", "blocked", "fused"}))
        ->capture_default_str();
    app->add_option("--threads", a.threads, "intra-op threads (default: every core)");
}

void add_output_args(CLI::App* app, OutputArgs& o, bool required, const std::string& what) {
    auto* opt = app->add_option("-o,--out", o.out, what);
    if (required) opt->required();
    app->add_flag("--force", o.force, "replace an existing output file");
    app->add_flag("--append", o.append, "add results to an existing HDF5 file of the same model");
}

LoadOptions load_options(const ModelArgs& a) {
    LoadOptions o;
    try {
        o.device = c10::Device(a.device);
    } catch (const std::exception&) {
        throw UsageError(fmt::format("--device '{}': expected cpu, cuda or cuda:N", a.device));
    }
    if (o.device.is_cuda() && !torch::cuda::is_available())
        throw UsageError(fmt::format("--device {}: this libtorch build or machine has no CUDA", a.device));
    if (o.device.is_cuda() && o.device.has_index() && o.device.index() >= static_cast<int>(torch::cuda::device_count()))
        throw UsageError(fmt::format("--device {}: this machine has {} CUDA device(s) (cuda:0..cuda:{})", a.device,
                                     torch::cuda::device_count(), static_cast<int>(torch::cuda::device_count()) - 1));
    if (a.dtype == "auto") o.dtype = o.device.is_cuda() ? c10::kBFloat16 : c10::kFloat;
    else o.dtype = a.dtype == "bfloat16" ? c10::kBFloat16 : a.dtype == "float16" ? c10::kHalf : c10::kFloat;
    o.attention = a.attention == "fused" ? AttentionKernel::kFused : a.attention == "blocked" ? AttentionKernel::kBlocked
                                                                                               : AttentionKernel::kAuto;
    if (o.attention == AttentionKernel::kFused && !compat::has_fused_attention())
        throw UsageError(fmt::format("--attention fused: this build's libtorch {} has no fused attention (2.1 or later; "
                                     "README, \"Building for a GPU\")", TORCH_VERSION));
    if (o.device.is_cpu() && o.dtype != c10::kFloat && !cpu_gemm_supported(o.dtype))
        throw UsageError(fmt::format("--dtype {}: this libtorch build ({}) cannot multiply {} matrices on the CPU; use "
                                     "float32{}", a.dtype, TORCH_VERSION, a.dtype,
                                     cpu_gemm_supported(c10::kBFloat16) ? " or bfloat16" : ""));
    return o;
}

void warn_if_slow_dtype(const LoadOptions& o) {
    if (!o.device.is_cpu() || o.dtype == c10::kFloat) return;
    // Measured once (~0.1 s): CPUs without native bf16 products fall back to a slow kernel.
    const double low = measure_gemm_gflops(256, 3, o.dtype), f32 = measure_gemm_gflops(256, 3, c10::kFloat);
    if (low < 0.8 * f32)
        log_warn(fmt::format("{} matrix products run at {:.1f} GFLOP/s on this CPU against {:.1f} for float32 (no "
                             "native {} support): this run will be up to {:.0f}x slower than with --dtype float32",
                             c10::toString(o.dtype), low, f32, c10::toString(o.dtype), f32 / std::max(low, 1e-9)));
    else
        log_verbose("{} products {:.1f} GFLOP/s, float32 {:.1f}", c10::toString(o.dtype), low, f32);
}

WriteMode write_mode(const OutputArgs& o) {
    if (o.force && o.append) throw UsageError("--force and --append exclude each other");
    return o.append ? WriteMode::kAppend : o.force ? WriteMode::kForce : WriteMode::kCreate;
}

ResultWriter open_result(const std::string& path, WriteMode mode) {
    return with_overwrite_flags(true, [&] { return ResultWriter(path, mode); });
}

Loaded open_model(const ModelArgs& a, bool require_tokenizer) {
    int n = set_threads(a.threads);
    auto sys = system_info();
    if (sys.blas_slow) log_warn("libtorch is using the reference BLAS: " + sys.blas_kind);
    log_verbose("threads {}, BLAS {}", n, sys.blas_kind);
    Loaded l;
    const LoadOptions lo = load_options(a);
    warn_if_slow_dtype(lo);
    l.model = load_model(a.model, lo);
    if (!a.tokenizer.empty())
        l.tokenizer = load_tokenizer(tokenizer_location(a.tokenizer), l.model->config.vocab_size);
    else  // next to the checkpoint on disk (a hub name's snapshot folder)
        l.tokenizer = find_tokenizer_for_model(l.model->path, l.model->config.vocab_size);
    if (require_tokenizer && !l.tokenizer)
        throw DataError(fmt::format("{}: no tokenizer found next to the model (pass --tokenizer)", l.model->path));
    if (l.tokenizer && l.tokenizer->vocab_size() > l.model->config.vocab_size)
        throw DataError(fmt::format("{}: tokenizer has {} tokens but the model only {}", l.tokenizer->source_path(),
                                    l.tokenizer->vocab_size(), l.model->config.vocab_size));
    return l;
}

std::string tokenizer_location(const std::string& spec) {
    if (file_exists(spec) || !looks_like_hub_name(spec)) return spec;
    try {
        return resolve_hub_name(spec).folder;
    } catch (const ModelLoadError& e) {
        throw DataError(e.what());
    }
}

void write_meta(ResultWriter& w, const Model& m, int64_t seed) {
    const auto& c = m.config;
    schema::MetaRecord r;
    r.tool_version = HS_VERSION, r.git_commit = HS_GIT_COMMIT, r.command_line = command_line(), r.utc_time = utc_now_iso8601();
    r.model_path = m.path, r.weights_sha256 = m.weights_sha256();
    r.model_format = m.source.format, r.hub_repo = m.source.hub_repo, r.hub_revision = m.source.hub_revision;
    r.hub_commit = m.source.hub_commit;
    r.architecture = c.architecture, r.family = family_name(c.family);
    r.n_layers = c.n_layers, r.n_heads = c.n_heads, r.n_kv_heads = c.n_kv_heads;
    r.d_model = c.d_model, r.d_head = c.d_head, r.vocab_size = c.vocab_size;
    r.dtype = c10::toString(m.options.dtype), r.device = m.options.device.str();
    r.fused_attention = fused_attention_enabled(m.options);
    r.threads = torch::get_num_threads(), r.seed = seed;
    r.study_config = study_config_text();  // --config's file, as read ("": none)
    schema::write_run_meta(w, r);
}

void check_same_model(ResultWriter& w, const Model& m) {
    // A file without /meta's weights_sha256 is not refused (older files); else the job runner's one
    // identity check, on the model alone.
    std::string sha = w.read_attr_string(schema::meta(), "weights_sha256");
    if (!sha.empty() && jobs::compare(sha, {}, "", jobs::Identity{m.weights_sha256(), {}, {}, {}, {}}))
        throw StorageError(fmt::format("{}: holds results of another model ({}); refusing to mix", w.path(),
                                       w.read_attr_string(schema::meta(), "model_path")));
}

}  // namespace hs::cli
