#include "store.h"

#include "errors.h"
#include "temp_files.h"
#include "util.h"

#include <fmt/format.h>
#include <hdf5.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <fstream>

namespace hs {

// Move-only owner of an HDF5 id; the destructor closes by type and never throws.
class H5Handle {
public:
    explicit H5Handle(hid_t id = -1) : id_(id) {}
    ~H5Handle() { reset(); }
    H5Handle(H5Handle&& o) noexcept : id_(o.id_) { o.id_ = -1; }
    H5Handle& operator=(H5Handle&& o) noexcept {
        if (this != &o) {
            reset();
            id_ = o.id_;
            o.id_ = -1;
        }
        return *this;
    }
    H5Handle(const H5Handle&) = delete;
    H5Handle& operator=(const H5Handle&) = delete;
    hid_t get() const { return id_; }
    hid_t release() {
        hid_t id = id_;
        id_ = -1;
        return id;
    }
    bool valid() const { return id_ >= 0; }
    void reset() {
        if (id_ < 0) return;
        switch (H5Iget_type(id_)) {
            case H5I_FILE: H5Fclose(id_); break;
            case H5I_GROUP: H5Gclose(id_); break;
            case H5I_DATASET: H5Dclose(id_); break;
            case H5I_DATASPACE: H5Sclose(id_); break;
            case H5I_DATATYPE: H5Tclose(id_); break;
            case H5I_ATTR: H5Aclose(id_); break;
            case H5I_GENPROP_LST: H5Pclose(id_); break;
            default: break;
        }
        id_ = -1;
    }

private:
    hid_t id_;
};

namespace {

struct SilenceH5 {  // HDF5 prints error stacks by default; we report our own one line.
    SilenceH5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};
const SilenceH5 kSilence;

H5Handle check(hid_t id, const std::string& path, const std::string& what) {
    if (id < 0) throw StorageError(fmt::format("{}: {}", path, what));
    return H5Handle(id);
}

bool link_exists(hid_t file, const std::string& obj) {
    if (obj == "/" || obj.empty()) return true;
    std::string cur;
    for (const auto& part : split(obj, '/')) {
        if (part.empty()) continue;
        cur += "/" + part;
        if (H5Lexists(file, cur.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    return true;
}

enum class ObjKind { kGroup, kDataset, kOther };

ObjKind object_kind(hid_t file, const std::string& obj) {
    H5Handle o(H5Oopen(file, obj.c_str(), H5P_DEFAULT));
    if (!o.valid()) return ObjKind::kOther;
    switch (H5Iget_type(o.get())) {
        case H5I_GROUP: return ObjKind::kGroup;
        case H5I_DATASET: return ObjKind::kDataset;
        default: return ObjKind::kOther;
    }
}

H5Handle string_type() {
    H5Handle t(H5Tcopy(H5T_C_S1));
    H5Tset_size(t.get(), H5T_VARIABLE);
    H5Tset_cset(t.get(), H5T_CSET_UTF8);
    return t;
}

}  // namespace

// The file is built in memory (HDF5's core driver, no backing store) and written to the temporary
// file only in commit(), by us, with every error checked. HDF5 never writes to the disk itself: when
// it did, a full disk left a file whose close failed, and HDF5's exit handler then crashed on it.
static H5Handle core_fapl() {
    H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_fapl_core(fapl.get(), 1 << 20, /*backing_store=*/0);
    return fapl;
}

ResultWriter::ResultWriter(const std::string& path, WriteMode mode) : path_(path), tmp_(temp_path_for(path)) {
    remove_stale_temps(path);
    const bool exists = file_exists(path);
    if (exists && mode == WriteMode::kCreate)
        throw StorageError(fmt::format("{}: exists", path), "overwrite");  // the tools name the flags (open_result)
    if (is_directory(path)) throw StorageError(fmt::format("{}: is a directory", path));
    // Claim the temporary name now, so that an unwritable folder fails before any work is done.
    std::FILE* probe = std::fopen(tmp_.c_str(), "wb");
    if (!probe) throw StorageError(fmt::format("{}: cannot create (is the folder writable?): {}", path, std::strerror(errno)));
    std::fclose(probe);
    auto fapl = core_fapl();
    if (exists && mode == WriteMode::kAppend) {
        try {
            check_hdf5_file_isolated(path);  // the existing file is read whole first, as a reader would
        } catch (...) {
            std::remove(tmp_.c_str());
            throw;
        }
        if (H5Fis_hdf5(path.c_str()) <= 0) {
            std::remove(tmp_.c_str());
            throw StorageError(fmt::format("{}: exists and is not an HDF5 file", path));
        }
        // Read whole into memory; changes stay there until commit() (the original is never touched).
        file_ = std::make_unique<H5Handle>(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.get()));
    } else {
        file_ = std::make_unique<H5Handle>(H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    }
    if (!file_->valid()) {
        std::remove(tmp_.c_str());
        throw StorageError(fmt::format("{}: cannot {}", path, exists && mode == WriteMode::kAppend ? "open for append" : "create"));
    }
}

ResultWriter::~ResultWriter() {
    file_.reset();
    if (!committed_) std::remove(tmp_.c_str());
}

bool ResultWriter::exists(const std::string& obj) const { return link_exists(file_->get(), obj); }

void ResultWriter::create_group(const std::string& group) {
    std::string cur;
    for (const auto& part : split(group, '/')) {
        if (part.empty()) continue;
        cur += "/" + part;
        if (H5Lexists(file_->get(), cur.c_str(), H5P_DEFAULT) > 0) continue;
        check(H5Gcreate2(file_->get(), cur.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path_,
              "cannot create group " + cur);
    }
}

void ResultWriter::remove(const std::string& obj) {
    if (exists(obj) && H5Ldelete(file_->get(), obj.c_str(), H5P_DEFAULT) < 0)
        throw StorageError(fmt::format("{}: cannot remove {}", path_, obj));
}

template <typename T>
static void write_numeric(hid_t file, const std::string& path, const std::string& ds, const std::vector<T>& data,
                          const std::vector<int64_t>& shape, hid_t mem_type, hid_t file_type) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    if (n != static_cast<int64_t>(data.size()))
        throw StorageError(fmt::format("{}: dataset {}: {} values for shape {}", path, ds, data.size(), shape_str(shape)));
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    auto space = check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), path, "dataspace");
    H5Handle plist(H5Pcreate(H5P_DATASET_CREATE));
    if (n >= 4096 && !dims.empty()) {  // chunk + compress large datasets; small ones stay contiguous
        std::vector<hsize_t> chunk(dims);
        hsize_t total = 1;
        for (auto& c : chunk) total *= c;
        for (size_t i = 0; i < chunk.size() && total > (1u << 20); ++i)
            while (chunk[i] > 1 && total > (1u << 20)) {
                total /= chunk[i];
                chunk[i] = (chunk[i] + 1) / 2;
                total *= chunk[i];
            }
        H5Pset_chunk(plist.get(), static_cast<int>(chunk.size()), chunk.data());
        H5Pset_deflate(plist.get(), 4);
    }
    auto d = check(H5Dcreate2(file, ds.c_str(), file_type, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT), path,
                   "cannot create dataset " + ds + " (does it exist already?)");
    if (n > 0 && H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) < 0)
        throw StorageError(fmt::format("{}: cannot write dataset {}", path, ds));
}

static std::string parent_group(const std::string& ds) {
    auto p = ds.find_last_of('/');
    return p == std::string::npos || p == 0 ? "/" : ds.substr(0, p);
}

void ResultWriter::write(const std::string& ds, const std::vector<float>& data, const std::vector<int64_t>& shape) {
    create_group(parent_group(ds));
    write_numeric(file_->get(), path_, ds, data, shape, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE);
}
void ResultWriter::write(const std::string& ds, const std::vector<double>& data, const std::vector<int64_t>& shape) {
    create_group(parent_group(ds));
    write_numeric(file_->get(), path_, ds, data, shape, H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE);
}
void ResultWriter::write(const std::string& ds, const std::vector<int32_t>& data, const std::vector<int64_t>& shape) {
    create_group(parent_group(ds));
    write_numeric(file_->get(), path_, ds, data, shape, H5T_NATIVE_INT32, H5T_STD_I32LE);
}
void ResultWriter::write(const std::string& ds, const std::vector<int64_t>& data, const std::vector<int64_t>& shape) {
    create_group(parent_group(ds));
    write_numeric(file_->get(), path_, ds, data, shape, H5T_NATIVE_INT64, H5T_STD_I64LE);
}

void ResultWriter::write(const std::string& ds, const std::vector<uint8_t>& data, const std::vector<int64_t>& shape) {
    create_group(parent_group(ds));
    write_numeric(file_->get(), path_, ds, data, shape, H5T_NATIVE_UINT8, H5T_STD_U8LE);
}

void ResultWriter::write_strings(const std::string& ds, const std::vector<std::string>& data) {
    create_group(parent_group(ds));
    hsize_t dims[1] = {data.size()};
    auto space = check(H5Screate_simple(1, dims, nullptr), path_, "dataspace");
    auto type = string_type();
    auto d = check(H5Dcreate2(file_->get(), ds.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   path_, "cannot create dataset " + ds);
    std::vector<const char*> ptrs;
    for (const auto& s : data) ptrs.push_back(s.c_str());
    if (!data.empty() && H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0)
        throw StorageError(fmt::format("{}: cannot write dataset {}", path_, ds));
}

static void write_attr(hid_t obj, const std::string& path, const std::string& name, const AttrValue& v) {
    if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
    auto fail = [&] { return StorageError(fmt::format("{}: cannot write attribute {}", path, name)); };
    if (auto* s = std::get_if<std::string>(&v)) {
        auto type = string_type();
        H5Handle space(H5Screate(H5S_SCALAR));
        H5Handle a(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
        const char* p = s->c_str();
        if (!a.valid() || H5Awrite(a.get(), type.get(), &p) < 0) throw fail();
    } else if (auto* ss = std::get_if<std::vector<std::string>>(&v)) {
        auto type = string_type();
        hsize_t dims[1] = {ss->size()};
        H5Handle space(H5Screate_simple(1, dims, nullptr));
        H5Handle a(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
        std::vector<const char*> ptrs;
        for (const auto& x : *ss) ptrs.push_back(x.c_str());
        if (!a.valid() || (!ptrs.empty() && H5Awrite(a.get(), type.get(), ptrs.data()) < 0)) throw fail();
    } else {
        hid_t mt, ft;
        const void* data;
        hsize_t n = 1;
        bool scalar = true;
        if (auto* i = std::get_if<int64_t>(&v)) {
            mt = H5T_NATIVE_INT64, ft = H5T_STD_I64LE, data = i;
        } else if (auto* d = std::get_if<double>(&v)) {
            mt = H5T_NATIVE_DOUBLE, ft = H5T_IEEE_F64LE, data = d;
        } else if (auto* vi = std::get_if<std::vector<int64_t>>(&v)) {
            mt = H5T_NATIVE_INT64, ft = H5T_STD_I64LE, data = vi->data(), n = vi->size(), scalar = false;
        } else {
            auto* vd = std::get_if<std::vector<double>>(&v);
            mt = H5T_NATIVE_DOUBLE, ft = H5T_IEEE_F64LE, data = vd->data(), n = vd->size(), scalar = false;
        }
        H5Handle space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr));
        H5Handle a(H5Acreate2(obj, name.c_str(), ft, space.get(), H5P_DEFAULT, H5P_DEFAULT));
        if (!a.valid() || (n > 0 && H5Awrite(a.get(), mt, data) < 0)) throw fail();
    }
}

void ResultWriter::set_attrs(const std::string& obj, const Attrs& attrs) {
    if (!exists(obj)) create_group(obj);
    auto o = check(H5Oopen(file_->get(), obj.c_str(), H5P_DEFAULT), path_, "cannot open " + obj);
    for (const auto& [k, v] : attrs) write_attr(o.get(), path_, k, v);
}

static Attrs read_attrs(hid_t file, const std::string& path, const std::string& obj);

std::string ResultWriter::read_attr_string(const std::string& obj, const std::string& name) const {
    if (!exists(obj)) return "";
    auto a = read_attrs(file_->get(), path_, obj);
    auto it = a.find(name);
    return it == a.end() ? "" : attr_to_string(it->second);
}

void ResultWriter::commit() {
    if (H5Fflush(file_->get(), H5F_SCOPE_GLOBAL) < 0) throw StorageError(fmt::format("{}: flush failed", path_));
    const ssize_t n = H5Fget_file_image(file_->get(), nullptr, 0);
    if (n <= 0) throw StorageError(fmt::format("{}: cannot serialise the file", path_));
    std::vector<char> image(static_cast<size_t>(n));
    if (H5Fget_file_image(file_->get(), image.data(), image.size()) != n)
        throw StorageError(fmt::format("{}: cannot serialise the file", path_));
    file_.reset();  // in memory: closing cannot fail on the disk
    std::FILE* f = std::fopen(tmp_.c_str(), "wb");
    if (!f) throw StorageError(fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
    const bool ok = std::fwrite(image.data(), 1, image.size(), f) == image.size() && std::fflush(f) == 0 &&
                    ::fsync(::fileno(f)) == 0;  // on disk before the rename: a crash leaves the old file or the new
    const int err = errno;
    if (std::fclose(f) != 0 || !ok)
        throw StorageError(fmt::format("{}: write failed: {}", path_, std::strerror(ok ? errno : err)));
    rename_into_place(tmp_, path_);
    committed_ = true;
}

// ---- reading ----

ResultReader::ResultReader(const std::string& path, Hdf5Open how) : path_(path) {
    if (!file_exists(path)) throw StorageError(fmt::format("{}: no such file", path));
    if (is_directory(path)) throw StorageError(fmt::format("{}: is a directory", path));
    if (how == Hdf5Open::kIsolatedCheck) check_hdf5_file_isolated(path);
    if (H5Fis_hdf5(path.c_str()) <= 0) throw StorageError(fmt::format("{}: not an HDF5 file", path));
    file_ = std::make_unique<H5Handle>(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!file_->valid()) throw StorageError(fmt::format("{}: cannot open", path));
}

ResultReader::~ResultReader() = default;

bool ResultReader::exists(const std::string& obj) const { return link_exists(file_->get(), obj); }

bool ResultReader::is_group(const std::string& obj) const {
    return exists(obj) && object_kind(file_->get(), obj) == ObjKind::kGroup;
}

static herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* data) {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
}

std::vector<std::string> ResultReader::children(const std::string& group) const {
    std::vector<std::string> out;
    auto g = check(H5Gopen2(file_->get(), group.c_str(), H5P_DEFAULT), path_, "no group " + group);
    H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name, &out);
    std::sort(out.begin(), out.end());
    return out;
}

// Element counts read from a file's headers are checked against the file's length before anything
// is allocated: every stored element takes at least one byte of the file, or, for a compressed
// (filtered) dataset, at least 1/1100 of one (deflate's best ratio is ~1032:1). A header that
// asks for more is corrupt (or, for a dataset, was never written: headscope always writes the
// data), and refused with a StorageError instead of a huge allocation.
static uint64_t checked_count(hid_t file, hid_t space, bool compressed, const std::string& path, const std::string& what) {
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0 || rank > 32) throw StorageError(fmt::format("{}: {}: unreadable dataspace", path, what));
    std::vector<hsize_t> dims(rank);
    if (rank > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0)
        throw StorageError(fmt::format("{}: {}: unreadable dataspace", path, what));
    hsize_t file_size = 0;
    if (H5Fget_filesize(file, &file_size) < 0) throw StorageError(fmt::format("{}: cannot get the file size", path));
    const uint64_t limit = compressed ? uint64_t(file_size) * 1100 : uint64_t(file_size);
    uint64_t n = 1;
    for (hsize_t x : dims) {
        if (x != 0 && n > limit / x) {
            n = UINT64_MAX;
            break;
        }
        n *= x;
    }
    if (H5Sget_simple_extent_type(space) == H5S_NULL) n = 0;
    if (n > limit)
        throw StorageError(fmt::format("{}: {}: shape {} claims more elements than the file's {} bytes can hold", path,
                                       what, fmt::join(dims, "x"), file_size));
    return n;
}

