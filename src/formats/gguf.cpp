#include "gguf.h"

#include "errors.h"
#include "safetensors.h"
#include "util.h"

#include <torch/torch.h>

#include <cstring>
#include <fstream>

namespace hs {

namespace {

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30;
constexpr int64_t kQ8Block = 32, kQ8Bytes = 34;  // fp16 scale + 32 int8

// Reads little-endian values from [data, data + size), throwing on any read past the end.
class Cursor {
public:
    Cursor(const std::string& path, const uint8_t* data, size_t size) : path_(path), data_(data), size_(size) {}
    size_t pos() const { return pos_; }
    size_t left() const { return size_ - pos_; }
    void need(size_t n, const std::string& what) const {
        if (n > left())
            throw ModelLoadError(fmt::format("{}: truncated: {} needs {} bytes at byte {}, the file has {} left", path_,
                                             what, n, pos_, left()));
    }
    template <class T>
    T read(const std::string& what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }
    std::string string(const std::string& what) {
        const auto n = read<uint64_t>(what + " length");
        need(n, what);
        std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
        pos_ += static_cast<size_t>(n);
        return s;
    }

private:
    const std::string& path_;
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
};

size_t scalar_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
        case GgufValueType::kU16: case GgufValueType::kI16: return 2;
        case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
        case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
        default: return 0;
    }
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

// One scalar of type t into v (num and the exact u64/i64).
void read_scalar(Cursor& c, GgufValueType t, GgufValue& v, const std::string& what, const std::string& path) {
    switch (t) {
        case GgufValueType::kU8: v.u64 = c.read<uint8_t>(what); v.i64 = static_cast<int64_t>(v.u64); v.num = static_cast<double>(v.u64); break;
        case GgufValueType::kI8: v.i64 = c.read<int8_t>(what); v.num = static_cast<double>(v.i64); break;
        case GgufValueType::kU16: v.u64 = c.read<uint16_t>(what); v.i64 = static_cast<int64_t>(v.u64); v.num = static_cast<double>(v.u64); break;
        case GgufValueType::kI16: v.i64 = c.read<int16_t>(what); v.num = static_cast<double>(v.i64); break;
        case GgufValueType::kU32: v.u64 = c.read<uint32_t>(what); v.i64 = static_cast<int64_t>(v.u64); v.num = static_cast<double>(v.u64); break;
        case GgufValueType::kI32: v.i64 = c.read<int32_t>(what); v.num = static_cast<double>(v.i64); break;
        case GgufValueType::kU64: v.u64 = c.read<uint64_t>(what); v.i64 = static_cast<int64_t>(v.u64); v.num = static_cast<double>(v.u64); break;
        case GgufValueType::kI64: v.i64 = c.read<int64_t>(what); v.num = static_cast<double>(v.i64); break;
        case GgufValueType::kF32: v.num = c.read<float>(what); break;
        case GgufValueType::kF64: v.num = c.read<double>(what); break;
        case GgufValueType::kBool: {
            const auto b = c.read<uint8_t>(what);
            if (b > 1) throw ModelLoadError(fmt::format("{}: {} is a bool holding {}, not 0 or 1", path, what, b));
            v.num = b;
            v.u64 = b;
            break;
        }
        default: throw ModelLoadError(fmt::format("{}: {}: value type {} is not a scalar", path, what, static_cast<uint32_t>(t)));
    }
}

void read_value(Cursor& c, GgufValue& v, const std::string& key, const std::string& path) {
    const auto t = c.read<uint32_t>("the type of key '" + key + "'");
    if (!known_value_type(t))
        throw ModelLoadError(fmt::format("{}: key '{}' has unknown value type {}", path, key, t));
    v.type = static_cast<GgufValueType>(t);
    const std::string what = "key '" + key + "'";
    if (v.type == GgufValueType::kString) {
        v.str = c.string(what);
        return;
    }
    if (v.type != GgufValueType::kArray) {
        read_scalar(c, v.type, v, what, path);
        return;
    }
    const auto et = c.read<uint32_t>(what + "'s element type");
    if (!known_value_type(et))
        throw ModelLoadError(fmt::format("{}: key '{}' is an array of unknown value type {}", path, key, et));
    v.elem = static_cast<GgufValueType>(et);
    if (v.elem == GgufValueType::kArray)
        throw ModelLoadError(fmt::format("{}: key '{}' is an array of arrays (no model key is; not supported)", path, key));
    const auto n = c.read<uint64_t>(what + "'s length");
    // Every element takes at least its own size (a string at least its 8-byte length): a count
    // the rest of the file cannot hold is refused before anything is reserved.
    const size_t each = v.elem == GgufValueType::kString ? 8 : scalar_size(v.elem);
    if (n > c.left() / each)
        throw ModelLoadError(fmt::format("{}: truncated: key '{}' promises {} elements, the file has {} bytes left", path,
                                         key, n, c.left()));
    if (v.elem == GgufValueType::kString) {
        v.strs.reserve(static_cast<size_t>(n));
        for (uint64_t i = 0; i < n; ++i) v.strs.push_back(c.string(fmt::format("{}[{}]", what, i)));
    } else {
        v.nums.reserve(static_cast<size_t>(n));
        GgufValue e;
        for (uint64_t i = 0; i < n; ++i) {
            read_scalar(c, v.elem, e, what, path);
            v.nums.push_back(e.num);
        }
    }
}

// Bytes of a tensor of `type` with `n` elements and innermost dimension `ne0`; throws for types
// this reader does not load.
uint64_t tensor_bytes(const std::string& path, const std::string& name, uint32_t type, uint64_t n, int64_t ne0) {
    switch (type) {
        case kF32: return n * 4;
        case kF16:
        case kBF16: return n * 2;
        case kQ8_0:
            if (ne0 % kQ8Block != 0)
                throw ModelLoadError(fmt::format("{}: tensor '{}' is Q8_0 with rows of {} values, not a multiple of 32", path,
                                                 name, ne0));
            return n / kQ8Block * kQ8Bytes;
        default: {
            const char* tn = ggml_type_name(type);
            if (!tn) throw ModelLoadError(fmt::format("{}: tensor '{}' has unknown ggml type {}", path, name, type));
            throw ModelLoadError(fmt::format("{}: tensor '{}' is {}: headscope reads F32, F16, BF16 and Q8_0 tensors "
                                             "(convert with llama.cpp's --outtype f16 or q8_0)", path, name, tn));
        }
    }
}

}  // namespace

