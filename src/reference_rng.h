// The random streams of the reference codes, reproduced draw for draw, so that a protocol that
// follows a reference (headscope retrieval --protocol locos) samples what the reference samples:
//   - numpy's legacy RandomState(seed): MT19937 seeded by init_genrand(seed), randint(low, high,
//     size) by masked rejection on 32-bit draws (numpy/random/src/distributions.c,
//     random_bounded_uint64_fill with use_masked, as RandomState.randint calls it);
//   - Python's random.Random(seed) for a non-negative int seed: MT19937 seeded by init_by_array of
//     the seed's 32-bit words, getrandbits(k <= 32) = genrand_int32() >> (32 - k), _randbelow by
//     rejection on getrandbits(n.bit_length()), shuffle (Fisher-Yates from the end) and sample (the
//     pool or the set branch, as Lib/random.py chooses by the set size).
// Checked against numpy and CPython by tests/test_reference_rng.cpp (fixtures made by
// scripts/make_rng_fixture.py). No torch here.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace hs {

// The Mersenne Twister MT19937 (Matsumoto & Nishimura 1998) with both seedings of the reference
// implementation mt19937ar.c.
class Mt19937 {
public:
    explicit Mt19937(uint32_t seed) { init_genrand(seed); }
    explicit Mt19937(const std::vector<uint32_t>& key) { init_by_array(key); }
    uint32_t next();  // genrand_int32

private:
    void init_genrand(uint32_t s);
    void init_by_array(const std::vector<uint32_t>& key);
    std::array<uint32_t, 624> mt_{};
    int mti_ = 625;
};

// numpy.random.RandomState(seed) (legacy), the calls the references make.
class NumpyRandomState {
public:
    explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}
    // randint(low, high, size=n): n ints in [low, high), high > low.
    std::vector<int64_t> randint(int64_t low, int64_t high, int64_t n);

private:
    Mt19937 mt_;
};

// Python's random.Random(seed), seed >= 0.
class PythonRandom {
public:
    explicit PythonRandom(uint64_t seed);
    uint32_t getrandbits(int k);  // 1 <= k <= 32
    int64_t randbelow(int64_t n);  // n >= 1
    // random.shuffle(x) on a list of n items: the permutation applied, as indices (out[i] = the
    // item that ends at position i).
    std::vector<int64_t> shuffle_order(int64_t n);
    // random.sample(range(n), k) as indices into the population.
    std::vector<int64_t> sample(int64_t n, int64_t k);

private:
    Mt19937 mt_;
};

}  // namespace hs
