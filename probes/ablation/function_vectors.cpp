#include "function_vectors.h"

#include "errors.h"
#include "guard.h"
#include "hooks.h"
#include "patching.h"
#include "score_records.h"
#include "store.h"
#include "tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

namespace hs {

namespace {
std::vector<WordPair> pair_list(const nlohmann::json& j, const std::string& where) {
    const char* shape = "expected a JSON list of {\"input\": TEXT, \"output\": TEXT}";
    if (!j.is_array()) throw DataError(fmt::format("{}: {}", where, shape));
    std::vector<WordPair> out;
    for (size_t i = 0; i < j.size(); ++i) {
        const auto& e = j[i];
        if (!e.is_object() || !e.contains("input") || !e.contains("output") || !e["input"].is_string() ||
            !e["output"].is_string())
            throw DataError(fmt::format("{}: entry {}: {}", where, i, shape));
        WordPair w{e["input"].get<std::string>(), e["output"].get<std::string>()};
        if (w.input.empty() || w.output.empty()) throw DataError(fmt::format("{}: entry {}: an empty input or output", where, i));
        out.push_back(std::move(w));
    }
    if (out.empty()) throw DataError(fmt::format("{}: no pairs", where));
    return out;
}
}  // namespace

FvTask read_fv_task(const std::string& path) {
    const std::string text = read_utf8_text_file(path);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
        throw DataError(fmt::format("{}: not JSON: {}", path, e.what()));
    }
    FvTask t;
    if (j.is_object()) {
        if (!j.contains("demonstrations") || !j.contains("queries") || j.size() != 2)
            throw DataError(fmt::format("{}: expected a list of pairs or {{\"demonstrations\": [...], \"queries\": [...]}}", path));
        t.train = pair_list(j["demonstrations"], path + ": demonstrations");
        t.valid = pair_list(j["queries"], path + ": queries");
    } else {
        t.pairs = pair_list(j, path);
    }
    return t;
}

std::string fv_prompt_text(const std::vector<WordPair>& demos, const std::string& query, const FvTemplate& t) {
    // create_fewshot_primer + create_prompt (prompt_utils.py l. 10-49), the spaces of
    // word_pairs_to_prompt_data (l. 322-330); instructions are empty.
    const std::string sp = t.prepend_space ? " " : "";
    std::string s;
    for (const auto& d : demos) s += t.input_prefix + sp + d.input + t.input_sep + t.output_prefix + sp + d.output + t.output_sep;
    return s + t.input_prefix + sp + query + t.input_sep + t.output_prefix;
}

namespace {

std::vector<int64_t> encode(const Tokenizer& tok, const std::string& text) {
    auto e = tok.encode(text, true);
    return {e.begin(), e.end()};
}

// Tokens, lengths and answers of prompts, padded into one [N, T] tensor.
void encode_prompts(const std::vector<std::string>& texts, const std::vector<std::string>& answers, const Tokenizer& tok,
                    const ModelConfig& c, const std::string& task_path, at::Tensor& tokens, std::vector<int64_t>& lengths,
                    std::vector<int64_t>& answer, const FvTemplate& t) {
    std::vector<std::vector<int64_t>> ids;
    for (size_t i = 0; i < texts.size(); ++i) {
        auto src = encode(tok, texts[i]);
        auto tgt = encode(tok, texts[i] + (t.prepend_space ? " " : "") + answers[i]);
        // get_answer_id (eval_utils.py l. 79-93): the target's tokens past the prompt's count.
        if (tgt.size() <= src.size())
            throw DataError(fmt::format("{}: the output '{}' adds no token after its prompt", task_path, answers[i]));
        if (static_cast<int64_t>(src.size()) > c.max_seq_len)
            throw DataError(fmt::format("{}: a prompt of {} tokens exceeds the model's context of {} (fewer --shots)", task_path,
                                        src.size(), c.max_seq_len));
        for (auto id : src)
            if (id < 0 || id >= c.vocab_size)
                throw DataError(fmt::format("{}: token id {} out of the model's vocabulary [0, {})", task_path, id, c.vocab_size));
        answer.push_back(tgt[src.size()]);
        lengths.push_back(static_cast<int64_t>(src.size()));
        ids.push_back(std::move(src));
    }
    const int64_t N = static_cast<int64_t>(ids.size());
    const int64_t T = *std::max_element(lengths.begin(), lengths.end());
    tokens = torch::zeros({N, T}, torch::kLong);
    auto acc = tokens.accessor<int64_t, 2>();
    for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < lengths[i]; ++j) acc[i][j] = ids[i][j];
}

