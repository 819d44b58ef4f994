#!/usr/bin/env bash
# `retrieval --config STUDY.yaml`: the shipped study file runs the same trials, to the digit, as the
# command line it spells; an option on the command line wins over the file's; --print-config writes
# a command line as a study file that reruns it; the file's text is kept in /meta; bad study files
# get one line naming the file (and line), exit 3, and no output.
# Usage: cli_study.sh path/to/headscope
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
S="$ROOT/datasets/needles/toy-recall-study.yaml"
check "shipped study file" -- test -s "$S"

if [ -z "$TD" ]; then
  echo "skipped: ../shared/testdata not found"
  echo "cli-study: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
fi
# The study file names its paths from the repository root, as a user runs it there (models/toy-recall:
# the CI toy recall model, trained once per build tree).
W="$TMP/repo"; mkdir -p "$TMP/shared" "$W/models"
ln -s "$(cd "$TD" && pwd)" "$TMP/shared/testdata"; ln -s "$ROOT/datasets" "$W/datasets"
ln -s "$(ci_toy recall)" "$W/models/toy-recall"
cd "$W"
N=datasets/needles
LINE=(models/toy-recall --haystack $N/toy_recall_haystack.txt --needles $N/toy_recall_needles.jsonl
      --template '{context}?{question}' --lengths 24,40,56,72 --max-new-tokens 1 --seed 1 --ablate-top 3
      --random-controls 3 --ablation-scope decode --stream-sweep --order locos --sink 1 --recent 4
      --full-fractions 0,0.25,0.5,1)

# bad study files first (cheap): exit 3, one line naming the file and where
printf 'model: x\nlenghts: [300]\n' >bad1.yaml
expect "unknown key" 3 "bad1.yaml:2:1: 'lenghts' is not an option of .headscope retrieval. \(did you mean 'lengths'\?\)" -- "$HS" retrieval --config bad1.yaml --out o.h5
no_file o.h5
printf 'lengths:\n  a: 1\n' >bad2.yaml
expect "mapping value" 3 "bad2.yaml:2:3: 'lengths' takes a value or a list, not a mapping" -- "$HS" retrieval --config bad2.yaml --out o.h5
printf 'no-prefix-reuse: maybe\n' >bad3.yaml
expect "flag value" 3 "bad3.yaml:1:18: 'no-prefix-reuse' is a flag: true or false" -- "$HS" retrieval --config bad3.yaml --out o.h5
printf 'lengths: [300\n' >bad4.yaml
expect "YAML syntax" 3 "bad4.yaml:[0-9]+:[0-9]+: " -- "$HS" retrieval --config bad4.yaml --out o.h5
printf -- '- lengths\n' >bad5.yaml
expect "not a mapping" 3 "bad5.yaml: a study file is a mapping of option names to values" -- "$HS" retrieval --config bad5.yaml --out o.h5
printf 'seed: 1\nseed: 2\n' >bad6.yaml
expect "twice" 3 "bad6.yaml:2:1: 'seed' is given twice" -- "$HS" retrieval --config bad6.yaml --out o.h5
printf 'config: other.yaml\n' >bad7.yaml
expect "config in config" 3 "bad7.yaml:1:1: 'config' is not an option" -- "$HS" retrieval --config bad7.yaml --out o.h5
printf 'seed:\n' >bad8.yaml
expect "empty value" 3 "bad8.yaml:1:1: 'seed' has no value" -- "$HS" retrieval --config bad8.yaml --out o.h5
expect "missing file" 5 "nope.yaml" -- "$HS" retrieval --config nope.yaml --out o.h5
printf 'max-new-tokens: 0\n' >bad9.yaml
expect "value checked as on the command line" 2 "max-new-tokens" -- "$HS" retrieval models/toy-recall --config bad9.yaml --out o.h5
printf 'depths: [0, 50]\n' >partial.yaml
expect "model still required" 2 "model is required" -- "$HS" retrieval --config partial.yaml --out o.h5
expect "another command" 2 "--config" -- "$HS" detect --config "$S" --out o.h5
no_file o.h5

# --print-config: the options given, as a study file; the command line wins over the file
ok "print-config" -- "$HS" retrieval --config "$S" --lengths 40 --seed 7 --print-config
cp "$TMP/out" printed.yaml
check "printed: the command line's lengths" -- grep -qx "lengths: 40" printed.yaml
check "printed: the file's fractions" -- grep -qx "full-fractions: 0,0.25,0.5,1" printed.yaml
check "printed: the command line's seed" -- grep -qx "seed: 7" printed.yaml
check "printed: a flag" -- grep -qx "stream-sweep: true" printed.yaml
check "printed: the template" -- grep -qF 'template: "{context}?{question}"' printed.yaml

# the same study three ways: the shipped file, the command line it spells, that line's --print-config
ok "study file" -- "$HS" retrieval --config "$S" --out a.h5
grep -v '^wrote' "$TMP/out" >a.txt
ok "command line" -- "$HS" retrieval "${LINE[@]}" --out b.h5
grep -v '^wrote' "$TMP/out" >b.txt
ok "command line printed" -- "$HS" retrieval "${LINE[@]}" --print-config
cp "$TMP/out" line.yaml
ok "printed study" -- "$HS" retrieval --config line.yaml --out c.h5
check "summary: file = command line" -- cmp -s a.txt b.txt
for f in a b c; do
  "$HS" export $f.h5 --table scores/retrieval --format csv >$f-r.csv 2>/dev/null
  "$HS" export $f.h5 --table scores/locos --format csv >$f-l.csv 2>/dev/null
done
check "retrieval scores: file = command line" -- cmp -s a-r.csv b-r.csv
check "locos scores: file = command line" -- cmp -s a-l.csv b-l.csv
check "scores: printed study = command line" -- cmp -s c-l.csv b-l.csv
check "scores: a row a head" -- test "$(grep -c '^locos,' a-l.csv)" -eq 8
if command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  check "/meta study_config holds the file" -- /usr/bin/python3 - a.h5 b.h5 "$S" <<'PY'
import sys, h5py
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
text = open(sys.argv[3]).read()
got = a["meta"].attrs["study_config"]
got = got.decode() if isinstance(got, bytes) else got
assert got == text, "study_config differs from the file"
assert "study_config" not in b["meta"].attrs, "a command-line run has no study_config"
import numpy as np
for ds in ("accuracy", "kv_budget", "masks", "order"):
    assert np.array_equal(a["retrieval/streaming/" + ds][()], b["retrieval/streaming/" + ds][()]), ds
assert np.array_equal(a["retrieval/ablation/accuracy"][()], b["retrieval/ablation/accuracy"][()])
PY
fi

echo "cli-study: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
