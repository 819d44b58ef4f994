// DuoAttention's deployment by sparsity (probes/ablation/duo_sparsity.h) against the reference's
// selection lines (mit-han-lab/duo-attention@fe93c31 duo_attn/utils.py l. 353-373) run in numpy by
// tests/duo_sparsity_check.py with the same fixed noise: its printed thresholds (hex, compared bit
// for bit), returned sparsities and masks are the table below. Regenerate the table with
// `/usr/bin/python3 tests/duo_sparsity_check.py` (numpy 1.24) if the cases change.
#include <doctest/doctest.h>

#include "duo_sparsity.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

using namespace hs;

namespace {

struct Expected {
    char kase;
    double sparsity, threshold, returned;
    const char* mask;
};

// tests/duo_sparsity_check.py's output.
const Expected kExpected[] = {
    {'A', 0x0.0p+0, -0x1.0000000000000p+0, 0x0.0p+0, "11111111"},
    {'A', 0x1.999999999999ap-4, 0x1.92a737110e454p-21, 0x1.0000000000000p-3, "11111011"},
    {'A', 0x1.0000000000000p-2, 0x1.333410a8c4afcp-4, 0x1.0000000000000p-2, "11110011"},
    {'A', 0x1.3333333333333p-2, 0x1.eb85e55cbb97ep-4, 0x1.8000000000000p-2, "11110010"},
    {'A', 0x1.0000000000000p-1, 0x1.33334ab0277aap-2, 0x1.0000000000000p-1, "11100010"},
    {'A', 0x1.8000000000000p-1, 0x1.8cccdcbd04d8bp-1, 0x1.8000000000000p-1, "11000000"},
    {'A', 0x1.ccccccccccccdp-1, 0x1.000002af31dc4p+0, 0x1.c000000000000p-1, "10000000"},
    {'A', 0x1.0000000000000p+0, 0x1.0000000000000p+1, 0x1.0000000000000p+0, "00000000"},
    {'B', 0x1.999999999999ap-4, 0x1.76c8e03507bf6p-3, 0x1.a492492492490p-4, "11110011011111111111111110110111111111111101111111101111111011111111111111010111111111111111101110111111111111011111111101111110111111111111111001111111111111111011110111111111110111111111101111101111111111111111011111111111"},
    {'B', 0x1.0000000000000p-1, 0x1.785200821fc43p-1, 0x1.0000000000000p-1, "10010010000111100100111100000111001001111000011110000011110000111100100111000001111001001111000010110010011110000111100100111100001111001001111000011110010011110000110100100111100001111001001111000011110010011110000111100101"},
    {'B', 0x1.8000000000000p-1, 0x1.e6666b62015a7p-1, 0x1.8000000000000p-1, "10010000000011000100011000000110001000110000001100000001100000011000100010000000110001000110000000100010001100000011000100011000000110001000100000001100010001000000010000100010000000110001000100000001100010001000000011000100"},
    {'B', 0x1.5555555555555p-2, 0x1.11111a3187646p-1, 0x1.56db6db6db6dcp-2, "10110010000111110101111100010111101011111000111111000111110001111110101111000011111101011111000110111010111110001111110101111100011111101011111000111111010111110001110110101111100011111101001111000111111010111110001111110101"},
    {'B', 0x1.ccccccccccccdp-1, 0x1.0000025d29303p+0, 0x1.cb6db6db6db6ep-1, "00010000000001000100010000000000001000100000000000000001000000000000100010000000000000000100000000000010001000000000000100000000000000001000100000000000010001000000000000100010000000000001000100000000000010001000000000000000"},
    {'B', 0x1.999999999999ap-5, 0x1.c28fa25e8a052p-4, 0x1.b6db6db6db6e0p-5, "11110011111111111111111111110111111111111111111111101111111111111111111111011111111111111111111110111111111111111111111101111111111111111111111011111111111111111111110111111111111111111111101111101111111111111111011111111111"},
};

// The script's cases: the gates (before the clip) and the noise, flat.
void case_of(char k, std::vector<double>* g, std::vector<double>* n) {
    g->clear(), n->clear();
    if (k == 'A') {
        *g = {1, 1, 0.3, 0.3, 0, 0, 0.7, 0.1};
        *n = {3e-7, 1e-7, 5e-7, 2e-7, 9e-7, 4e-7, 6e-7, 8e-7};
        return;
    }
    for (int i = 0; i < 28 * 8; ++i) {
        // np.round(np.abs(np.sin(i * 0.37)), 2): round half to even at 2 decimals, as numpy's
        // (it scales by 100, rounds half to even and divides)
        g->push_back(std::nearbyint(std::fabs(std::sin(i * 0.37)) * 100.0) / 100.0);
        n->push_back(static_cast<double>((i * 7919) % 1000) * 1e-9);
    }
    for (int i = 0; i < 28 * 8; i += 17) (*g)[static_cast<size_t>(i)] = 1.0;
    for (int i = 5; i < 28 * 8; i += 23) (*g)[static_cast<size_t>(i)] = 0.0;
    (*g)[3] = 1.25, (*g)[4] = -0.5;
}

}  // namespace

