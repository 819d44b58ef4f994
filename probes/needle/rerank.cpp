// QRHead's re-ranker (see rerank.h).
#include "rerank.h"

#include "errors.h"
#include "lines.h"
#include "needle_trials.h"
#include "qrhead.h"
#include "util.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace hs {

std::vector<RerankExample> read_rerank_examples(const std::string& path) {
    const std::string text = read_text_file(path);
    std::vector<RerankExample> out;
    for_each_line(text, path, [&](const std::string& line, const std::string& where, int line_no) {
        const auto j = parse_json_line(line, where, " (expected {\"query\": ..., \"docs\": [...], \"gold\": INDEX})");
        if (!j.is_object()) throw DataError(fmt::format("{}: not a JSON object", where));
        RerankExample e;
        e.line = line_no;
        if (!j.contains("query") || !j["query"].is_string()) throw DataError(fmt::format("{}: missing string field \"query\"", where));
        e.query = j["query"].get<std::string>();
        if (trim(e.query).empty()) throw DataError(fmt::format("{}: field \"query\" is empty", where));
        if (!j.contains("docs") || !j["docs"].is_array() || j["docs"].empty())
            throw DataError(fmt::format("{}: missing field \"docs\" (a non-empty list of strings)", where));
        for (const auto& d : j["docs"]) {
            if (!d.is_string()) throw DataError(fmt::format("{}: field \"docs\" holds a value that is not a string", where));
            e.docs.push_back(d.get<std::string>());
        }
        if (!j.contains("gold") || !j["gold"].is_number_integer())
            throw DataError(fmt::format("{}: missing integer field \"gold\" (the relevant document's 0-based index)", where));
        e.gold = j["gold"].get<int64_t>();
        if (e.gold < 0 || e.gold >= static_cast<int64_t>(e.docs.size()))
            throw DataError(fmt::format("{}: gold {} is outside the {} documents (0-based)", where, e.gold, e.docs.size()));
        out.push_back(std::move(e));
        return true;
    });
    if (out.empty()) throw DataError(fmt::format("{}: no examples (the file is empty)", path));
    return out;
}

static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
    return s;
}

void check_rerank_format(const RerankFormat& f) {
    if (f.doc.find("{doc}") == std::string::npos)
        throw UsageError(fmt::format("the document format '{}' has no {{doc}}", f.doc), "doc_format");
    if (f.query.find("{query}") == std::string::npos)
        throw UsageError(fmt::format("the query format '{}' has no {{query}}", f.query), "query_format");
}

RerankPrompt build_rerank_prompt(const Tokenizer& tok, const RerankFormat& f, const RerankExample& e, const std::string& where) {
    auto enc = [&](const std::string& s) {
        if (s.empty()) return std::vector<int64_t>{};
        const auto ids = tok.encode(s, false);
        return std::vector<int64_t>(ids.begin(), ids.end());
    };
    RerankPrompt p;
    const auto facts = token_facts(tok);
    p.tokens = facts.bos_prefix;
    auto add = [&](const std::vector<int64_t>& v) { p.tokens.insert(p.tokens.end(), v.begin(), v.end()); };
    add(enc(f.prefix + f.instruction));
    const auto sep = enc(f.separator);
    for (size_t i = 0; i < e.docs.size(); ++i) {
        add(sep);
        const auto doc = enc(replace_all(replace_all(f.doc, "{i}", std::to_string(i + 1)), "{doc}", e.docs[i]));
        if (doc.empty()) throw DataError(fmt::format("{}: document {} encodes to no token", where, i));
        const int64_t s = static_cast<int64_t>(p.tokens.size());
        add(doc);
        p.spans.push_back({s, static_cast<int64_t>(p.tokens.size())});
    }
    add(sep);
    auto query = [&](const std::string& q) {
        return enc(replace_all(replace_all(f.query, "{sep}", f.separator), "{query}", q) + f.suffix);
    };
    p.query_start = static_cast<int64_t>(p.tokens.size());
    add(query(e.query));
    p.null_query = query(f.null_query);
    if (static_cast<int64_t>(p.tokens.size()) == p.query_start || p.null_query.empty())
        throw DataError(fmt::format("{}: the query encodes to no token", where));
    return p;
}

RerankResult rerank_example(const Model& m, const RerankPrompt& p, const std::vector<Head>& heads, int64_t gold,
                            int64_t prefill_chunk) {
    const KVCache prefix = qrhead_prefill(m, p.tokens, p.query_start, prefill_chunk);
    const std::vector<int64_t> query(p.tokens.begin() + p.query_start, p.tokens.end());
    const at::Tensor cal = qrhead_calibrated(m, prefix, query, p.null_query);
    RerankResult r;
    r.scores = qrhead_doc_scores(cal, heads, p.spans);
    std::vector<at::Tensor> per;
    for (auto [s, e] : p.spans) per.push_back(qrhead_span_scores(cal, s, e));
    r.per_head = torch::stack(per);
    const int64_t D = static_cast<int64_t>(r.scores.size());
    r.ranking.resize(static_cast<size_t>(D));
    std::iota(r.ranking.begin(), r.ranking.end(), 0);
    std::stable_sort(r.ranking.begin(), r.ranking.end(),
                     [&](int64_t a, int64_t b) { return r.scores[static_cast<size_t>(a)] > r.scores[static_cast<size_t>(b)]; });
    r.gold_rank = 1 + (std::find(r.ranking.begin(), r.ranking.end(), gold) - r.ranking.begin());
    r.reciprocal_rank = 1.0 / static_cast<double>(r.gold_rank);
    r.hit1 = r.gold_rank == 1;
    return r;
}

}  // namespace hs
