#!/usr/bin/env bash
# detect --probe sink-rate on the command line (Gu et al.'s attention-sink rates): the file's rates
# recomputed from its own per-sequence alpha_0 with numpy as the reference computes them (float32
# indicator, means over sequences, layers, heads); bad input gets one line and a documented exit
# code; the report draws the rates.
# Usage: cli_sink_rate.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"

"$HS" detect --help | grep -q -- "--sink-epsilon" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL detect --help omits --sink-epsilon"; }
if [ -z "$TD" ]; then
  echo "skipped the test-data checks: ../shared/testdata not found"
  echo "cli-sink-rate: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
fi
M="$TD/stories260K/stories260K.bin"
TXT="$(dirname "$0")/../datasets/needles/haystack.txt"
O="$TMP/sink.h5"

expect "epsilon range" 2 "sink-epsilon: 1.5 is outside \[0, 1\]" -- "$HS" detect "$M" --probe sink-rate --sink-epsilon 1.5 --out "$O"
expect "epsilon unused" 2 "only the probe sink-rate reads it" -- "$HS" detect "$M" --probe induction --sink-epsilon 0.2 --out "$O"
expect "first-tokens too long" 5 "haystack.txt:1: --first-tokens 100000: the sequence has only" -- \
  "$HS" detect "$M" --probe sink-rate --text-file "$TXT" --first-tokens 100000 --out "$O"
expect "first-tokens needs sequences" 2 "first-tokens: cuts given sequences" -- "$HS" detect "$M" --probe sink-rate --first-tokens 5 --out "$O"
no_file "$O"

# The reference's setting on headscope's texts: the first 64 tokens of each line, epsilon 0.2.
ok "sink-rate run" -- "$HS" detect "$M" --probe sink-rate,attention-sink --text-file "$TXT" --first-tokens 64 --sink-epsilon 0.2 --samples --out "$O"
grep -q "^sink rate" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL no sink rate line:"; cat "$TMP/out"; }
PY=$(bash "$(dirname "$0")/../scripts/find_python.sh" h5py numpy) || { echo "FAIL: no Python with h5py and numpy"; exit 1; }
if "$PY" - "$O" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
g = f["scores/sink-rate"]
a = g["samples"][()]                       # [N, L, H] alpha_0, float32
eps = g.attrs["epsilon"]
assert eps == 0.2 and a.dtype == np.float32 and a.shape[0] == 8, (eps, a.dtype, a.shape)
above = (a > np.float32(eps)).astype(np.float64)  # torch compares float32 with a Python float in float32
assert np.array_equal(g["rate"][()], above.mean(0).astype(np.float32))
assert np.allclose(g["layer_rate"][()], above.mean((0, 2)), atol=1e-7)
assert abs(g.attrs["model_rate"] - above.mean()) < 1e-12, (g.attrs["model_rate"], above.mean())
assert np.allclose(g["score"][()], a.mean(0), atol=1e-6)
# alpha_0 counts query 0 (A[0, 0] = 1); attention-sink does not: alpha_0 = (1 + 63 sink) / 64.
s = f["scores/attention-sink/samples"][()]
assert np.allclose(a, (1 + 63 * s) / 64, atol=1e-5)
assert (a >= 1 / 64 - 1e-6).all()
print("model sink rate", g.attrs["model_rate"])
PY
then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL the file's rates differ from numpy's"; fi
ok "report" -- "$HS" report "$O" --out "$TMP/r.html"
grep -q "model sink rate" "$TMP/r.html" && grep -q "layer 4 sink rate" "$TMP/r.html" && pass=$((pass+1)) \
  || { fail=$((fail+1)); echo "FAIL the report does not draw the sink rates"; }
echo "cli-sink-rate: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