TEST_CASE("duo sparsity: the reference's selection (quantile, tie noise, ends) as numpy runs its lines") {
    for (const auto& e : kExpected) {
        std::vector<double> g, n;
        case_of(e.kase, &g, &n);
        CAPTURE(e.kase);
        CAPTURE(e.sparsity);
        const auto r = duo_sparsify(g, e.sparsity, n);
        CHECK(r.threshold == e.threshold);  // bit for bit
        CHECK(r.sparsity == e.returned);
        std::string mask;
        for (char c : r.full) mask += c ? '1' : '0';
        CHECK(mask == e.mask);
    }
}

TEST_CASE("duo sparsity: numpy's linear quantile by hand; the noise; bad input") {
    // (n - 1) q = 1.5 between 2 and 3 (t = 0.5: b - (b - a) * 0.5), = 3 (an index, t = 0), the ends
    CHECK(numpy_quantile_linear({4, 1, 3, 2, 5}, 0.375) == 2.5);
    CHECK(numpy_quantile_linear({4, 1, 3, 2, 5}, 0.75) == 4);
    CHECK(numpy_quantile_linear({4, 1, 3, 2, 5}, 0) == 1);
    CHECK(numpy_quantile_linear({4, 1, 3, 2, 5}, 1) == 5);
    CHECK(numpy_quantile_linear({7}, 0.3) == 7);
    CHECK_THROWS_AS(numpy_quantile_linear({1, 2}, 1.5), std::invalid_argument);
    CHECK_THROWS_AS(numpy_quantile_linear({1, NAN}, 0.5), std::invalid_argument);
    CHECK_THROWS_AS(duo_sparsify({0.5, 0.2}, -0.1, {0, 0}), std::invalid_argument);
    CHECK_THROWS_AS(duo_sparsify({0.5, 0.2}, 0.5, {0}), std::invalid_argument);
    CHECK_THROWS_AS(duo_sparsify({0.5, NAN}, 0.5, {0, 0}), std::invalid_argument);
    const auto a = duo_tie_noise(1000, 7), b = duo_tie_noise(1000, 7), c = duo_tie_noise(1000, 8);
    CHECK(a == b);
    CHECK(a != c);
    double lo = 1, hi = 0, mean = 0;
    for (double v : a) lo = std::min(lo, v), hi = std::max(hi, v), mean += v / 1000;
    CHECK(lo >= 0);
    CHECK(hi < 1e-6);
    CHECK(mean == doctest::Approx(0.5e-6).epsilon(0.1));
    // Tied gates: the noise decides, and the count kept is what the quantile gives distinct values
    // (8 values, sparsity 0.5: (n - 1) q = 3.5, the 4 above the 4th smallest).
    const auto r = duo_sparsify(std::vector<double>(8, 1.0), 0.5, duo_tie_noise(8, 3));
    int kept = 0;
    for (char f : r.full) kept += f;
    CHECK(kept == 4);
    CHECK(r.sparsity == 0.5);
}
