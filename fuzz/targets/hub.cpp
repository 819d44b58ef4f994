// Hugging Face cache names (src/formats/hub.cpp): `looks_like_hub_name` and `resolve_hub_name` on a
// model name as the command line gives it, resolved through a cache tree built from the input in the
// per-process scratch folder ($HF_HUB_CACHE points there): cache folder names (models--org--name),
// refs/<revision> files and their contents, snapshot folders and their links to blobs, present or
// missing. Bad input: UsageError (exit 2) for a string that is no hub name, ModelLoadError (exit 4)
// for a name the cache does not hold or holds damaged.
//
// Input: the name, then entries cut at the part separator (fuzz_target.h), each "KIND PATH" on its
// first line (PATH relative to the cache root) and its content after it:
//   f PATH\nCONTENT   a regular file (a ref file: the commit hash; a blob)
//   d PATH            a folder
//   l PATH\nNAME      a link to ../../blobs/NAME, as huggingface_hub links snapshot files
//   s PATH\nNAME      a link to NAME beside it (one path component, "." allowed)
// PATH components are never "..", and NAME holds no '/' and is not "..", so every entry is written
// inside the cache root (checked again on the real path before each write).
#include "fuzz_target.h"

#include "errors.h"
#include "hub.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxEntries = 32;

// PATH's components, "" and "." dropped; false when it is empty, absolute, too long or climbs with "..".
bool safe_relative(const std::string& path, fs::path& out) {
    if (path.empty() || path.size() > 1024 || path.front() == '/' || path.find('\0') != std::string::npos) return false;
    out.clear();
    size_t n = 0, start = 0;
    while (start <= path.size()) {
        size_t end = path.find('/', start);
        if (end == std::string::npos) end = path.size();
        const std::string c = path.substr(start, end - start);
        start = end + 1;
        if (c.empty() || c == ".") continue;
        if (c == ".." || c.size() > 255 || ++n > 12) return false;
        out /= c;
    }
    return n > 0;
}

bool safe_name(const std::string& name) {
    return !name.empty() && name.size() <= 255 && name != ".." && name.find('/') == std::string::npos &&
           name.find('\0') == std::string::npos;
}

// Whether the folder that would hold `p` (its real path, links followed) lies inside root.
bool parent_inside(const fs::path& root_canon, const fs::path& p) {
    std::error_code ec;
    const fs::path parent = fs::weakly_canonical(p.parent_path(), ec);
    if (ec) return false;
    const std::string r = root_canon.string(), s = parent.string();
    return s == r || (s.size() > r.size() && s.compare(0, r.size(), r) == 0 && s[r.size()] == '/');
}

void build_entry(const fs::path& root, const fs::path& root_canon, const std::string& part) {
    const size_t nl = part.find('\n');
    const std::string head = part.substr(0, nl);
    const std::string body = nl == std::string::npos ? "" : part.substr(nl + 1);
    if (head.size() < 3 || head[1] != ' ') return;
    fs::path rel;
    if (!safe_relative(head.substr(2), rel)) return;
    const fs::path p = root / rel;
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    if (ec || !parent_inside(root_canon, p)) return;
    switch (head[0]) {
        case 'f': {
            if (fs::exists(fs::symlink_status(p, ec))) return;  // never written through a link
            std::ofstream(p, std::ios::binary) << body.substr(0, 8192);
            break;
        }
        case 'd': fs::create_directory(p, ec); break;
        case 'l': {
            const std::string name = body.substr(0, body.find('\n'));
            if (safe_name(name)) fs::create_symlink(fs::path("../../blobs") / name, p, ec);
            break;
        }
        case 's': {
            const std::string name = body.substr(0, body.find('\n'));
            if (safe_name(name)) fs::create_symlink(name, p, ec);
            break;
        }
        default: break;
    }
}

}  // namespace

HS_FUZZ_TARGET(hub) {
    static const fs::path root = fs::path(hs_fuzz::temp_dir()) / "hub";
    std::error_code ec;
    fs::remove_all(root, ec);
    fs::create_directories(root, ec);
    const fs::path root_canon = fs::canonical(root, ec);
    ::setenv("HF_HUB_CACHE", root.c_str(), 1);

    const auto parts = hs_fuzz::split_parts(data, size, kMaxEntries + 1);
    const std::string& spec = parts[0];
    for (size_t i = 1; i < parts.size(); ++i)
        if (!parts[i].empty()) build_entry(root, root_canon, parts[i]);

    const bool is_name = hs::looks_like_hub_name(spec);
    hs_fuzz::run_guarded("hub", {hs::ExitCode::kUsage, hs::ExitCode::kModelLoad}, [&] {
        try {
            const hs::HubSnapshot s = hs::resolve_hub_name(spec);
            hs_fuzz::check(is_name, "hub", "a string looks_like_hub_name refuses was resolved");
            const size_t at = spec.find('@');
            hs_fuzz::check(s.repo == spec.substr(0, at), "hub", "repo is not the name before '@'");
            hs_fuzz::check(s.revision == (at == std::string::npos ? "main" : spec.substr(at + 1)), "hub",
                           "revision is not the one asked for");
            hs_fuzz::check(s.commit.size() == 40 && std::all_of(s.commit.begin(), s.commit.end(),
                                                                 [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }),
                           "hub", "the commit is not a 40-character lowercase hash");
            const std::string org = s.repo.substr(0, s.repo.find('/')), name = s.repo.substr(s.repo.find('/') + 1);
            const fs::path want = root / ("models--" + org + "--" + name) / "snapshots" / s.commit;
            hs_fuzz::check(s.folder == want.string(), "hub", "the snapshot folder is not <root>/models--org--name/snapshots/<commit>");
            std::error_code e;
            hs_fuzz::check(fs::is_directory(s.folder, e), "hub", "the snapshot folder returned does not exist");
            // The ref file, when there is one, is what named the commit.
            const fs::path ref = root / ("models--" + org + "--" + name) / "refs" / s.revision;
            if (fs::is_regular_file(ref, e)) {
                std::ifstream in(ref, std::ios::binary);
                std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
                hs_fuzz::check(text.find(s.commit) != std::string::npos, "hub", "the commit is not the ref file's hash");
            }
        } catch (const hs::UsageError&) {
            hs_fuzz::check(!is_name, "hub", "a string looks_like_hub_name accepts was refused as no hub name");
            throw;
        }
    });
}
