// headscope rerank: QRHead's re-ranker (Zhang et al., EMNLP 2025): each example's documents scored by
// the top heads' calibrated attention mass from the query, ranked, and judged against the gold one.
// Method: probes/needle/rerank.h, qrhead.h; docs/methods.md ("QRHead").
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "heads.h"
#include "progress.h"
#include "rerank.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstdio>

namespace hs::cli {

struct RerankCliOptions {
    ModelArgs model;
    std::string heads, docs, dump;
    int64_t top = 16;
    int64_t prefill_chunk = 512;
    RerankFormat format;
};

// --heads: FILE.h5:DATASET (its top --top heads) or a head list (L1H0,L1H2).
static std::vector<Head> rerank_heads(const RerankCliOptions& o, int L, int H, std::string* source) {
    int l = 0, h = 0;
    const std::string first = trim(split(o.heads, ',').front());
    if (parse_head_name(first, l, h)) {
        *source = "the named heads";
        return with_flag("--heads", [&] { return parse_head_list(o.heads, L, H); });
    }
    const at::Tensor score = with_flag("--heads", [&] { return read_head_score(split_head_score_ref(o.heads), L, H); });
    if (o.top > L * H) throw UsageError(fmt::format("--top {}: the model has {} heads", o.top, L * H));
    *source = fmt::format("the top {} of {}", o.top, o.heads);
    return top_heads(score, o.top);
}

void run_rerank(const RerankCliOptions& o) {
    with_flag({{"--doc-format", "doc_format"}, {"--query-format", "query_format"}}, [&] { check_rerank_format(o.format); });
    const auto examples = read_rerank_examples(o.docs);
    auto lm = open_model(o.model, true);
    const Model& m = *lm.model;
    const int L = m.config.n_layers, H = m.config.n_heads;
    std::string source;
    const auto heads = rerank_heads(o, L, H, &source);
    std::printf("heads (%s): %s\n", source.c_str(), format_heads(heads).c_str());
    double hits = 0, mrr = 0;
    nlohmann::json dump = nlohmann::json::array();
    for (const auto& e : examples) {
        const std::string where = fmt::format("{}:{}", o.docs, e.line);
        const auto p = build_rerank_prompt(*lm.tokenizer, o.format, e, where);
        if (m.config.max_seq_len > 0 && static_cast<int64_t>(p.tokens.size() + p.null_query.size()) > m.config.max_seq_len)
            throw UsageError(fmt::format("{}: the prompt ({} tokens) is beyond the model's context of {}", where, p.tokens.size(),
                                         m.config.max_seq_len));
        const auto r = rerank_example(m, p, heads, e.gold, o.prefill_chunk);
        hits += r.hit1, mrr += r.reciprocal_rank;
        std::printf("line %d: ranking %s, gold %lld at rank %lld (recall@1 %d, RR %.4f), scores", e.line,
                    fmt::format("[{}]", fmt::join(r.ranking, ", ")).c_str(), static_cast<long long>(e.gold),
                    static_cast<long long>(r.gold_rank), r.hit1 ? 1 : 0, r.reciprocal_rank);
        for (double s : r.scores) std::printf(" %.5f", s);
        std::printf("\n");
        if (o.dump.empty()) continue;
        const auto ph = r.per_head.contiguous();
        nlohmann::json spans = nlohmann::json::array();
        for (auto [s, t] : p.spans) spans.push_back({s, t});
        dump.push_back({{"line", e.line},
                        {"tokens", p.tokens},
                        {"query_start", p.query_start},
                        {"null_query", p.null_query},
                        {"spans", spans},
                        {"gold", e.gold},
                        {"scores", r.scores},
                        {"ranking", r.ranking},
                        {"per_head", std::vector<double>(ph.data_ptr<double>(), ph.data_ptr<double>() + ph.numel())}});
    }
    const double n = static_cast<double>(examples.size());
    std::printf("%zu examples: recall@1 %.4f, MRR %.4f\n", examples.size(), hits / n, mrr / n);
    if (!o.dump.empty()) {
        nlohmann::json j = {{"heads", format_heads(heads)}, {"L", L}, {"H", H}, {"examples", dump}};
        AtomicFile f(o.dump);
        f.write(j.dump() + "\n");
        f.commit();
        log_info("wrote {}", o.dump);
    }
}

void setup_rerank(CLI::App& app) {
    auto o = std::make_shared<RerankCliOptions>();
    auto* sub = app.add_subcommand(
        "rerank",
        "QRHead's re-ranker (Zhang et al., EMNLP 2025; princeton-pli/QRHead attn_retriever.py score_docs): each\n"
        "example's documents scored by the heads' attention mass from the query, calibrated by the same prompt\n"
        "with the null query 'N/A', ranked; recall@1 and the reciprocal rank of the gold document per example\n"
        "and over the file. The heads: the top --top of an [L, H] score (e.g. a needle scan's\n"
        "scores/qrhead/score) or a list.\n"
        "Example: headscope rerank models/toy-recall --heads L1H0,L1H1,L1H2 --docs datasets/rerank/toy_recall.jsonl "
        "--instruction '' --separator '' --doc-format '{doc}' --query-format '?{query}'");
    add_model_args(sub, o->model);
    sub->add_option("--heads", o->heads, "FILE.h5:DATASET with an [L, H] score (its top --top heads), or heads L1H0,L1H2")
        ->required();
    sub->add_option("--top", o->top, "heads taken from an [L, H] score (QRHead's configs: 16)")
        ->check(at_least(1))
        ->capture_default_str();
    sub->add_option("--docs", o->docs, "JSON lines: {\"query\": str, \"docs\": [str, ...], \"gold\": 0-based index}")
        ->required();
    sub->add_option("--prefix", o->format.prefix, "text before the instruction (a chat header; QRHead: the model's)");
    sub->add_option("--instruction", o->format.instruction, "the instruction before the documents")->capture_default_str();
    sub->add_option("--separator", o->format.separator, "between the pieces")->capture_default_str();
    sub->add_option("--doc-format", o->format.doc, "a document: {i} its 1-based index, {doc} its text")->capture_default_str();
    sub->add_option("--query-format", o->format.query, "the query piece: {query}, {sep} the separator")->capture_default_str();
    sub->add_option("--suffix", o->format.suffix, "text after the query (a chat footer; QRHead: the model's)");
    sub->add_option("--null-query", o->format.null_query, "the calibration's null query")->capture_default_str();
    sub->add_option("--prefill-chunk", o->prefill_chunk, "prompt tokens per prefill forward")->check(at_least(1))->capture_default_str();
    sub->add_option("--dump", o->dump, "also write each example's tokens, spans, scores and per-head scores (JSON; "
                                       "tests/qrhead_check.py reads it)");
    sub->callback([o] { run_rerank(*o); });
}

}  // namespace hs::cli
