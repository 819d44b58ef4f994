// safetensors header and tensor table (src/formats/safetensors.cpp): SafetensorsFile over the input as a
// file, then every tensor read back. Bad input: ModelLoadError (exit 4).
#include "fuzz_target.h"

#include "safetensors.h"

#include <torch/torch.h>

HS_FUZZ_TARGET(safetensors) {
    const std::string path = hs_fuzz::write_temp("model.safetensors", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("safetensors", {hs::ExitCode::kModelLoad}, [&] {
        hs::SafetensorsFile f(path);
        for (const auto& [name, e] : f.entries()) {
            // Every accepted tensor lies inside the file and holds exactly numel x element bytes.
            hs_fuzz::check(e.begin <= e.end && e.end <= size, "safetensors", "tensor '" + name + "' outside the file");
            at::Tensor t = f.get(name);
            hs_fuzz::check(static_cast<size_t>(t.numel()) * t.element_size() == e.end - e.begin, "safetensors",
                           "tensor '" + name + "' size differs from its byte range");
            if (t.numel() > 0) {
                auto c = t.clone();  // reads every byte of the range
                hs_fuzz::check(c.numel() == t.numel(), "safetensors", "clone");
            }
        }
    });
}
