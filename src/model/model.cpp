#include "model.h"

#include "blocks.h"
#include "errors.h"
#include "packed_kv.h"
#include "../families/families.h"
#include "util.h"

#include <algorithm>
#include <atomic>

namespace hs {

int64_t KVCache::shared_length() const {
    if (!shared || shared->empty()) return 0;
    int64_t n = 0;
    for (const auto& c : *shared) n = std::max(n, c.length());
    return n;
}

bool KVCache::ragged() const {
    if (!shared || shared->empty()) return false;
    const int64_t n = shared->front().length();
    for (const auto& c : *shared)
        if (c.length() != n) return true;
    return false;
}

static int64_t own_length(const std::vector<at::Tensor>& k) {
    for (const auto& t : k)
        if (t.defined()) return t.size(1);
    return 0;
}

int64_t KVCache::length() const {
    if (packed) return packed_length(*packed);
    return shared_length() + own_length(k);
}

int64_t KVCache::row_length(int64_t row) const {
    if (!shared) return length();
    return shared->at(static_cast<size_t>(shared_rows.at(static_cast<size_t>(row)))).length() + own_length(k);
}

std::pair<at::Tensor, at::Tensor> KVCache::whole(int layer) const {
    const auto l = static_cast<size_t>(layer);
    at::Tensor ok = l < k.size() ? k[l] : at::Tensor(), ov = l < v.size() ? v[l] : at::Tensor();
    if (!shared) return {ok, ov};
    HS_REQUIRE(!ragged(), "KVCache::whole: rows of different lengths (ragged shared caches) have no [B, S, K, d] keys");
    std::vector<at::Tensor> ks, vs;
    for (const int64_t r : shared_rows) {
        const KVCache& c = shared->at(static_cast<size_t>(r));
        HS_REQUIRE(l < c.k.size() && c.k[l].defined(), "KVCache::whole: a shared cache without this layer");
        ks.push_back(c.k[l]), vs.push_back(c.v[l]);
    }
    auto sk = torch::cat(ks, 0), sv = torch::cat(vs, 0);
    if (ok.defined() && ok.size(1) > 0) sk = torch::cat({sk, ok}, 1), sv = torch::cat({sv, ov}, 1);
    return {sk, sv};
}

void KVCache::unshare() {
    if (!shared) return;
    const size_t L = shared->empty() ? 0 : shared->front().k.size();
    std::vector<at::Tensor> nk(L), nv(L);
    for (size_t l = 0; l < L; ++l) std::tie(nk[l], nv[l]) = whole(static_cast<int>(l));
    k = std::move(nk), v = std::move(nv);  // foreign views: the next append copies them into own buffers
    kbuf_.clear(), vbuf_.clear(), owned_.clear();
    shared.reset(), shared_rows.clear();
}

uint64_t KVCache::new_content_id() {
    static std::atomic<uint64_t> next{1};
    return next++;
}

KVCache::KVCache(const KVCache& o)
    : k(o.k), v(o.v), packed(o.packed ? clone_packed(*o.packed) : nullptr), shared(o.shared), shared_rows(o.shared_rows),
      content_id(o.content_id), origins(o.origins), reserved_(o.reserved_) {}

KVCache& KVCache::operator=(const KVCache& o) {
    if (this != &o) {
        k = o.k, v = o.v, reserved_ = o.reserved_;
        packed = o.packed ? clone_packed(*o.packed) : nullptr;
        shared = o.shared, shared_rows = o.shared_rows;
        content_id = o.content_id, origins = o.origins;
        kbuf_.clear(), vbuf_.clear(), owned_.clear();
    }
    return *this;
}

void KVCache::clear() {
    k.clear(), v.clear(), kbuf_.clear(), vbuf_.clear(), owned_.clear();
    packed.reset();
    shared.reset(), shared_rows.clear();
    content_id = 0, origins.clear();
}

void KVCache::truncate(int64_t positions) {
    HS_REQUIRE(!packed, "KVCache::truncate: a compressed (packed) cache cannot be truncated");
    HS_REQUIRE(!ragged(), "KVCache::truncate: rows of different lengths (ragged shared caches)");
    HS_REQUIRE(positions >= shared_length(), "KVCache::truncate: below the shared prompt caches' positions");
    // Positions past `positions` may be written again: this cache's name no longer vouches for them.
    content_id = 0;
    for (auto& o : origins) o.second = std::min(o.second, positions);
    positions -= shared_length();
    for (size_t l = 0; l < k.size(); ++l) {
        if (!k[l].defined() || k[l].size(1) <= positions) continue;
        const bool own = l < owned_.size() && owned_[l] == k[l].unsafeGetTensorImpl();
        k[l] = k[l].narrow(1, 0, positions), v[l] = v[l].narrow(1, 0, positions);
        if (own) owned_[l] = k[l].unsafeGetTensorImpl();
    }
}

std::pair<at::Tensor, at::Tensor> KVCache::append(int layer, const at::Tensor& k_new, const at::Tensor& v_new) {
    HS_REQUIRE(!packed, "KVCache::append: a compressed (packed) cache is appended to by blocks::attention");
    const auto l = static_cast<size_t>(layer);
    if (k.size() <= l) k.resize(l + 1), v.resize(l + 1);
    if (kbuf_.size() <= l) kbuf_.resize(l + 1), vbuf_.resize(l + 1), owned_.resize(l + 1, nullptr);
    const int64_t B = k_new.size(0), T = k_new.size(1), K = k_new.size(2), d = k_new.size(3);
    HS_REQUIRE(!shared || static_cast<int64_t>(shared_rows.size()) == B, "KVCache::append: one shared cache a row");
    const int64_t past = k[l].defined() ? k[l].size(1) : 0, need = past + T;
    const bool own = kbuf_[l].defined() && k[l].defined() && owned_[l] == k[l].unsafeGetTensorImpl();
    if (!own || kbuf_[l].size(2) < need || kbuf_[l].size(0) != B || kbuf_[l].scalar_type() != k_new.scalar_type() ||
        kbuf_[l].device() != k_new.device()) {
        const int64_t hint = reserved_ - shared_length();  // reserve() counts the shared positions too
        int64_t cap = hint >= need ? hint : need;
        if (own && cap == need) cap = std::max(need, 2 * kbuf_[l].size(2));  // growing without a hint: double
        auto kb = at::empty({B, K, cap, d}, k_new.options()), vb = at::empty({B, K, cap, d}, v_new.options());
        if (past > 0) {
            kb.narrow(2, 0, past).copy_(k[l].permute({0, 2, 1, 3}));
            vb.narrow(2, 0, past).copy_(v[l].permute({0, 2, 1, 3}));
        }
        kbuf_[l] = kb, vbuf_[l] = vb;
    }
    kbuf_[l].narrow(2, past, T).copy_(k_new.permute({0, 2, 1, 3}));
    vbuf_[l].narrow(2, past, T).copy_(v_new.permute({0, 2, 1, 3}));
    k[l] = kbuf_[l].narrow(2, 0, need).permute({0, 2, 1, 3});
    v[l] = vbuf_[l].narrow(2, 0, need).permute({0, 2, 1, 3});
    owned_[l] = k[l].unsafeGetTensorImpl();
    return {k[l], v[l]};
}

at::Tensor Model::forward(const at::Tensor& tokens_in, const Hooks* hooks, KVCache* cache,
                          const ForwardOptions& opts) const {
    auto tokens = tokens_in.dim() == 1 ? tokens_in.unsqueeze(0) : tokens_in;
    if (tokens.dim() != 2) throw DataError(fmt::format("tokens must be [B, T], got {} dims", tokens.dim()));
    tokens = tokens.to(options.device, torch::kLong);
    if (tokens.numel() > 0) {
        const int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
        if (lo < 0 || hi >= config.vocab_size)
            throw DataError(fmt::format("token id {} out of range [0, {})", lo < 0 ? lo : hi, config.vocab_size));
    }
    const int64_t past = cache ? cache->length() : 0;
    if (past + tokens.size(1) > config.max_seq_len)
        throw DataError(fmt::format("sequence of {} tokens exceeds the model's context of {}", past + tokens.size(1),
                                    config.max_seq_len));
    if (opts.stop_after_layer >= config.n_layers)
        throw ConfigError(fmt::format("stop_after_layer {} >= n_layers {}", opts.stop_after_layer, config.n_layers));
    if (opts.start_layer < 0 || opts.start_layer >= config.n_layers)
        throw ConfigError(fmt::format("start_layer {} outside [0, {})", opts.start_layer, config.n_layers));
    if (opts.start_layer > 0) {
        if (cache) throw ConfigError("start_layer > 0 cannot be combined with a KV cache");
        const auto& r = opts.start_resid;
        if (!r.defined() || r.dim() != 3 || r.size(0) != tokens.size(0) || r.size(1) != tokens.size(1) ||
            r.size(2) != config.d_model)
            throw ConfigError(fmt::format("start_resid must be [B, T, D] = [{}, {}, {}] for start_layer {}",
                                          tokens.size(0), tokens.size(1), config.d_model, opts.start_layer));
    }
    if (opts.attention_only) {
        if (config.family != Family::kLlama || hooks)
            throw ConfigError("attention_only: the Llama family's forward, without hooks, only");
        at::NoGradGuard no_grad;
        for (const auto& lw : weights.layers)
            for (const auto* t : {&lw.w_down, &lw.b_down})
                if (t->defined() && (t->requires_grad() || t->count_nonzero().item<int64_t>() != 0))
                    throw ConfigError("attention_only: a layer's MLP output is not exactly 0 (w_down / b_down nonzero or trained)");
    }
    blocks::Pass pass{*this, hooks, cache, opts};
    pass.per_row_gemm = opts.gemm == GemmMode::kPerRow ||
                        (opts.gemm == GemmMode::kAuto && hooks && hooks->has_row_specific_interventions());
    switch (config.family) {
        case Family::kLlama: return forward_llama(pass, tokens);
        case Family::kGpt2: return forward_gpt2(pass, tokens);
        case Family::kGptNeoX: return forward_gpt_neox(pass, tokens);
        case Family::kGemma: return forward_gemma(pass, tokens);
        case Family::kOlmo2: return forward_olmo2(pass, tokens);
    }
    throw ConfigError(fmt::format("family '{}' has no forward in this build", family_name(config.family)));
}

at::Tensor Model::final_norm(const at::Tensor& resid) const {
    return blocks::norm(config, resid, weights.final_norm_w, weights.final_norm_b);
}

at::Tensor Model::unembed(const at::Tensor& resid) const { return blocks::unembed(*this, resid, false); }

int64_t Model::n_params() const {
    int64_t n = weights.embed.numel();
    auto add = [&](const at::Tensor& t) {
        if (t.defined()) n += t.numel();
    };
    add(weights.pos_embed);
    add(weights.final_norm_w);
    add(weights.final_norm_b);
    if (!weights.unembed.is_same(weights.embed)) add(weights.unembed);
    add(weights.unembed_b);
    for (const auto& l : weights.layers)
        for (const auto* t : {&l.attn_norm_w, &l.attn_norm_b, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo,
                              &l.q_norm_w, &l.k_norm_w, &l.post_attn_norm_w, &l.post_attn_norm_b, &l.mlp_norm_w,
                              &l.mlp_norm_b, &l.w_gate, &l.w_up, &l.w_down, &l.b_gate, &l.b_up, &l.b_down,
                              &l.post_mlp_norm_w, &l.post_mlp_norm_b})
            add(*t);
    return n;
}

std::string Model::weights_sha256() const {
    if (!sha_cache_.empty()) return sha_cache_;
    auto files = split(weight_files, ';');
    if (files.size() == 1) {
        sha_cache_ = sha256_file(files[0]);
    } else {
        std::string all;  // hash of the shards' hashes, in order
        for (const auto& f : files) all += sha256_file(f);
        sha_cache_ = sha256_bytes(all.data(), all.size());
    }
    return sha_cache_;
}

}  // namespace hs
