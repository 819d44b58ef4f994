// HDF5 result files as export, top and --from read them back (src/store.cpp ResultReader): open,
// walk every group, read every dataset and every attribute. Bad input: StorageError (exit 6).
#include "fuzz_target.h"

#include "store.h"

#include <functional>

HS_FUZZ_TARGET(hdf5) {
    const std::string path = hs_fuzz::write_temp("result.h5", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("hdf5", {hs::ExitCode::kStorage}, [&] {
        hs::ResultReader r(path);
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
