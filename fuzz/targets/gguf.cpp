// GGUF files (src/formats/gguf.cpp, src/formats/gguf_model.cpp, src/tokenizers/tokenizer_gguf.cpp): the header and
// tensor table, every tensor read back (Q8_0 dequantised), the model built from the metadata, and
// the file's own tokenizer encoding a line. Bad input: ModelLoadError (exit 4), ConfigError (exit 3)
// from the config the metadata describes, DataError (exit 5) from the tokenizer.
#include "fuzz_target.h"

#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

#include <torch/torch.h>

HS_FUZZ_TARGET(gguf) {
    const std::string path = hs_fuzz::write_temp("model.gguf", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("gguf", {hs::ExitCode::kModelLoad, hs::ExitCode::kConfig, hs::ExitCode::kData}, [&] {
        hs::GgufFile f(path);
        for (const auto& [name, t] : f.tensors()) {
            hs_fuzz::check(t.begin <= t.end && t.end <= size, "gguf", "tensor '" + name + "' outside the file");
            at::Tensor x = f.get(name);
            int64_t n = 1;
            for (auto d : t.shape) n *= d;
            hs_fuzz::check(x.numel() == n, "gguf", "tensor '" + name + "' has the wrong element count");
            (void)x.sum().item<double>();  // reads every value
        }
        if (auto tok = hs::find_tokenizer_for_model(path, 0)) tok->decode(tok->encode("Hello world, 12 cats."));
        hs::load_model(path);
    });
}
