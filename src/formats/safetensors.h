// The project's own safetensors reader and writer: mmap, zero-copy views where the stored dtype
// is the one asked for, every offset checked against the file size before any byte is read.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hs {

// Read-only private mapping of a whole file; move-only, unmaps in its destructor.
class MappedFile {
public:
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

struct TensorEntry {
    std::string name;
    std::string dtype;            // "F32", "F16", "BF16", "I32", "I64", ...
    std::vector<int64_t> shape;
    size_t begin = 0;             // absolute byte offsets into the file
    size_t end = 0;
};

class SafetensorsFile {
public:
    // Throws ModelLoadError naming the file: truncated header, bad JSON, unknown dtype,
    // offsets past the end, size not matching shape x dtype, overlapping tensors.
    explicit SafetensorsFile(const std::string& path);

    const std::string& path() const { return file_->path(); }
    bool has(const std::string& name) const { return entries_.count(name) != 0; }
    const TensorEntry& entry(const std::string& name) const;
    const std::map<std::string, TensorEntry>& entries() const { return entries_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    // A CPU tensor over the mapped bytes (zero-copy; the mapping lives as long as the tensor).
    // Float tensors keep their stored dtype; callers convert.
    at::Tensor get(const std::string& name) const;

private:
    std::shared_ptr<MappedFile> file_;
    std::map<std::string, TensorEntry> entries_;
    std::map<std::string, std::string> metadata_;
};

// Writes tensors (contiguous CPU copies are made as needed) atomically: path.tmp then rename.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace hs
