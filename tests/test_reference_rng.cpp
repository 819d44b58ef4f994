// The reference codes' random streams (src/reference_rng.h) against numpy and CPython, and LOCOS's
// bootstrap interval (probes/needle/needle.h bootstrap_ci_numpy) against numpy's own computation, to the
// last float32 bit. Fixture: tests/data/reference_rng.json, written by scripts/make_rng_fixture.py
// (numpy's legacy RandomState and Python's random; the same values from numpy 1.24 and 2.4).
#include <doctest/doctest.h>

#include "needle.h"
#include "reference_rng.h"
#include "util.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstring>

using namespace hs;

static nlohmann::json fixture() {
    return nlohmann::json::parse(read_text_file(std::string(HS_SOURCE_DIR) + "/tests/data/reference_rng.json"));
}

TEST_CASE("reference rng: numpy RandomState(seed).randint draws as numpy does, the stream continuing across calls") {
    const auto f = fixture();
    for (const auto& c : f["randint"]) {
        CAPTURE(c["seed"].get<int64_t>());
        CAPTURE(c["n"].get<int64_t>());
        NumpyRandomState rs(c["seed"].get<uint32_t>());
        for (const auto& draw : c["draws"])
            CHECK(rs.randint(0, c["n"].get<int64_t>(), c["size"].get<int64_t>()) == draw.get<std::vector<int64_t>>());
    }
}

TEST_CASE("reference rng: Python random.Random(seed) getrandbits, shuffle and sample as CPython does") {
    const auto f = fixture();
    for (const auto& c : f["python"]) {
        const auto seed = c["seed"].get<uint64_t>();
        CAPTURE(seed);
        PythonRandom r(seed);
        std::vector<int64_t> bits;
        for (int k : {1, 5, 17, 32, 31, 8}) bits.push_back(r.getrandbits(k));
        CHECK(bits == c["getrandbits"].get<std::vector<int64_t>>());
        PythonRandom r2(seed);
        CHECK(r2.shuffle_order(50) == c["shuffle50"].get<std::vector<int64_t>>());
        PythonRandom r3(seed);
        CHECK(r3.sample(20, 7) == c["sample20_7"].get<std::vector<int64_t>>());  // the pool branch
        CHECK(r3.sample(1024, 12) == c["sample1024_12_then_300_3"][0].get<std::vector<int64_t>>());  // the set branch
        CHECK(r3.sample(300, 3) == c["sample1024_12_then_300_3"][1].get<std::vector<int64_t>>());
    }
}

TEST_CASE("reference rng: LOCOS's bootstrap interval equals numpy's to the last float32 bit") {
    const auto f = fixture()["bootstrap"];
    const auto rows = f["samples"];
    const int64_t N = static_cast<int64_t>(rows.size()), A = 3, B = 4;
    auto s = torch::empty({N, A, B}, torch::kFloat);
    for (int64_t i = 0; i < N; ++i)
        for (int64_t a = 0; a < A; ++a)
            for (int64_t b = 0; b < B; ++b) s[i][a][b] = rows[i][a][b].get<float>();
    const auto [low, high] = bootstrap_ci_numpy(s, f["resamples"].get<int64_t>(), f["seed"].get<uint32_t>());
    auto hex = [](float v) {
        unsigned char b[4];
        std::memcpy(b, &v, 4);
        static const char* d = "0123456789abcdef";
        std::string out;
        for (int i = 0; i < 4; ++i) out += d[b[i] >> 4], out += d[b[i] & 15];  // little-endian, as numpy's tobytes()
        return out;
    };
    const auto lo = low.contiguous(), hi = high.contiguous();
    for (int64_t c = 0; c < A * B; ++c) {
        CAPTURE(c);
        CHECK(hex(lo.data_ptr<float>()[c]) == f["low_hex"][c].get<std::string>());
        CHECK(hex(hi.data_ptr<float>()[c]) == f["high_hex"][c].get<std::string>());
    }
}
