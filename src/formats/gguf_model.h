// Models from GGUF files (llama.cpp's format): the Hugging Face config.json that the file's
// metadata describes, its tensors under Hugging Face names with llama.cpp's converter changes
// undone, and the family's own loader on top (docs/models.md, "GGUF files").
#pragma once

#include "model.h"

#include <memory>
#include <string>

namespace hs {

class GgufFile;

// The config.json text (Hugging Face keys) the file's metadata describes, as load_gguf_model parses
// it. Throws ModelLoadError / ConfigError naming the file: an architecture llama.cpp names that
// headscope does not load, a missing or mistyped key.
std::string gguf_config_json(const GgufFile& f);

std::unique_ptr<Model> load_gguf_model(const std::string& path, const LoadOptions& opts);

}  // namespace hs