Dataset ResultReader::read(const std::string& ds) const {
    if (!exists(ds)) throw StorageError(fmt::format("{}: no dataset {}", path_, ds));
    auto d = check(H5Dopen2(file_->get(), ds.c_str(), H5P_DEFAULT), path_, "cannot open dataset " + ds);
    H5Handle space(H5Dget_space(d.get()));
    H5Handle dcpl(H5Dget_create_plist(d.get()));
    const bool compressed = dcpl.valid() && H5Pget_nfilters(dcpl.get()) > 0;
    const size_t n = checked_count(file_->get(), space.get(), compressed, path_, "dataset " + ds);
    Dataset out;
    {
        std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space.get()));
        if (!dims.empty()) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
        for (auto x : dims) out.shape.push_back(static_cast<int64_t>(x));
        if (H5Sget_simple_extent_type(space.get()) == H5S_NULL) out.shape = {0};
    }
    H5Handle type(H5Dget_type(d.get()));
    if (H5Tget_class(type.get()) == H5T_STRING) {
        out.is_string = true;
        auto st = string_type();
        std::vector<char*> ptrs(n, nullptr);
        if (n && H5Dread(d.get(), st.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0)
            throw StorageError(fmt::format("{}: cannot read {}", path_, ds));
        for (auto* p : ptrs) out.strings.emplace_back(p ? p : "");
        if (n) H5Dvlen_reclaim(st.get(), space.get(), H5P_DEFAULT, ptrs.data());
        return out;
    }
    out.values.resize(n);
    if (n && H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.values.data()) < 0)
        throw StorageError(fmt::format("{}: cannot read {}", path_, ds));
    return out;
}

