// llama2.c tokenizer .bin: uint32 max_token_length, then per token float32 score, uint32 byte
// length, bytes. Encoding reproduces run.c's encode(): optional BOS, a dummy-prefix " " for
// non-empty text, one token per UTF-8 codepoint (byte fallback to <0xNN> = byte + 3), then
// greedy merging of the adjacent pair whose concatenation is in the vocabulary with the highest
// score (leftmost on ties). run.c rescans all pairs per merge (quadratic); a heap over a linked
// list gives the same result in O(n log n).
#include <cmath>
#include <cstring>
#include <queue>

#include <fmt/format.h>

#include "errors.h"
#include "tokenizer_internal.h"

namespace hs::detail {

namespace {

constexpr int32_t kBos = 1;
constexpr int32_t kEos = 2;
constexpr int32_t kByteOffset = 3;  // <0x00> is token 3 in llama2.c vocabularies
// run.c starts its search at best_score = -1e10 and needs a strictly greater score.
constexpr float kNoScore = -1e10f;

class Llama2cTokenizer : public Tokenizer {
public:
    Llama2cTokenizer(std::string path, std::vector<std::string> vocab, std::vector<float> scores)
        : path_(std::move(path)), vocab_(std::move(vocab)), scores_(std::move(scores)) {
        lookup_.reserve(vocab_.size());
        // First occurrence wins for duplicates (run.c's bsearch picks an arbitrary one).
        for (size_t i = 0; i < vocab_.size(); ++i) lookup_.emplace(vocab_[i], static_cast<int32_t>(i));
    }

    std::vector<int32_t> encode(const std::string& text, bool add_special, bool) const override {
        // parse_special has no effect: llama2.c never parses special tokens from text.
        std::vector<int32_t> ids;
        ids.reserve(text.size() + 2);
        if (add_special) ids.push_back(kBos);
        if (!text.empty()) push_piece(" ", ids);
        size_t n = text.size();
        for (size_t i = 0; i < n;) {
            // run.c's grouping: a lead byte plus following continuation bytes, at most 4 bytes.
            size_t len = 1;
            while (i + len < n && len < 4 && (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80) ++len;
            push_piece(text.substr(i, len), ids);
            i += len;
        }
        merge(ids);
        return ids;
    }

    std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
        std::string out;
        // The start of the sequence counts as "after BOS" so that the dummy-prefix space is
        // dropped even when the ids carry no BOS (decode(encode(s, false)) == s).
        int32_t prev = kBos;
        for (int32_t id : ids) {
            std::string piece = decode_piece(prev, id);
            if (!(skip_special && is_special(id))) out += piece;
            prev = id;
        }
        return utf8_lossy(out);
    }

    std::string token_text(int32_t id) const override {
        check_id(id);
        return vocab_[id];
    }

    std::string decode_piece(int32_t prev_id, int32_t id) const override {
        check_id(id);
        const std::string& piece = vocab_[id];
        int b = parse_byte_token(piece);
        if (b >= 0) return std::string(1, static_cast<char>(b));
        if (prev_id == kBos && !piece.empty() && piece[0] == ' ') return piece.substr(1);
        return piece;
    }

    int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.size()); }
    std::optional<int32_t> bos_id() const override { return kBos; }
    std::optional<int32_t> eos_id() const override { return kEos; }
    // <unk>, <s>, </s>: ids 0..2 by llama2.c's (SentencePiece's) convention.
    bool is_special(int32_t id) const override { return id >= 0 && id <= kEos && id < vocab_size(); }
    std::optional<int32_t> token_to_id(const std::string& token) const override {
        auto it = lookup_.find(token);
        if (it == lookup_.end()) return std::nullopt;
        return it->second;
    }
    std::string kind() const override { return "llama2c"; }
    std::string source_path() const override { return path_; }

private:
    void check_id(int32_t id) const {
        if (id < 0 || id >= vocab_size())
            throw DataError(fmt::format("{}: token id {} out of range (vocabulary size {})", path_, id,
                                        vocab_size()));
    }

    void push_piece(const std::string& s, std::vector<int32_t>& ids) const {
        auto it = lookup_.find(s);
        if (it != lookup_.end()) {
            ids.push_back(it->second);
            return;
        }
        for (char c : s) {
            int32_t id = static_cast<unsigned char>(c) + kByteOffset;
            if (id >= vocab_size())
                throw DataError(fmt::format("{}: cannot encode byte 0x{:02X}: the vocabulary has no byte tokens",
                                            path_, static_cast<unsigned char>(c)));
            ids.push_back(id);
        }
    }

