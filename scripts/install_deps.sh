#!/usr/bin/env bash
# Installs what headscope needs to build and test on Debian 12 (run as root, or with sudo).
# libopenblas0-pthread is not optional: Debian's libtorch links the generic libblas.so.3, and with
# the reference BLAS behind it fp32 matrix products run 20-30x slower.
set -euo pipefail
PKGS=(cmake g++ make pkg-config ccache git
      libtorch-dev libopenblas0-pthread libcli11-dev libhdf5-dev libfmt-dev libyaml-cpp-dev
      doctest-dev nlohmann-json3-dev libpcre2-dev libssl-dev
      python3 python3-venv python3-torch python3-h5py python3-numpy python3-matplotlib time  # venv: the GGUF test files (scripts/setup_gguf.sh)
      chromium   # headless chromium renders the HTML report in tests/cli_report.sh
      clang libclang-rt-14-dev)  # scripts/fuzz.sh: libFuzzer + ASan/UBSan runtimes (docs/reliability.md)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
