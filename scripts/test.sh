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
(cd build && ctest --no-tests=error --output-on-failure --timeout 1500 "${select[@]}")
if [ -n "$san" ]; then
  if [ "$san" = all ]; then bash scripts/test_sanitize.sh; else bash scripts/test_sanitize.sh "$san"; fi
fi
