// headscope maps: MAPS relation scores per head from raw weights (static) and, on request, from
// the head's output on templates (dynamic). Method: probes/weights/maps.h, docs/methods-weights.md.
#include "commands.h"
#include "common.h"
#include "schema.h"
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

static void write_relation(ResultWriter& w, const Model& m, const TokenizedRelation& r, const MapsScores& s,
                           const at::Tensor& dynamic, const MapsCliOptions& o) {
    const int64_t L = m.config.n_layers, H = m.config.n_heads, N = static_cast<int64_t>(r.src.size());
    Attrs a{{"probe", std::string("maps")},
            {"relation", r.rel.name},
            {"relation_file", r.rel.source},
            {"category", r.rel.category},
            {"k", static_cast<int64_t>(s.k)},
            {"block_size", o.block_size},
            {"weight_processing", std::string("raw")},
            {"source_representation", std::string("MLP0(norm2_0(W_E[s])) output only; raw W_E[s] for layer-0 heads")},
            {"n_pairs_total", r.n_total},
            {"n_pairs_kept", N},
            {"min_pairs", static_cast<int64_t>(o.min_pairs)}};
    schema::ScoreGroup g{"maps/" + r.rel.name, {}, {}};
    Attrs sa = a;
    sa["description"] = std::string("fraction of pairs whose target is in the top-k of E_s W_VO W_U^T");
    g.datasets.push_back({"score", {{L, H}, host_floats(s.score), sa}});
    if (s.suppression.defined()) {
        sa["description"] = std::string("fraction of pairs whose target is in the top-k of -(E_s W_VO W_U^T)");
        g.datasets.push_back({"suppression", {{L, H}, host_floats(s.suppression), sa}});
    }
    auto ranks = s.target_rank.contiguous();
    g.datasets.push_back({"target_rank", {{L, H, N}, std::vector<int64_t>(ranks.data_ptr<int64_t>(), ranks.data_ptr<int64_t>() + ranks.numel()), {}}});
    g.datasets.push_back({"source_tokens", {{N}, std::vector<int32_t>(r.src.begin(), r.src.end()), {}}});
    g.datasets.push_back({"target_tokens", {{N}, std::vector<int32_t>(r.dst.begin(), r.dst.end()), {}}});
    if (dynamic.defined()) {
        sa["description"] = std::string("mean over templates of the top-k criterion on z[-1,h] W_O^h W_U^T");
        sa["templates"] = maps_templates();
        g.datasets.push_back({"dynamic", {{L, H}, host_floats(dynamic), sa}});
        a["static_dynamic_pearson"] = pearson(s.score, dynamic);
    }
    g.attrs = a;
    schema::write_scores(w, g);
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
        write_relation(w, m, r, s, dyn, o);
        bar.tick();
    }
    bar.finish();
    std::string names, skipped_names;
    for (const auto& r : rels) names += (names.empty() ? "" : ",") + r.rel.name;
    for (const auto& s : skipped) skipped_names += (skipped_names.empty() ? "" : ",") + s;
    w.set_attrs(schema::maps_root(), {{"probe", std::string("maps")},
                                 {"relations", names},
                                 {"skipped_relations", skipped_names},  // too few single-token pairs
                                 {"min_pairs", static_cast<int64_t>(o.min_pairs)}});
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
