// What the tokenizer targets do with a tokenizer they could load: encode the text every way a
// command does, decode, and check the ids and the byte-level round trip.
#pragma once

#include "fuzz_target.h"
#include "tokenizer.h"

namespace hs_fuzz {

// Encodes `text` (and a few fixed strings) with and without specials, decodes every result,
// decodes each id as a piece, and checks every id is inside the vocabulary.
void exercise_tokenizer(const char* target, const hs::Tokenizer& t, const std::string& text);

}  // namespace hs_fuzz
