#!/usr/bin/env bash
# QRHead on the command line (docs/methods.md, "QRHead"): `rerank` on the CI toy recall model with
# the proven retrieval heads (documents "kV", the query "?k": every gold pair ranked first) and on
# ../shared/testdata/tinystories-656k (a small Hugging Face Llama), each example's per-head and
# document scores recomputed from princeton-pli/QRHead's lines by tests/qrhead_check.py (plain
# float64 torch, its own forward) within 1e-5; --help's example.
# Usage: cli_qrhead.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

"$HS" rerank --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL rerank --help has no example"; }
PY=$(bash "$ROOT/scripts/find_python.sh" torch numpy) || { echo "FAIL: no Python with torch and numpy"; exit 1; }
RECALL="$(ci_toy recall)" || { echo "FAIL: no CI toy recall model"; exit 1; }
TOYFMT=(--instruction '' --separator '' --doc-format '{doc}' --query-format '?{query}')

ok "toy rerank" -- "$HS" -q rerank "$RECALL" --heads L1H0,L1H1,L1H2 --docs "$ROOT/datasets/rerank/toy_recall.jsonl" \
  "${TOYFMT[@]}" --threads 1 --dump "$TMP/toy.json"
grep -q "16 examples: recall@1 1.0000, MRR 1.0000" "$TMP/out" && pass=$((pass+1)) \
  || { fail=$((fail+1)); echo "FAIL the toy's gold pairs are not all ranked first:"; tail -3 "$TMP/out"; }
if "$PY" "$ROOT/tests/qrhead_check.py" "$RECALL" "$TMP/toy.json" --tol 1e-5 >"$TMP/check" 2>&1; then
  pass=$((pass+1)); cat "$TMP/check"
else
  fail=$((fail+1)); echo "FAIL qrhead_check on the toy:"; cat "$TMP/check"
fi

if [ -n "$TD" ] && [ -d "$TD/tinystories-656k" ]; then
  M="$TD/tinystories-656k"
  ok "stories rerank" -- "$HS" -q rerank "$M" --heads L0H0,L0H3,L1H2,L1H5,L1H7 --docs "$ROOT/tests/fixtures/rerank/stories.jsonl" \
    --threads 1 --dump "$TMP/stories.json"
  cat "$TMP/out"
  if "$PY" "$ROOT/tests/qrhead_check.py" "$M" "$TMP/stories.json" --tol 1e-5 >"$TMP/check" 2>&1; then
    pass=$((pass+1)); cat "$TMP/check"
  else
    fail=$((fail+1)); echo "FAIL qrhead_check on tinystories-656k:"; cat "$TMP/check"
  fi
else
  echo "skipped tinystories-656k: ../shared/testdata not found"
fi
echo "cli-qrhead: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
