// A fresh temporary folder removed (with its files) at scope exit.
#pragma once

#include <cstdlib>
#include <string>
#include <unistd.h>

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/headscope-test-XXXXXX";
        path = ::mkdtemp(tmpl);
    }
    ~TempDir() {
        std::string cmd = "rm -rf '" + path + "'";
        int rc = std::system(cmd.c_str());
        (void)rc;
    }
    std::string file(const std::string& name) const { return path + "/" + name; }
};
