// Hugging Face cache names, resolved offline (hub.h).
#include "hub.h"

#include "errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <pwd.h>
#include <system_error>
#include <unistd.h>
#include <vector>

namespace hs {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

std::string home_dir() {
    std::string h = env("HOME");
    if (!h.empty()) return h;
    if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) return pw->pw_dir;
    return "/";
}

// os.path.expanduser for "~" and "~/...": what huggingface_hub applies to the variables.
std::string expand_user(const std::string& p) {
    if (p == "~") return home_dir();
    if (p.rfind("~/", 0) == 0) return home_dir() + p.substr(1);
    return p;
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// One part of a repo id as huggingface_hub's validate_repo_id accepts it.
bool valid_repo_part(const std::string& s) {
    if (s.empty()) return false;
    for (unsigned char c : s)
        if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.')) return false;
    auto edge = [](char c) { return c == '-' || c == '.'; };
    if (edge(s.front()) || edge(s.back())) return false;
    return s.find("--") == std::string::npos && s.find("..") == std::string::npos;
}

// A branch, tag or commit as git allows it in a ref name (and safe as a path under refs/).
bool valid_revision(const std::string& r) {
    if (r.empty() || r.size() > 255) return false;
    for (unsigned char c : r)
        if (c < 0x21 || c == 0x7f || c == '~' || c == '^' || c == ':' || c == '?' || c == '*' || c == '[' || c == '\\')
            return false;
    if (r.front() == '/' || r.back() == '/' || r.back() == '.') return false;
    return r.find("..") == std::string::npos && r.find("//") == std::string::npos && r.find("@{") == std::string::npos;
}

bool is_commit_hash(const std::string& s) {
    return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

struct HubName {
    std::string repo, revision;
    bool revision_given = false;
};

bool parse(const std::string& spec, HubName& out) {
    const auto at = spec.find('@');
    out.repo = spec.substr(0, at);
    out.revision_given = at != std::string::npos;
    out.revision = out.revision_given ? spec.substr(at + 1) : "main";
    if (out.repo.size() > 96 || !valid_revision(out.revision)) return false;
    const auto slash = out.repo.find('/');
    if (slash == std::string::npos || out.repo.find('/', slash + 1) != std::string::npos) return false;
    const std::string org = out.repo.substr(0, slash), name = out.repo.substr(slash + 1);
    if (!valid_repo_part(org) || !valid_repo_part(name)) return false;
    std::string lower = name;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const char* ext : {".bin", ".safetensors", ".gguf", ".json", ".txt", ".model", ".pt", ".pth"})
        if (ends_with(lower, ext)) return false;
    return true;
}

// What would fetch the revision: huggingface_hub's `hf` command (`huggingface-cli` before 0.34).
std::string fetch_hint(const HubName& n) {
    const std::string r = n.revision == "main" ? "" : " --revision " + n.revision;
    return fmt::format("`hf download {}{}` (or `huggingface-cli download {}{}`)", n.repo, r, n.repo, r);
}

// The files a loader may read from a snapshot folder: a broken link among these is an error; other
// files (README.md, .gitattributes, pytorch_model.bin, ...) are not read and not checked.
bool loader_reads(const std::string& name) {
    static const char* const kNames[] = {"config.json",      "generation_config.json", "tokenizer.json",
                                         "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                                         "merges.txt",       "tokenizer.bin"};
    for (const char* n : kNames)
        if (name == n) return true;
    return ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json") || ends_with(name, ".gguf");
}

// The revisions refs/ names (relative paths of its files, sorted), for an error message.
std::vector<std::string> cached_refs(const fs::path& refs) {
    std::vector<std::string> out;
    std::error_code ec;
    if (!fs::is_directory(refs, ec)) return out;
    for (fs::recursive_directory_iterator it(refs, ec), end; !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) out.push_back(fs::relative(it->path(), refs, ec).generic_string());
    std::sort(out.begin(), out.end());
    return out;
}

std::string read_small_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) throw ModelLoadError(fmt::format("{}: cannot read the ref file", p.string()));
    std::string s;
    char buf[256];
    while (f.read(buf, sizeof buf) || f.gcount() > 0) {
        s.append(buf, static_cast<size_t>(f.gcount()));
        if (s.size() > 4096) break;  // a ref is 40 characters; more is not a ref, and need not be read
    }
    return s;
}

