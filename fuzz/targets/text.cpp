// Text files (--text-file, data of kind text, haystacks): the file read with read_text_file and
// encoded line by line and whole with two fixed tokenizers (fuzz/data/: a GPT-2 byte-level
// vocab.json + merges.txt and a SentencePiece-style tokenizer.json with byte fallback). Checks
// that every id is in the vocabulary and that the byte-level tokenizer gives back valid UTF-8
// text exactly (decode(encode(s)) == s, as GPT-2's byte map is lossless).
#include "fuzz_target.h"

#include "tokenizer.h"
#include "util.h"


namespace {

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (size_t k = 1; k < n; ++k) {
            unsigned char d = s[i + k];
            if ((d & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (d & 0x3F);
        }
        static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n;
    }
    return true;
}

}  // namespace

HS_FUZZ_TARGET(text) {
    static const auto gpt2 = hs::load_tokenizer(hs_fuzz::source_dir() + "/fuzz/data/gpt2");
    static const auto sp = hs::load_tokenizer(hs_fuzz::source_dir() + "/fuzz/data/sentencepiece_tokenizer.json");
    const std::string path = hs_fuzz::write_temp("text.txt", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("text", {hs::ExitCode::kData}, [&] {
        const std::string text = hs::read_text_file(path);
        hs_fuzz::check(text.size() == size, "text", "read_text_file lost bytes");
        auto whole = sp->encode(text, true);
        for (auto id : whole) hs_fuzz::check(id >= 0 && id < sp->vocab_size(), "text", "id outside the vocabulary");
        (void)sp->decode(whole, true);
        for (const auto& raw : hs::split(text, '\n')) (void)sp->encode(hs::trim(raw), true);
        auto ids = gpt2->encode(text, false, false);
        for (auto id : ids) hs_fuzz::check(id >= 0 && id < gpt2->vocab_size(), "text", "id outside the vocabulary");
        if (valid_utf8(text))
            hs_fuzz::check(gpt2->decode(ids, false) == text, "text", "byte-level decode(encode(text)) != text");
    });
}
