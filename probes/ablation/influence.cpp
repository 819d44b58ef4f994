// AttentionInfluence through the ablation engine (see influence.h).
#include "influence.h"

#include "ablation.h"
#include "errors.h"
#include "guard.h"
#include "lines.h"
#include "tokenizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace hs {

std::vector<CorpusSample> read_corpus(const std::string& path, const Tokenizer* tok, int64_t vocab, int64_t max_tokens) {
    const std::string text = read_utf8_text_file(path);
    std::vector<CorpusSample> out;
    for_each_line(text, path, [&](const std::string& line, const std::string& where, int line_no) {
        const auto j = parse_json_line(line, where, " ({\"text\": ...} or {\"tokens\": [ids]} a line)");
        if (!j.is_object()) throw DataError(fmt::format("{}: not a JSON object ({{\"text\": ...}} or {{\"tokens\": [ids]}})", where));
        CorpusSample s;
        s.line = line_no;
        if (j.contains("text") && j["text"].is_string()) {
            if (!tok) throw DataError(fmt::format("{}: a text sample, but the model has no tokenizer (give --tokenizer)", where));
            const auto t = j["text"].get<std::string>();
            for (auto id : tok->encode(t, true, false)) s.tokens.push_back(id);
            s.preview = t.substr(0, 80);
        } else if (j.contains("tokens") && j["tokens"].is_array()) {
            for (const auto& v : j["tokens"]) {
                if (!v.is_number_integer()) throw DataError(fmt::format("{}: \"tokens\" holds a value that is not an integer", where));
                const auto id = v.get<int64_t>();
                if (id < 0 || id >= vocab) throw DataError(fmt::format("{}: token id {} out of range [0, {})", where, id, vocab));
                s.tokens.push_back(id);
            }
        } else {
            throw DataError(fmt::format("{}: has neither a string \"text\" nor a list \"tokens\"", where));
        }
        s.length = static_cast<int64_t>(s.tokens.size());
        if (static_cast<int64_t>(s.tokens.size()) > max_tokens) {
            s.tokens.resize(static_cast<size_t>(max_tokens));
            s.truncated = true;
        }
        if (s.tokens.size() < 2) throw DataError(fmt::format("{}: {} token(s): a sample needs 2 for a next-token loss", where, s.tokens.size()));
        if (s.preview.empty() && tok) {
            std::vector<int32_t> ids(s.tokens.begin(), s.tokens.begin() + std::min<size_t>(s.tokens.size(), 24));
            s.preview = tok->decode(ids).substr(0, 80);
        }
        out.push_back(std::move(s));
        return true;
    });
    if (out.empty()) throw DataError(fmt::format("{}: no samples", path));
    return out;
}

const std::vector<Intervention>& influence_maskings() {
    static const std::vector<Intervention> v = {Intervention::kZeroQuery, Intervention::kZero};
    return v;
}

const NameTable<Intervention>& influence_masking_names() {
    static const NameTable<Intervention> t = subset_of(intervention_names(), influence_maskings());
    return t;
}

InfluenceResult attention_influence(const Model& m, const std::vector<CorpusSample>& corpus,
                                    const std::vector<std::vector<Head>>& sets, const InfluenceOptions& o) {
    const int L = m.config.n_layers, H = m.config.n_heads;
    std::vector<std::vector<int64_t>> seqs;
    std::vector<int64_t> last;
    InfluenceResult r;
    for (const auto& s : corpus) {
        seqs.push_back(s.tokens);
        if (o.last_only) last.push_back(seqs.back().back()), seqs.back().pop_back();
        r.n_tokens.push_back(o.last_only ? 1 : static_cast<int64_t>(s.tokens.size()) - 1);
    }
    AblationData data = sequence_data("corpus", seqs);
    AblationSetup setup;
    HS_REQUIRE(std::find(influence_maskings().begin(), influence_maskings().end(), o.masking) != influence_maskings().end(),
               "attention_influence: a masking outside influence_maskings()");
    setup.mode = o.masking;
    setup.metric = MetricKind::kLoss;
    setup.positions = Positions::kAll;
    if (o.last_only) {  // the loss of the last token alone: the rows as prompts, the last token their answer
        data.answers = last;
        setup.positions = Positions::kAnswer;
    }
    setup.max_rows = o.max_rows;
    const int64_t S = static_cast<int64_t>(sets.size());
    auto masks = torch::zeros({S + 1, L, H}, torch::kUInt8);  // configuration 0: nothing masked
    for (int64_t s = 0; s < S; ++s)
        for (auto [l, h] : sets[static_cast<size_t>(s)]) masks[s + 1][l][h] = 1;
    Ablator ab(m, data, setup);
    const auto rows = ab.evaluate(masks);  // [S + 1, N]
    r.forwards = ab.forwards();
    r.loss = rows[0].clone();
    r.masked_loss = rows.narrow(0, 1, S).clone();
    r.score = (r.masked_loss - r.loss.unsqueeze(0)) / r.loss.unsqueeze(0);
    return r;
}

const NameTable<SelectBy>& select_by_names() {
    static const NameTable<SelectBy> t = {{SelectBy::kTokens, "tokens"}, {SelectBy::kSamples, "samples"}};
    return t;
}

Selection select_top_share(const std::vector<int64_t>& rank, const std::vector<uint8_t>& done,
                           const std::vector<int64_t>& length, double fraction, SelectBy by) {
    const size_t N = done.size();
    HS_REQUIRE(rank.size() == N && length.size() == N, "select_top_share: rank, done and length differ in size");
    HS_REQUIRE(fraction >= 0 && fraction <= 1, "select_top_share: fraction outside [0, 1]");
    Selection s;
    s.selected.assign(N, 0);
    for (size_t i = 0; i < N; ++i)
        if (done[i]) ++s.n_done, s.tokens_done += length[i];
    const auto n_sel = static_cast<int64_t>(std::ceil(fraction * static_cast<double>(s.n_done) - 1e-9));
    const double budget = fraction * static_cast<double>(s.tokens_done) - 1e-9 * std::max<double>(1, static_cast<double>(s.tokens_done));
    for (int64_t i : rank) {
        const auto k = static_cast<size_t>(i);
        if (!done[k]) continue;
        const bool more = by == SelectBy::kSamples ? s.n_selected < n_sel : static_cast<double>(s.tokens_selected) < budget;
        if (!more) break;
        s.selected[k] = 1, ++s.n_selected, s.tokens_selected += length[k];
    }
    return s;
}

}  // namespace hs
