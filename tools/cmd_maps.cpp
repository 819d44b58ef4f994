// headscope maps: MAPS relation scores per head from raw weights (static) and, on request, from
// the head's output on templates (dynamic). Method: probes/weights/maps.h, docs/methods-weights.md.
#include "commands.h"
#include "common.h"
#include "score_records.h"
#include "errors.h"
#include "maps.h"
#include "progress.h"

#include <torch/torch.h>

namespace hs::cli {

struct MapsCliOptions {
    ModelArgs model;
    OutputArgs out;
    std::string relations;
    int k = 0;
    bool suppression = false;
    int64_t block_size = 2048;
    bool dynamic = false;
    int min_pairs = 30;
};

// Keeps relations with at least min_pairs single-token pairs; says what it kept and dropped.
static std::vector<TokenizedRelation> usable_relations(const MapsCliOptions& o, const Tokenizer& tok,
                                                       std::vector<std::string>& skipped) {
    std::vector<TokenizedRelation> kept;
    std::string why;
    for (const auto& rel : read_relations(o.relations)) {
        auto t = tokenize_relation(rel, tok);
        const auto n = static_cast<int64_t>(t.src.size());
        auto line = fmt::format("relation '{}' ({}): {} of {} pairs are single tokens", rel.name, rel.source, n,
                                t.n_total);
        if (n >= o.min_pairs) {
            log_info(line);
            kept.push_back(std::move(t));
        } else {
            log_warn(fmt::format("{}, need {} (--min-pairs): skipped", line, o.min_pairs));
            skipped.push_back(rel.name);
            why = line;
        }
    }
    if (kept.empty())
        throw DataError(fmt::format("{}, need {} (--min-pairs); no relation left to score", why, o.min_pairs));
    return kept;
}

// One relation's scores as the record /scores/maps/<relation> stores (dynamic undefined: not scored).
static schema::MapsRelationRecord relation_record(const Model& m, const TokenizedRelation& r, const MapsScores& s,
                                                  const at::Tensor& dynamic, const MapsCliOptions& o) {
    schema::MapsRelationRecord x;
    x.L = m.config.n_layers, x.H = m.config.n_heads, x.N = static_cast<int64_t>(r.src.size());
    x.relation = r.rel.name, x.relation_file = r.rel.source, x.category = r.rel.category;
    x.k = s.k, x.block_size = o.block_size, x.n_pairs_total = r.n_total, x.min_pairs = o.min_pairs;
    x.score = host_floats(s.score);
    if (s.suppression.defined()) x.suppression = host_floats(s.suppression);
    auto ranks = s.target_rank.contiguous();
    x.target_rank.assign(ranks.data_ptr<int64_t>(), ranks.data_ptr<int64_t>() + ranks.numel());
    x.source_tokens.assign(r.src.begin(), r.src.end());
    x.target_tokens.assign(r.dst.begin(), r.dst.end());
    if (dynamic.defined()) {
        x.dynamic = host_floats(dynamic);
        x.templates = maps_templates();
        x.static_dynamic_pearson = pearson(s.score, dynamic);
    }
    return x;
}

void run_maps(const MapsCliOptions& o) {
    if (o.min_pairs < 1) throw UsageError("--min-pairs must be at least 1");
    const WriteMode mode = write_mode(o.out);
    auto l = open_model(o.model, true);
    const Model& m = *l.model;
    std::vector<std::string> skipped;
    auto rels = usable_relations(o, *l.tokenizer, skipped);
    ResultWriter w = open_result(o.out.out, mode);
    if (mode == WriteMode::kAppend) check_same_model(w, m);
    write_meta(w, m, 0);
    MapsOptions mo{o.k, o.block_size, o.suppression};
    Progress bar("maps", static_cast<int64_t>(rels.size()));
    for (const auto& r : rels) {
        auto s = maps_static(m, r, mo);
        at::Tensor dyn;
        if (o.dynamic) {
            dyn = maps_dynamic(m, *l.tokenizer, r, s.k);
            log_info("relation '{}': static/dynamic Pearson r = {:.3f}", r.rel.name, pearson(s.score, dyn));
        }
        schema::write_maps_relation(w, relation_record(m, r, s, dyn, o));
        bar.tick();
    }
    bar.finish();
    schema::MapsRunRecord run{{}, skipped, o.min_pairs};
    for (const auto& r : rels) run.relations.push_back(r.rel.name);
    schema::write_maps_run(w, run);
    w.commit();
    log_info("wrote {} ({} relations scored, {} skipped)", o.out.out, rels.size(), skipped.size());
}

void setup_maps(CLI::App& app) {
    auto o = std::make_shared<MapsCliOptions>();
    auto* sub = app.add_subcommand(
        "maps", "MAPS: score each head's OV circuit on relations of [source, target] word pairs (raw weights)\n"
                "(datasets/relations needs a vocabulary whose words are single tokens, GPT-2 size; the toy relation in\n"
                "datasets/examples/relations fits the 512-token test models)\n"
                "Example: headscope maps ../shared/testdata/stories260K/stories260K.bin --relations "
                "datasets/examples/relations --min-pairs 10 --out maps.h5 --suppression");
    add_model_args(sub, o->model);
    add_output_args(sub, o->out, true);
    sub->add_option("--relations", o->relations, "relation JSON files (comma-separated) or a folder of them")->required();
    sub->add_option("--k", o->k, "top-k for every relation (default: 1 for copying relations, else 10)");
    sub->add_flag("--suppression", o->suppression, "also score -P (the head suppresses the target)");
    sub->add_option("--block-size", o->block_size, "rows of P formed at once")->check(at_least(1))->capture_default_str();
    sub->add_flag("--dynamic", o->dynamic, "also score the head's output on templates, with the static/dynamic correlation");
    sub->add_option("--min-pairs", o->min_pairs, "single-token pairs a relation needs to be scored")->capture_default_str();
    sub->callback([o] { run_maps(*o); });
}

}  // namespace hs::cli
