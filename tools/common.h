// Option groups shared by every subcommand (model, device, dtype, threads, output), defined once.
#pragma once

#include "errors.h"
#include "model.h"
#include "store.h"
#include "tokenizer.h"
#include "util.h"  // parse_token_list (moved to the library for the fuzz targets)

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hs::cli {

// Runs fn; a UsageError from the library, which names the value and not the flag it came from, is
// rethrown with the flag in front ("--ablate: 'x' is not a head ..."). Other errors pass as they are.
template <class F>
auto with_flag(const std::string& flag, F&& fn) -> decltype(fn()) {
    try {
        return fn();
    } catch (const UsageError& e) {
        throw UsageError(flag + ": " + e.what(), e.param());
    }
}

// Range checks for add_option(...)->check(...), with one-line messages ("--batch: 0 is below 1").
// (CLI11's PositiveNumber/NonNegativeNumber print the range up to DBL_MAX in full.)
CLI::Validator at_least(double lo);
CLI::Validator in_range(double lo, double hi);

// Runs fn; an error of any class whose param() (the library's name for a parameter, errors.h) is
// in `flags` is rethrown with that flag in front, keeping its class and exit code:
// with_flags({{"seq_len", "--seq-len"}}, ...) turns "|R| = 9: ..." into "--seq-len: |R| = 9: ...".
template <class F>
auto with_flags(const std::vector<std::pair<std::string, std::string>>& flags, F&& fn) -> decltype(fn()) {
    try {
        return fn();
    } catch (const Error& e) {
        for (const auto& [param, flag] : flags)
            if (e.param() == param) rethrow_prefixed(e, flag);
        throw;
    }
}

// A tensor's values on the host as float32, row-major: what the result files store (one copy, in
// bulk, after the computation).
std::vector<float> host_floats(const at::Tensor& t);

struct ModelArgs {
    std::string model;
    std::string tokenizer;
    std::string dtype = "auto";      // auto: bfloat16 on CUDA, float32 on the CPU
    std::string device = "cpu";
    std::string attention = "auto";  // auto | blocked | fused (AttentionKernel)
    int threads = 0;
};

struct OutputArgs {
    std::string out;
    bool force = false;
    bool append = false;
};

// MODEL positional plus --tokenizer, --dtype, --device, --attention, --threads.
void add_model_args(CLI::App* app, ModelArgs& a);
void add_output_args(CLI::App* app, OutputArgs& o, bool required, const std::string& what = "HDF5 result file");

struct Loaded {
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tokenizer;  // may be null when not required
};

// Sets threads, loads the model (and its tokenizer: required -> error when none is found).
Loaded open_model(const ModelArgs& a, bool require_tokenizer);
// Refuses (UsageError) a dtype the device cannot compute in at all.
LoadOptions load_options(const ModelArgs& a);
// One warning line when a CPU dtype's products run much slower than float32 (measured).
void warn_if_slow_dtype(const LoadOptions& o);
WriteMode write_mode(const OutputArgs& o);

// /meta attributes every result file carries (docs/hdf5-schema.md).
void write_meta(ResultWriter& w, const Model& m, int64_t seed);
// Refuses to --append results of another model into a file (StorageError naming both).
void check_same_model(ResultWriter& w, const Model& m);

// The command line as typed, for /meta.
void set_command_line(int argc, char** argv);
const std::string& command_line();

}  // namespace hs::cli
