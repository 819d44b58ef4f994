#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: install, build, run every test.
#   bash scripts/test.sh              the default CI run (every suite but the long fits: ctest -LE long)
#   bash scripts/test.sh --long       the long fits too (ctest label long: long_<file>, docs/architecture.md)
#   bash scripts/test.sh --sanitize   then every suite again under ASan + UBSan (scripts/test_sanitize.sh;
#                                     --sanitize=fast or --sanitize=rest run one half, docs/reliability.md)
set -euo pipefail
cd "$(dirname "$0")/.."
san=""
select=(-LE long)
case "${1:-}" in
  --long) select=() ;;
  --sanitize) san=all ;;
  --sanitize=fast) san=--fast ;;
  --sanitize=rest) san=--rest ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--long | --sanitize[=fast|=rest]]" >&2; exit 2 ;;
esac
bash scripts/install_deps.sh
bash scripts/build.sh
# Two tests at a time on a 2-core machine (one a core; every suite is written to run beside others: the CI
# toys train under a lock, each test its own temporary folder): the default suite took 1235 s one at a
# time and 789 s two at a time on the 2-core AVX2 VM (2026-12-07). At most 4 at a time: each test's
# headscope uses every core, and a few of them hold 1-3 GB.
jobs=$(nproc); [ "$jobs" -gt 4 ] && jobs=4
(cd build && ctest --no-tests=error --output-on-failure --timeout 1500 -j"$jobs" "${select[@]}")
if [ -n "$san" ]; then
  if [ "$san" = all ]; then bash scripts/test_sanitize.sh; else bash scripts/test_sanitize.sh "$san"; fi
fi
