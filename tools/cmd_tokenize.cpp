// headscope tokenize: the ids a tokenizer gives a text, as a JSON array on stdout.
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "util.h"

namespace hs::cli {

struct TokenizeOptions {
    std::string path;
    std::string text;
    bool no_special = false;
    bool parse_special = false;
    bool pieces = false;
};

// A model path (folder with config.json, or a llama2.c model .bin) finds its tokenizer;
// anything else is taken as a tokenizer path. A Hugging Face cache name stands for its snapshot folder.
static std::unique_ptr<Tokenizer> tokenizer_for(const std::string& spec) {
    const std::string path = tokenizer_location(spec);
    if (is_directory(path) && file_exists(path_join(path, "config.json"))) {
        auto t = find_tokenizer_for_model(path, -1);
        if (!t) throw DataError(fmt::format("{}: no tokenizer.json or vocab.json+merges.txt in the folder", path));
        return t;
    }
    if (!is_directory(path) && path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0) {
        std::unique_ptr<Model> m;
        try {
            m = load_model(path);
        } catch (const Error&) {
            return load_tokenizer(path);  // not a model: a llama2.c tokenizer file
        }
        auto t = find_tokenizer_for_model(path, m->config.vocab_size);
        if (!t) throw DataError(fmt::format("{}: no tokenizer .bin next to the model", path));
        return t;
    }
    return load_tokenizer(path);
}

void run_tokenize(const TokenizeOptions& o) {
    auto tok = tokenizer_for(o.path);
    auto ids = tok->encode(o.text, !o.no_special, o.parse_special);
    if (o.pieces) {
        std::vector<std::string> p;
        for (auto id : ids) p.push_back(fmt::format("{}:{}", id, tok->token_text(id)));
        fmt::print("{}\n", fmt::join(p, " "));
    } else {
        fmt::print("[{}]\n", fmt::join(ids, ", "));
    }
}

void setup_tokenize(CLI::App& app) {
    auto o = std::make_shared<TokenizeOptions>();
    auto* sub = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array\n"
                                               "Example: headscope tokenize ../shared/testdata/tinystories-656k --text 'Hello world'");
    sub->add_option("path", o->path, "model folder, llama2.c model .bin, a tokenizer file/folder, or a Hugging Face "
                                     "cache name org/name[@revision]")->required();
    sub->add_option("--text", o->text, "text to encode")->required();
    sub->add_flag("--no-special", o->no_special, "add no BOS/EOS");
    sub->add_flag("--parse-special", o->parse_special, "match special-token strings in the text");
    sub->add_flag("--pieces", o->pieces, "print id:piece pairs instead of JSON");
    sub->callback([o] { run_tokenize(*o); });
}

}  // namespace hs::cli
