#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/targets/*.cpp) for SECONDS each (default 60), one after
# another at nice 10, and prints executions, coverage and findings per target.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
# Builds build-fuzz/ with clang (ASan + UBSan + libFuzzer; Debian: clang, libclang-rt-14-dev) when
# needed. Each target starts from its committed seeds fuzz/corpus/<target>/ plus
# fuzz/regressions/<target>/ and grows a working corpus in build-fuzz/fuzz-work/<target>/corpus
# (not committed). Limits: -rss_limit_mb=2048, -malloc_limit_mb=512 (one allocation above 512 MB,
# e.g. a header asking for 10^12 elements, is a finding), -timeout=10 s per input.
# Every crash, timeout, leak or out-of-memory input is copied to fuzz/regressions/<target>/ (commit
# it with the fix: ctest fuzz_replay replays it ever after). Exit status 1 when anything was found.
# HEADSCOPE_FUZZ_RUNS=N also stops each target after N executions (the long run in
# docs/reliability.md: HEADSCOPE_FUZZ_RUNS=1000000 bash scripts/fuzz.sh 1800).
# HEADSCOPE_FUZZ_TIMEOUT=S: libFuzzer's -timeout per input (default 10 s). A timeout is replayed alone
# (three times, each with that limit) before it counts: on a loaded machine the niced fuzzer can be
# starved past the limit on an input that runs in milliseconds; such a timeout is reported as not
# reproduced, and only one that reproduces is a finding copied to fuzz/regressions/.
# The hdf5 target is different: Debian's libhdf5 itself hangs, crashes or allocates gigabytes on some
# corrupt files, below our code (headscope reads every result file in a child process first for
# that reason: src/store/store.cpp check_hdf5_file_isolated). So hdf5 runs in libFuzzer's fork mode, which
# keeps going past a crash, timeout or out-of-memory (-fork=1 -ignore_crashes=1 ...), and every input
# it stopped on is triaged: its stack is read from a replay under ASan, and the released headscope
# must refuse it in one line with exit 6 (or 2). An input whose fault lies inside libhdf5 and which
# headscope refuses cleanly counts under "in libhdf5, refused" (kept in
# build-fuzz/fuzz-work/hdf5/libhdf5/); any other is a finding, copied to fuzz/regressions/hdf5/.
# HEADSCOPE_FUZZ_FORK_TARGETS (default "hdf5") lists the targets run that way.
set -eu
cd "$(dirname "$0")/.."
SECS=${1:-60}
TO=${HEADSCOPE_FUZZ_TIMEOUT:-10}
shift || true
BUILD=${HEADSCOPE_FUZZ_BUILD:-build-fuzz}
JOBS=${HEADSCOPE_FUZZ_JOBS:-2}

CXX_BIN=$(command -v clang++ || command -v clang++-14 || true)
CC_BIN=$(command -v clang || command -v clang-14 || true)
if [ -z "$CXX_BIN" ] || [ -z "$CC_BIN" ]; then
  echo "fuzz.sh: clang not found (Debian: apt-get install clang libclang-rt-14-dev, or scripts/install_deps.sh)" >&2
  exit 2
fi
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHEADSCOPE_FUZZ=ON \
        -DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_C_COMPILER="$CC_BIN" >/dev/null
fi
# Serialised, so that several fuzz.sh runs side by side (one target each) share one build.
mkdir -p "$BUILD"
if [ -z "${HEADSCOPE_FUZZ_NOBUILD:-}" ]; then
  flock "$BUILD/.build.lock" nice -n 10 cmake --build "$BUILD" --target fuzz_all -j"$JOBS" >/dev/null
fi

