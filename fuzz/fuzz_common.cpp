#include "fuzz_target.h"

#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <typeinfo>

namespace hs_fuzz {

namespace fs = std::filesystem;

const char* const kSeparator = "\n====headscope-fuzz-part====\n";

Registration::Registration(const char* name, TargetFn fn) { targets().emplace_back(name, fn); }

std::vector<std::pair<std::string, TargetFn>>& targets() {
    static std::vector<std::pair<std::string, TargetFn>> t;
    return t;
}

namespace {

std::string demangled(const char* name) {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string out = (status == 0 && d) ? d : name;
    std::free(d);
    return out;
}

[[noreturn]] void fail(const char* target, const std::string& what) {
    std::fprintf(stderr, "\nheadscope fuzz target '%s': %s\n", target, what.c_str());
    std::fflush(stderr);
    std::abort();
}

const char* code_name(hs::ExitCode c) {
    switch (c) {
        case hs::ExitCode::kOk: return "0 (ok)";
        case hs::ExitCode::kFailure: return "1 (internal error)";
        case hs::ExitCode::kUsage: return "2 (usage)";
        case hs::ExitCode::kConfig: return "3 (config)";
        case hs::ExitCode::kModelLoad: return "4 (model load)";
        case hs::ExitCode::kData: return "5 (data)";
        case hs::ExitCode::kStorage: return "6 (storage)";
        case hs::ExitCode::kOutOfMemory: return "7 (out of memory)";
    }
    return "?";
}

}  // namespace

void check(bool cond, const char* target, const std::string& what) {
    if (!cond) fail(target, "invariant violated: " + what);
}

void run_guarded(const char* target, std::initializer_list<hs::ExitCode> allowed, const std::function<void()>& body) {
    try {
        body();
    } catch (const hs::Error& e) {
        bool ok = false;
        for (auto c : allowed) ok = ok || c == e.code();
        if (!ok) fail(target, std::string("hs::Error with unexpected exit code ") + code_name(e.code()) + ": " + e.what());
        const std::string msg = e.what();
        if (msg.empty()) fail(target, "hs::Error with an empty message");
        if (msg.find('\n') != std::string::npos || msg.find('\r') != std::string::npos)
            fail(target, "hs::Error message spans several lines: " + msg);
    } catch (const std::bad_alloc&) {
        fail(target, "std::bad_alloc escaped the parser (a size read from the file was not checked)");
    } catch (const std::exception& e) {
        fail(target, "exception of type " + demangled(typeid(e).name()) + " escaped the parser: " + e.what());
    } catch (...) {
        fail(target, "an exception of unknown type escaped the parser");
    }
}

const std::string& temp_dir() {
    // Never freed: the exit handler that removes the folder runs after static destructors.
    static const std::string* dir = [] {
        std::error_code ec;
        fs::path base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
        fs::path d = base / ("headscope-fuzz-" + std::to_string(::getpid()));
        fs::create_directories(d);
        auto* s = new std::string(d.string());
        std::atexit([] {
            std::error_code ec2;
            fs::remove_all(temp_dir(), ec2);
        });
        return s;
    }();
    return *dir;
}

std::string write_temp(const std::string& name, const std::string& bytes) {
    const std::string path = temp_dir() + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) {
        std::perror(path.c_str());
        std::abort();
    }
    if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
}

void remove_temp(const std::string& name) { ::unlink((temp_dir() + "/" + name).c_str()); }

std::vector<std::string> split_parts(const uint8_t* data, size_t size, size_t max_parts) {
    std::string s(reinterpret_cast<const char*>(data), size);
    std::vector<std::string> out;
    const std::string sep = kSeparator;
    size_t pos = 0;
    while (out.size() + 1 < max_parts) {
        size_t at = s.find(sep, pos);
        if (at == std::string::npos) break;
        out.push_back(s.substr(pos, at - pos));
        pos = at + sep.size();
    }
    out.push_back(s.substr(pos));
    out.resize(max_parts);
    return out;
}

std::string source_dir() {
    if (const char* e = std::getenv("HEADSCOPE_SOURCE_DIR")) return e;
    return HS_FUZZ_SOURCE_DIR;
}

}  // namespace hs_fuzz
