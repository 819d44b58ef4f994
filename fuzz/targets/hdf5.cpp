// HDF5 result files as export, top and --from read them back (src/store/store.cpp ResultReader): open,
// read_everything() (what the isolated check runs in its child process for every user), then walk
// every group, read every dataset and every attribute through the public calls and check each
// dataset's element count against its shape. Bad input: StorageError (exit 6). The reader is opened
// in process (Hdf5Open::kInProcess): the child process of the default open would hide the read's
// coverage from libFuzzer, and faults inside libhdf5 itself are what that child exists for
// (docs/reliability.md; tests/cli_hdf5_isolation.sh replays them through the default open).
#include "fuzz_target.h"

#include "store.h"

#include <functional>

HS_FUZZ_TARGET(hdf5) {
    const std::string path = hs_fuzz::write_temp("result.h5", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("hdf5", {hs::ExitCode::kStorage}, [&] {
        hs::ResultReader r(path, hs::Hdf5Open::kInProcess);
        r.read_everything();
        int budget = 256;  // objects visited at most (a file may link a group into itself)
        std::function<void(const std::string&, int)> walk = [&](const std::string& g, int depth) {
            if (--budget < 0 || depth > 16) return;
            for (const auto& [k, v] : r.attrs(g)) (void)hs::attr_to_string(v);
            for (const auto& c : r.children(g)) {
                const std::string p = g == "/" ? "/" + c : g + "/" + c;
                if (!r.exists(p)) continue;
                if (r.is_group(p)) {
                    walk(p, depth + 1);
                } else {
                    hs::Dataset d = r.read(p);
                    int64_t n = 1;
                    for (auto s : d.shape) n *= s;
                    hs_fuzz::check(static_cast<size_t>(n) == (d.is_string ? d.strings.size() : d.values.size()), "hdf5",
                                   "dataset " + p + ": element count differs from its shape");
                    for (const auto& [k, v] : r.attrs(p)) (void)hs::attr_to_string(v);
                }
            }
        };
        walk("/", 0);
    });
}
