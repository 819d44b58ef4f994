#include "safetensors.h"

#include "errors.h"
#include "util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace hs {

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw ModelLoadError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw ModelLoadError(fmt::format("{}: not a regular file", path));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        // MAP_PRIVATE + PROT_WRITE: copy-on-write, so a stray in-place op never touches the file.
        void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ::close(fd);
            throw ModelLoadError(fmt::format("{}: mmap failed: {}", path, std::strerror(errno)));
        }
        data_ = static_cast<uint8_t*>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (data_) ::munmap(data_, size_);
}

namespace {

struct DtypeInfo {
    size_t bytes;
    c10::ScalarType type;
};

bool dtype_info(const std::string& s, DtypeInfo* out) {
    static const std::map<std::string, DtypeInfo> kTable = {
        {"F64", {8, c10::kDouble}}, {"F32", {4, c10::kFloat}}, {"F16", {2, c10::kHalf}},
        {"BF16", {2, c10::kBFloat16}}, {"I64", {8, c10::kLong}}, {"I32", {4, c10::kInt}},
        {"I16", {2, c10::kShort}}, {"I8", {1, c10::kChar}}, {"U8", {1, c10::kByte}},
        {"BOOL", {1, c10::kBool}},
    };
    auto it = kTable.find(s);
    if (it == kTable.end()) return false;
    *out = it->second;
    return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) {
    file_ = std::make_shared<MappedFile>(path);
    const size_t size = file_->size();
    if (size < 8) throw ModelLoadError(fmt::format("{}: truncated: {} bytes, no header", path, size));
    uint64_t header_len = 0;
    std::memcpy(&header_len, file_->data(), 8);  // little-endian on every supported host
    if (header_len > size - 8)
        throw ModelLoadError(fmt::format("{}: header length {} past end of file ({} bytes)", path,
                                         header_len, size));
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(file_->data() + 8, file_->data() + 8 + header_len);
    } catch (const std::exception& e) {
        throw ModelLoadError(fmt::format("{}: header is not valid JSON", path));
    }
    if (!header.is_object()) throw ModelLoadError(fmt::format("{}: header is not a JSON object", path));
    const size_t data_start = 8 + header_len;
    const size_t data_size = size - data_start;
    std::vector<std::pair<size_t, size_t>> spans;
    for (auto& [name, v] : header.items()) {
        if (name == "__metadata__") {
            if (v.is_object())
                for (auto& [k, mv] : v.items())
                    if (mv.is_string()) metadata_[k] = mv.get<std::string>();
            continue;
        }
        const std::string where = fmt::format("{}: tensor '{}'", path, name);
        if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
            throw ModelLoadError(where + ": entry lacks dtype, shape or data_offsets");
        TensorEntry e;
        e.name = name;
        // Every shape entry and offset must be a JSON integer: nlohmann casts a float (1e32) to
        // an integer type without a range check, which is undefined behaviour.
        for (const char* key : {"shape", "data_offsets"}) {
            if (!v[key].is_array()) throw ModelLoadError(fmt::format("{}: {} is not a list", where, key));
            for (const auto& x : v[key])
                if (!x.is_number_integer()) throw ModelLoadError(fmt::format("{}: {} holds a non-integer", where, key));
        }
        try {
            e.dtype = v["dtype"].get<std::string>();
            e.shape = v["shape"].get<std::vector<int64_t>>();
            auto off = v["data_offsets"].get<std::vector<uint64_t>>();
            if (off.size() != 2) throw std::runtime_error("");
            e.begin = off[0];
            e.end = off[1];
        } catch (const std::exception&) {
            throw ModelLoadError(where + ": malformed dtype, shape or data_offsets");
        }
        DtypeInfo di{};
        if (!dtype_info(e.dtype, &di)) throw ModelLoadError(fmt::format("{}: unsupported dtype '{}'", where, e.dtype));
        if (e.end < e.begin || e.end > data_size)
            throw ModelLoadError(fmt::format("{}: offsets [{}, {}) past end of data ({} bytes)", where,
                                             e.begin, e.end, data_size));
        // 128-bit product: a shape whose element count wraps 64 bits (e.g. [2^62, 4]) must not
        // pass as an empty tensor.
        unsigned __int128 need = di.bytes;
        bool huge = false;
        for (int64_t d : e.shape) {
            if (d < 0) throw ModelLoadError(where + ": negative dimension");
            need *= static_cast<uint64_t>(d);
            if (need > static_cast<unsigned __int128>(UINT64_MAX)) huge = true, need = UINT64_MAX;
        }
        bool zero = false;
        for (int64_t d : e.shape) zero = zero || d == 0;
        if (zero) huge = false, need = 0;
        if (huge || static_cast<uint64_t>(need) != e.end - e.begin)
            throw ModelLoadError(fmt::format("{}: {} bytes stored but shape {} of {} needs {}", where, e.end - e.begin,
                                             shape_str(e.shape), e.dtype,
                                             huge ? std::string("more than 2^64") : std::to_string(static_cast<uint64_t>(need))));
        spans.emplace_back(e.begin, e.end);
        e.begin += data_start;
        e.end += data_start;
        entries_[name] = std::move(e);
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
        if (spans[i].first < spans[i - 1].second && spans[i].second > spans[i].first)
            throw ModelLoadError(fmt::format("{}: tensors overlap at data bytes [{}, {})", path,
                                             spans[i].first, spans[i - 1].second));
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) throw ModelLoadError(fmt::format("{}: no tensor '{}'", path(), name));
    return it->second;
}

