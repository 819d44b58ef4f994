// The project's own GGUF reader (llama.cpp's file format, versions 2 and 3): the key-value
// metadata and the tensor table, every length and offset checked against the file size before a
// byte is read, tensors handed out as CPU tensors (F32, F16, BF16 as zero-copy views; Q8_0
// dequantised to float32). Other tensor types are refused in one line naming the type.
// Layout (ggml/docs/gguf.md): "GGUF", u32 version, u64 tensor count, u64 key-value count, the
// key-values (u64-length string key, u32 type, value), the tensor infos (name, u32 n_dims, u64
// ne[n_dims] innermost first, u32 ggml type, u64 offset), padding to general.alignment (32), data.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hs {

class MappedFile;

// GGUF value types (gguf.md: GGUF_TYPE_*).
enum class GgufValueType : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8,
    kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);

// One metadata value. Scalars: `num` (integers exactly up to 2^53, which every key of a model
// file respects; `u64`/`i64` keep the full value), `str`. Arrays: `elem` and either `strs` or `nums`.
struct GgufValue {
    GgufValueType type = GgufValueType::kU8;
    double num = 0;
    uint64_t u64 = 0;
    int64_t i64 = 0;
    std::string str;
    GgufValueType elem = GgufValueType::kU8;  // arrays
    std::vector<std::string> strs;
    std::vector<double> nums;
    bool is_integer() const;
    bool is_number() const;  // integer or float (not bool)
};

// ggml tensor types this reader knows by name; only F32, F16, BF16 and Q8_0 are loaded.
const char* ggml_type_name(uint32_t type);  // "Q4_K", ... or nullptr for an unknown number

struct GgufTensorInfo {
    std::string name;
    std::vector<int64_t> shape;  // row-major (numpy/torch) order: ggml's ne reversed
    uint32_t type = 0;
    size_t begin = 0, end = 0;   // absolute byte offsets into the file
};

class GgufFile {
public:
    // Throws ModelLoadError naming the file: not GGUF, an unsupported version, truncation, a value
    // of an unknown type, a tensor of an unsupported type, offsets past the end or overlapping.
    explicit GgufFile(const std::string& path);
    ~GgufFile();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    const std::map<std::string, GgufValue>& metadata() const { return kv_; }
    const std::map<std::string, GgufTensorInfo>& tensors() const { return tensors_; }
    bool has(const std::string& key) const { return kv_.count(key) != 0; }
    bool has_tensor(const std::string& name) const { return tensors_.count(name) != 0; }

    // Typed metadata reads; a present key of the wrong type is a ModelLoadError naming key and type.
    std::optional<std::string> get_string(const std::string& key) const;
    std::optional<int64_t> get_int(const std::string& key) const;     // any integer type
    std::optional<double> get_float(const std::string& key) const;    // any number
    std::optional<bool> get_bool(const std::string& key) const;
    const std::vector<std::string>* get_strings(const std::string& key) const;  // string arrays
    const std::vector<double>* get_numbers(const std::string& key) const;       // numeric arrays

    // The tensor as stored: F32 / F16 / BF16 views over the mapping, Q8_0 dequantised to float32.
    at::Tensor get(const std::string& name) const;

private:
    std::string path_;
    std::shared_ptr<MappedFile> file_;
    uint32_t version_ = 0;
    std::map<std::string, GgufValue> kv_;
    std::map<std::string, GgufTensorInfo> tensors_;
};

// Whether `path` starts with the GGUF magic (a .gguf file under another name is still one).
bool is_gguf_file(const std::string& path);

// Parses the header (metadata and tensor table) of bytes [data, data + size) without torch: the
// fuzz target's entry point. `path` names the file in messages.
void parse_gguf_header(const std::string& path, const uint8_t* data, size_t size, uint32_t& version,
                       std::map<std::string, GgufValue>& kv, std::map<std::string, GgufTensorInfo>& tensors);

}  // namespace hs
