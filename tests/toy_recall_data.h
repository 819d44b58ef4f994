// The CI toy recall model's evaluation rows as a prompts dataset (tests of gating and DuoAttention's gates).
#pragma once

#include "ablation.h"
#include "toy_tasks.h"

#include <cstdint>
#include <vector>

// Recall evaluation rows ("... ? k" -> V, datasets/toy_tasks.h) as prompts: the metric reads the
// last position, whose answer is the queried key's value.
inline hs::AblationData toy_recall_prompts(int64_t rows, int64_t T, uint64_t seed) {
    hs::toy::Rng rng(seed);
    auto rb = hs::toy::recall_batch(rng, rows, T, true);
    std::vector<std::vector<int64_t>> seqs;
    std::vector<int64_t> answers, cf;
    auto tok = rb.batch.tokens.contiguous();
    for (int64_t i = 0; i < rows; ++i) {
        seqs.emplace_back(tok[i].data_ptr<int64_t>(), tok[i].data_ptr<int64_t>() + T);
        answers.push_back(rb.batch.targets[i][T - 1].item<int64_t>());
        cf.push_back(-1);
    }
    auto s = hs::sequence_data("recall", seqs);
    s.kind = hs::DataKind::kPrompts;
    s.answers = answers;
    s.counterfactuals = cf;
    return s;
}