Dataset ResultReader::read_numbers(const std::string& ds) const {
    Dataset d = read(ds);
    if (d.is_string) throw StorageError(fmt::format("{}: {} holds strings, expected numbers", path_, ds));
    return d;
}

struct AttrCollect {
    Attrs* out;
    hid_t file;
    const std::string* path;
    std::string error;  // set by the callback (exceptions must not cross HDF5's C frames)
};

static void read_one_attr(hid_t loc, const char* name, AttrCollect& c) {
    Attrs& out = *c.out;
    const std::string what = fmt::format("attribute '{}'", name);
    H5Handle a(H5Aopen(loc, name, H5P_DEFAULT));
    if (!a.valid()) throw StorageError(fmt::format("{}: cannot open {}", *c.path, what));
    H5Handle type(H5Aget_type(a.get()));
    H5Handle space(H5Aget_space(a.get()));
    if (!type.valid() || !space.valid()) throw StorageError(fmt::format("{}: unreadable {}", *c.path, what));
    const size_t n = checked_count(c.file, space.get(), false, *c.path, what);
    const bool scalar = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
    auto fail_read = [&] { throw StorageError(fmt::format("{}: cannot read {}", *c.path, what)); };
    switch (H5Tget_class(type.get())) {
        case H5T_STRING: {
            auto st = string_type();
            if (H5Tis_variable_str(type.get()) > 0) {
                std::vector<char*> ptrs(n, nullptr);
                if (n && H5Aread(a.get(), st.get(), ptrs.data()) < 0) fail_read();
                std::vector<std::string> v;
                for (auto* p : ptrs) v.emplace_back(p ? p : "");
                if (n) H5Dvlen_reclaim(st.get(), space.get(), H5P_DEFAULT, ptrs.data());
                if (scalar) out[name] = v.empty() ? std::string() : v[0];
                else out[name] = v;
            } else {
                const size_t sz = H5Tget_size(type.get());
                if (sz == 0 || (n && sz > (size_t(1) << 30) / n)) fail_read();
                std::string s(sz * n, '\0');
                if (n && H5Aread(a.get(), type.get(), s.data()) < 0) fail_read();
                out[name] = std::string(s.c_str());
            }
            break;
        }
        case H5T_INTEGER: {
            std::vector<int64_t> v(n);
            if (n && H5Aread(a.get(), H5T_NATIVE_INT64, v.data()) < 0) fail_read();
            if (scalar && !v.empty()) out[name] = v[0];
            else out[name] = v;
            break;
        }
        case H5T_FLOAT: {
            std::vector<double> v(n);
            if (n && H5Aread(a.get(), H5T_NATIVE_DOUBLE, v.data()) < 0) fail_read();
            if (scalar && !v.empty()) out[name] = v[0];
            else out[name] = v;
            break;
        }
        default: out[name] = std::string("<unsupported attribute type>");
    }
}

