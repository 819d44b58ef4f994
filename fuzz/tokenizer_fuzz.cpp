#include "tokenizer_fuzz.h"

namespace hs_fuzz {

void exercise_tokenizer(const char* target, const hs::Tokenizer& t, const std::string& text) {
    const int32_t V = t.vocab_size();
    check(V > 0, target, "empty vocabulary accepted");
    for (int32_t id = 0; id < V && id < 300; ++id) (void)t.token_text(id);
    (void)t.bos_id();
    (void)t.eos_id();
    const std::string fixed[] = {text, "Hello world", " 12 cats\n\n", "\xe2\x96\x81\xc3\xa9\xff\xfe", ""};
    for (const auto& s : fixed) {
        for (int mode = 0; mode < 4; ++mode) {
            auto ids = t.encode(s, mode & 1, mode & 2);
            for (auto id : ids) check(id >= 0 && id < V, target, "encode produced an id outside the vocabulary");
            (void)t.decode(ids, true);
            (void)t.decode(ids, false);
            for (size_t i = 0; i < ids.size() && i < 64; ++i) {
                (void)t.decode_piece(i ? ids[i - 1] : -1, ids[i]);
                (void)t.is_special(ids[i]);
                (void)t.token_to_id(t.token_text(ids[i]));
            }
        }
    }
}

}  // namespace hs_fuzz
