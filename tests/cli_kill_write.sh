#!/usr/bin/env bash
# Interrupted writes (docs/reliability.md, "Interrupted writes"): `detect`, `copy-suppression` and
# `run` are killed with SIGKILL at a spread of moments, from start-up to the end of the write. After
# each kill the output path must either not exist or hold a complete file: every dataset of an
# uninterrupted run, with the same values (a kill that lands after the rename counts as complete).
# `run` rewrites its whole file after every batch, so its file may also be a valid earlier state:
# then /experiment `complete` is 0 and `run --resume` must finish it to the uninterrupted result.
# Temporary files (OUT.tmp-PID) a kill leaves are never read, and the next write removes them.
# Usage: cli_kill_write.sh path/to/headscope
set -u
HS="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
cd "$ROOT"
PY=$(bash scripts/find_python.sh h5py numpy) || { echo "FAIL: no Python with h5py"; exit 1; }
TOY="$(ci_toy induction)" || { echo "FAIL: no CI toy model"; exit 1; }
KILLS="${KILLS:-8}"
kills=0; absent=0; complete=0; resumed=0

# same REF OUT: OUT holds every dataset of REF with equal values (NaN = NaN, 1e-5 relative).
cat >"$TMP/same.py" <<'PY'
import sys, h5py, numpy as np
ref, out = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
bad = []
def visit(name, obj):
    if not isinstance(obj, h5py.Dataset) or name.startswith("meta"): return
    if name not in out: bad.append("missing " + name); return
    a, b = obj[()], out[name][()]
    if getattr(a, "shape", None) != getattr(b, "shape", None): bad.append("shape " + name); return
    if a.dtype.kind in "fc":
        if not np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True): bad.append("values " + name)
    elif not np.array_equal(a, b): bad.append("values " + name)
ref.visititems(visit)
if bad: print("; ".join(bad[:5])); sys.exit(1)
PY
attr() { "$PY" -c "import h5py,sys; print(h5py.File(sys.argv[1],'r')['experiment'].attrs.get('complete', -1))" "$1"; }

# kill_test NAME OUT -- command...: a reference run, then KILLS runs killed at spread moments.
kill_test() {
  local name="$1" out="$2"; shift 3
  rm -f "$out"
  local t0; t0=$(date +%s%N)
  "$@" --out "$TMP/ref-$name.h5" >/dev/null 2>&1 || { fail=$((fail+1)); echo "FAIL $name: reference run failed"; return; }
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  for k in $(seq 1 "$KILLS"); do
    local delay_ms=$(( ms * k / KILLS + 5 * k ))  # from early in the run to just past its end
    rm -f "$out"
    "$@" --out "$out" >/dev/null 2>&1 &
    local pid=$!
    sleep "$(printf '0.%03d' $((delay_ms % 1000)))"; [ $((delay_ms / 1000)) -gt 0 ] && sleep $((delay_ms / 1000))
    kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    kills=$((kills+1))
    if [ ! -e "$out" ]; then
      pass=$((pass+1)); absent=$((absent+1)); continue  # killed before the first rename: nothing under the name
    fi
    if [ "$name" = run ] && [ "$(attr "$out")" = 0 ]; then
      # An earlier complete state of the run: --resume must finish it to the reference result.
      if "$HS" -q run "$E" --model "$TOY" --batch-rows 64 --out "$out" --resume >/dev/null 2>"$TMP/err" \
         && [ "$(attr "$out")" = 1 ] && "$PY" "$TMP/same.py" "$TMP/ref-$name.h5" "$out" >"$TMP/why"; then
        pass=$((pass+1)); resumed=$((resumed+1))
      else
        fail=$((fail+1)); echo "FAIL $name killed at ${delay_ms} ms: resume did not finish it: $(cat "$TMP/err" "$TMP/why" 2>/dev/null | head -3)"
      fi
    elif "$PY" "$TMP/same.py" "$TMP/ref-$name.h5" "$out" >"$TMP/why" 2>&1; then
      pass=$((pass+1)); complete=$((complete+1))
    else
      fail=$((fail+1)); echo "FAIL $name killed at ${delay_ms} ms: $out is not complete: $(head -3 "$TMP/why")"
    fi
  done
  # Whatever temporary files the kills left, the next write of the same name removes them.
  "$@" --out "$out" --force >/dev/null 2>&1
  check "$name: no temporary file left after the next write" -- test -z "$(ls "$out".tmp-* 2>/dev/null)"
}

E=datasets/experiments/toy-induction.yaml
kill_test detect "$TMP/d.h5" -- "$HS" -q detect "$TOY" --probe previous-token,induction,duplicate-token --samples --batch 64
kill_test copy-suppression "$TMP/c.h5" -- "$HS" -q copy-suppression "$TOY"
# A pause after each flushed batch spreads the kills over many intermediate states of the file.
kill_test run "$TMP/r.h5" -- "$HS" -q run "$E" --model "$TOY" --batch-rows 64 --pause-after-batch 100
echo "cli-kill-write: $kills kills ($absent left no file, $complete a complete file, $resumed an earlier state that --resume finished), $pass passed, $fail failed"
[ "$fail" -eq 0 ]