if [ $# -gt 0 ]; then
  TARGETS=("$@")
else
  TARGETS=()
  for f in fuzz/targets/*.cpp; do TARGETS+=("$(basename "$f" .cpp)"); done
fi

# Leaks are findings (fuzz/lsan.supp: one inside libhdf5). allocator_may_return_null=1: a huge
# malloc() inside the uninstrumented C libraries (libhdf5 on a corrupt header) returns NULL as it
# does in production, and the library reports the error; C++ `new` failing still aborts, and any
# allocation above -malloc_limit_mb is still a finding.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:handle_abort=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}

FORK_TARGETS=" ${HEADSCOPE_FUZZ_FORK_TARGETS-hdf5} "
HS_BIN=${HEADSCOPE_BIN:-build/headscope}

# triage TARGET WORK: classifies the inputs a fork-mode run stopped on (see the header). Prints
# "N_LIBHDF5 N_FINDINGS"; findings are copied to fuzz/regressions/TARGET/.
triage() {
  set +e  # runs in a subshell (process substitution); the replays below exit non-zero by design
  local t="$1" work="$2" nlib=0 nfind=0 a log frame rc lines
  mkdir -p "$work/libhdf5"
  for a in "$work/artifacts/"*; do
    [ -f "$a" ] || continue
    log="$work/triage.log"
    # The stack: a replay of the one input in the in-process target (libFuzzer prints the stack of
    # a timeout or an out-of-memory too). The first frame outside the sanitizer runtime decides.
    timeout -s KILL 60 "$BUILD/fuzz_$t" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 "$a" >"$log" 2>&1
    frame=$(grep -E '^ +#[0-9]+ 0x' "$log" | grep -vE 'in (__asan|__interceptor|__sanitizer|__ubsan|__lsan|operator new|malloc|calloc|realloc|memcpy|memmove|__libc|fuzzer::|LLVMFuzzer|abort|raise|gsignal)|libclang_rt|compiler-rt|/sanitizer_common/|libc\.so' | head -1)
    # The released tool on it: one line, exit 6 (damaged) or 2 (readable, no such probe).
    HEADSCOPE_HDF5_CHECK_TIMEOUT=5 timeout -s KILL 120 "$HS_BIN" -q top "$a" --probe induction >/dev/null 2>"$work/triage.err"
    rc=$?; lines=$(wc -l <"$work/triage.err")
    if echo "$frame" | grep -q 'libhdf5' && { [ "$rc" -eq 6 ] || [ "$rc" -eq 2 ]; } && [ "$lines" -eq 1 ]; then
      nlib=$((nlib + 1)); cp "$a" "$work/libhdf5/"
    elif [ -z "$frame" ] && ! grep -qE 'ERROR|SUMMARY|timeout|out-of-memory|leak' "$log" && \
         { [ "$rc" -eq 6 ] || [ "$rc" -eq 2 ] || [ "$rc" -eq 0 ]; } && [ "$lines" -le 1 ]; then
      nlib=$((nlib + 1)); cp "$a" "$work/libhdf5/"  # did not reproduce alone (e.g. a fork-mode OOM of a whole job)
    else
      nfind=$((nfind + 1)); cp "$a" "fuzz/regressions/$t/"
      echo "  finding: $a (first frame: ${frame:-none}; headscope top: rc $rc, $lines stderr lines)" >&2
    fi
  done
  echo "$nlib $nfind"
}

for t in "${TARGETS[@]}"; do
  case "$FORK_TARGETS" in
    *" $t "*) [ -x "$HS_BIN" ] || { echo "fuzz.sh: $HS_BIN missing (bash scripts/build.sh): the $t triage runs it" >&2; exit 2; } ;;
  esac
done

printf '%-16s %12s %9s %8s %8s %7s %9s %6s %7s %s\n' target executions exec/s cov ft corpus crashes leaks timeouts "in libhdf5, refused"
found=0
for t in "${TARGETS[@]}"; do
  bin="$BUILD/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz.sh: no target $t ($bin)" >&2; exit 2; }
  work="$BUILD/fuzz-work/$t"
  mkdir -p "$work/corpus" "$work/artifacts" "fuzz/regressions/$t"
  rm -f "$work/artifacts/"*
  dirs=("$work/corpus" "fuzz/corpus/$t")
  [ -n "$(ls -A "fuzz/regressions/$t" 2>/dev/null)" ] && dirs+=("fuzz/regressions/$t")
  fork=0; case "$FORK_TARGETS" in *" $t "*) fork=1 ;; esac
  set +e
  if [ $fork = 1 ]; then
    nice -n 10 "$bin" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
      -max_total_time="$SECS" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout="$TO" \
      ${HEADSCOPE_FUZZ_RUNS:+-runs=$HEADSCOPE_FUZZ_RUNS} -artifact_prefix="$work/artifacts/" "${dirs[@]}" >"$work/log" 2>&1
  else
    nice -n 10 "$bin" -max_total_time="$SECS" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout="$TO" \
      ${HEADSCOPE_FUZZ_RUNS:+-runs=$HEADSCOPE_FUZZ_RUNS} -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${dirs[@]}" >"$work/log" 2>&1
  fi
  set -e
  execs=$(grep -ao 'stat::number_of_executed_units: [0-9]*' "$work/log" | tail -1 | awk '{print $2}' || true)
  rate=$(grep -aoE 'stat::average_exec_per_sec: +[0-9]+' "$work/log" | tail -1 | awk '{print $2}' || true)
  last=$(grep -aE '^#[0-9]+.*cov: ' "$work/log" | tail -1 || true)
  if [ $fork = 1 ]; then  # fork mode prints "#N: cov: C ft: F corp: K exec/s: E oom/timeout/crash: ..."
    execs=$(echo "$last" | grep -oE '^#[0-9]+' | tr -d '#')
    rate=$(echo "$last" | grep -oE 'exec/s: [0-9]+' | awk '{print $2}')
  fi
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
  corp=$(echo "$last" | grep -o 'corp: [0-9]*' | awk '{print $2}')
  crashes=0 leaks=0 timeouts=0 inlib=""
  if [ $fork = 1 ]; then
    read -r nlib nfind < <(triage "$t" "$work") || { nlib=0; nfind=1; echo "  triage of $t failed" >&2; }
    inlib=$nlib; crashes=$nfind; [ "$nfind" -gt 0 ] && found=1
    rm -f "$work/artifacts/"*
  fi
  for a in "$work/artifacts/"*; do
    [ -e "$a" ] || continue
    case "$(basename "$a")" in
      crash-*|oom-*|deadly-*) crashes=$((crashes + 1)) ;;
      leak-*) leaks=$((leaks + 1)) ;;
      timeout-*)
        reproduced=0
        for _ in 1 2 3; do
          timeout -s KILL $((3 * TO)) "$bin" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout="$TO" "$a" >/dev/null 2>&1 || reproduced=1
        done
        if [ $reproduced = 0 ]; then
          echo "  $t: $(basename "$a") ran within ${TO} s in each of 3 replays alone: the machine starved the fuzzer, not a finding" >&2
          continue
        fi
        timeouts=$((timeouts + 1)) ;;
      *) continue ;;
    esac
    cp "$a" "fuzz/regressions/$t/"
    found=1
  done
  # A run that died before printing its final stats (e.g. a crash in a seed) counts as a finding.
  if [ -z "$execs" ]; then crashes=$((crashes > 0 ? crashes : 1)); found=1; fi
  printf '%-16s %12s %9s %8s %8s %7s %9s %6s %7s %s\n' "$t" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}" \
    "${corp:--}" "$crashes" "$leaks" "$timeouts" "${inlib:--}"
  if [ "$crashes$leaks$timeouts" != "000" ]; then
    echo "  log: $work/log; inputs copied to fuzz/regressions/$t/" >&2
  fi
done
exit $found
