// load_model: Hugging Face folders (config.json + safetensors, sharded or not) and llama2.c .bin.
#include "errors.h"
#include "../families/registry.h"
#include "gguf.h"
#include "gguf_model.h"
#include "hub.h"
#include "model.h"
#include "util.h"
#include "weight_source.h"

#include <torch/torch.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace hs {

// ---- WeightSource ----

WeightSource::WeightSource(std::vector<std::string> files, LoadOptions opts) : files_(std::move(files)), opts_(opts) {
    for (const auto& f : files_) st_.push_back(std::make_unique<SafetensorsFile>(f));
}

WeightSource::WeightSource(std::string file, std::map<std::string, at::Tensor> tensors, LoadOptions opts)
    : files_{std::move(file)}, mem_(std::move(tensors)), opts_(opts) {}

const SafetensorsFile* WeightSource::find(const std::string& name) const {
    for (const auto& s : st_)
        if (s->has(name)) return s.get();
    return nullptr;
}

double WeightSource::stored_values(double* largest) const {
    double n = 0, big = 0;
    for (const auto& [name, t] : mem_) {
        n += static_cast<double>(t.numel());
        big = std::max(big, static_cast<double>(t.numel()));
    }
    for (const auto& s : st_)
        for (const auto& [name, e] : s->entries()) {
            double k = 1;
            for (auto d : e.shape) k *= static_cast<double>(d);
            n += k;
            big = std::max(big, k);
        }
    if (largest) *largest = big;
    return n;
}

bool WeightSource::has(const std::string& name) const { return mem_.count(name) != 0 || find(name) != nullptr; }

std::string WeightSource::describe() const {
    if (files_.size() == 1) return files_[0];
    return fmt::format("{} (+{} shards)", files_[0], files_.size() - 1);
}

at::Tensor WeightSource::raw(const std::string& name) const {
    if (auto it = mem_.find(name); it != mem_.end()) return it->second;
    const SafetensorsFile* s = find(name);
    if (!s) throw ModelLoadError(fmt::format("{}: missing tensor '{}'", describe(), name));
    const auto& e = s->entry(name);
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64")
        throw ModelLoadError(fmt::format("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", s->path(), name, e.dtype));
    return s->get(name);
}

at::Tensor WeightSource::convert(const at::Tensor& t) const {
    return t.to(opts_.device, opts_.dtype).contiguous();
}

at::Tensor WeightSource::take(const std::string& name, const std::vector<int64_t>& shape) const {
    auto t = raw(name);
    if (t.sizes().vec() != shape)
        throw ModelLoadError(fmt::format("{}: tensor '{}' has shape {}, expected {}", find(name) ? find(name)->path() : files_[0], name,
                                         shape_str(t.sizes().vec()), shape_str(shape)));
    return convert(t);
}

at::Tensor WeightSource::take_optional(const std::string& name, const std::vector<int64_t>& shape) const {
    return has(name) ? take(name, shape) : at::Tensor();
}

// ---- Hugging Face folders ----

static nlohmann::json read_json(const std::string& path, bool config) {
    std::string text;
    try {
        text = read_text_file(path);
    } catch (const DataError& e) {
        if (config) throw ConfigError(e.what());
        throw ModelLoadError(e.what());
    }
    try {
        return nlohmann::json::parse(text);
    } catch (const std::exception&) {
        std::string m = fmt::format("{}: not valid JSON", path);
        if (config) throw ConfigError(m);
        throw ModelLoadError(m);
    }
}

static std::vector<std::string> weight_files(const std::string& dir) {
    const std::string single = path_join(dir, "model.safetensors");
    if (file_exists(single)) return {single};
    const std::string index = path_join(dir, "model.safetensors.index.json");
    if (!file_exists(index))
        throw ModelLoadError(fmt::format("{}: no model.safetensors or model.safetensors.index.json", dir));
    auto j = read_json(index, false);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw ModelLoadError(fmt::format("{}: no \"weight_map\" object", index));
    std::set<std::string> seen;
    std::vector<std::string> files;
    for (auto& [name, f] : j["weight_map"].items()) {
        if (!f.is_string()) throw ModelLoadError(fmt::format("{}: weight_map[\"{}\"] is not a file name", index, name));
        auto s = f.get<std::string>();
        if (s.find('/') != std::string::npos) throw ModelLoadError(fmt::format("{}: shard name '{}' has a path", index, s));
        if (seen.insert(s).second) files.push_back(path_join(dir, s));
    }
    std::sort(files.begin(), files.end());
    return files;
}

// The fewest values any supported family stores for this config: embedding, q/k/v/o, the MLP's
// two or three matrices, learned positions. Counted in double so that absurd sizes cannot wrap.
static double implied_parameters(const ModelConfig& c) {
    const double D = c.d_model, L = c.n_layers, V = c.vocab_size, F = c.d_ff;
    const double Q = static_cast<double>(c.n_heads) * c.d_head, KV = static_cast<double>(c.n_kv_heads) * c.d_head;
    const double per_layer = D * Q + 2 * D * KV + Q * D + (c.gated_mlp ? 3 : 2) * D * F;
    return V * D + L * per_layer + (c.learned_positions ? static_cast<double>(c.max_seq_len) * D : 0);
}