static herr_t collect_attr(hid_t loc, const char* name, const H5A_info_t*, void* data) {
    auto& c = *static_cast<AttrCollect*>(data);
    try {
        read_one_attr(loc, name, c);
    } catch (const std::exception& e) {
        c.error = e.what();
        return -1;  // stops the iteration
    }
    return 0;
}

static Attrs read_attrs(hid_t file, const std::string& path, const std::string& obj) {
    Attrs out;
    hid_t o = H5Oopen(file, obj.c_str(), H5P_DEFAULT);
    if (o < 0) throw StorageError(fmt::format("{}: no object {}", path, obj));
    AttrCollect c{&out, file, &path, {}};
    const herr_t r = H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attr, &c);
    H5Oclose(o);
    if (!c.error.empty()) throw StorageError(c.error);
    if (r < 0) throw StorageError(fmt::format("{}: cannot read the attributes of {}", path, obj));
    return out;
}

Attrs ResultReader::attrs(const std::string& obj) const { return read_attrs(file_->get(), path_, obj); }

// ---- reading a whole file, and doing so in a child process first ----

void ResultReader::read_everything(const std::function<void(uint64_t)>& before_data) const {
    constexpr size_t kMaxObjects = 100000;
    constexpr int kMaxDepth = 32;
    std::vector<std::string> objects{"/"}, datasets;
    uint64_t declared = 0;
    std::function<void(const std::string&, int)> walk = [&](const std::string& g, int depth) {
        if (depth > kMaxDepth)
            throw StorageError(fmt::format("{}: groups nested more than {} deep (a link cycle?)", path_, kMaxDepth));
        for (const auto& c : children(g)) {
            const std::string p = g == "/" ? "/" + c : g + "/" + c;
            if (objects.size() >= kMaxObjects)
                throw StorageError(fmt::format("{}: more than {} objects (a link cycle?)", path_, kMaxObjects));
            if (!exists(p)) continue;  // a dangling soft or external link: nothing to read
            const ObjKind kind = object_kind(file_->get(), p);
            if (kind == ObjKind::kOther) continue;  // a committed datatype: no data of its own
            objects.push_back(p);
            if (kind == ObjKind::kGroup) {
                walk(p, depth + 1);
                continue;
            }
            datasets.push_back(p);
            auto d = check(H5Dopen2(file_->get(), p.c_str(), H5P_DEFAULT), path_, "cannot open dataset " + p);
            H5Handle space(H5Dget_space(d.get()));
            H5Handle dcpl(H5Dget_create_plist(d.get()));
            H5Handle type(H5Dget_type(d.get()));
            const bool compressed = dcpl.valid() && H5Pget_nfilters(dcpl.get()) > 0;
            const uint64_t n = checked_count(file_->get(), space.get(), compressed, path_, "dataset " + p);
            const uint64_t per = H5Tget_class(type.get()) == H5T_STRING ? 8 + sizeof(std::string) : sizeof(double);
            declared += n * per;
        }
    };
    walk("/", 0);
    if (before_data) before_data(declared);
    for (const auto& o : objects) (void)attrs(o);
    for (const auto& d : datasets) (void)read(d);
}

