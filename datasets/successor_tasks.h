// The ordinal sequences of the successor-head paper (Gould et al. 2023, "Successor Heads: Recurring,
// Interpretable Attention Heads In The Wild", section 2) as the public reimplementation lists them
// (curt-tigges/circuits-over-time test_successor_head.py lines 11-19): numbers 1-200, number words,
// cardinal (ordinal) words, days and months (each wrapping: its first word again at the end), day and
// month prefixes, letters. `headscope successor` scores heads on these unless --tasks names a file;
// `--print-tasks` writes them as that file's JSON.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace hs::data {

// {name, the words in order}: each word's successor is the next word of its list.
const std::vector<std::pair<std::string, std::vector<std::string>>>& successor_tasks();

}  // namespace hs::data
