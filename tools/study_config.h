// `--config STUDY.yaml`: a subcommand's options from a YAML file (docs/experiments.md, "Needle studies from a file").
//
// The file is a mapping whose keys are the subcommand's long option names without the dashes
// (`max-new-tokens`, or `max_new_tokens`), and the positional's name (`model`); a value is what the
// command line would take: a scalar, or a list for an option of several values (`lengths: [512,
// 1024]` or `lengths: 512,1024`); a flag takes true or false. CLI11 reads the file into the
// subcommand's own options after the command line, so every check, default and `needs`/`excludes`
// rule is the command line's, and an option given on the command line wins over the file's: a study
// file plus `--seed 7` reruns the study with another seed. Paths in it are read as the command
// line's are (from the working directory).
//
// Bad files get one line naming the file (and the line where the YAML says it): an unknown key, with
// the nearest option name; a nested mapping; an empty value; a YAML syntax error (exit 3, ConfigError).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace hs::cli {

// Gives `sub` (a subcommand of `root`) a --config option reading a study file as above.
void add_study_config(CLI::App& root, CLI::App* sub);

// The text of the study file read for this run ("" when none): tools store it in /meta so that a
// result holds the file it came from.
const std::string& study_config_text();

}  // namespace hs::cli
