// Small helpers with no torch: files, atomic output, hashing, string formatting.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace hs {

std::string shape_str(const std::vector<int64_t>& shape);  // "[2, 3]"
std::string read_text_file(const std::string& path);       // throws DataError naming the file
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);
std::string path_join(const std::string& a, const std::string& b);
std::string parent_dir(const std::string& path);
std::string sha256_file(const std::string& path);           // hex digest; throws StorageError
std::string sha256_bytes(const void* data, size_t n);
std::string utc_now_iso8601();
std::vector<std::string> split(const std::string& s, char sep);
std::string trim(const std::string& s);
// The whole of `s` as a number (nullopt for "", trailing text, out of range; parse_double also for
// inf and nan): the one exact number reader of flags, lists and environment variables.
std::optional<double> parse_double(const std::string& s);
std::optional<int64_t> parse_int64(const std::string& s);
// "1, 2,3" -> {1, 2, 3}, blank entries skipped; nullopt with *bad = the first entry that is not an
// integer. The one integer-list reader: parse_token_list (data) and the tools' flag lists use it.
std::optional<std::vector<int64_t>> split_ints(const std::string& s, std::string* bad);
// "1,2,3" -> ids. DataError on a bad entry or an empty list, with `where` the list came from in front
// (a file's "FILE:LINE"; empty: none, and the error's param() is "token_list", for the tool's flag).
std::vector<int64_t> parse_token_list(const std::string& s, const std::string& where = {});

// Writes to "<path>.tmp-<pid>" and renames onto path in commit(); the destructor removes the
// temporary file if commit() was never reached, so a failed run leaves nothing behind.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    void write(const char* data, size_t n);
    void write(const std::string& s) { write(s.data(), s.size()); }
    void commit();
    const std::string& temp_path() const { return tmp_; }

private:
    std::string path_, tmp_;
    std::FILE* f_ = nullptr;
    bool committed_ = false;
};

// A unique temporary name next to `path`, for writers (HDF5) that need to open a path themselves.
std::string temp_path_for(const std::string& path);
// rename(tmp, path) with a StorageError naming path on failure.
void rename_into_place(const std::string& tmp, const std::string& path);

}  // namespace hs
