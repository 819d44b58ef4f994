#!/usr/bin/env bash
# Every `Example:` line of `headscope --help-all` (the top-level one and each subcommand's) runs as
# written and exits 0. Commands added later are picked up from the binary's own help.
# How "as written" is arranged, with no edit of the example text: each example runs in a scratch
# repository folder W/repo where
#   ../shared/testdata   -> the test data (../shared/testdata or $HEADSCOPE_TESTDATA),
#   datasets/            -> this repository's datasets/ (symlink),
#   models/toy-induction -> the CI toy induction model (tests/ci_toy.sh), models/toy-recall likewise,
# so the paths an example names resolve as they would in a checkout with the quickstart's models.
# Examples share W/repo in help order, so `top scores.h5` reads what `detect ... --out scores.h5`
# wrote; an example whose --out file already exists there gets it removed first (a user would
# pick another name), and one whose --out is a substituted model folder (train-toy) runs in a fresh
# scratch folder so the shared toy model is never overwritten.
# One exception, for time: `train-toy` examples train for thousands of steps (minutes on two cores);
# they run with `--steps 20` appended (the same command, shorter) unless HEADSCOPE_LONG_EXAMPLES=1.
# Usage: cli_help_examples.sh path/to/headscope
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
if [ -z "$TD" ]; then
  # Like the other suites' test-data checks: skipped, and said so, where the data is not beside the
  # checkout (e.g. a clone in /tmp); set HEADSCOPE_TESTDATA to run it there.
  echo "cli-help-examples: skipped: ../shared/testdata not found (the examples name it; set HEADSCOPE_TESTDATA)"
  echo "cli-help-examples: 0 passed, 0 failed"; exit 0
fi
TDA="$(cd "$TD" && pwd)"
scratch() {  # scratch DIR: a repository-like folder with the links above
  mkdir -p "$1/shared" "$1/repo/models"
  ln -s "$TDA" "$1/shared/testdata"
  ln -s "$ROOT/datasets" "$1/repo/datasets"
  ln -s "$(ci_toy induction)" "$1/repo/models/toy-induction"
  ln -s "$(ci_toy recall)" "$1/repo/models/toy-recall"
}
W="$TMP/w"; scratch "$W"

mapfile -t examples < <("$HS" --help-all | grep -o 'Example: .*' | sed 's/^Example: //')
check "examples found (${#examples[@]})" -- test "${#examples[@]}" -ge 10
n=0
for ex in "${examples[@]}"; do
  n=$((n+1))
  case "$ex" in headscope\ *) ;; *) fail=$((fail+1)); echo "FAIL example does not start with 'headscope': $ex"; continue ;; esac
  dir="$W/repo"
  out=$(printf '%s\n' "$ex" | sed -nE 's/.*(--out|-o) +([^ ]+).*/\2/p')
  if [ -n "$out" ] && [ -L "$dir/$out" ]; then
    dir="$TMP/fresh$n/repo"; scratch "$TMP/fresh$n"; rm -f "$dir/$out"
  elif [ -n "$out" ] && [ -e "$dir/$out" ]; then
    rm -rf "${dir:?}/$out"
  fi
  run="${ex#headscope }"
  case "$run" in train-toy\ *) [ "${HEADSCOPE_LONG_EXAMPLES:-0}" = 1 ] || run="$run --steps 20" ;; esac
  start=$SECONDS
  if (cd "$dir" && eval "\"\$HS\" $run") >"$TMP/out" 2>"$TMP/err"; then
    pass=$((pass+1)); echo "ok   ($((SECONDS-start)) s) $ex"
  else
    rc=$?; fail=$((fail+1)); echo "FAIL (exit $rc) $ex"; head -3 "$TMP/err"
  fi
done
echo "cli-help-examples: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
