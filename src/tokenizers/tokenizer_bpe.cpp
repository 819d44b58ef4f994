// Rank-based BPE over one pre-tokenized word, as the Rust `tokenizers` crate does it: start from
// characters (with unknown-character handling: byte fallback, then unk with optional fusing),
// then repeatedly merge the adjacent pair with the lowest merge rank, leftmost first.
// A heap over a linked list of symbols keeps this O(n log n) per word, which matters for
// SentencePiece-style tokenizers with no pre-tokenizer, where the whole text is one word.
#include <queue>

#include "tokenizer_internal.h"

namespace hs::detail {

namespace {

// Words longer than this are rarely repeated; caching them would only grow the cache.
constexpr size_t kMaxCachedWordBytes = 96;
constexpr size_t kMaxCacheEntries = 200000;

uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
};

struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    // priority_queue pops the largest: make lower rank, then lower position, the largest.
    bool operator<(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
};

}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab, BpeOptions opts)
    : vocab_(std::move(vocab)), opts_(std::move(opts)) {
    byte_ids_.fill(-1);
    for (const auto& [tok, id] : vocab_) {
        int b = parse_byte_token(tok);
        if (b >= 0) byte_ids_[b] = id;
    }
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t merged) {
    // A repeated pair keeps its last rank, as the crate's HashMap collect does.
    merges_[pair_key(left, right)] = {next_rank_++, merged};
}

std::optional<int32_t> BpeModel::find(const std::string& token) const {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
}

void BpeModel::encode_word(const std::string& word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (word.size() > kMaxCachedWordBytes) {
        merge_word(word, out);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        auto it = cache_.find(word);
        if (it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    size_t start = out.size();
    merge_word(word, out);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(word, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
}

void BpeModel::merge_word(const std::string& word, std::vector<int32_t>& out) const {
    if (opts_.ignore_merges) {
        auto it = vocab_.find(word);
        if (it != vocab_.end()) {
            out.push_back(it->second);
            return;
        }
    }

    std::vector<Symbol> sym;
    sym.reserve(word.size());
    auto push = [&sym](int32_t id) {
        auto n = static_cast<int32_t>(sym.size());
        sym.push_back({id, n - 1, -1, true});
        if (n > 0) sym[n - 1].next = n;
    };
    bool pending_unk = false;
    std::string piece;
    for (size_t i = 0; i < word.size();) {
        size_t len = utf8_char_len(word, i);
        piece.assign(word, i, len);
        if (i > 0 && !opts_.continuing_subword_prefix.empty())
            piece.insert(0, opts_.continuing_subword_prefix);
        i += len;
        if (i == word.size() && !opts_.end_of_word_suffix.empty()) piece += opts_.end_of_word_suffix;

        auto it = vocab_.find(piece);
        if (it != vocab_.end()) {
            if (pending_unk) push(*opts_.unk_id);
            pending_unk = false;
            push(it->second);
            continue;
        }
        if (opts_.byte_fallback) {
            bool all = true;
            for (char c : piece) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
            if (all) {
                // As in the crate, a pending unk is not flushed here: it lands after these bytes.
                for (char c : piece) push(byte_ids_[static_cast<unsigned char>(c)]);
                continue;
            }
        }
        if (opts_.unk_id) {
            if (pending_unk && !opts_.fuse_unk) push(*opts_.unk_id);
            pending_unk = true;
        }
        // Without an unk token the crate drops the character; so do we.
    }
    if (pending_unk) push(*opts_.unk_id);

    std::priority_queue<Candidate> heap;
    auto consider = [&](int32_t pos) {
        if (pos < 0 || sym[pos].next < 0) return;
        auto it = merges_.find(pair_key(sym[pos].id, sym[sym[pos].next].id));
        if (it != merges_.end()) heap.push({it->second.first, pos, it->second.second});
    };
    for (int32_t p = 0; p + 1 < static_cast<int32_t>(sym.size()); ++p) consider(p);

    while (!heap.empty()) {
        Candidate top = heap.top();
        heap.pop();
        Symbol& left = sym[top.pos];
        if (!left.alive || left.next < 0) continue;
        // Stale entry: one side merged since it was queued.
        auto it = merges_.find(pair_key(left.id, sym[left.next].id));
        if (it == merges_.end() || it->second.second != top.merged) continue;
        Symbol& right = sym[left.next];
        left.id = top.merged;
        right.alive = false;
        left.next = right.next;
        if (right.next >= 0) sym[right.next].prev = top.pos;
        consider(left.prev);
        consider(top.pos);
    }
    for (const auto& s : sym)
        if (s.alive) out.push_back(s.id);
}

}  // namespace hs::detail
