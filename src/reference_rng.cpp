#include "reference_rng.h"

#include "errors.h"

#include <cmath>
#include <numeric>
#include <unordered_set>

namespace hs {

// mt19937ar.c (Matsumoto & Nishimura), the generator numpy's MT19937 and CPython's _random share.
void Mt19937::init_genrand(uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < 624; ++i) mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
    mti_ = 624;
}

void Mt19937::init_by_array(const std::vector<uint32_t>& key) {
    init_genrand(19650218U);
    const int n = 624, len = static_cast<int>(key.size());
    int i = 1, j = 0;
    for (int k = n > len ? n : len; k > 0; --k) {
        mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525U)) + key[j] + static_cast<uint32_t>(j);
        ++i, ++j;
        if (i >= n) mt_[0] = mt_[n - 1], i = 1;
        if (j >= len) j = 0;
    }
    for (int k = n - 1; k > 0; --k) {
        mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
        ++i;
        if (i >= n) mt_[0] = mt_[n - 1], i = 1;
    }
    mt_[0] = 0x80000000U;
    mti_ = 624;
}

uint32_t Mt19937::next() {
    constexpr uint32_t kUpper = 0x80000000U, kLower = 0x7fffffffU, kMatrix = 0x9908b0dfU;
    if (mti_ >= 624) {
        int k = 0;
        for (; k < 624 - 397; ++k) {
            const uint32_t y = (mt_[k] & kUpper) | (mt_[k + 1] & kLower);
            mt_[k] = mt_[k + 397] ^ (y >> 1) ^ ((y & 1U) ? kMatrix : 0U);
        }
        for (; k < 623; ++k) {
            const uint32_t y = (mt_[k] & kUpper) | (mt_[k + 1] & kLower);
            mt_[k] = mt_[k + (397 - 624)] ^ (y >> 1) ^ ((y & 1U) ? kMatrix : 0U);
        }
        const uint32_t y = (mt_[623] & kUpper) | (mt_[0] & kLower);
        mt_[623] = mt_[396] ^ (y >> 1) ^ ((y & 1U) ? kMatrix : 0U);
        mti_ = 0;
    }
    uint32_t y = mt_[mti_++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

std::vector<int64_t> NumpyRandomState::randint(int64_t low, int64_t high, int64_t n) {
    HS_REQUIRE(high > low && n >= 0, "NumpyRandomState::randint: needs high > low and n >= 0");
    const uint64_t rng = static_cast<uint64_t>(high - 1 - low);  // the closed range's width
    HS_REQUIRE(rng <= 0xFFFFFFFFULL, "NumpyRandomState::randint: ranges wider than 32 bits are not reproduced");
    std::vector<int64_t> out(static_cast<size_t>(n), low);
    if (rng == 0) return out;  // numpy draws nothing
    if (rng == 0xFFFFFFFFULL) {
        for (auto& v : out) v = low + static_cast<int64_t>(mt_.next());
        return out;
    }
    uint64_t mask = rng;  // the smallest 2^k - 1 >= rng
    for (int s : {1, 2, 4, 8, 16, 32}) mask |= mask >> s;
    for (auto& v : out) {
        uint64_t x;
        while ((x = (mt_.next() & mask)) > rng) {}
        v = low + static_cast<int64_t>(x);
    }
    return out;
}

static std::vector<uint32_t> seed_words(uint64_t seed) {
    std::vector<uint32_t> key;
    do {
        key.push_back(static_cast<uint32_t>(seed & 0xFFFFFFFFULL));
        seed >>= 32;
    } while (seed != 0);
    return key;
}

PythonRandom::PythonRandom(uint64_t seed) : mt_(seed_words(seed)) {}

uint32_t PythonRandom::getrandbits(int k) {
    HS_REQUIRE(k >= 1 && k <= 32, "PythonRandom::getrandbits: 1 <= k <= 32");
    return mt_.next() >> (32 - k);
}

int64_t PythonRandom::randbelow(int64_t n) {
    HS_REQUIRE(n >= 1 && n <= 0xFFFFFFFFLL, "PythonRandom::randbelow: 1 <= n < 2^32");
    int k = 0;
    for (uint64_t v = static_cast<uint64_t>(n); v; v >>= 1) ++k;  // n.bit_length()
    int64_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
}

std::vector<int64_t> PythonRandom::shuffle_order(int64_t n) {
    std::vector<int64_t> x(static_cast<size_t>(n));
    std::iota(x.begin(), x.end(), int64_t{0});
    for (int64_t i = n - 1; i >= 1; --i) std::swap(x[static_cast<size_t>(i)], x[static_cast<size_t>(randbelow(i + 1))]);
    return x;
}

std::vector<int64_t> PythonRandom::sample(int64_t n, int64_t k) {
    HS_REQUIRE(k >= 0 && k <= n, "PythonRandom::sample: 0 <= k <= n");
    std::vector<int64_t> result(static_cast<size_t>(k));
    int64_t setsize = 21;
    if (k > 5) setsize += static_cast<int64_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
    if (n <= setsize) {
        std::vector<int64_t> pool(static_cast<size_t>(n));
        std::iota(pool.begin(), pool.end(), int64_t{0});
        for (int64_t i = 0; i < k; ++i) {
            const int64_t j = randbelow(n - i);
            result[static_cast<size_t>(i)] = pool[static_cast<size_t>(j)];
            pool[static_cast<size_t>(j)] = pool[static_cast<size_t>(n - i - 1)];
        }
    } else {
        std::unordered_set<int64_t> selected;
        for (int64_t i = 0; i < k; ++i) {
            int64_t j = randbelow(n);
            while (selected.count(j)) j = randbelow(n);
            selected.insert(j);
            result[static_cast<size_t>(i)] = j;
        }
    }
    return result;
}

}  // namespace hs