std::string trim_ws(const std::string& s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

std::string hub_cache_root(std::string* from) {
    auto pick = [&](const std::string& root, const char* what) {
        if (from) *from = what;
        return root;
    };
    if (auto v = env("HF_HUB_CACHE"); !v.empty()) return pick(expand_user(v), "HF_HUB_CACHE");
    if (auto v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return pick(expand_user(v), "HUGGINGFACE_HUB_CACHE");
    if (auto v = env("HF_HOME"); !v.empty()) return pick((fs::path(expand_user(v)) / "hub").string(), "HF_HOME");
    if (auto v = env("XDG_CACHE_HOME"); !v.empty())
        return pick((fs::path(expand_user(v)) / "huggingface" / "hub").string(), "XDG_CACHE_HOME");
    return pick((fs::path(home_dir()) / ".cache" / "huggingface" / "hub").string(), "the default");
}

bool looks_like_hub_name(const std::string& spec) {
    HubName n;
    return parse(spec, n);
}

HubSnapshot resolve_hub_name(const std::string& spec) {
    HubName n;
    if (!parse(spec, n)) throw UsageError(fmt::format("{}: not a Hugging Face name (org/name or org/name@revision)", spec));
    std::string from;
    const fs::path root = hub_cache_root(&from);
    const std::string root_text = root.string() + (from == "the default" ? "" : " (from $" + from + ")");
    const std::string folder_name = "models--" + n.repo.substr(0, n.repo.find('/')) + "--" + n.repo.substr(n.repo.find('/') + 1);
    const fs::path repo_dir = root / folder_name;
    std::error_code ec;
    if (!fs::is_directory(repo_dir, ec))
        throw ModelLoadError(fmt::format("{}: no such file or folder, and not in the Hugging Face cache: {} has no {}; "
                                         "fetch it with {}",
                                         spec, root_text, folder_name, fetch_hint(n)));

    HubSnapshot s;
    s.repo = n.repo;
    s.revision = n.revision;
    const fs::path ref = repo_dir / "refs" / n.revision;
    if (fs::is_regular_file(ref, ec)) {
        const std::string raw = read_small_file(ref);
        const std::string c = trim_ws(raw);
        if (c.empty())
            throw ModelLoadError(fmt::format("{}: empty ref file: expected the commit hash of revision {}; fetch it "
                                             "again with {}", ref.string(), n.revision, fetch_hint(n)));
        if (!is_commit_hash(c))
            throw ModelLoadError(fmt::format("{}: holds '{}', not a 40-character commit hash; fetch it again with {}",
                                             ref.string(), c.size() > 60 ? c.substr(0, 60) + "..." : c, fetch_hint(n)));
        s.commit = c;
    } else if (is_commit_hash(n.revision) && fs::is_directory(repo_dir / "snapshots" / n.revision, ec)) {
        s.commit = n.revision;
    } else {
        const auto refs = cached_refs(repo_dir / "refs");
        std::string have = refs.empty() ? "none" : "";
        for (size_t i = 0; i < refs.size() && i < 8; ++i) have += (i ? ", " : "") + refs[i];
        if (refs.size() > 8) have += fmt::format(", ... ({} in all)", refs.size());
        throw ModelLoadError(fmt::format("{}: revision {} is not in the Hugging Face cache: {} has no refs/{}{} (cached "
                                         "revisions: {}); fetch it with {}",
                                         spec, n.revision, repo_dir.string(), n.revision,
                                         is_commit_hash(n.revision) ? " and no snapshots/" + n.revision : "", have,
                                         fetch_hint(n)));
    }

    const fs::path snap = repo_dir / "snapshots" / s.commit;
    if (!fs::is_directory(snap, ec))
        throw ModelLoadError(fmt::format("{}: no such snapshot folder (refs/{} names commit {}; the snapshot was removed "
                                         "or never finished); fetch it again with {}",
                                         snap.string(), n.revision, s.commit, fetch_hint(n)));
    s.folder = snap.string();

    std::vector<fs::path> entries;
    for (fs::directory_iterator it(snap, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
    std::sort(entries.begin(), entries.end());
    for (const auto& p : entries) {
        std::error_code e1, e2;
        if (!fs::is_symlink(fs::symlink_status(p, e1)) || fs::exists(p, e2) || !loader_reads(p.filename().string()))
            continue;
        const auto target = fs::read_symlink(p, e1);
        throw ModelLoadError(fmt::format("{}: a link to a missing blob ({}): an interrupted download or a pruned cache; "
                                         "fetch it again with {}",
                                         p.string(), e1 ? std::string("unreadable link") : target.string(), fetch_hint(n)));
    }
    return s;
}

}  // namespace hs
