// JUICE's head selection (Li et al., GaotangLi/JUICE, src/select_intervention_head.py) from a YAML
// scale-grid study (docs/experiments.md "JUICE head selection"; docs/methods.md).
//
// The reference adds alpha o_h to the layer's output for one head at a time (o_h the head's own
// output in the same run, so it is z_h *= 1 + alpha), alpha in {1, 3, 5, 10, 30} and {-1, -2, -5},
// and records p(first token of the parametric answer) - p(unchanged) at the last prompt position on
// three prompt types (clean, substitution conflict, coherent conflict). Per head and prompt type it
// averages over the positive alphas ("Positive") and over the negative ones ("Negative"), each over
// the instances. Heads whose Positive change is > 0 on every prompt type are the enhance candidates,
// ranked by its sum over types; heads whose Negative change is > 0 on every type (scaling them down
// raises the parametric answer) are the suppress candidates, ranked the same way.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace hs {

struct JuiceSelection {
    std::vector<int64_t> variants;  // the prompt types present (a conflicts dataset's variant ids), ascending
    std::vector<double> factors;    // the grid, in the study's order
    at::Tensor delta;               // [V, L, H, F] float64: mean metric - the baseline's, per variant (NaN: not run)
    at::Tensor up, down;            // [V, L, H] float64: mean of delta over factors > 1 (alpha > 0) / < 1 (alpha < 0)
    at::Tensor enhance, suppress;   // [L, H] float64: sum over variants of up / down where it is > 0 in EVERY
                                    // variant, NaN elsewhere (rank_heads puts NaN last)
};

// A scale-grid study as `run` computes it or as its file stores it (so `merge` recomputes the same):
// rows [S, N] metric per configuration and dataset row (configuration 0 the baseline), masks
// [S, L, H] (one head each after the baseline), factors [S]; variants [N] prompt type per row (empty:
// one type). Throws ConfigError for anything that is not a scale grid.
JuiceSelection juice_selection(const at::Tensor& rows, const at::Tensor& masks, const std::vector<double>& factors,
                               const std::vector<int64_t>& variants);

}  // namespace hs