// A config whose sizes need more values than the checkpoint's files hold (beyond the slack of its
// largest tensor) is refused here, before
// any tensor is built (a layer count of 2^31 would otherwise allocate its layer table first).
static void check_config_fits_checkpoint(const ModelConfig& c, const std::string& cfg_path, const WeightSource& src) {
    double largest = 0;
    const double stored = src.stored_values(&largest);
    const double need = implied_parameters(c);
    // The slack of one tensor keeps a checkpoint that merely lacks one tensor on the path that
    // names it ("missing tensor ..."); a config off by orders of magnitude never fits in it.
    if (need > stored + largest)
        throw ModelLoadError(fmt::format(
            "{}: {} describes at least {:.4g} parameters ({} layers, hidden {}, {} heads of {}, MLP {}, vocabulary {}), "
            "but the checkpoint holds only {:.4g} values",
            src.describe(), cfg_path, need, c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_ff, c.vocab_size, stored));
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& where) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(json_text);
    } catch (const std::exception&) {
        throw ConfigError(fmt::format("{}: not valid JSON", where));
    }
    if (!j.is_object()) throw ConfigError(fmt::format("{}: not a JSON object", where));
    std::string arch;
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
        j["architectures"][0].is_string())
        arch = j["architectures"][0].get<std::string>();
    else
        throw ConfigError(fmt::format("{}: no \"architectures\" list naming the model class", where));
    const ArchSpec* spec = find_arch(arch);
    if (!spec) {
        std::string names;
        for (const auto& s : arch_specs()) names += (names.empty() ? "" : ", ") + s.architecture;
        throw ConfigError(fmt::format("{}: unknown architecture '{}' (supported: {})", where, arch, names));
    }
    ModelConfig c;
    c.architecture = arch;
    spec->parse_config(j, where, c);
    c.family = spec->family;
    c.validate(where);
    return c;
}

static std::unique_ptr<Model> load_hf(const std::string& dir, const LoadOptions& opts) {
    const std::string cfg_path = path_join(dir, "config.json");
    if (!file_exists(cfg_path)) throw ConfigError(fmt::format("{}: no config.json in the folder", dir));
    std::string text;
    try {
        text = read_text_file(cfg_path);
    } catch (const DataError& e) {
        throw ConfigError(e.what());
    }
    auto m = std::make_unique<Model>();
    m->path = dir;
    m->source.format = "safetensors";
    m->options = opts;
    m->config = parse_model_config(text, cfg_path);
    const ArchSpec* spec = find_arch(m->config.architecture);
    WeightSource src(weight_files(dir), opts);
    check_config_fits_checkpoint(m->config, cfg_path, src);
    m->weight_files.clear();
    for (const auto& f : src.files()) m->weight_files += (m->weight_files.empty() ? "" : ";") + f;
    spec->load_weights(src, *m);
    return m;
}

// ---- llama2.c legacy .bin ----

// Hugging Face's convert_llama_weights_to_hf permutation: llama2.c rotates adjacent pairs
// (2i, 2i+1); rotate_half pairs (i, i + d/2). Permuting q/k rows per head makes the scores equal.
static at::Tensor permute_rope_rows(const at::Tensor& w, int64_t n_heads, int64_t d_head) {
    const int64_t in = w.size(1);
    return w.view({n_heads, d_head / 2, 2, in}).transpose(1, 2).reshape({n_heads * d_head, in});
}