namespace {

// HEADSCOPE_HDF5_CHECK_TIMEOUT, or 30 s + 1 s per 10 MB of file (reading a 186 MB result file whole took 3 s on a loaded 2-core VM).
double check_timeout_s(uint64_t file_size) {
    if (const char* e = std::getenv("HEADSCOPE_HDF5_CHECK_TIMEOUT")) {
        char* end = nullptr;
        const double v = std::strtod(e, &end);
        if (end != e && *end == '\0' && v > 0 && v < 1e6) return v;
    }
    return 30.0 + double(file_size) / 10e6;
}

uint64_t virtual_memory_bytes() {  // this process's address space now (/proc/self/statm, first field)
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long pages = 0;
    const int got = std::fscanf(f, "%llu", &pages);
    std::fclose(f);
    return got == 1 ? pages * uint64_t(::sysconf(_SC_PAGESIZE)) : 0;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

void write_all(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
        const ssize_t w = ::write(fd, s.data() + off, s.size() - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        off += size_t(w);
    }
}

// The child: reads the file whole, writes "ok" or the one-line error to `fd`, and _exits (no exit
// handlers: HDF5's and libtorch's belong to the parent).
[[noreturn]] void check_in_child(const std::string& path, int fd, uint64_t file_size, double timeout_s) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) ::dup2(devnull, STDERR_FILENO);  // a crash report must not add lines to ours
    struct rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::alarm(static_cast<unsigned>(timeout_s) + 2);  // in case the parent is gone
    uint64_t cap = 0;
    try {
        ResultReader r(path, Hdf5Open::kInProcess);
        r.read_everything([&](uint64_t declared) {
            if (kAddressSanitizer) return;  // ASan reserves terabytes of address space up front
            const uint64_t now = virtual_memory_bytes();
            if (now == 0) return;
            cap = now + (uint64_t(512) << 20) + 2 * declared + 16 * file_size;
            struct rlimit lim{};
            if (::getrlimit(RLIMIT_AS, &lim) != 0) return;
            if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < cap) cap = lim.rlim_cur;  // never raise a user's limit
            lim.rlim_cur = cap;
            ::setrlimit(RLIMIT_AS, &lim);
        });
        write_all(fd, "ok");
        ::_exit(0);
    } catch (const std::bad_alloc&) {
        write_all(fd, fmt::format("{}: reading it needs more memory than its declared contents account for ({} MiB "
                                  "for this process): the file is damaged",
                                  path, cap >> 20));
    } catch (const std::exception& e) {
        // A read that failed under the memory cap says so: libhdf5 reports an allocation it
        // could not make as a plain read error.
        write_all(fd, cap ? fmt::format("{} (read under a memory limit of {} MiB, from what the file declares)",
                                        e.what(), cap >> 20)
                          : std::string(e.what()));
    } catch (...) {
        write_all(fd, fmt::format("{}: cannot read", path));
    }
    ::_exit(3);
}

}  // namespace

