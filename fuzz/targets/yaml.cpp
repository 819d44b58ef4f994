// YAML experiment files (src/experiment/experiment.cpp parse_experiment_text): schema and type checks with
// FILE:LINE:COL marks. Bad input: ConfigError (exit 3) or DataError (exit 5).
#include "fuzz_target.h"

#include "attention_detectors.h"
#include "experiment.h"

HS_FUZZ_TARGET(yaml) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    hs_fuzz::run_guarded("yaml", {hs::ExitCode::kConfig, hs::ExitCode::kData}, [&] {
        hs::Experiment e = hs::parse_experiment_text(text, "exp.yaml", hs::detector_probe_names());
        for (const auto& s : e.studies)
            for (const auto& p : {s.mode.data, s.metric.data})
                if (!p.empty()) (void)e.find_data(p);
    });
}
