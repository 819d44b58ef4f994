// The temporary files of atomic writes ("<path>.tmp-<pid>", renamed onto <path> when complete:
// util.h AtomicFile, store.h ResultWriter) and the ones killed writers leave behind.
#pragma once

#include <string>

namespace hs {

// Removes "<path>.tmp-<pid>" files that a killed writer left behind (its process no longer runs).
// They are never read as results (readers open only <path>), but they would pile up.
void remove_stale_temps(const std::string& path);

}  // namespace hs
