#include "toy_tasks.h"

#include <torch/torch.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace hs::toy {

namespace {

// Row-major [B, T] buffers filled on the host, turned into tensors at the end.
struct Rows {
    int64_t B, T;
    std::vector<int64_t> tok, tgt;
    std::vector<float> mask;
    Rows(int64_t b, int64_t t) : B(b), T(t), tok(b * t, kBos), tgt(b * t, 0), mask(b * t, 0.f) {}
    int64_t* row(int64_t b) { return tok.data() + b * T; }
    void score(int64_t b, int64_t t) {  // logits at t predict tokens[t + 1]
        tgt[b * T + t] = tok[b * T + t + 1];
        mask[b * T + t] = 1.f;
    }
    Batch to_batch() const {
        Batch out;
        out.tokens = torch::tensor(tok, torch::kLong).view({B, T});
        out.targets = torch::tensor(tgt, torch::kLong).view({B, T});
        out.mask = torch::tensor(mask, torch::kFloat).view({B, T});
        return out;
    }
};

int64_t uniform(Rng& rng, int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

int64_t random_alnum(Rng& rng) { return uniform(rng, kFirstAlnum, kVocabSize - 1); }

}  // namespace

std::string token_text(int64_t id) {
    static const char* kPunct = "?=.;";
    if (id == kUnk) return "<unk>";
    if (id == kBos) return "<s>";
    if (id >= 2 && id < kDigit0) return std::string(1, kPunct[id - 2]);
    if (id >= kDigit0 && id < kLower0) return std::string(1, static_cast<char>('0' + (id - kDigit0)));
    if (id >= kLower0 && id < kUpper0) return std::string(1, static_cast<char>('a' + (id - kLower0)));
    if (id >= kUpper0 && id < kVocabSize) return std::string(1, static_cast<char>('A' + (id - kUpper0)));
    return "<unk>";
}

std::string tokenizer_json() {
    using nlohmann::json;
    json vocab = json::object();
    for (int64_t id = 0; id < kVocabSize; ++id) vocab[token_text(id)] = id;
    auto added = [](int64_t id) {
        return json{{"id", id},        {"content", token_text(id)}, {"single_word", false}, {"lstrip", false},
                    {"rstrip", false}, {"normalized", false},       {"special", true}};
    };
    json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
    json j = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", json::array({added(kUnk), added(kBos)})},
        {"normalizer", nullptr},
        {"pre_tokenizer", nullptr},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single", json::array({bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
          {"pair", json::array({bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array({kBos})}, {"tokens", json::array({"<s>"})}}}}}}},
        {"decoder", nullptr},
        {"model",
         {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
          {"ignore_merges", false}, {"vocab", vocab}, {"merges", json::array()}}},
    };
    return j.dump(2) + "\n";
}

Batch induction_train_batch(Rng& rng, int64_t B, int64_t T) {
    Rows r(B, T);
    for (int64_t b = 0; b < B; ++b) {
        int64_t* row = r.row(b);
        for (int64_t t = 1; t < T; ++t) row[t] = random_alnum(rng);
        if (uniform(rng, 0, 1) == 0) {
            // [BOS, filler, R, R, R, ...] with a short period (3..9): only an offset-1 circuit
            // predicts these, which rules out the displaced circuit (layer-0 heads at offsets -9/-10
            // feeding a layer-1 head) that long repeats alone let a RoPE model settle into.
            const int64_t n = uniform(rng, 3, 9);
            const int64_t start = uniform(rng, 1, 11);
            for (int64_t t = start + n; t < T; ++t) row[t] = row[t - n];
        } else {  // [BOS, R, R, random tail], |R| = 4..30: the evaluation's shape at varied lengths
            const int64_t n = uniform(rng, 4, std::min<int64_t>(30, (T - 1) / 2));
            std::copy(row + 1, row + 1 + n, row + 1 + n);
        }
        for (int64_t t = 0; t + 1 < T; ++t) r.score(b, t);
    }
    return r.to_batch();
}

InductionEval induction_eval_batch(Rng& rng, int64_t B, int64_t n) {
    const int64_t T = 2 * n + 1;
    Rows r(B, T);
    std::vector<float> first(B * T, 0.f);
    for (int64_t b = 0; b < B; ++b) {
        int64_t* row = r.row(b);
        for (int64_t t = 1; t <= n; ++t) row[t] = random_alnum(rng);
        std::copy(row + 1, row + 1 + n, row + 1 + n);
        for (int64_t q = n + 1; q <= 2 * n - 1; ++q) r.score(b, q);
        for (int64_t q = 1; q <= n - 1; ++q) {  // first occurrence: targets set, scored by first_mask
            first[b * T + q] = 1.f;
            r.tgt[b * T + q] = row[q + 1];
        }
    }
    InductionEval e;
    e.batch = r.to_batch();
    e.first_mask = torch::tensor(first, torch::kFloat).view({B, T});
    e.n = n;
    return e;
}

