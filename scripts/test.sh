#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: install, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
cd build && ctest --output-on-failure --timeout 1500
