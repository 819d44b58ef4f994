// Prompt files: the DLA prompt list (probes/weights/dla.cpp read_dla_prompts: a JSON list of {prompt,
// correct, incorrect}) and the needle file (probes/needle/needle.cpp read_needles: one JSON object a
// line), both on the same input. Bad input: DataError (exit 5).
#include "fuzz_target.h"

#include "dla.h"
#include "needle.h"

HS_FUZZ_TARGET(prompts) {
    const std::string path = hs_fuzz::write_temp("prompts.json", std::string(reinterpret_cast<const char*>(data), size));
    hs_fuzz::run_guarded("prompts", {hs::ExitCode::kData}, [&] {
        auto p = hs::read_dla_prompts(path);
        hs_fuzz::check(!p.empty(), "prompts", "an empty DLA prompt list was accepted");
    });
    hs_fuzz::run_guarded("prompts", {hs::ExitCode::kData}, [&] {
        auto n = hs::read_needles(path);
        hs_fuzz::check(!n.empty(), "prompts", "an empty needle file was accepted");
        for (const auto& x : n) (void)hs::rouge1(x.answer, x.needle).recall;
    });
}