RecallBatch recall_batch(Rng& rng, int64_t B, int64_t T, bool eval) {
    Rows r(B, T);
    RecallBatch out;
    std::vector<int64_t> keys(26);
    for (int64_t b = 0; b < B; ++b) {
        int64_t* row = r.row(b);
        const int64_t n_queries = eval ? 1 : uniform(rng, 1, std::max<int64_t>(1, std::min<int64_t>(8, (T - 3) / 5)));
        const int64_t body = T - 1 - (eval ? 2 : 3 * n_queries);  // tokens between BOS and the queries
        const int64_t n_pairs = uniform(rng, 1, std::min<int64_t>(12, body / 2));
        for (int64_t i = 0; i < 26; ++i) keys[i] = kLower0 + i;
        std::shuffle(keys.begin(), keys.end(), rng);  // the first n_pairs are this row's keys
        std::vector<int64_t> gaps(n_pairs + 1, 0);     // filler before each pair and after the last
        for (int64_t f = 0; f < body - 2 * n_pairs; ++f) ++gaps[uniform(rng, 0, n_pairs)];
        std::vector<int64_t> values(n_pairs), vpos(n_pairs);
        int64_t t = 1;
        for (int64_t p = 0; p <= n_pairs; ++p) {
            for (int64_t g = 0; g < gaps[p]; ++g) {
                const int64_t f = uniform(rng, 0, 10);
                row[t++] = f == 10 ? kFillerDot : kDigit0 + f;
            }
            if (p == n_pairs) break;
            values[p] = kUpper0 + uniform(rng, 0, 25);
            row[t++] = keys[p];
            vpos[p] = t;
            row[t++] = values[p];
        }
        std::vector<int64_t> order(n_pairs);
        for (int64_t i = 0; i < n_pairs; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        for (int64_t qi = 0; qi < std::min(n_queries, n_pairs); ++qi) {
            const int64_t p = order[qi];
            row[t++] = kQuery;
            if (qi == 0) {
                out.value_pos.push_back(vpos[p]);
                out.query_pos.push_back(t);
            }
            row[t] = keys[p];
            if (eval) {  // the answer is not in the row: score the last position against it
                r.tgt[b * T + t] = values[p];
                r.mask[b * T + t] = 1.f;
                ++t;
            } else {
                row[t + 1] = values[p];
                r.score(b, t);
                t += 2;
            }
        }
        for (; t < T; ++t) row[t] = kFillerDot;  // only when fewer pairs than queries: pad
    }
    out.batch = r.to_batch();
    return out;
}

// ---- in-context functions

int64_t icl_output(int task, int64_t x) { return kUpper0 + (x + task) % kIclDomain; }

std::vector<std::pair<std::string, std::string>> icl_pairs(int task) {
    std::vector<std::pair<std::string, std::string>> out;
    for (int64_t x = 0; x < kIclDomain; ++x) out.push_back({token_text(kLower0 + x), token_text(icl_output(task, x))});
    return out;
}

IclBatch icl_batch(Rng& rng, int64_t B, bool eval, int task, bool shuffle) {
    Rows rows(B, kIclLen);
    IclBatch out;
    std::fill(rows.tok.begin(), rows.tok.end(), 0);
    for (int64_t b = 0; b < B; ++b) {
        const int k = task >= 0 ? task : static_cast<int>(uniform(rng, 0, kIclTasks - 1));
        const int64_t n = uniform(rng, kIclMinShots, kIclMaxShots);
        std::vector<int64_t> xs;  // n distinct inputs from b..l (index 1..11)
        for (int64_t x = 1; x < kIclDomain; ++x) xs.push_back(x);
        for (int64_t i = 0; i < n; ++i) std::swap(xs[i], xs[i + uniform(rng, 0, kIclDomain - 2 - i)]);
        xs.resize(n);
        std::vector<int64_t> ys;
        for (auto x : xs) ys.push_back(icl_output(k, x));
        if (shuffle) std::shuffle(ys.begin(), ys.end(), rng);
        int64_t* r = rows.row(b);
        r[0] = kBos;
        std::vector<int64_t> labels;
        for (int64_t i = 0; i < n; ++i) {
            r[1 + 2 * i] = kLower0 + xs[i];
            r[2 + 2 * i] = ys[i];
            labels.push_back(2 + 2 * i);
        }
        const int64_t last = 1 + 2 * n;
        r[last] = kLower0;  // the query 'a'
        if (!eval)
            for (int64_t i = 1; i < n; ++i) rows.score(b, 1 + 2 * i);
        rows.tgt[b * kIclLen + last] = icl_output(k, 0);
        rows.mask[b * kIclLen + last] = 1.f;
        out.last.push_back(last);
        out.label_pos.push_back(std::move(labels));
    }
    out.batch = rows.to_batch();
    return out;
}

}  // namespace hs::toy
