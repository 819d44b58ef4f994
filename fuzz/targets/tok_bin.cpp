// llama2.c tokenizer .bin (src/tokenizers/tokenizer_llama2c.cpp): load (vocabulary size from the file, and
// from the first input byte when it asks for a fixed size), then encode, decode and look up.
// Bad input: DataError (exit 5).
#include "fuzz_target.h"

#include "tokenizer_internal.h"

HS_FUZZ_TARGET(tok_bin) {
    const std::string path = hs_fuzz::write_temp("tok.bin", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("tok_bin", {hs::ExitCode::kData}, [&] {
        const int expected = (size > 0 && (data[0] & 1)) ? 3 + data[size - 1] : -1;
        auto t = hs::detail::load_llama2c_tokenizer(path, expected);
        const int32_t V = t->vocab_size();
        hs_fuzz::check(V >= 3, "tok_bin", "fewer than 3 tokens accepted");
        for (int32_t id = 0; id < V && id < 600; ++id) (void)t->token_text(id);
        for (const char* s : {"Once upon a time", "", " a\n\xe2\x96\x81\xff", "<s>hi</s>"}) {
            auto ids = t->encode(s, true, true);
            for (auto id : ids) hs_fuzz::check(id >= 0 && id < V, "tok_bin", "encode produced an out-of-range id");
            (void)t->decode(ids, false);
            (void)t->decode(ids, true);
            for (size_t i = 0; i < ids.size(); ++i) (void)t->decode_piece(i ? ids[i - 1] : -1, ids[i]);
        }
        (void)t->token_to_id("<unk>");
    });
}
