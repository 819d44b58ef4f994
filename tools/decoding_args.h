// The decoding options `generate` and `retrieval --decoding` share (DeCoRe's --contrast/--alpha/
// --alpha-max, JUICE's --enhance/--suppress and their coefficients), declared and turned into a
// DecodingSpec (probes/decoding/decoding.h) in one place.
#pragma once

#include "decoding.h"

#include <CLI/CLI.hpp>

#include <limits>
#include <string>

namespace hs::cli {

struct DecodingArgs {
    std::string contrast, alpha = "entropy", enhance, suppress;
    double alpha_max = std::numeric_limits<double>::infinity();
    double alpha_enhance = 0.0, alpha_suppress = 0.0;
    bool decore() const { return !contrast.empty(); }
    bool juice() const { return !enhance.empty() || !suppress.empty(); }
};

void add_decoding_args(CLI::App* sub, DecodingArgs& a);
// DeCoRe's two rows from --contrast and --alpha ("entropy" or a number >= 0) and --alpha-max.
DecodingSpec decore_from(const DecodingArgs& a, int L, int H);
// JUICE's two rows from --enhance/--suppress and their coefficients.
DecodingSpec juice_from(const DecodingArgs& a, int L, int H);

}  // namespace hs::cli