static std::unique_ptr<Model> load_llama2c(const std::string& path, const LoadOptions& opts) {
    MappedFile f(path);
    if (f.size() < 28) throw ModelLoadError(fmt::format("{}: truncated: {} bytes, header needs 28", path, f.size()));
    int32_t h[7];
    std::memcpy(h, f.data(), sizeof h);
    auto m = std::make_unique<Model>();
    m->path = path;
    m->source.format = "llama2c";
    m->weight_files = path;
    m->options = opts;
    ModelConfig& c = m->config;
    c.architecture = "llama2c";
    c.family = Family::kLlama;
    c.d_model = h[0];
    c.d_ff = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    const bool shared = h[5] > 0;
    c.vocab_size = std::abs(h[5]);
    c.max_seq_len = h[6];
    c.norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.tie_embeddings = shared;
    c.bos_id = 1;
    c.eos_id = 2;
    for (int i = 0; i < 7; ++i)
        if (h[i] <= 0 && i != 5) throw ConfigError(fmt::format("{}: header field {} is {} (not a llama2.c checkpoint?)", path, i, h[i]));
    if (c.n_heads > 0 && c.d_model % c.n_heads != 0)
        throw ConfigError(fmt::format("{}: dim {} is not divisible by n_heads {}", path, c.d_model, c.n_heads));
    c.d_head = c.d_model / c.n_heads;
    c.validate(path);

    const int64_t D = c.d_model, F = c.d_ff, L = c.n_layers, V = c.vocab_size, KV = c.d_kv(), hs = c.d_head;
    // Every field is a positive int32, so a product of three is below 2^93: 128-bit arithmetic
    // cannot wrap, and a header promising more than the file holds is refused before any read.
    using u128 = unsigned __int128;
    const u128 n_floats = u128(V) * D + u128(L) * D + u128(L) * D * D + 2 * u128(L) * KV * D + u128(L) * D * D +
                          u128(L) * D + 3 * u128(L) * F * D + D + u128(c.max_seq_len) * hs + (shared ? 0 : u128(V) * D);
    const u128 need128 = 28 + n_floats * 4;
    if (need128 > u128(f.size())) {
        const std::string promised = need128 > u128(UINT64_MAX) ? std::string("more than 2^64")
                                                                : std::to_string(static_cast<uint64_t>(need128));
        throw ModelLoadError(fmt::format("{}: truncated: {} bytes, header promises {}", path, f.size(), promised));
    }
    const uint64_t need = static_cast<uint64_t>(need128);
    if (f.size() > need)
        throw ModelLoadError(fmt::format("{}: {} bytes but header promises {}: wrong header or trailing data", path, f.size(), need));
    const float* p = reinterpret_cast<const float*>(f.data() + 28);
    auto next = [&](std::vector<int64_t> shape) {
        int64_t n = 1;
        for (auto s : shape) n *= s;
        auto t = torch::from_blob(const_cast<float*>(p), shape, torch::kFloat).clone();
        p += n;
        return t;
    };
    auto emb = next({V, D});
    auto rms_att = next({L, D});
    auto wq = next({L, D, D});
    auto wk = next({L, KV, D});
    auto wv = next({L, KV, D});
    auto wo = next({L, D, D});
    auto rms_ffn = next({L, D});
    auto w1 = next({L, F, D});
    auto w2 = next({L, D, F});
    auto w3 = next({L, F, D});
    auto rms_final = next({D});
    p += c.max_seq_len * hs;  // freq_cis real and imag (seq_len * head_size / 2 each): unused
    auto wcls = shared ? emb : next({V, D});

    auto cv = [&](const at::Tensor& t) { return t.to(opts.device, opts.dtype).contiguous(); };
    auto& w = m->weights;
    w.embed = cv(emb);
    w.unembed = shared ? w.embed : cv(wcls);
    w.final_norm_w = cv(rms_final);
    w.layers.resize(L);
    for (int64_t l = 0; l < L; ++l) {
        auto& lw = w.layers[l];
        lw.attn_norm_w = cv(rms_att[l]);
        lw.wq = cv(permute_rope_rows(wq[l], c.n_heads, hs));
        lw.wk = cv(permute_rope_rows(wk[l], c.n_kv_heads, hs));
        lw.wv = cv(wv[l]);
        lw.wo = cv(wo[l]);
        lw.mlp_norm_w = cv(rms_ffn[l]);
        lw.w_gate = cv(w1[l]);
        lw.w_down = cv(w2[l]);
        lw.w_up = cv(w3[l]);
    }
    return m;
}

static std::unique_ptr<Model> load_any(const std::string& path, const LoadOptions& opts) {
    if (is_directory(path)) return load_hf(path, opts);
    if ((path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) || is_gguf_file(path))
        return load_gguf_model(path, opts);
    if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0) return load_llama2c(path, opts);
    if (path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0)
        return load_hf(parent_dir(path), opts);
    throw ModelLoadError(fmt::format("{}: not a checkpoint folder, a GGUF file or a llama2.c .bin file", path));
}

// A path that exists always wins; else a Hugging Face name (org/name[@revision]) is resolved
// through the local cache (hub.h) and its snapshot folder loaded.
std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& opts) {
    HubSnapshot hub;
    if (!file_exists(path)) {
        if (!looks_like_hub_name(path)) throw ModelLoadError(fmt::format("{}: no such file or folder", path));
        hub = resolve_hub_name(path);
    }
    torch::NoGradGuard no_grad;
    auto m = load_any(hub.folder.empty() ? path : hub.folder, opts);
    if (!hub.folder.empty()) {
        m->path = hub.folder;
        m->source.hub_repo = hub.repo;
        m->source.hub_revision = hub.revision;
        m->source.hub_commit = hub.commit;
        m->source.snapshot = hub.folder;
    }
    auto& w = m->weights;
    if (w.unembed.defined() && w.unembed.device().is_cpu() && !w.unembed_b.defined() &&
        w.unembed.numel() * static_cast<int64_t>(w.unembed.element_size()) <= (int64_t{1} << 30))
        w.unembed_t = w.unembed.t().contiguous();
    return m;
}

std::vector<std::string> supported_architectures() {
    std::vector<std::string> out;
    for (const auto& s : arch_specs()) out.push_back(s.architecture);
    out.push_back("llama2c (.bin)");
    out.push_back("GGUF (llama, qwen2, qwen3, gemma, gemma2, gemma3, olmo2, gpt2, gptneox)");
    return out;
}

}  // namespace hs
