#!/usr/bin/env bash
# run / ablate / merge on the command line: every example in datasets/experiments/ runs, bad
# experiments get one line naming FILE:LINE:COL and exit 3 with no output file, a finished file is
# not clobbered, and ablate prints the metric with and without the ablation.
# Usage: cli_run.sh path/to/headscope
set -u
HS="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
cd "$ROOT"

for cmd in run ablate merge; do
  "$HS" "$cmd" --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL $cmd --help has no example"; }
done
TOY="$(ci_toy induction)" || { echo "FAIL: no CI toy model"; exit 1; }

# Every example: the toy ones on the CI toy models (induction, recall), the test-data ones when the test data is here.
for y in datasets/experiments/*.yaml; do
  name=$(basename "$y" .yaml)
  if grep -q '^model: models/toy-induction' "$y"; then
    ok "example $name" -- "$HS" run "$y" --model "$TOY" --out "$TMP/$name.h5"
  elif grep -q '^model: models/toy-recall' "$y"; then
    RTOY="$(ci_toy recall)" || { fail=$((fail+1)); echo "FAIL example $name: no CI toy recall model"; continue; }
    ok "example $name" -- "$HS" run "$y" --model "$RTOY" --out "$TMP/$name.h5"
  elif [ -n "$TD" ]; then
    ok "example $name" -- "$HS" run "$y" --out "$TMP/$name.h5"
  else
    echo "skipped example $name: ../shared/testdata not found"; continue
  fi
  check "example $name wrote its file" -- test -s "$TMP/$name.h5"
done

E="$ROOT/datasets/experiments/toy-induction.yaml"
O="$TMP/x.h5"
expect "no output" 2 "no output" -- "$HS" run <(grep -v '^output:' "$E") --model "$TOY"
# Errors that need the model: a head out of range, a score path not in another file.
python3 - "$E" "$TMP" <<'PY'
import sys
src = open(sys.argv[1]).read()
tmp = sys.argv[2]
open(tmp + "/range.yaml", "w").write(src.replace("    sweep: single\n", "    sweep: single\n    heads: [L0H1, L12H3]\n", 1))
open(tmp + "/score.yaml", "w").write(src.replace("by: scores/induction/score", "by: %s/none.h5:/scores/x/score" % tmp))
open(tmp + "/key.yaml", "w").write(src.replace("  - name: single\n", "  - name: single\n    heads_: all\n", 1))
open(tmp + "/prompts.yaml", "w").write(src.replace("metric: {kind: loss, data: repeats, positions: repeated-half}",
                                                   "metric: {kind: logit-diff, data: repeats}", 1))
PY
expect "head out of range" 3 "range.yaml:20:19: head L12H3 out of range: the model has 2 layers" -- "$HS" run "$TMP/range.yaml" --model "$TOY" --out "$O"
no_file "$O"
expect "score file" 3 "score.yaml:24:36: by: .*none.h5: no such file" -- "$HS" run "$TMP/score.yaml" --model "$TOY" --out "$O"
no_file "$O"
cp "$TMP/toy-induction.h5" "$TMP/scores.h5"
sed "s#by: scores/induction/score#by: $TMP/scores.h5:/scores/nope/score#" "$E" >"$TMP/path.yaml"
expect "score path not in the file" 3 "path.yaml:24:36: by: .*scores.h5 has no dataset /scores/nope/score" -- "$HS" run "$TMP/path.yaml" --model "$TOY" --out "$O"
no_file "$O"
sed "s#by: scores/induction/score#by: $TMP/scores.h5:/scores/induction/score#" "$E" >"$TMP/other.yaml"
ok "score from another file" -- "$HS" run "$TMP/other.yaml" --model "$TOY" --out "$O"
rm -f "$O"
expect "unknown key" 3 "key.yaml:19:5: unknown key 'heads_' in study" -- "$HS" run "$TMP/key.yaml" --model "$TOY" --out "$O"
expect "metric needs prompts" 3 "prompts.yaml:21:13: metric logit-diff needs a prompts or conflicts dataset" -- "$HS" run "$TMP/prompts.yaml" --model "$TOY" --out "$O"
no_file "$O"
printf 'model: m\ndata: [\n' >"$TMP/syntax.yaml"
expect "not YAML" 3 "syntax.yaml:3:1: not valid YAML" -- "$HS" run "$TMP/syntax.yaml" --out "$O"
expect "missing experiment" 5 "nope.yaml" -- "$HS" run "$TMP/nope.yaml" --out "$O"
expect "bad shard" 2 "--shard '3/2'" -- "$HS" run "$E" --model "$TOY" --shard 3/2 --out "$O"
no_file "$O"

ok "run" -- "$HS" run "$E" --model "$TOY" --out "$O"
expect "no clobber" 6 "exists \(use --resume" -- "$HS" run "$E" --model "$TOY" --out "$O"
ok "resume of a finished run" -- "$HS" run "$E" --model "$TOY" --out "$O" --resume
expect "resume another experiment" 6 "another experiment" -- "$HS" run "$TMP/other.yaml" --model "$TOY" --out "$O" --resume
expect "merge one file" 2 "at least two" -- "$HS" merge "$O" --out "$TMP/m.h5"

ok "ablate" -- "$HS" ablate "$TOY" --heads L1H0,L1H3 --mode zero --metric loss --repeated 20 --token-range 6,68
check "ablate prints both" -- grep -qE '^with +[0-9.]+$' "$TMP/out"
ok "ablate prompts" -- "$HS" ablate "$TOY" --heads L0H2 --metric logit-diff --data datasets/experiments/toy-induction-prompts.jsonl
expect "ablate bad head" 2 "L9H0 is outside the model" -- "$HS" ablate "$TOY" --heads L9H0 --repeated 10
expect "ablate bad mode" 2 "mode 'half': expected zero, mean, resample, scale, zero-query, mean-query or stream" -- "$HS" ablate "$TOY" --heads L0H0 --mode half --repeated 10

echo "cli-run: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