// k distinct indices of [0, n) in draw order.
std::vector<size_t> choose(std::mt19937_64& rng, size_t n, size_t k) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    for (size_t i = 0; i < k; ++i) std::swap(idx[i], idx[i + std::uniform_int_distribution<size_t>(0, n - 1 - i)(rng)]);
    idx.resize(k);
    return idx;
}

}  // namespace

FvPrompts fv_prompts(const FvTask& task, const std::string& task_path, const Tokenizer& tok,
                     const ModelConfig& c, const FvOptions& o) {
    HS_REQUIRE(o.n_shots >= 1 && o.n_trials >= 1 && o.test_split > 0 && o.test_split < 1, "fv_prompts: options out of range");
    // split_icl_dataset (prompt_utils.py l. 371) through train_test_split: ceil(test_size * n) queries.
    std::mt19937_64 rng(o.seed);
    std::vector<WordPair> valid = task.valid, train = task.train;
    if (!task.split_given()) {
        const size_t n = task.pairs.size();
        const size_t n_valid = static_cast<size_t>(std::ceil(o.test_split * static_cast<double>(n)));
        auto order = choose(rng, n, n);
        for (size_t i = 0; i < n; ++i) (i < n_valid ? valid : train).push_back(task.pairs[order[i]]);
    }
    if (valid.empty() || train.size() < static_cast<size_t>(o.n_shots))
        throw DataError(fmt::format("{}: {} pairs for demonstrations and {} for queries; {} shots need at least {} demonstrations",
                                    task_path, train.size(), valid.size(), o.n_shots, o.n_shots));
    FvPrompts p;
    std::vector<std::string> clean_ans, corrupt_ans;
    // get_mean_head_activations (extract_utils.py l. 83-90), then compute_indirect_effect (l. 129-137
    // of compute_indirect_effect.py): shots from train without replacement, one query from valid;
    // shuffle_labels permutes the demonstrations' outputs (prompt_utils.py l. 320-323).
    for (int pass = 0; pass < 2; ++pass)
        for (int t = 0; t < o.n_trials; ++t) {
            std::vector<WordPair> demos;
            for (auto i : choose(rng, train.size(), static_cast<size_t>(o.n_shots))) demos.push_back(train[i]);
            const WordPair& q = valid[choose(rng, valid.size(), 1)[0]];
            if (pass == 1) {
                std::vector<std::string> outs;
                for (const auto& d : demos) outs.push_back(d.output);
                std::shuffle(outs.begin(), outs.end(), rng);
                for (size_t i = 0; i < demos.size(); ++i) demos[i].output = outs[i];
            }
            (pass == 0 ? p.clean_text : p.corrupt_text).push_back(fv_prompt_text(demos, q.input, o.tmpl));
            (pass == 0 ? clean_ans : corrupt_ans).push_back(q.output);
        }
    encode_prompts(p.clean_text, clean_ans, tok, c, task_path, p.clean, p.clean_lengths, p.clean_answer, o.tmpl);
    encode_prompts(p.corrupt_text, corrupt_ans, tok, c, task_path, p.corrupt, p.corrupt_lengths, p.corrupt_answer, o.tmpl);
    return p;
}

FvResult function_vector_heads(const Model& m, const FvPrompts& p, const FvOptions& o) {
    FvResult r;
    auto t0 = std::chrono::steady_clock::now();
    // The mean of every head's z at the last token over the clean prompts (get_mean_head_activations:
    // the input of o_proj, split by head, at the query_predictive_token slot).
    const MeanAtLast mean = mean_site_at_last(m, p.clean, p.clean_lengths, p.clean_answer, Point::kAttnZ, o.max_rows);
    r.p_clean = mean.prob;
    r.top1_clean = mean.top1;
    auto t1 = std::chrono::steady_clock::now();
    // Each head's mean put at the last token of every corrupted prompt (replace_activation_w_avg,
    // last_token_only; intervention_utils.py l. 55-59), p(answer) read at the last token
    // (activation_replacement_per_class_intervention, compute_indirect_effect.py l. 66-88).
    PatchPairs pairs;
    pairs.clean = pairs.corrupt = p.corrupt;
    pairs.lengths = p.corrupt_lengths;
    pairs.answer = p.corrupt_answer;
    pairs.wrong.assign(p.corrupt_answer.size(), -1);
    PatchOptions po;
    po.metric = MetricKind::kProb;
    po.site = Point::kAttnZ;
    po.max_rows = o.max_rows;
    po.mean_source = mean.mean;
    const PatchResult pr = exact_patching(m, pairs, po);
    auto t2 = std::chrono::steady_clock::now();
    r.aie = pr.scores;
    r.patched = pr.patched;
    r.p_corrupt = pr.metric_corrupt;
    r.forwards = mean.forwards + pr.forwards;
    r.seconds_mean = std::chrono::duration<double>(t1 - t0).count();
    r.seconds_sweep = std::chrono::duration<double>(t2 - t1).count();
    return r;
}

