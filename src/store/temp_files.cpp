#include "temp_files.h"

#include "util.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace hs {

void remove_stale_temps(const std::string& path) {
    const std::string dir = parent_dir(path), base = path.substr(path.find_last_of('/') + 1);
    const std::string prefix = base + ".tmp-";
    DIR* d = ::opendir(dir.empty() ? "." : dir.c_str());
    if (!d) return;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string pid = name.substr(prefix.size());
        if (pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
        const long p = std::stol(pid);
        if (p <= 0 || p == static_cast<long>(::getpid())) continue;
        if (::kill(static_cast<pid_t>(p), 0) == 0 || errno != ESRCH) continue;  // still running (or not ours)
        std::remove(path_join(dir.empty() ? "." : dir, name).c_str());
    }
    ::closedir(d);
}

}  // namespace hs
