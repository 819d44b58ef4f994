// AttentionInfluence's head detection (see influence_detect.h).
#include "influence_detect.h"

#include "errors.h"
#include "needle.h"
#include "needle_results.h"
#include "progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace hs {

int64_t top_share_count(double share, int64_t n_heads) {
    HS_REQUIRE(share > 0 && share <= 1 && n_heads >= 1, "top_share_count: share outside (0, 1]");
    const double x = share * static_cast<double>(n_heads);
    const double r = std::round(x);
    const int64_t k = std::abs(x - r) < 1e-9 ? static_cast<int64_t>(r) : static_cast<int64_t>(std::ceil(x));
    return std::clamp<int64_t>(k, 1, n_heads);
}

RetrievalDetection detect_retrieval_heads(const Model& m, const Tokenizer& tok, const KeyValueTask& task, double top_share,
                                          int64_t prefill_chunk, const std::function<void()>& tick) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    auto kv = key_value_trials(tok, task);
    RetrievalDetection d;
    d.format = kv.format, d.values = kv.values, d.trials = static_cast<int64_t>(kv.trials.size());
    d.max_new_tokens = kv.max_new_tokens;
    for (const auto& t : kv.trials) d.max_prompt = std::max(d.max_prompt, static_cast<int64_t>(t.prompt.size()));
    d.min_pairs = *std::min_element(kv.pairs.begin(), kv.pairs.end()), d.max_pairs = *std::max_element(kv.pairs.begin(), kv.pairs.end());
    // The needle study's headscope protocol, stopped as the task says, decoding these trials.
    NeedleProtocol p = protocol_defaults(Protocol::kHeadscope);
    p.stop = kv.stop, p.max_new_tokens = kv.max_new_tokens, p.ablation_max_new_tokens = kv.max_new_tokens;
    TokenFacts facts = token_facts(tok, kv.stop);
    const size_t n = kv.needles.size();
    TrialBuilder builder(tok, p, std::move(facts), std::move(kv.needles), "key-value task", std::vector<std::string>(n));
    NeedleConfig c;
    c.decode.max_new_tokens = kv.max_new_tokens, c.ablation_max_new_tokens = kv.max_new_tokens;
    c.decode.prefill_chunk = prefill_chunk;
    c.decode.reuse_prefix = false;  // every context is drawn anew: only the instruction is shared
    c.decode.scores = NeedleScoreSet{};
    c.decode.scores.add(NeedleScore::kRetrieval);  // Wu's score is all this reads
    c.max_positions = m.config.max_seq_len;
    NeedleTest test(m, tok, std::move(builder), std::move(c), std::move(kv.trials));
    Progress bar("detect (key-value trials)", d.trials);  // on stderr, drawn only on a terminal
    const auto results = test.run_baseline([&] {
        bar.tick();
        if (tick) tick();
    });
    bar.finish();
    NeedleResults r;
    r.init(d.trials, L, H, kv.max_new_tokens, kv.max_new_tokens, false);
    for (size_t i = 0; i < results.size(); ++i) r.set_trial(static_cast<int64_t>(i), results[i]);
    // Wu's retrieval score is the registry's mean over the passing trials; the LOCOS interval the
    // summary also computes is not used here (one bootstrap draw).
    const auto s = summarize(r, 1, task.seed, 0.1);
    d.passed = s.n_pass;
    d.score = s.score(NeedleScore::kRetrieval).clone();
    if (d.passed == 0)
        throw DataError(fmt::format("key-value task: none of the {} trials passed (length {}: prompts of up to {} tokens, "
                                    "{}-{} pairs), so no head has a retrieval score (the model does not retrieve at this length)",
                                    d.trials, task.length, d.max_prompt, d.min_pairs, d.max_pairs));
    d.heads = top_heads(d.score, top_share_count(top_share, static_cast<int64_t>(L) * H));
    std::sort(d.heads.begin(), d.heads.end());  // a set: named in (layer, head) order whatever the ranking's
    return d;
}

}  // namespace hs
