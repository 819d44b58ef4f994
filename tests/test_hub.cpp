// Hugging Face cache names (src/formats/hub.h): a cache folder built the way huggingface_hub lays it out
// (blobs/<sha256> copies, snapshots/<commit>/<file> relative links into ../../blobs, refs/<revision>
// holding a commit), resolved offline by name, name@branch, name@tag and name@commit; the cache
// root's precedence; a real path winning over a name; a model loaded by name equal to the same
// model loaded by path; and every error one line naming the file or the cache root.
#include <doctest/doctest.h>

#include "errors.h"
#include "hub.h"
#include "model.h"
#include "testdata.h"
#include "tmpdir.h"
#include "util.h"

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <unistd.h>

using namespace hs;
namespace fs = std::filesystem;

namespace {

// Every variable hub_cache_root reads, saved, cleared for the test and restored at scope exit.
struct EnvGuard {
    std::map<std::string, std::optional<std::string>> saved;
    EnvGuard() {
        for (const char* n : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"}) {
            const char* v = std::getenv(n);
            saved[n] = v ? std::optional<std::string>(v) : std::nullopt;
            if (std::string(n) != "HOME") ::unsetenv(n);
        }
    }
    ~EnvGuard() {
        for (const auto& [n, v] : saved) {
            if (v) ::setenv(n.c_str(), v->c_str(), 1);
            else ::unsetenv(n.c_str());
        }
    }
};

// The current directory changed for the test and restored at scope exit.
struct CwdGuard {
    fs::path old = fs::current_path();
    explicit CwdGuard(const std::string& dir) { fs::current_path(dir); }
    ~CwdGuard() {
        std::error_code ec;
        fs::current_path(old, ec);
    }
};

std::string fake_commit(const std::string& seed) {
    const std::string h = sha256_bytes(seed.data(), seed.size());
    return h.substr(0, 40);
}

void write_text(const fs::path& p, const std::string& s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << s;
}

// One file into the repo's blobs (named by its sha256, as huggingface_hub names LFS blobs) and a
// relative link to it from snapshots/<commit>/<name>.
void add_file(const fs::path& repo, const std::string& commit, const std::string& name, const std::string& content) {
    const std::string hash = sha256_bytes(content.data(), content.size());
    const fs::path blob = repo / "blobs" / hash;
    if (!fs::exists(blob)) write_text(blob, content);
    fs::create_directories(repo / "snapshots" / commit);
    fs::create_symlink(fs::path("../../blobs") / hash, repo / "snapshots" / commit / name);
}

void add_ref(const fs::path& repo, const std::string& ref, const std::string& content) {
    write_text(repo / "refs" / ref, content);
}

struct Cache {
    fs::path root, repo;
    std::string main_commit, v1_commit, bare_commit;
};

// <root>/models--tiny--stories with:
//   refs/main -> A: tinystories-656k's files
//   refs/v1   -> B: the same weights, config.json with max_position_embeddings 256, no tokenizer.json
//   C (no ref, reachable only as a commit hash): the same files as A
Cache build_cache(const std::string& root, const std::string& td) {
    Cache c;
    c.root = root;
    c.repo = c.root / "models--tiny--stories";
    c.main_commit = fake_commit("A");
    c.v1_commit = fake_commit("B");
    c.bare_commit = fake_commit("C");
    const std::string src = td + "/tinystories-656k";
    const std::vector<std::string> files = {"config.json", "generation_config.json", "model.safetensors",
                                            "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"};
    for (const auto& f : files) {
        const std::string content = read_text_file(src + "/" + f);
        add_file(c.repo, c.main_commit, f, content);
        add_file(c.repo, c.bare_commit, f, content);
        if (f == "tokenizer.json") continue;
        std::string v1 = content;
        if (f == "config.json") {
            const auto at = v1.find("\"max_position_embeddings\": 512");
            REQUIRE(at != std::string::npos);
            v1.replace(at, 30, "\"max_position_embeddings\": 256");
        }
        add_file(c.repo, c.v1_commit, f, v1);
    }
    // A link to a missing blob among files no loader reads is no error.
    fs::create_symlink("../../blobs/" + std::string(64, 'e'), c.repo / "snapshots" / c.main_commit / "README.md");
    add_ref(c.repo, "main", c.main_commit);  // huggingface_hub writes the hash with no newline
    add_ref(c.repo, "v1", c.v1_commit + "\n");
    return c;
}

template <typename E>
std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const E& e) {
        return e.what();
    } catch (const std::exception& e) {
        return std::string("<other error> ") + e.what();
    }
    return "<no error>";
}

