// tokenizer.json (src/tokenizers/tokenizer_hf.cpp, tokenizer_stages.cpp, tokenizer_bpe.cpp): the input is
// tokenizer.json [separator tokenizer_config.json [separator text]]. The tokenizer is loaded
// through load_tokenizer() and the text encoded (specials parsed or not, BOS/EOS added or not)
// and decoded through the normalizer / pre-tokenizer / decoder pipeline the file describes.
// Bad input: DataError (exit 5).
#include "fuzz_target.h"

#include "tokenizer.h"

#include "tokenizer_fuzz.h"

HS_FUZZ_TARGET(tokenizer_json) {
    auto p = hs_fuzz::split_parts(data, size, 3);
    const std::string path = hs_fuzz::write_temp("tokenizer.json", p[0]);
    if (!p[1].empty())
        hs_fuzz::write_temp("tokenizer_config.json", p[1]);
    else
        hs_fuzz::remove_temp("tokenizer_config.json");
    hs_fuzz::run_guarded("tokenizer_json", {hs::ExitCode::kData}, [&] {
        auto t = hs::load_tokenizer(path);
        hs_fuzz::exercise_tokenizer("tokenizer_json", *t, p[2]);
    });
}
