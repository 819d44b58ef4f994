#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (docs/reliability.md,
# "Sanitizers"): builds build-san/ with -DHEADSCOPE_SANITIZE=address,undefined (our library, probes,
# tool and tests instrumented; libtorch, HDF5 and the other system libraries are not) and runs ctest
# there, so every unit suite and every command-line suite runs the sanitized code. Any report stops
# the process with a non-zero exit and fails its test.
#   bash scripts/test_sanitize.sh          every suite
#   bash scripts/test_sanitize.sh --fast   the half that CI runs (scripts/test.sh): the suites of
#                                          parsers and bad input, see FAST below
#   bash scripts/test_sanitize.sh --rest   the other half
# Extra arguments go to ctest (e.g. -R unit_loading). The CI toy models come from build/ci-toy
# when scripts/test.sh trained them there (the same weights; training under ASan is 3x slower).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# The fast half: the suites that feed bad or foreign bytes to the parsers and writers.
FAST='^(unit_loading|unit_tokenizer|unit_report|cli_test|cli_bad_input|cli_kill_write|cli_run)$'
sel=()
case "${1:-}" in
  --fast) sel=(-R "$FAST"); shift ;;
  --rest) sel=(-E "$FAST"); shift ;;
esac
cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DHEADSCOPE_SANITIZE=address,undefined -DHEADSCOPE_CI_TOY_DIR="$PWD/build/ci-toy" >/dev/null
cmake --build build-san -j"$(nproc)"
# detect_leaks=0: see docs/reliability.md ("Sanitizers": leaks). allocator_may_return_null=1: a
# malloc() too big to serve returns NULL, as glibc's does in production (libhdf5 asks for 3.4 x 10^15
# bytes on fuzz/regressions/hdf5/huge-malloc-in-h5c-protect and reports the NULL as an error);
# C++ `new` failing is still reported. Everything else stops at the first report with a stack trace.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=0:check_initialization_order=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
start=$(date +%s)
cd build-san
status=0
ctest --output-on-failure --timeout 3000 "${sel[@]}" "$@" || status=$?
echo "sanitizer suite: $(( $(date +%s) - start )) s of tests (the build before it not counted)"
exit $status
