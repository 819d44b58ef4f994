#!/usr/bin/env bash
# The test suite against PyPI's current torch wheel (libtorch 2.x) instead of Debian's libtorch 1.13,
# from a fresh Debian 12 machine with scripts/install_deps.sh done:
#   1. a virtual environment: .venv-torch2/ in the repository root (ignored by git), or
#      $HEADSCOPE_TORCH2_VENV; created when absent, reused otherwise;
#   2. pip installs torch there when it is missing (pip's cache, ~/.cache/pip, is reused), then the nvcc
#      of the wheel's own CUDA version (cuda-toolkit[nvcc], ~110 MB): the wheel is a CUDA build and its
#      CMake files want a CUDA toolkit even on a machine without a GPU (scripts/build.sh, "CUDA");
#   3. scripts/build.sh --torch into build-torch2/;
#   4. ctest in build-torch2/ (the CI toy models are trained once into build-torch2/ci-toy/).
# Prints how long each phase took.
#   bash scripts/test_torch2.sh [CTEST ARGS...]   e.g. -R unit_ to run the doctest suites only
# HEADSCOPE_DEADLINE=EPOCH-SECONDS (.ci/run sets it: CI's time budget): each phase runs under `timeout`
# until then. A phase the deadline stops is named with the tests passed so far, and the script exits 0
# if no test had failed (the rest of the part did not run: said, never counted as passed), 1 if one had.
# HEADSCOPE_BUILD_TARGET=T builds only T (and what it needs): .ci/run builds headscope_tests (with the
# headscope binary), not the benchmarks and the fuzz replay its ctest -R does not run.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
venv="${HEADSCOPE_TORCH2_VENV:-$repo/.venv-torch2}"
times=()
phase_start=0
start() { phase_start=$(date +%s); echo "== test_torch2.sh: $1" >&2; }
done_() { times+=("$(printf '%-8s %5d s' "$1" $(($(date +%s) - phase_start)))"); }
report() { echo "== test_torch2.sh: phase times" >&2; printf '   %s\n' "${times[@]}" >&2; }
trap report EXIT
deadline="${HEADSCOPE_DEADLINE:-}"
# run_phase CMD...: CMD under the deadline (when set); 124 when the deadline stopped it (or had passed).
run_phase() {
  if [ -z "$deadline" ]; then "$@"; return; fi
  local left=$(( deadline - $(date +%s) ))
  [ "$left" -gt 0 ] || return 124
  local rc=0
  timeout -k 20 "$left" "$@" || rc=$?
  [ "$rc" -eq 137 ] && rc=124
  return "$rc"
}
# phase NAME CMD...: run_phase, and at the deadline end the script (out_of_time).
phase() {
  local name="$1"; shift
  local rc=0
  run_phase "$@" || rc=$?
  [ "$rc" -eq 124 ] && [ -n "$deadline" ] && out_of_time "$name"
  return "$rc"
}
out_of_time() {
  done_ "$1 (stopped)"
  local passed=0 failed=0
  if [ -f "${ctest_log:-}" ]; then
    passed=$(grep -E 'Test +#[0-9]+: ' "$ctest_log" | grep -c ' Passed' || true)
    failed=$(grep -E 'Test +#[0-9]+: ' "$ctest_log" | grep -vc ' Passed' || true)
  fi
  echo "test_torch2.sh: CI's time budget ran out during the $1 phase ($(date -u -d "@$deadline" +%H:%M:%S) UTC):" \
       "$passed suites passed, $failed failed; the rest of the libtorch 2.x part did NOT run here" >&2
  if [ "$failed" -gt 0 ]; then exit 1; fi
  exit 0
}

start "virtual environment $venv"
if [ ! -x "$venv/bin/python" ]; then
  # Debian's python3 lacks ensurepip (and so venv) until python3-venv is installed.
  if ! python3 -m venv "$venv" 2>/dev/null; then
    rm -rf "$venv"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-venv
    python3 -m venv "$venv"
  fi
fi
done_ venv

start "torch (pip)"
py="$venv/bin/python"
if ! "$py" -c 'import torch' 2>/dev/null; then
  phase pip "$py" -m pip install torch
fi
# The CUDA toolkit version the wheel depends on (empty for a CPU-only torch): its nvcc, same version.
cuda_tk=$("$py" -c 'from importlib.metadata import version
try: print(version("cuda-toolkit"))
except Exception: print("")')
if [ -n "$cuda_tk" ] && ! ls "$venv"/lib/python3*/site-packages/nvidia/cu*/bin/nvcc >/dev/null 2>&1; then
  phase pip "$py" -m pip install "cuda-toolkit[nvcc]==$cuda_tk"
fi
prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
echo "torch $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) at $prefix" >&2
done_ pip

start "build build-torch2/"
# The suites are always built here, whatever an earlier configure of build-torch2/ chose
# (device_check.sh --dry-run configures it with HS_BUILD_TESTS=OFF).
# HEADSCOPE_CI_TOY_DIR (CI: build/ci-toy) goes into the configure: ctest hands the tests the
# configured folder, not the caller's environment, and a second training of the toys costs ~10 min.
toy_arg=""
[ -n "${HEADSCOPE_CI_TOY_DIR:-}" ] && toy_arg="-DHEADSCOPE_CI_TOY_DIR=$HEADSCOPE_CI_TOY_DIR"
HEADSCOPE_CMAKE_ARGS="-DHS_BUILD_TESTS=ON $toy_arg ${HEADSCOPE_CMAKE_ARGS:-}" phase build bash scripts/build.sh --torch "$prefix"
done_ build

start "ctest in build-torch2/"
rc=0
jobs=$(nproc); [ "$jobs" -gt 4 ] && jobs=4  # as scripts/test.sh
ctest_log="build-torch2/ctest-torch2.log"
: >"$ctest_log"
set +e
run_phase ctest --test-dir build-torch2 --no-tests=error --output-on-failure --timeout 1500 -j"$jobs" "$@" 2>&1 \
  | tee "$ctest_log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 124 ] && [ -n "$deadline" ] && out_of_time ctest
done_ ctest
exit $rc
