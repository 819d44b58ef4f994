// A fresh multi-query recall sample per step for DuoAttention's gates (duo_data.h).
#include "duo_data.h"

#include "errors.h"
#include "toy_tasks.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include <vector>

namespace hs {

Ablator::ScoredRows duo_recall_sample(uint64_t seed, int64_t step, int64_t rows, int64_t T, c10::Device device) {
    if (T < 8 || rows < 1) throw ConfigError(fmt::format("duo-gates sample: {} rows of {} tokens (at least 1 row of 8)", rows, T));
    toy::Rng rng(seed + static_cast<uint64_t>(step));
    auto rb = toy::recall_batch(rng, rows, T, false);
    auto tok = rb.batch.tokens.contiguous();
    const int64_t* t = tok.data_ptr<int64_t>();
    std::vector<int64_t> row, pos;
    for (int64_t b = 0; b < rows; ++b)
        for (int64_t q = rb.query_pos[static_cast<size_t>(b)] - 1; q < T; ++q)
            if (t[b * T + q] != toy::kFillerDot) row.push_back(b), pos.push_back(q);  // the questions and answers, not the pad
    Ablator::ScoredRows r;
    r.tokens = tok.to(device);
    r.row = torch::tensor(row, torch::kLong).to(device);
    r.pos = torch::tensor(pos, torch::kLong).to(device);
    return r;
}

}  // namespace hs
