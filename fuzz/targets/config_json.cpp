// config.json -> ModelConfig for every family (src/formats/loader.cpp parse_model_config and the
// per-family parsers in src/families/*_load.cpp). Bad input: ConfigError (exit 3).
#include "fuzz_target.h"

#include "model.h"

HS_FUZZ_TARGET(config_json) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    hs_fuzz::run_guarded("config_json", {hs::ExitCode::kConfig}, [&] {
        hs::ModelConfig c = hs::parse_model_config(text, "config.json");
        // What validate() promises the forward code.
        hs_fuzz::check(c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0 &&
                           c.d_model > 0 && c.d_head > 0 && c.d_ff > 0 && c.vocab_size > 0 && c.max_seq_len > 0,
                       "config_json", "validate() accepted a non-positive or inconsistent dimension");
        hs_fuzz::check(c.layer_sliding.empty() || static_cast<int>(c.layer_sliding.size()) == c.n_layers, "config_json",
                       "layer_sliding length");
        for (int l = 0; l < c.n_layers && l < 4096; ++l) (void)c.is_sliding(l);
    });
}
