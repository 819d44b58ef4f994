// MAPS relation files (probes/weights/maps.cpp read_relation): a JSON list of [source, target] pairs or
// {"name", "category", "k", "pairs"}. Bad input: DataError (exit 5).
#include "fuzz_target.h"

#include "maps.h"

HS_FUZZ_TARGET(relations) {
    const std::string path = hs_fuzz::write_temp("relation.json", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("relations", {hs::ExitCode::kData}, [&] {
        hs::Relation r = hs::read_relation(path);
        hs_fuzz::check(!r.pairs.empty(), "relations", "a relation with no pairs was accepted");
        hs_fuzz::check(hs::default_k(r) > 0, "relations", "default k not positive");
    });
}
