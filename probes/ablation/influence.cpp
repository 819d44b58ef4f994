// AttentionInfluence through the ablation engine (see influence.h).
#include "influence.h"

#include "ablation.h"
#include "errors.h"
#include "guard.h"
#include "lines.h"
#include "tokenizer.h"

#include <torch/torch.h>

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
    setup.mode = Intervention::kZero;
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

}  // namespace hs
