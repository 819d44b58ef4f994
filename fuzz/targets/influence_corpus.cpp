// AttentionInfluence corpora (probes/ablation/influence.cpp read_corpus): JSONL, {"text": ...} or
// {"tokens": [ids]} a line; no tokenizer here, so text lines are refused too. Bad input: DataError
// (exit 5).
#include "fuzz_target.h"

#include "influence.h"

HS_FUZZ_TARGET(influence_corpus) {
    const std::string path = hs_fuzz::write_temp("corpus.jsonl", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("influence_corpus", {hs::ExitCode::kData}, [&] {
        const auto c = hs::read_corpus(path, nullptr, 100, 16);
        hs_fuzz::check(!c.empty(), "influence_corpus", "an empty corpus was accepted");
        for (const auto& s : c) {
            hs_fuzz::check(s.tokens.size() >= 2 && s.tokens.size() <= 16, "influence_corpus", "a sample of the wrong length");
            for (auto id : s.tokens) hs_fuzz::check(id >= 0 && id < 100, "influence_corpus", "an id outside the vocabulary");
        }
    });
}
