#!/usr/bin/env bash
# Decoding under head interventions on the command line (probes/decoding/decoding.h): `generate --rows /
# --contrast / --enhance` print what the rows wrote (and plain `generate --json` its one row), DeCoRe at alpha 0 is greedy decoding, bad
# specs get one line and exit 2; on the toy recall model, `retrieval --decoding decore` contrasting
# the three causal retrieval heads keeps the accuracy and widens the answer's margin more than
# contrasting random head sets of the same size.
# Usage: cli_decoding.sh path/to/headscope
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
PY="$(bash "$ROOT/scripts/find_python.sh" json 2>/dev/null || command -v python3)"
N="$ROOT/datasets/needles"

if [ -n "$TD" ]; then
  M="$(cd "$TD" && pwd)/stories260K/stories260K.bin"
  P=(--prompt "Tom and Sue went to the park" --steps 20)
  expect "bad row mode" 2 "row 'mean:L1H0': mode 'mean': expected zero, zero-query or scale" -- "$HS" generate "$M" "${P[@]}" --rows mean:L1H0
  expect "row head outside" 2 "--rows: .*L9H0 is outside the model" -- "$HS" generate "$M" "${P[@]}" --rows zero:L9H0
  expect "two rules" 2 "give one of --rows, --contrast and --enhance/--suppress" -- "$HS" generate "$M" "${P[@]}" --rows zero:L1H0 --contrast L1H0
  expect "sampling with rows" 2 "decode greedily" -- "$HS" generate "$M" "${P[@]}" --contrast L1H0 --temperature 0.8
  expect "bad alpha" 2 "--alpha 'much': expected entropy or a number >= 0" -- "$HS" generate "$M" "${P[@]}" --contrast L1H0 --alpha much
  ok "plain" -- "$HS" -q generate "$M" "${P[@]}"
  plain="$(cat "$TMP/out")"
  ok "plain json" -- "$HS" -q generate "$M" "${P[@]}" --json
  cp "$TMP/out" "$TMP/plain.json"
  ok "decore alpha 0" -- "$HS" -q generate "$M" "${P[@]}" --contrast L1H0,L2H3,L4H5 --alpha 0 --json
  cp "$TMP/out" "$TMP/a0.json"
  ok "rows" -- "$HS" -q generate "$M" "${P[@]}" --rows zero-query:L1H0,L2H3 --rows scale=2:L3H1 --json
  cp "$TMP/out" "$TMP/rows.json"
  ok "juice" -- "$HS" -q generate "$M" "${P[@]}" --enhance L2H1 --alpha-enhance 1.5 --suppress L3H0 --alpha-suppress 0.5 --json
  cp "$TMP/out" "$TMP/juice.json"
  check "json: alpha 0 is greedy, rows and rules as asked" -- "$PY" - "$TMP" "$plain" <<'PYEOF'
import json, sys
tmp, plain = sys.argv[1], sys.argv[2]
a0 = json.load(open(tmp + "/a0.json")); rows = json.load(open(tmp + "/rows.json")); ju = json.load(open(tmp + "/juice.json"))
assert a0["rule"] == "decore" and a0["alphas"] == [0.0] * len(a0["tokens"]), a0
assert a0["tokens"] == a0["rows"][0]["tokens"], "alpha 0: the combined output is the base row's"
assert plain.endswith(a0["text"].strip()) or a0["text"].strip() in plain, (plain, a0["text"])
assert rows["rule"] == "independent" and len(rows["rows"]) == 3 and rows["tokens"] == rows["rows"][0]["tokens"]
assert [r["interventions"] for r in rows["rows"]] == ["none", "zero-query:L1H0,L2H3", "scale=2:L3H1"]
assert rows["rows"][0]["tokens"] == a0["tokens"], "row 0 of --rows is the plain model"
assert ju["rule"] == "juice" and ju["enhance"] == "L2H1" and ju["suppress"] == "L3H0" and ju["tokens"] == ju["rows"][1]["tokens"]
pj = json.load(open(tmp + "/plain.json"))
assert pj["rule"] == "independent" and len(pj["rows"]) == 1 and pj["rows"][0]["interventions"] == "none", pj
assert pj["tokens"] == pj["rows"][0]["tokens"] and len(pj["margins"]) == len(pj["tokens"]) > 0, pj
assert all(m >= 0 for m in pj["margins"]), "greedy: the chosen token has the largest logit"
assert plain.endswith(pj["text"].strip()) or pj["text"].strip() in plain, (plain, pj["text"])
PYEOF
else
  echo "skipped the stories260K checks: ../shared/testdata not found"
fi

# The toy recall model: its training log proves L1H0, L1H1, L1H2 carry recall.
REC="$(ci_toy recall)" || { echo "FAIL: no CI toy recall model"; exit 1; }
O="$TMP/dec.h5"
RA=("$HS" retrieval "$REC" --haystack "$N/toy_recall_haystack.txt" --needles "$N/toy_recall_needles.jsonl" --template '{context}?{question}' --lengths 24 --max-new-tokens 1)
expect "decore without heads" 2 "--decoding decore needs --contrast HEADS" -- "${RA[@]}" --decoding decore --out "$O"
expect "contrast without decoding" 2 "--contrast, --enhance and --suppress need --decoding decore or juice" -- "${RA[@]}" --contrast L1H0 --out "$O"
expect "unknown rule" 2 "--decoding 'beam': expected greedy, decore or juice" -- "${RA[@]}" --decoding beam --out "$O"
expect "decoding shards" 2 "not sharded yet" -- "${RA[@]}" --decoding juice --enhance L1H0 --shard 0/2 --out "$O"
no_file "$O"
ok "decore needle scan" -- "$HS" retrieval "$REC" --haystack "$N/toy_recall_haystack.txt" --needles "$N/toy_recall_needles.jsonl" \
  --template '{context}?{question}' --lengths 24,40,56,72 --max-new-tokens 1 --decoding decore --contrast L1H0,L1H1,L1H2 \
  --random-controls 5 --seed 1 --out "$O"
grep "^decoding" "$TMP/out"
PYH="$(bash "$ROOT/scripts/find_python.sh" h5py numpy)" || { echo "FAIL: no Python with h5py"; exit 1; }
check "decore: causal heads keep accuracy, widen the margin more than 5 random sets" -- "$PYH" - "$O" <<'PYEOF'
import sys
import h5py
f = h5py.File(sys.argv[1], "r"); d = f["retrieval/decoding"]
acc, mm, base = d["accuracy"][()], d["mean_answer_margin"][()], d["base_margin"][()].mean(axis=1)
greedy = f["retrieval/trials/passed"][()].mean()
assert acc.shape == (6,) and d.attrs["rule"] == "decore", acc
assert acc[0] >= greedy - 1e-9, (acc[0], greedy)
gain = mm - base
print("margin gain: causal %.3f, controls %s" % (gain[0], " ".join("%.3f" % g for g in gain[1:])))
assert gain[0] > 0 and gain[0] > gain[1:].max(), gain
PYEOF
echo "cli-decoding: $pass passed, $fail failed"; [ "$fail" -eq 0 ]