void check_hdf5_file_isolated(const std::string& path) {
    if (const char* e = std::getenv("HEADSCOPE_HDF5_CHECK"); e && std::string(e) == "0") return;
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) throw StorageError(fmt::format("{}: {}", path, std::strerror(errno)));
    const uint64_t file_size = uint64_t(st.st_size);
    const double timeout_s = check_timeout_s(file_size);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
        throw StorageError(fmt::format("{}: cannot start the process that checks it: {}", path, std::strerror(errno)));
    const pid_t pid = ::fork();
    if (pid < 0) {
        const int err = errno;
        ::close(fds[0]);
        ::close(fds[1]);
        throw StorageError(fmt::format("{}: cannot start the process that checks it: {} (HEADSCOPE_HDF5_CHECK=0 reads "
                                       "it without the check)",
                                       path, std::strerror(err)));
    }
    if (pid == 0) {
        ::close(fds[0]);
        check_in_child(path, fds[1], file_size, timeout_s);
    }
    ::close(fds[1]);
    std::string msg;
    bool timed_out = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd p{fds[0], POLLIN, 0};
        const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;  // woken without data: the deadline decides
        char buf[4096];
        const ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF: the child has exited (or closed its end)
        if (msg.size() < 65536) msg.append(buf, size_t(n));
    }
    ::close(fds[0]);
    if (timed_out) ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (timed_out)
        throw StorageError(fmt::format("{}: libhdf5 did not finish reading it within {:.0f} s: the file is damaged "
                                       "(HEADSCOPE_HDF5_CHECK_TIMEOUT sets the limit)",
                                       path, timeout_s));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && msg == "ok") return;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3 && !msg.empty()) throw StorageError(msg);
    if (WIFSIGNALED(status))
        throw StorageError(fmt::format("{}: libhdf5 crashed while reading it ({}): the file is damaged or was not "
                                       "written by headscope",
                                       path, strsignal(WTERMSIG(status))));
    throw StorageError(fmt::format("{}: the process that checks it stopped with exit code {}: the file is damaged or "
                                   "was not written by headscope",
                                   path, WIFEXITED(status) ? WEXITSTATUS(status) : -1));
}

std::string attr_to_string(const AttrValue& v) {
    struct V {
        std::string operator()(const std::string& s) const { return s; }
        std::string operator()(int64_t i) const { return std::to_string(i); }
        std::string operator()(double d) const { return fmt::format("{}", d); }
        std::string operator()(const std::vector<int64_t>& x) const { return fmt::format("[{}]", fmt::join(x, ",")); }
        std::string operator()(const std::vector<double>& x) const { return fmt::format("[{}]", fmt::join(x, ",")); }
        std::string operator()(const std::vector<std::string>& x) const { return fmt::format("[{}]", fmt::join(x, ",")); }
    };
    return std::visit(V{}, v);
}

}  // namespace hs
