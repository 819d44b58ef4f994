// headscope front end: parses the command line, runs one subcommand, and turns every error into
// one line on stderr and a documented exit code (README.md, "Exit codes").
#include "commands.h"
#include "common.h"
#include "errors.h"
#include "hs_git_commit.h"
#include "preinit.h"
#include "progress.h"
#include "system.h"

#include <c10/util/Exception.h>

#include <csignal>
#include <cstdio>
#include <new>

int main(int argc, char** argv) {
    using namespace hs;
    tune_allocator();
    // Past a file-size limit (RLIMIT_FSIZE) a write should fail with EFBIG, which the writers turn
    // into one line and exit 6; the default action of SIGXFSZ would kill the process instead.
    std::signal(SIGXFSZ, SIG_IGN);
    CLI::App app{"headscope: find out what each attention head of a language model does.\n"
                 "Example: headscope detect models/toy-induction --probe induction,previous-token --out scores.h5"};
    app.set_help_all_flag("--help-all", "help for every subcommand");
    app.require_subcommand(1);
    int verbose = 0;
    bool quiet = false;
    app.add_flag("-v,--verbose", verbose, "more log lines on stderr (repeatable)");
    app.add_flag("-q,--quiet", quiet, "no log lines or progress on stderr");
    app.add_flag_callback("--version", [] {
        std::printf("headscope %s (%s)\n", HS_VERSION, HS_GIT_COMMIT);
        throw CLI::Success();
    }, "print the version and exit");
    app.parse_complete_callback([&] { set_verbosity(quiet ? 0 : 1 + verbose); });
    cli::setup_info(app);
    cli::setup_tokenize(app);
    cli::setup_generate(app);
    cli::setup_logits(app);
    cli::setup_bench(app);
    cli::setup_detect(app);
    cli::setup_export(app);
    cli::setup_top(app);
    cli::setup_train_toy(app);
    cli::setup_maps(app);
    cli::setup_successor(app);
    cli::setup_influence(app);
    cli::setup_copy_suppression(app);
    cli::setup_dla(app);
    cli::setup_qk_spectrum(app);
    cli::setup_rerank(app);
    cli::setup_retrieval(app);
    cli::setup_run(app);
    cli::setup_ablate(app);
    cli::setup_patch(app);
    cli::setup_fv_heads(app);
    cli::setup_merge(app);
    cli::setup_report(app);
    cli::setup_atlas(app);
    cli::set_command_line(argc, argv);
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e);
    } catch (const CLI::ValidationError& e) {
        // A value outside its range (at_least, in_range): one line, like every bad input.
        std::fprintf(stderr, "headscope: error: %s\n", e.what());
        return static_cast<int>(ExitCode::kUsage);
    } catch (const CLI::ExcludesError& e) {
        std::fprintf(stderr, "headscope: error: %s\n", e.what());
        return static_cast<int>(ExitCode::kUsage);
    } catch (const CLI::ParseError& e) {
        app.exit(e);  // prints the message (and help on --help)
        return static_cast<int>(ExitCode::kUsage);
    } catch (const hs::Error& e) {
        std::fprintf(stderr, "headscope: error: %s\n", e.what());
        return static_cast<int>(e.code());
    } catch (const std::bad_alloc&) {
        // Sizes from files and options are checked against the memory before allocating
        // (docs/reliability.md), so this is either a machine short of memory or a missed check.
        std::fprintf(stderr, "headscope: error: out of memory (host)\n");
        return static_cast<int>(ExitCode::kOutOfMemory);
    } catch (const c10::OutOfMemoryError& e) {
        // libtorch's allocator (CUDA) ran out: its message's first line says how much was asked for.
        std::string msg = e.what_without_backtrace();
        msg = msg.substr(0, msg.find('\n'));
        std::fprintf(stderr, "headscope: error: out of memory on the device: %s (try a smaller --batch or --lengths, or "
                             "--dtype bfloat16)\n", hs::one_line(msg).c_str());
        return static_cast<int>(ExitCode::kOutOfMemory);
    } catch (const c10::Error& e) {
        std::fprintf(stderr, "headscope: error: %s\n", e.what_without_backtrace());
        return static_cast<int>(ExitCode::kFailure);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "headscope: error: %s\n", e.what());
        return static_cast<int>(ExitCode::kFailure);
    }
    return 0;  // a command reports failure by throwing (the catches above map it to its exit code)
}
