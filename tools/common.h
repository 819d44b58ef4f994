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

// Range checks for add_option(...)->check(...), with one-line messages ("--batch: 0 is below 1").
// (CLI11's PositiveNumber/NonNegativeNumber print the range up to DBL_MAX in full.)
CLI::Validator at_least(double lo);
CLI::Validator in_range(double lo, double hi);

// The one way a tool attaches a flag to a library error (errors.h: the library names the value and,
// for a parameter, its own name for it, never the flag). with_flag runs fn, which reads what the
// flags carried, and rethrows an error about one of them with that flag in front, keeping its class
// and exit code ("--ablate: 'x' is not a head ..."). An error is about a flag when its param() is the
// flag's `param`; a flag given without one (the call parses that flag's value alone) also takes every
// UsageError without a param():
//   with_flag("--heads", [&] { return parse_head_list(o.heads, L, H); });
//   with_flag({{"--seq-len", "seq_len"}, {"--batch", "batch"}}, [&] { return repeated_random_tokens(...); });
struct Flag {
    std::string flag;   // "--seq-len"
    std::string param;  // "seq_len" (Error::param()); empty: the UsageErrors of a parser of this flag's value
};
template <class F>
auto with_flag(const std::vector<Flag>& flags, F&& fn) -> decltype(fn()) {
    try {
        return fn();
    } catch (const Error& e) {
        for (const auto& f : flags)
            if (f.param.empty() ? e.code() == ExitCode::kUsage && e.param().empty() : e.param() == f.param)
                rethrow_prefixed(e, f.flag);
        throw;
    }
}
template <class F>
auto with_flag(const char* flag, F&& fn) -> decltype(fn()) {
    return with_flag(std::vector<Flag>{{flag, {}}}, std::forward<F>(fn));
}

// The library's error for an output that exists where the write mode may not replace it (a
// StorageError with param "overwrite": ResultWriter, StagedFolder) with the flags that would:
// "PATH: exists (use --force to replace it or --append to add to it)". fn opens the output.
template <class F>
auto with_overwrite_flags(bool append, F&& fn) -> decltype(fn()) {
    try {
        return fn();
    } catch (const StorageError& e) {
        if (e.param() != "overwrite") throw;
        throw StorageError(std::string(e.what()) + (append ? " (use --force to replace it or --append to add to it)"
                                                           : " (use --force to replace it)"),
                           e.param());
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
// MODEL and --tokenizer may be Hugging Face cache names (org/name[@revision], src/formats/hub.h).
Loaded open_model(const ModelArgs& a, bool require_tokenizer);
// A tokenizer argument (or tokenize's tokenizer-or-model path): `spec` itself when it exists or is no
// Hugging Face name, else the name's snapshot folder in the local cache; a name that does not
// resolve is a DataError (the tokenizer's exit code) with the resolver's one line.
std::string tokenizer_location(const std::string& spec);
// Refuses (UsageError) a dtype the device cannot compute in at all.
LoadOptions load_options(const ModelArgs& a);
// One warning line when a CPU dtype's products run much slower than float32 (measured).
void warn_if_slow_dtype(const LoadOptions& o);
WriteMode write_mode(const OutputArgs& o);
// The result file `path` opened in `mode` (with_overwrite_flags: the error for an existing file names
// --force and --append).
ResultWriter open_result(const std::string& path, WriteMode mode);

// /meta attributes every result file carries (docs/hdf5-schema.md).
void write_meta(ResultWriter& w, const Model& m, int64_t seed);
// Refuses to --append results of another model into a file (StorageError naming both).
void check_same_model(ResultWriter& w, const Model& m);

// The command line as typed, for /meta.
void set_command_line(int argc, char** argv);
const std::string& command_line();

}  // namespace hs::cli
