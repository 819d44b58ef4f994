// Checks that turn a bad input into one clear error before it can do harm (docs/reliability.md,
// "The bad-input guarantee"): text that is not UTF-8, and a size that could never fit in memory.
// (The leftovers of killed writers are temp_files.h's.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hs {

// Throws DataError "PATH:LINE: not valid UTF-8 (byte B of the line)" at the first malformed
// sequence (overlong forms, surrogates and code points past U+10FFFF count as malformed).
void check_utf8(std::string_view text, const std::string& path);
// read_text_file + check_utf8.
std::string read_utf8_text_file(const std::string& path);

// Physical memory of this machine in bytes (sysconf), or 0 when unknown.
uint64_t physical_memory_bytes();
// Throws UsageError "WHAT: needs at least N GiB, more than this machine's M GiB of memory" when
// `bytes` (a lower bound of what the request allocates) exceeds the physical memory, so an absurd
// size is refused before the allocation rather than failing inside it.
void check_fits_in_memory(double bytes, const std::string& what);

// Saturating a * b * ... for sizes read from files or the command line (no signed overflow).
double size_product(std::initializer_list<double> factors);

}  // namespace hs
