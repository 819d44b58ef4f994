// The report's sections (internal to src/report/, not part of the public API): one function per group
// of the file, each returning its section's body; render_file (report.cpp) calls them in page order
// and wraps each with section(). Each section's file is named after it (report_<section>.cpp).
#pragma once

#include "store.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hs::report_detail {

struct FileView {
    std::string path;
    std::unique_ptr<ResultReader> r;
    int index = 0;
    std::vector<std::string> toc;  // section titles
    int known = 0;                 // groups rendered
};

// A section of one file's column: its title joins the file's table of contents.
std::string section(FileView& f, const std::string& title, const std::string& body);

// /meta (report_provenance.cpp); a whole section, already wrapped.
std::string provenance(FileView& f);
// /scores (report_scores.cpp): one probe's group, DLA's decomposition, the MAPS relations.
std::string score_group(FileView& f, const std::string& probe, int top_k);
std::string dla_extra(FileView& f, int64_t L, int64_t H);
std::string maps_group(FileView& f, int top_k);
// /scores/sink-rate's rates (report_sink.cpp): the model's and each layer's; "" without layer_rate.
std::string sink_rates(FileView& f);
// /atlas (report_atlas.cpp): the head atlas's table, multi-role heads, correlations.
std::string atlas_section(FileView& f);
// /patching/<name> (report_patching.cpp).
std::string patching_group(FileView& f, const std::string& name, int top_k);
// /ablation/<study> (report_ablation.cpp).
std::string ablation_study(FileView& f, const std::string& name);
// /retrieval: the needle test's trials, its query ablation and its streaming-heads sweep (report_needle.cpp).
std::string retrieval_trials(FileView& f);
std::string retrieval_ablation(FileView& f);
std::string retrieval_streaming(FileView& f);
// /retrieval/kv_compare: KV-cache policies at equal memory (report_kv.cpp).
std::string retrieval_kv_compare(FileView& f);
// /influence: AttentionInfluence (report_influence.cpp).
std::string influence_section(FileView& f, int top_k);

}  // namespace hs::report_detail
