#!/usr/bin/env bash
# fv-heads on the command line: the file's AIE recomputed by tests/fv_check.py (its own PyTorch
# Llama forward, one prompt a forward as the reference runs them, from the prompts the file keeps)
# on the CI icl toy and on tinystories-656k (when the test data is here), within 1e-6 in
# probability; the toy's function-carrying heads (its training log) lead the AIE averaged over its
# four tasks.
# Usage: cli_fv.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=$(bash "$ROOT/scripts/find_python.sh" torch h5py numpy) || { echo "cli-fv: skipped: no Python with torch, h5py and numpy"; exit 0; }
TOY="$(ci_toy icl)" || { echo "FAIL: no CI icl toy"; exit 1; }
FV=(--input-prefix '' --output-prefix '' --input-sep '' --output-sep '' --no-space)

O="$TMP/toy.h5"
ok "fv-heads on the toy's four tasks" -- "$HS" fv-heads "$TOY" --task "$ROOT"/datasets/fv/toy-icl-shift{0,1,2,3}.json --shots 6 --trials 32 "${FV[@]}" --top 2 --out "$O"
# The first two heads by the AIE averaged over the tasks are the training log's function heads (L1H0,
# L1H2 for the CI seed).
top=$(sed -n '/averaged over the 4 tasks/,$p' "$TMP/out" | awk '$1 == 1 || $1 == 2 {print $2}' | sort | tr '\n' ' ')
gt=$("$PY" -c 'import json, sys; print(" ".join(sorted(json.load(open(sys.argv[1]))["ground_truth"]["function_heads"])) + " ")' "$TOY/training_log.json")
check "toy: the top heads are the log's function heads ($top vs $gt)" -- test "$top" = "$gt"
ok "fv_check on the toy" -- "$PY" "$ROOT/tests/fv_check.py" "$TOY" "$O" fv-toy-icl-shift3
grep -q "  ok" "$TMP/out" || cat "$TMP/out"

if [ -n "$TD" ]; then
  O="$TMP/ts.h5"
  ok "fv-heads on tinystories-656k" -- "$HS" fv-heads "$TD/tinystories-656k" --task "$ROOT/datasets/fv/lowercase-uppercase.json" --shots 5 --trials 8 --out "$O"
  ok "fv_check on tinystories-656k" -- "$PY" "$ROOT/tests/fv_check.py" "$TD/tinystories-656k" "$O"
  grep -q "  ok" "$TMP/out" || cat "$TMP/out"
else
  echo "skipped the test-data checks: ../shared/testdata not found"
fi
echo "cli-fv: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
