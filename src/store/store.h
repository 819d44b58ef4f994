// The HDF5 result store: plain datasets and attributes that h5py and pandas read with no custom
// code. Writes go to a temporary file that replaces the target only in commit(): a run that fails
// leaves nothing behind, and --append never damages the existing file. Schema: docs/hdf5-schema.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace hs {

using AttrValue = std::variant<std::string, int64_t, double, std::vector<int64_t>, std::vector<double>,
                               std::vector<std::string>>;
using Attrs = std::map<std::string, AttrValue>;

enum class WriteMode {
    kCreate,  // refuse when the file exists
    kForce,   // replace an existing file
    kAppend,  // add groups to an existing file (or create it)
};

class H5Handle;  // RAII owner of an hid_t (store.cpp)

class ResultWriter {
public:
    ResultWriter(const std::string& path, WriteMode mode);
    ~ResultWriter();  // without commit(): the temporary file is removed
    ResultWriter(const ResultWriter&) = delete;
    ResultWriter& operator=(const ResultWriter&) = delete;

    bool exists(const std::string& obj) const;  // "/scores/induction"
    // Datasets; intermediate groups are created. Shape product must equal data size.
    void write(const std::string& dataset, const std::vector<float>& data, const std::vector<int64_t>& shape);
    void write(const std::string& dataset, const std::vector<double>& data, const std::vector<int64_t>& shape);
    void write(const std::string& dataset, const std::vector<int32_t>& data, const std::vector<int64_t>& shape);
    void write(const std::string& dataset, const std::vector<int64_t>& data, const std::vector<int64_t>& shape);
    void write(const std::string& dataset, const std::vector<uint8_t>& data, const std::vector<int64_t>& shape);
    void write_strings(const std::string& dataset, const std::vector<std::string>& data);
    void create_group(const std::string& group);
    void remove(const std::string& obj);  // unlink (for --force on one group in append mode)
    void set_attrs(const std::string& obj, const Attrs& attrs);  // obj "/" for the root
    std::string read_attr_string(const std::string& obj, const std::string& name) const;  // "" if absent
    void commit();
    const std::string& path() const { return path_; }

private:
    std::string path_, tmp_;
    std::unique_ptr<H5Handle> file_;
    bool committed_ = false;
};

// Read side, for export/top/tests.
struct Dataset {
    std::vector<int64_t> shape;
    std::vector<double> values;  // numeric datasets, converted
    std::vector<std::string> strings;  // string datasets
    bool is_string = false;
};

// How a ResultReader opens its file. libhdf5 itself can hang, crash or allocate gigabytes on a
// corrupt file (docs/reliability.md, "libhdf5 on corrupt files"), below any check our code can make,
// so by default the file is first read whole in a child process with a time limit and an address-
// space limit derived from the file's declared contents; only a file the child read to the end is
// opened here. kInProcess skips that (the fuzz target, which needs the coverage of the read, and the
// child itself).
enum class Hdf5Open { kIsolatedCheck, kInProcess };

// Reads `path` whole in a child process (see Hdf5Open) and throws StorageError naming the file, with
// the child's own message or what stopped it (signal, time limit, memory limit). Seconds allowed:
// HEADSCOPE_HDF5_CHECK_TIMEOUT when set (a positive number), else 30 + 1 per 10 MB of the file.
void check_hdf5_file_isolated(const std::string& path);

class ResultReader {
public:
    // Throws StorageError naming the file.
    explicit ResultReader(const std::string& path, Hdf5Open how = Hdf5Open::kIsolatedCheck);
    ~ResultReader();
    // Visits every group (at most 100,000 objects, 32 levels: a file may link a group into itself),
    // reads every attribute and every dataset, and checks that each dataset's element count equals
    // its shape. `before_data` (optional) is called once the structure is known, with the number of
    // bytes the datasets declare, before any data is read.
    void read_everything(const std::function<void(uint64_t declared_bytes)>& before_data = {}) const;
    bool exists(const std::string& obj) const;
    bool is_group(const std::string& obj) const;
    std::vector<std::string> children(const std::string& group) const;  // sorted names
    Dataset read(const std::string& dataset) const;
    // A numeric dataset (StorageError naming the file when it holds strings): values.size() is
    // the product of shape, so callers may index by shape.
    Dataset read_numbers(const std::string& dataset) const;
    Attrs attrs(const std::string& obj) const;
    const std::string& path() const { return path_; }

private:
    std::string path_;
    std::unique_ptr<H5Handle> file_;
};

std::string attr_to_string(const AttrValue& v);

}  // namespace hs
