// Every subcommand: `void setup_x(CLI::App&)` registers it; its run function lives in its file.
#pragma once

#include <CLI/CLI.hpp>

namespace hs::cli {

void setup_info(CLI::App& app);
void setup_tokenize(CLI::App& app);
void setup_generate(CLI::App& app);
void setup_logits(CLI::App& app);
void setup_bench(CLI::App& app);
void setup_detect(CLI::App& app);
void setup_export(CLI::App& app);
void setup_top(CLI::App& app);
void setup_train_toy(CLI::App& app);
void setup_maps(CLI::App& app);
void setup_successor(CLI::App& app);
void setup_influence(CLI::App& app);
void setup_copy_suppression(CLI::App& app);
void setup_dla(CLI::App& app);
void setup_qk_spectrum(CLI::App& app);
void setup_rerank(CLI::App& app);
void setup_retrieval(CLI::App& app);
void setup_run(CLI::App& app);
void setup_ablate(CLI::App& app);
void setup_patch(CLI::App& app);
void setup_fv_heads(CLI::App& app);
void setup_merge(CLI::App& app);
void setup_report(CLI::App& app);
void setup_atlas(CLI::App& app);

}  // namespace hs::cli
