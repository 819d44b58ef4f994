// The head atlas's file (`headscope atlas`, probes/atlas/atlas.h): /atlas holds every score as a
// column of one [S, L, H] array, each head's roles, the columns' correlations, and as attributes the
// columns' names, sources, roles and thresholds (docs/hdf5-schema.md, "/atlas"). Every dataset name
// and attribute text is here.
#pragma once

#include "store.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hs::schema {

struct AtlasRecord {
    int64_t S = 0, L = 0, H = 0;
    std::vector<std::string> columns, sources, roles, threshold_sources;  // [S]
    std::vector<double> thresholds;      // [S], NaN: the column gives no role
    std::vector<float> scores;           // [S, L, H]
    std::vector<uint8_t> role;           // [S, L, H] 1 where the head's score > the column's threshold
    std::vector<int64_t> n_roles;        // [L, H]
    std::vector<float> correlation;      // [S, S] Spearman's rho over the L*H heads
    std::vector<std::string> skipped;    // methods the model does not allow, with the reason
    int64_t seq_len = 0, batch = 0, seed = 0, cs_tokens = 0;
    double sink_epsilon = 0.3, model_sink_rate = 0;
};
void write_atlas(ResultWriter& w, const AtlasRecord& r);  // an existing /atlas is replaced
AtlasRecord read_atlas(const ResultReader& r);            // DataError naming the file when /atlas is malformed

}  // namespace hs::schema
