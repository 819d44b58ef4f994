// GPT-2 vocab.json + merges.txt (src/tokenizers/tokenizer_hf.cpp load_gpt2_vocab_merges): the input is
// vocab.json separator merges.txt [separator text]; loaded through load_tokenizer() on the folder,
// then the text encoded and decoded. Bad input: DataError (exit 5).
#include "fuzz_target.h"

#include "tokenizer.h"

#include "tokenizer_fuzz.h"

HS_FUZZ_TARGET(vocab_merges) {
    auto p = hs_fuzz::split_parts(data, size, 3);
    hs_fuzz::write_temp("vocab.json", p[0]);
    const std::string merges = hs_fuzz::write_temp("merges.txt", p[1]);
    hs_fuzz::run_guarded("vocab_merges", {hs::ExitCode::kData}, [&] {
        auto t = hs::load_tokenizer(merges);
        hs_fuzz::exercise_tokenizer("vocab_merges", *t, p[2]);
    });
}