    struct Candidate {
        float score;
        int32_t pos;
        int32_t left, right, merged;
        // Pops the highest score first; on ties the leftmost pair, as run.c's scan does.
        bool operator<(const Candidate& o) const {
            return score != o.score ? score < o.score : pos > o.pos;
        }
    };

    void merge(std::vector<int32_t>& ids) const {
        const auto n = static_cast<int32_t>(ids.size());
        std::vector<int32_t> next(n), prev(n);
        std::vector<bool> alive(n, true);
        for (int32_t i = 0; i < n; ++i) {
            next[i] = i + 1 < n ? i + 1 : -1;
            prev[i] = i - 1;
        }
        std::priority_queue<Candidate> heap;
        std::string buf;
        auto consider = [&](int32_t pos) {
            if (pos < 0 || next[pos] < 0) return;
            int32_t l = ids[pos], r = ids[next[pos]];
            buf.assign(vocab_[l]);
            buf += vocab_[r];
            auto it = lookup_.find(buf);
            if (it == lookup_.end()) return;
            float s = scores_[it->second];
            if (!(s > kNoScore)) return;  // also rejects NaN, as run.c's comparison would
            heap.push({s, pos, l, r, it->second});
        };
        for (int32_t i = 0; i + 1 < n; ++i) consider(i);
        while (!heap.empty()) {
            Candidate c = heap.top();
            heap.pop();
            if (!alive[c.pos] || next[c.pos] < 0 || ids[c.pos] != c.left || ids[next[c.pos]] != c.right)
                continue;  // stale: a neighbour merged since this pair was queued
            int32_t r = next[c.pos];
            ids[c.pos] = c.merged;
            alive[r] = false;
            next[c.pos] = next[r];
            if (next[r] >= 0) prev[next[r]] = c.pos;
            consider(prev[c.pos]);
            consider(c.pos);
        }
        size_t w = 0;
        for (int32_t i = 0; i < n; ++i)
            if (alive[i]) ids[w++] = ids[i];
        ids.resize(w);
    }

    std::string path_;
    std::vector<std::string> vocab_;
    std::vector<float> scores_;
    std::unordered_map<std::string, int32_t> lookup_;
};

uint32_t read_u32(const std::string& d, size_t off) {
    uint32_t v;
    std::memcpy(&v, d.data() + off, 4);  // the format is little-endian, as is every host we target
    return v;
}

}  // namespace

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int expected_vocab) {
    const std::string data = read_file_bytes(path);
    if (data.size() < 4)
        throw DataError(fmt::format("{}: truncated llama2.c tokenizer: {} bytes, no header", path, data.size()));
    const uint32_t max_len = read_u32(data, 0);
    std::vector<std::string> vocab;
    std::vector<float> scores;
    size_t off = 4;
    auto expected = [&] {
        return expected_vocab > 0 ? fmt::format(" of {}", expected_vocab) : std::string();
    };
    while (expected_vocab > 0 ? static_cast<int>(vocab.size()) < expected_vocab : off < data.size()) {
        const size_t i = vocab.size();
        if (data.size() - off < 8)
            throw DataError(fmt::format("{}: truncated llama2.c tokenizer: file ends in the header of token {}{}",
                                        path, i, expected()));
        float score;
        std::memcpy(&score, data.data() + off, 4);
        const uint32_t len = read_u32(data, off + 4);
        off += 8;
        // max_token_length bounds every token in a well-formed file; a wild length means this is
        // not a llama2.c tokenizer at all.
        if (len > std::max<uint32_t>(max_len, 64) * 4)
            throw DataError(fmt::format("{}: token {} has length {} but max_token_length is {} "
                                        "(not a llama2.c tokenizer .bin?)", path, i, len, max_len));
        if (data.size() - off < len)
            throw DataError(fmt::format("{}: truncated llama2.c tokenizer: file ends inside token {}{}",
                                        path, i, expected()));
        vocab.emplace_back(data, off, len);
        scores.push_back(score);
        off += len;
    }
    if (vocab.size() <= static_cast<size_t>(kEos))
        throw DataError(fmt::format("{}: llama2.c tokenizer has {} tokens; needs at least <unk>, <s>, </s>",
                                    path, vocab.size()));
    return std::make_unique<Llama2cTokenizer>(path, std::move(vocab), std::move(scores));
}

}  // namespace hs::detail
