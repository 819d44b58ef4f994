#include "decoding_args.h"

#include "common.h"
#include "errors.h"
#include "heads.h"

#include <fmt/format.h>

#include <cmath>

namespace hs::cli {

void add_decoding_args(CLI::App* sub, DecodingArgs& a) {
    sub->add_option("--contrast", a.contrast,
                    "DeCoRe: contrast the plain model with these heads masked (zero query: uniform causal attention, "
                    "the reference's flash path; its eager path zeroes scores after the causal mask and lets the head "
                    "see future tokens, headscope does not); next = argmax[(1 + a) log p_base - a log p_masked]; the "
                    "prompt is prefilled unmasked and shared, as decore_entropy.py does");
    sub->add_option("--alpha", a.alpha, "DeCoRe's a: entropy (of p_base, nats) or a constant")->capture_default_str();
    sub->add_option("--alpha-max", a.alpha_max, "DeCoRe: cap on a (the reference's alpha_cap)")->check(at_least(0));
    sub->add_option("--enhance", a.enhance, "JUICE: heads whose output gets + alpha-enhance x the plain run's (dual run as 2 rows)");
    sub->add_option("--alpha-enhance", a.alpha_enhance, "JUICE: enhance coefficient")->capture_default_str();
    sub->add_option("--suppress", a.suppress, "JUICE: heads whose output gets - alpha-suppress x the plain run's");
    sub->add_option("--alpha-suppress", a.alpha_suppress, "JUICE: suppress coefficient")->capture_default_str();
}

DecodingSpec decore_from(const DecodingArgs& a, int L, int H) {
    const auto heads = with_flag("--contrast", [&] { return parse_head_list(a.contrast, L, H); });
    const bool entropy = a.alpha == "entropy";
    double value = 0;
    if (!entropy) {
        const auto v = parse_double(a.alpha);
        if (!v || *v < 0) throw UsageError(fmt::format("--alpha '{}': expected entropy or a number >= 0", a.alpha));
        value = *v;
    }
    return decore_spec(heads, entropy, value, a.alpha_max);
}

DecodingSpec juice_from(const DecodingArgs& a, int L, int H) {
    auto heads = [&](const std::string& s, const char* flag) {
        return s.empty() ? std::vector<Head>{} : with_flag(flag, [&] { return parse_head_list(s, L, H); });
    };
    return juice_spec(heads(a.enhance, "--enhance"), a.alpha_enhance, heads(a.suppress, "--suppress"), a.alpha_suppress);
}

}  // namespace hs::cli