bool is_gguf_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char magic[4] = {};
    return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

const char* gguf_value_type_name(GgufValueType t) {
    static const char* kNames[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                   "bool", "string", "array", "uint64", "int64", "float64"};
    const auto i = static_cast<uint32_t>(t);
    return i < 13 ? kNames[i] : "unknown";
}

const char* ggml_type_name(uint32_t type) {
    static const std::map<uint32_t, const char*> kNames = {
        {0, "F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {6, "Q5_0"}, {7, "Q5_1"}, {8, "Q8_0"}, {9, "Q8_1"},
        {10, "Q2_K"}, {11, "Q3_K"}, {12, "Q4_K"}, {13, "Q5_K"}, {14, "Q6_K"}, {15, "Q8_K"}, {16, "IQ2_XXS"},
        {17, "IQ2_XS"}, {18, "IQ3_XXS"}, {19, "IQ1_S"}, {20, "IQ4_NL"}, {21, "IQ3_S"}, {22, "IQ2_S"}, {23, "IQ4_XS"},
        {24, "I8"}, {25, "I16"}, {26, "I32"}, {27, "I64"}, {28, "F64"}, {29, "IQ1_M"}, {30, "BF16"},
        {34, "TQ1_0"}, {35, "TQ2_0"}, {39, "MXFP4"}};
    auto it = kNames.find(type);
    return it == kNames.end() ? nullptr : it->second;
}

bool GgufValue::is_integer() const {
    switch (type) {
        case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kU16: case GgufValueType::kI16:
        case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kU64: case GgufValueType::kI64: return true;
        default: return false;
    }
}

bool GgufValue::is_number() const {
    return is_integer() || type == GgufValueType::kF32 || type == GgufValueType::kF64;
}

void parse_gguf_header(const std::string& path, const uint8_t* data, size_t size, uint32_t& version,
                       std::map<std::string, GgufValue>& kv, std::map<std::string, GgufTensorInfo>& tensors) {
    Cursor c(path, data, size);
    if (size < 4 || std::memcmp(data, "GGUF", 4) != 0)
        throw ModelLoadError(fmt::format("{}: not a GGUF file (no \"GGUF\" magic)", path));
    c.read<uint32_t>("the magic");
    version = c.read<uint32_t>("the version");
    if (version == 0x02000000u || version == 0x03000000u)
        throw ModelLoadError(fmt::format("{}: a big-endian GGUF file (not supported)", path));
    if (version != 2 && version != 3)
        throw ModelLoadError(fmt::format("{}: GGUF version {} (headscope reads versions 2 and 3)", path, version));
    const auto n_tensors = c.read<uint64_t>("the tensor count");
    const auto n_kv = c.read<uint64_t>("the key-value count");
    // A key-value takes at least 13 bytes, a tensor info at least 32.
    if (n_kv > c.left() / 13)
        throw ModelLoadError(fmt::format("{}: truncated: {} key-values promised, the file has {} bytes left", path, n_kv, c.left()));
    for (uint64_t i = 0; i < n_kv; ++i) {
        std::string key = c.string(fmt::format("key {}", i));
        GgufValue v;
        read_value(c, v, key, path);
        if (!kv.emplace(key, std::move(v)).second) throw ModelLoadError(fmt::format("{}: key '{}' appears twice", path, key));
    }
    uint64_t alignment = 32;
    if (auto it = kv.find("general.alignment"); it != kv.end()) {
        if (it->second.type != GgufValueType::kU32)
            throw ModelLoadError(fmt::format("{}: metadata key 'general.alignment' is {}, expected uint32", path,
                                             gguf_value_type_name(it->second.type)));
        alignment = it->second.u64;
        if (alignment == 0 || (alignment & (alignment - 1)) != 0)
            throw ModelLoadError(fmt::format("{}: general.alignment {} is not a power of two", path, alignment));
    }
    if (n_tensors > c.left() / 32)
        throw ModelLoadError(fmt::format("{}: truncated: {} tensors promised, the file has {} bytes left", path, n_tensors, c.left()));
    std::vector<std::pair<uint64_t, uint64_t>> spans;  // relative [offset, offset + bytes)
    std::vector<GgufTensorInfo> infos;
    for (uint64_t i = 0; i < n_tensors; ++i) {
        GgufTensorInfo t;
        t.name = c.string(fmt::format("the name of tensor {}", i));
        const std::string what = "tensor '" + t.name + "'";
        const auto nd = c.read<uint32_t>(what + "'s dimension count");
        if (nd == 0 || nd > kMaxDims)
            throw ModelLoadError(fmt::format("{}: {} has {} dimensions (1 to {} allowed)", path, what, nd, kMaxDims));
        std::vector<int64_t> ne(nd);
        unsigned __int128 n = 1;
        for (uint32_t d = 0; d < nd; ++d) {
            const auto x = c.read<uint64_t>(what + "'s dimensions");
            if (x == 0 || x > (uint64_t{1} << 62))
                throw ModelLoadError(fmt::format("{}: {} has dimension {} of size {}", path, what, d, x));
            ne[d] = static_cast<int64_t>(x);
            n *= x;
            if (n > (static_cast<unsigned __int128>(1) << 62))
                throw ModelLoadError(fmt::format("{}: {} has more than 2^62 elements", path, what));
        }
        t.shape.assign(ne.rbegin(), ne.rend());
        t.type = c.read<uint32_t>(what + "'s type");
        const auto offset = c.read<uint64_t>(what + "'s offset");
        const uint64_t bytes = tensor_bytes(path, t.name, t.type, static_cast<uint64_t>(n), ne[0]);
        if (offset % alignment != 0)
            throw ModelLoadError(fmt::format("{}: {} starts at data offset {}, not a multiple of the alignment {}", path, what,
                                             offset, alignment));
        spans.emplace_back(offset, offset + bytes);
        t.begin = static_cast<size_t>(offset);
        t.end = static_cast<size_t>(bytes);  // relative begin and size for now; absolute below
        infos.push_back(std::move(t));
    }
    const uint64_t header_end = c.pos();
    const uint64_t data_start = (header_end + alignment - 1) / alignment * alignment;
    const uint64_t data_size = size >= data_start ? size - data_start : 0;
    for (auto& t : infos) {
        const uint64_t off = t.begin, bytes = t.end;
        if (data_start > size || off > data_size || bytes > data_size - off)
            throw ModelLoadError(fmt::format("{}: truncated: tensor '{}' needs data bytes [{}, {}), the data section holds {}",
                                             path, t.name, off, off + bytes, data_size));
        t.begin = static_cast<size_t>(data_start + off);
        t.end = static_cast<size_t>(data_start + off + bytes);
        std::string name = t.name;
        if (!tensors.emplace(name, std::move(t)).second)
            throw ModelLoadError(fmt::format("{}: tensor '{}' appears twice", path, name));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
        if (spans[i].first < spans[i - 1].second)
            throw ModelLoadError(fmt::format("{}: tensors overlap at data bytes [{}, {})", path, spans[i].first,
                                             spans[i - 1].second));
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
    file_ = std::make_shared<MappedFile>(path);
    parse_gguf_header(path, file_->data(), file_->size(), version_, kv_, tensors_);
}

GgufFile::~GgufFile() = default;

namespace {
const GgufValue* find_typed(const std::map<std::string, GgufValue>& kv, const std::string& path, const std::string& key,
                            bool (*ok)(const GgufValue&), const char* expected) {
    auto it = kv.find(key);
    if (it == kv.end()) return nullptr;
    if (!ok(it->second)) {
        std::string got = gguf_value_type_name(it->second.type);
        if (it->second.type == GgufValueType::kArray) got += std::string(" of ") + gguf_value_type_name(it->second.elem);
        throw ModelLoadError(fmt::format("{}: metadata key '{}' is {}, expected {}", path, key, got, expected));
    }
    return &it->second;
}
}  // namespace

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
    auto* v = find_typed(kv_, path_, key, [](const GgufValue& x) { return x.type == GgufValueType::kString; }, "a string");
    return v ? std::optional<std::string>(v->str) : std::nullopt;
}

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
    auto* v = find_typed(kv_, path_, key, [](const GgufValue& x) { return x.is_integer(); }, "an integer");
    if (!v) return std::nullopt;
    if (v->type == GgufValueType::kU64 && v->u64 > static_cast<uint64_t>(INT64_MAX))
        throw ModelLoadError(fmt::format("{}: metadata key '{}' is {}, out of range", path_, key, v->u64));
    return v->i64;
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
    auto* v = find_typed(kv_, path_, key, [](const GgufValue& x) { return x.is_number(); }, "a number");
    return v ? std::optional<double>(v->num) : std::nullopt;
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
    auto* v = find_typed(kv_, path_, key, [](const GgufValue& x) { return x.type == GgufValueType::kBool; }, "a bool");
    return v ? std::optional<bool>(v->num != 0) : std::nullopt;
}

