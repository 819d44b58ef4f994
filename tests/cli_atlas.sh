#!/usr/bin/env bash
# headscope atlas on the command line: on stories260K (a fixture with a tokenizer: successor heads
# scored) and on the CI toy induction model (its induction heads, known by construction, take the
# induction role), the file's layout as docs/hdf5-schema.md "/atlas" says (roles = scores above the
# thresholds, correlations symmetric), the report's page, and bad input in one line.
# Usage: cli_atlas.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"

"$HS" atlas --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL atlas --help has no example"; }
if [ -z "$TD" ]; then
  echo "skipped the test-data checks: ../shared/testdata not found"
  echo "cli-atlas: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
fi
PY=$(bash "$(dirname "$0")/../scripts/find_python.sh" h5py numpy) || { echo "FAIL: no Python with h5py and numpy"; exit 1; }
M="$TD/stories260K/stories260K.bin"
O="$TMP/atlas.h5"

expect "unknown threshold" 2 "threshold for 'bogus': the atlas has no such score" -- "$HS" atlas "$M" --threshold bogus=1 --cs-tokens 64 --out "$O"
expect "threshold syntax" 2 "threshold 'x': expected NAME=NUMBER" -- "$HS" atlas "$M" --threshold x --out "$O"
expect "epsilon range" 2 "sink-epsilon: 2 is outside" -- "$HS" atlas "$M" --sink-epsilon 2 --out "$O"
no_file "$O"

layout() {  # layout FILE: /atlas as documented
  "$PY" - "$1" <<'PY'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
g = f["atlas"]
cols = [c.decode() if isinstance(c, bytes) else c for c in g.attrs["columns"]]
S = len(cols)
s, r, n, c = g["scores"][()], g["roles"][()], g["n_roles"][()], g["correlation"][()]
L, H = f["meta"].attrs["n_layers"], f["meta"].attrs["n_heads"]
assert s.shape == (S, L, H) and s.dtype == np.float32 and r.shape == s.shape and r.dtype == np.uint8, (s.shape, r.dtype)
assert n.shape == (L, H) and (n == r.sum(0)).all() and c.shape == (S, S)
th = g.attrs["thresholds"]
for k in range(S):
    want = np.zeros_like(r[k]) if np.isnan(th[k]) else (s[k] > np.float32(th[k])).astype(np.uint8)
    assert (r[k] == want).all(), cols[k]
ok = ~np.isnan(c)
assert np.allclose(c[ok], c.T[ok]) and np.allclose(np.diag(c)[np.diag(ok)], 1, atol=1e-6)
for a in ("sources", "roles", "threshold_sources", "skipped", "seq_len", "batch", "seed", "sink_epsilon", "model_sink_rate"):
    assert a in g.attrs, a
print(" ".join(cols))
PY
}
ok "stories260K atlas" -- "$HS" atlas "$M" --cs-tokens 128 --threshold copy-suppression=0.5 --out "$O"
grep -q "^several roles:" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL no several-roles line:"; cat "$TMP/out"; }
if cols=$(layout "$O"); then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL stories260K /atlas layout"; fi
[ "$cols" = "induction previous-token duplicate-token sink-rate successor copy-suppression qk-rank" ] && pass=$((pass+1)) \
  || { fail=$((fail+1)); echo "FAIL columns: $cols"; }
# MAPS on request: one more column a relation; a threshold the caller sets gives copy suppression roles.
ok "with MAPS" -- "$HS" atlas "$M" --cs-tokens 64 --maps-relations "$(dirname "$0")/../datasets/examples/relations" \
  --threshold copy-suppression=0.005 --out "$TMP/maps.h5"
if mcols=$(layout "$TMP/maps.h5"); then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL MAPS /atlas layout"; fi
[ "${mcols##* }" = "maps/next_letter" ] && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL MAPS columns: $mcols"; }
ok "report" -- "$HS" report "$O" --out "$TMP/a.html"
grep -q "Head atlas" "$TMP/a.html" && grep -q "heads with several roles" "$TMP/a.html" && grep -q "Spearman correlations" "$TMP/a.html" \
  && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL the report does not draw the atlas"; }

# The toy induction model: induction heads L1H0, L1H1, L1H3 and the previous-token head L0H2 by
# construction (README, "The main job"); no tokenizer words for successor tasks there.
T="$(ci_toy induction)"
ok "toy atlas" -- "$HS" atlas "$T" --out "$TMP/toy.h5"
if layout "$TMP/toy.h5" >/dev/null && "$PY" - "$TMP/toy.h5" <<'PY'
import sys, h5py
g = h5py.File(sys.argv[1], "r")["atlas"]
cols = [c.decode() if isinstance(c, bytes) else c for c in g.attrs["columns"]]
r = g["roles"][()]
ind, prev = cols.index("induction"), cols.index("previous-token")
assert r[ind, 1, 0] and r[ind, 1, 1] and r[ind, 1, 3], r[ind]
assert r[prev, 0, 2], r[prev]
PY
then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL the toy model's known heads lack their roles"; cat "$TMP/out"; fi
# --needle: the needle scan's retrieval and QRHead columns on a short grid. On the CI toy recall
# model (its recall heads L1H0, L1H1, L1H2 known from the training log) both rank them first, the
# retrieval column gives them the retrieval role (> 0.1), and the columns equal `retrieval --score
# retrieval,qrhead` on the same grid (the atlas runs the study's own scored pass: float32 copies).
R="$(ci_toy recall)"
NA=(--needles "$(dirname "$0")/../datasets/needles/toy_recall_needles.jsonl" --haystack "$(dirname "$0")/../datasets/needles/toy_recall_haystack.txt"
    --template '{context}?{question}')
expect "needle lengths auto on a short context" 2 "--needle-lengths auto: the model's context of 128 leaves" -- "$HS" atlas "$R" --needle "${NA[@]}" --out "$TMP/rn.h5"
no_file "$TMP/rn.h5"
ok "toy atlas --needle" -- "$HS" atlas "$R" --needle "${NA[@]}" --needle-lengths 16,24,32 --needle-max-new-tokens 1 --out "$TMP/rn.h5"
grep -q "^needle trials: *[0-9]*, [0-9]* passed" "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL no needle trials line"; cat "$TMP/out"; }
ok "retrieval on the same grid" -- "$HS" retrieval "$R" "${NA[@]}" --lengths 16,24,32 --depths 0,50,100 --max-new-tokens 1 --score retrieval,qrhead --out "$TMP/rr.h5"
if layout "$TMP/rn.h5" >/dev/null && "$PY" - "$TMP/rn.h5" "$TMP/rr.h5" <<'PY'
import sys, h5py, numpy as np
g = h5py.File(sys.argv[1], "r")["atlas"]
f = h5py.File(sys.argv[2], "r")
cols = [c.decode() if isinstance(c, bytes) else c for c in g.attrs["columns"]]
s, r = g["scores"][()], g["roles"][()]
for name in ("retrieval", "qrhead"):
    k = cols.index(name)
    top3 = set(np.argsort(-s[k].ravel(), kind="stable")[:3])
    assert top3 == {4, 5, 6}, (name, s[k])           # L1H0, L1H1, L1H2 (4 heads a layer)
    ref = f["scores/" + name + "/score"][()].astype(np.float32)
    assert np.array_equal(np.nan_to_num(s[k], nan=-9), np.nan_to_num(ref, nan=-9)), (name, s[k], ref)
k = cols.index("retrieval")
assert r[k, 1, 0] and r[k, 1, 1] and r[k, 1, 2], r[k]
PY
then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL the atlas's needle columns"; cat "$TMP/out"; fi
echo "cli-atlas: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
