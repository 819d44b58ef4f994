// The error a YAML experiment text gets from the parser ("(no error)" when it parses), for the
// suites that check schema messages (test_ablation, test_stream).
#pragma once

#include "attention_detectors.h"
#include "errors.h"
#include "experiment.h"

#include <string>

inline std::string cfg_error(const std::string& yaml) {
    try {
        hs::parse_experiment_text(yaml, "exp.yaml", hs::detector_probe_names());
    } catch (const hs::ConfigError& e) {
        return e.what();
    }
    return "(no error)";
}
