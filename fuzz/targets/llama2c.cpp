// llama2.c checkpoint .bin: 7-field header, sizes checked against the file length, weights loaded
// (src/formats/loader.cpp load_llama2c via load_model). Bad input: ConfigError (3) or ModelLoadError (4).
#include "fuzz_target.h"

#include "model.h"

HS_FUZZ_TARGET(llama2c) {
    const std::string path = hs_fuzz::write_temp("model.bin", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("llama2c", {hs::ExitCode::kConfig, hs::ExitCode::kModelLoad}, [&] {
        auto m = hs::load_model(path);
        const auto& c = m->config;
        hs_fuzz::check(c.n_layers > 0 && c.d_model > 0 && c.vocab_size > 0, "llama2c", "accepted a bad header");
        hs_fuzz::check(static_cast<int>(m->weights.layers.size()) == c.n_layers, "llama2c", "layer count");
    });
}