// The error is of class E, one line, and holds every piece of `want`.
template <typename E>
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& want) {
    const std::string got = error_of<E>(fn);
    INFO("error: " << got);
    CHECK(got.find('\n') == std::string::npos);
    CHECK(got.rfind("<", 0) != 0);
    for (const auto& w : want) {
        INFO("wanted: " << w);
        CHECK(got.find(w) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("hub names: what looks like org/name[@revision]") {
    for (const char* s : {"tiny/stories", "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B@main", "org/name@v1.0",
                          "org/name@refs/pr/1", "org/name@0123456789abcdef0123456789abcdef01234567", "a_b/c_d",
                          "TheBloke/Llama-2-7B-GGUF"}) {
        INFO(s);
        CHECK(looks_like_hub_name(s));
    }
    for (const char* s : {"", "gpt2", "/abs/path", "./x/y", "../x", "~/x", "a/b/c", "models/x.bin", "org/m.safetensors",
                          "org/m.gguf", "org/-bad", "org/bad-", "org/.x", "org/na--me", "org/na..me", "org/name@",
                          "org/name@a..b", "org/name@/x", "org/name@x y", "org/", "/name", "org/name@a:b"}) {
        INFO(s);
        CHECK_FALSE(looks_like_hub_name(s));
    }
    CHECK_FALSE(looks_like_hub_name("org/" + std::string(100, 'x')));
}

TEST_CASE("hub cache root: HF_HUB_CACHE, then HUGGINGFACE_HUB_CACHE, then HF_HOME/hub, then ~/.cache/huggingface/hub") {
    EnvGuard env;
    std::string from;
    ::setenv("HOME", "/home/someone", 1);
    CHECK(hub_cache_root(&from) == "/home/someone/.cache/huggingface/hub");
    CHECK(from == "the default");
    ::setenv("XDG_CACHE_HOME", "/xdg", 1);
    CHECK(hub_cache_root(&from) == "/xdg/huggingface/hub");
    ::setenv("HF_HOME", "/hf-home", 1);
    CHECK(hub_cache_root(&from) == "/hf-home/hub");
    CHECK(from == "HF_HOME");
    ::setenv("HUGGINGFACE_HUB_CACHE", "/old-var", 1);
    CHECK(hub_cache_root(&from) == "/old-var");
    ::setenv("HF_HUB_CACHE", "~/my-cache", 1);
    CHECK(hub_cache_root(&from) == "/home/someone/my-cache");
    CHECK(from == "HF_HUB_CACHE");
    ::setenv("HF_HUB_CACHE", "", 1);  // empty: as if unset
    CHECK(hub_cache_root() == "/old-var");
}

TEST_CASE("hub names resolve through the cache: name, @branch, @tag, @commit") {
    HS_REQUIRE_TESTDATA(td);
    EnvGuard env;
    TempDir tmp;
    const Cache c = build_cache(tmp.file("hub"), td);
    ::setenv("HF_HUB_CACHE", c.root.c_str(), 1);

    auto s = resolve_hub_name("tiny/stories");
    CHECK(s.repo == "tiny/stories");
    CHECK(s.revision == "main");
    CHECK(s.commit == c.main_commit);
    CHECK(s.folder == (c.repo / "snapshots" / c.main_commit).string());
    CHECK(resolve_hub_name("tiny/stories@main").commit == c.main_commit);
    s = resolve_hub_name("tiny/stories@v1");  // refs/v1 ends with a newline: read as the hash
    CHECK(s.revision == "v1");
    CHECK(s.commit == c.v1_commit);
    s = resolve_hub_name("tiny/stories@" + c.bare_commit);  // no ref names it: the snapshot folder does
    CHECK(s.revision == c.bare_commit);
    CHECK(s.commit == c.bare_commit);
    CHECK(s.folder == (c.repo / "snapshots" / c.bare_commit).string());
    CHECK(resolve_hub_name("tiny/stories@" + c.main_commit).commit == c.main_commit);

    // The same through HF_HOME (<HF_HOME>/hub) and through HOME (~/.cache/huggingface/hub).
    ::unsetenv("HF_HUB_CACHE");
    ::setenv("HF_HOME", tmp.path.c_str(), 1);
    CHECK(resolve_hub_name("tiny/stories").commit == c.main_commit);
    ::unsetenv("HF_HOME");
    fs::create_directories(tmp.file("home/.cache/huggingface"));
    fs::create_directory_symlink(c.root, tmp.file("home/.cache/huggingface/hub"));
    ::setenv("HOME", tmp.file("home").c_str(), 1);
    CHECK(resolve_hub_name("tiny/stories@v1").commit == c.v1_commit);
    // HF_HUB_CACHE wins over HF_HOME: an empty cache there and the name is not found.
    fs::create_directories(tmp.file("empty"));
    ::setenv("HF_HOME", tmp.path.c_str(), 1);
    ::setenv("HF_HUB_CACHE", tmp.file("empty").c_str(), 1);
    expect_error<ModelLoadError>([&] { resolve_hub_name("tiny/stories"); }, {tmp.file("empty") + " (from $HF_HUB_CACHE)"});
}

TEST_CASE("a model loaded by hub name equals the model loaded from the folder, and records where it came from") {
    HS_REQUIRE_TESTDATA(td);
    EnvGuard env;
    TempDir tmp;
    const Cache c = build_cache(tmp.file("hub"), td);
    ::setenv("HF_HUB_CACHE", c.root.c_str(), 1);

    auto by_path = load_model(td + "/tinystories-656k");
    auto by_name = load_model("tiny/stories");
    const std::string snap = (c.repo / "snapshots" / c.main_commit).string();
    CHECK(by_name->path == snap);
    CHECK(by_name->source.hub_repo == "tiny/stories");
    CHECK(by_name->source.hub_revision == "main");
    CHECK(by_name->source.hub_commit == c.main_commit);
    CHECK(by_name->source.snapshot == snap);
    CHECK(by_name->source.format == by_path->source.format);
    CHECK(by_path->source.hub_repo.empty());
    CHECK(by_path->source.hub_commit.empty());
    CHECK(by_name->weights_sha256() == by_path->weights_sha256());
    torch::NoGradGuard ng;
    auto tokens = torch::randint(3, 2048, {2, 9}, torch::kLong);
    CHECK(torch::equal(by_name->forward(tokens), by_path->forward(tokens)));

    auto v1 = load_model("tiny/stories@v1");
    CHECK(v1->config.max_seq_len == 256);
    CHECK(by_name->config.max_seq_len == 512);
    CHECK(v1->source.hub_revision == "v1");
    CHECK(v1->source.hub_commit == c.v1_commit);
    CHECK(torch::equal(v1->forward(tokens), by_path->forward(tokens)));
    CHECK(load_model("tiny/stories@" + c.bare_commit)->source.hub_commit == c.bare_commit);

    // A path that exists wins over the name: ./tiny/stories (the v1 snapshot, 256 positions).
    fs::create_directories(tmp.file("cwd/tiny"));
    fs::create_directory_symlink(c.repo / "snapshots" / c.v1_commit, tmp.file("cwd/tiny/stories"));
    {
        CwdGuard cwd(tmp.file("cwd"));
        auto local = load_model("tiny/stories");
        CHECK(local->path == "tiny/stories");
        CHECK(local->config.max_seq_len == 256);
        CHECK(local->source.hub_repo.empty());
    }
    CHECK(load_model("tiny/stories")->config.max_seq_len == 512);
}

TEST_CASE("hub name errors: one line naming the cache root or the file, ModelLoadError") {
    HS_REQUIRE_TESTDATA(td);
    EnvGuard env;
    TempDir tmp;
    const Cache c = build_cache(tmp.file("hub"), td);
    ::setenv("HF_HUB_CACHE", c.root.c_str(), 1);
    const std::string root = c.root.string(), repo = c.repo.string();

    // Not in the cache: the root searched and the command that would fetch it.
    expect_error<ModelLoadError>([&] { load_model("other/model"); },
                                 {"other/model: no such file or folder, and not in the Hugging Face cache: " + root +
                                      " (from $HF_HUB_CACHE) has no models--other--model",
                                  "`hf download other/model`", "`huggingface-cli download other/model`"});
    // A revision not cached: the refs present and the command with --revision.
    expect_error<ModelLoadError>([&] { load_model("tiny/stories@v9"); },
                                 {"tiny/stories@v9: revision v9 is not in the Hugging Face cache: " + repo + " has no refs/v9",
                                  "cached revisions: main, v1", "`hf download tiny/stories --revision v9`"});
    const std::string unknown = fake_commit("Z");
    expect_error<ModelLoadError>([&] { load_model("tiny/stories@" + unknown); },
                                 {"has no refs/" + unknown + " and no snapshots/" + unknown});
    // An empty ref file, a ref file that holds no hash.
    add_ref(c.repo, "empty", "");
    expect_error<ModelLoadError>([&] { load_model("tiny/stories@empty"); },
                                 {repo + "/refs/empty: empty ref file: expected the commit hash of revision empty"});
    add_ref(c.repo, "junk", "not a hash\nsecond line");
    expect_error<ModelLoadError>([&] { load_model("tiny/stories@junk"); },
                                 {repo + "/refs/junk: holds 'not a hash\\nsecond line', not a 40-character commit hash"});
    // A ref naming a commit whose snapshot folder is gone.
    const std::string gone = fake_commit("gone");
    add_ref(c.repo, "gone", gone);
    expect_error<ModelLoadError>([&] { load_model("tiny/stories@gone"); },
                                 {repo + "/snapshots/" + gone + ": no such snapshot folder (refs/gone names commit " + gone});
    // A link to a missing blob for a file the loader reads (the blob deleted from a copy of A).
    const std::string broken = fake_commit("broken");
    fs::create_directories(c.repo / "snapshots" / broken);
    for (const auto& e : fs::directory_iterator(c.repo / "snapshots" / c.main_commit))
        fs::copy_symlink(e.path(), c.repo / "snapshots" / broken / e.path().filename());
    fs::remove(c.repo / "snapshots" / broken / "config.json");
    fs::create_symlink("../../blobs/" + std::string(64, 'f'), c.repo / "snapshots" / broken / "config.json");
    add_ref(c.repo, "broken", broken);
    expect_error<ModelLoadError>([&] { load_model("tiny/stories@broken"); },
                                 {repo + "/snapshots/" + broken + "/config.json: a link to a missing blob (../../blobs/" +
                                      std::string(64, 'f') + ")",
                                  "`hf download tiny/stories --revision broken`"});
    // A missing path that is no hub name keeps its error; resolve_hub_name refuses a non-name.
    expect_error<ModelLoadError>([&] { load_model(tmp.file("nope")); }, {tmp.file("nope") + ": no such file or folder"});
    expect_error<ModelLoadError>([&] { load_model("models/x.bin"); }, {"models/x.bin: no such file or folder"});
    expect_error<UsageError>([&] { resolve_hub_name("not-a-name"); }, {"not-a-name: not a Hugging Face name"});
    // Error codes: the documented exit code 4 for every hub error.
    try {
        load_model("other/model");
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(e.code() == ExitCode::kModelLoad);
    }
}