const std::vector<std::string>* GgufFile::get_strings(const std::string& key) const {
    auto* v = find_typed(kv_, path_, key,
                         [](const GgufValue& x) { return x.type == GgufValueType::kArray && x.elem == GgufValueType::kString; },
                         "an array of strings");
    return v ? &v->strs : nullptr;
}

const std::vector<double>* GgufFile::get_numbers(const std::string& key) const {
    auto* v = find_typed(kv_, path_, key,
                         [](const GgufValue& x) {
                             return x.type == GgufValueType::kArray && x.elem != GgufValueType::kString &&
                                    x.elem != GgufValueType::kBool;
                         },
                         "an array of numbers");
    return v ? &v->nums : nullptr;
}

at::Tensor GgufFile::get(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw ModelLoadError(fmt::format("{}: no tensor '{}'", path_, name));
    const auto& t = it->second;
    uint8_t* ptr = const_cast<uint8_t*>(file_->data()) + t.begin;
    const size_t bytes = t.end - t.begin;
    auto keep = file_;
    auto view = [&](c10::ScalarType st, std::vector<int64_t> shape, size_t elem) {
        auto opts = torch::TensorOptions().dtype(st).device(torch::kCPU);
        if (reinterpret_cast<uintptr_t>(ptr) % elem != 0) {  // misaligned: copy
            auto out = torch::empty(shape, opts);
            std::memcpy(out.data_ptr(), ptr, bytes);
            return out;
        }
        return torch::from_blob(ptr, shape, [keep](void*) {}, opts);
    };
    switch (t.type) {
        case kF32: return view(torch::kFloat, t.shape, 4);
        case kF16: return view(torch::kHalf, t.shape, 2);
        case kBF16: return view(torch::kBFloat16, t.shape, 2);
        case kQ8_0: {
            // Blocks of 32 along the innermost dimension: x = d * q (ggml's dequantize_row_q8_0).
            const auto blocks = static_cast<int64_t>(bytes) / kQ8Bytes;
            auto raw = view(torch::kByte, {blocks, kQ8Bytes}, 1);
            auto d = raw.narrow(1, 0, 2).contiguous().view(torch::kHalf).to(torch::kFloat);        // [blocks, 1]
            auto q = raw.narrow(1, 2, kQ8Block).contiguous().view(torch::kChar).to(torch::kFloat);  // [blocks, 32]
            return (q * d).view(t.shape);
        }
        default: throw ModelLoadError(fmt::format("{}: tensor '{}' has an unsupported type", path_, name));
    }
}

}  // namespace hs