at::Tensor SafetensorsFile::get(const std::string& name) const {
    const TensorEntry& e = entry(name);
    DtypeInfo di{};
    dtype_info(e.dtype, &di);
    auto opts = torch::TensorOptions().dtype(di.type).device(torch::kCPU);
    uint8_t* ptr = const_cast<uint8_t*>(file_->data()) + e.begin;
    if (e.begin == e.end) return torch::empty(e.shape, opts);
    if (reinterpret_cast<uintptr_t>(ptr) % di.bytes != 0) {
        // Misaligned data: copy rather than hand out an unaligned view.
        auto t = torch::empty(e.shape, opts);
        std::memcpy(t.data_ptr(), ptr, e.end - e.begin);
        return t;
    }
    auto keep = file_;
    return torch::from_blob(ptr, e.shape, [keep](void*) {}, opts);
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    static const std::map<c10::ScalarType, std::string> kNames = {
        {c10::kDouble, "F64"}, {c10::kFloat, "F32"}, {c10::kHalf, "F16"}, {c10::kBFloat16, "BF16"},
        {c10::kLong, "I64"}, {c10::kInt, "I32"}, {c10::kShort, "I16"}, {c10::kChar, "I8"},
        {c10::kByte, "U8"}, {c10::kBool, "BOOL"}};
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::vector<at::Tensor> blobs;
    size_t offset = 0;
    for (const auto& [name, t0] : tensors) {
        auto t = t0.detach().to(torch::kCPU).contiguous();
        auto it = kNames.find(t.scalar_type());
        if (it == kNames.end()) throw StorageError(fmt::format("{}: tensor '{}' has an unsupported dtype", path, name));
        size_t nbytes = t.numel() * t.element_size();
        header[name] = {{"dtype", it->second},
                        {"shape", std::vector<int64_t>(t.sizes().begin(), t.sizes().end())},
                        {"data_offsets", {offset, offset + nbytes}}};
        offset += nbytes;
        blobs.push_back(t);
    }
    std::string hs = header.dump();
    while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');  // keep the data 8-byte aligned
    AtomicFile out(path);
    uint64_t n = hs.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(hs.data(), hs.size());
    for (const auto& t : blobs) out.write(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
    out.commit();
}

}  // namespace hs