namespace {
std::vector<float> floats(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kFloat).contiguous();
    return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}
std::vector<int32_t> ints(const at::Tensor& t) {
    auto c = t.to(torch::kCPU, torch::kInt).contiguous();
    return {c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel()};
}
std::vector<int32_t> ints(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }
}  // namespace

void write_fv_heads_result(ResultWriter& w, const std::string& group, const std::string& task, const FvOptions& o,
                           const FvPrompts& prompts, const FvResult& r) {
    schema::PatchingRecord rec;
    rec.name = group;
    rec.shape = r.aie.sizes().vec();
    rec.scores = floats(r.aie), rec.patched = floats(r.patched);
    rec.metric_clean = static_cast<float>(r.p_clean), rec.metric_corrupt = static_cast<float>(r.p_corrupt);
    schema::FvHeadsRun run;
    run.task = task, run.n_shots = o.n_shots, run.n_trials = o.n_trials, run.seed = o.seed;
    run.test_split = o.test_split;
    run.input_prefix = o.tmpl.input_prefix, run.output_prefix = o.tmpl.output_prefix;
    run.input_sep = o.tmpl.input_sep, run.output_sep = o.tmpl.output_sep, run.prepend_space = o.tmpl.prepend_space;
    run.top1_clean = r.top1_clean, run.forwards = r.forwards, run.seconds = r.seconds_mean + r.seconds_sweep;
    schema::FvPromptsRecord q;
    q.clean_shape = prompts.clean.sizes().vec(), q.corrupt_shape = prompts.corrupt.sizes().vec();
    q.clean_tokens = ints(prompts.clean), q.corrupt_tokens = ints(prompts.corrupt);
    q.clean_lengths = ints(prompts.clean_lengths), q.corrupt_lengths = ints(prompts.corrupt_lengths);
    q.clean_answer = ints(prompts.clean_answer), q.corrupt_answer = ints(prompts.corrupt_answer);
    schema::write_fv_heads(w, rec, run, q);
}

FvResult fv_heads_mean(const std::vector<FvResult>& results) {
    HS_REQUIRE(!results.empty(), "fv_heads_mean: no results");
    FvResult m;
    double p_clean = 0, p_corrupt = 0, top1 = 0;
    for (const auto& r : results) {
        m.aie = m.aie.defined() ? m.aie + r.aie : r.aie.clone();
        m.patched = m.patched.defined() ? m.patched + r.patched : r.patched.clone();
        p_clean += r.p_clean, p_corrupt += r.p_corrupt, top1 += r.top1_clean;
        m.forwards += r.forwards, m.seconds_mean += r.seconds_mean, m.seconds_sweep += r.seconds_sweep;
    }
    const double n = static_cast<double>(results.size());
    m.aie = m.aie / n, m.patched = m.patched / n;
    m.p_clean = p_clean / n, m.p_corrupt = p_corrupt / n, m.top1_clean = top1 / n;
    return m;
}

void write_fv_heads_mean_result(ResultWriter& w, const std::string& group, const std::vector<std::string>& tasks,
                                const std::vector<std::string>& task_groups, const FvResult& mean) {
    HS_REQUIRE(tasks.size() == task_groups.size(), "write_fv_heads_mean_result: a group for every task");
    schema::PatchingRecord rec;
    rec.name = group;
    rec.shape = mean.aie.sizes().vec();
    rec.scores = floats(mean.aie), rec.patched = floats(mean.patched);
    rec.metric_clean = static_cast<float>(mean.p_clean), rec.metric_corrupt = static_cast<float>(mean.p_corrupt);
    schema::write_fv_heads_mean(w, rec, tasks, task_groups);
}

}  // namespace hs
