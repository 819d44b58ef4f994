#!/usr/bin/env bash
# AttentionInfluence on the command line (`headscope influence`): on the CI toy recall model (its
# training log proves L1H0, L1H1, L1H2 carry recall), masking those heads with the last-token loss ranks
# the 16 rows that end in a recall answer above the 16 that end in filler (>= 14 of the top 16
# selected); the file's scores are (masked - loss) / loss of its own losses; `export --table influence`
# writes the ranked table; the report draws the section; --from/--top takes the heads from a score
# file (a detect result, and a retrieval scan: the paper's route, whose top 3 on the toy are the recall heads); two shards merged equal the unsharded run and --resume keeps finished chunks; --masking (the
# default zero-query, and zero) is recorded and a resume or merge across maskings is refused;
# --select-by samples (the default, the paper's top 20% of samples) and tokens each select the samples a
# recomputation from the file's rank and lengths selects; tests/influence_check.py (the reference lines in float64 torch) agrees with the
# file's losses, scores and selection for both maskings and both losses; bad corpora and flags are one line, the documented exit code, and no file left behind.
# Usage: cli_influence.sh path/to/headscope
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
cd "$(dirname "$0")/.."
EXPECT_MAX_LINES=3  # the corpus line's error may follow a progress line
source tests/lib_cli.sh
TOY="$(ci_toy recall)" || { echo "FAIL: no toy recall model"; exit 1; }
PY=$(bash scripts/find_python.sh h5py numpy) || { echo "FAIL: no Python with h5py"; exit 1; }
C=datasets/examples/toy-recall-influence.jsonl

"$HS" influence --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL influence --help has no example"; }
"$HS" influence --help | grep -q -- "^Example: .*--masking zero --select-by samples" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL influence --help has no --masking example"; }
ok "influence (toy, recall heads, last token)" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0,L1H1,L1H2 --loss-tokens last \
  --select-fraction 0.5 --random-controls 3 --out "$TMP/i.h5"
check "prints the heads and 3 controls" -- grep -qE "^heads +L1H0,L1H1,L1H2 +mean score" "$TMP/out"
check "prints the masking" -- grep -q "heads masked by zero-query$" "$TMP/out"
check "prints the selection" -- grep -qE "^selected 16 of 32 samples, 1040 of 2080 tokens \(the top 0.5 by samples\)$" "$TMP/out"
check "the ranking selects the recall rows" -- "$PY" -c "
import h5py, numpy as np, sys
f = h5py.File(sys.argv[1]); g = f['influence']
s, loss, ml, sel = g['score'][()], g['loss'][()], g['masked_loss'][()], g['selected'][()]
assert s.shape == (4, 32) and g['masks'].shape == (4, 2, 4), s.shape
assert np.allclose(s, (ml - loss[None]) / loss[None], rtol=1e-6, atol=0)
n = int(sel[0::2].sum()); print('recall rows selected:', n, 'of', int(sel.sum()))
assert sel.sum() == 16 and n >= 14
assert list(g['rank'][()][:1]) == [int(np.argmax(s[0]))]
assert g.attrs['masking'] == 'zero-query' and g.attrs['select_by'] == 'samples' and g.attrs['select_fraction'] == 0.5, dict(g.attrs)
" "$TMP/i.h5"
# --masking zero (z = 0): the same losses unmasked, other masked losses, recorded; both maskings rank the recall rows first.
ok "influence --masking zero --select-by samples" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0,L1H1,L1H2 --loss-tokens last \
  --select-fraction 0.5 --random-controls 3 --masking zero --select-by samples --out "$TMP/iz.h5"
check "zero: recorded, same unmasked losses, other masked ones" -- "$PY" -c "
import h5py, numpy as np, sys
a, b = h5py.File(sys.argv[1])['influence'], h5py.File(sys.argv[2])['influence']
assert b.attrs['masking'] == 'zero' and b.attrs['select_by'] == 'samples', dict(b.attrs)
assert 'HeadKV' in a.attrs['masking_description'] and 'output z' in b.attrs['masking_description']
assert np.array_equal(a['loss'][()], b['loss'][()])
assert np.abs(a['masked_loss'][()] - b['masked_loss'][()]).max() > 1e-3
sel = b['selected'][()]; assert sel.sum() == 16 and sel[0::2].sum() >= 14
" "$TMP/i.h5" "$TMP/iz.h5"
# Selection by tokens on samples of unequal lengths: the file's selection is the shortest prefix of its
# rank whose summed lengths reach the share (the sample that reaches it kept whole); by samples, ceil(f n).
"$PY" -c "
import random
random.seed(3)
for i in range(12): print('{\"tokens\": [%s]}' % ', '.join(str(random.randrange(1, 20)) for _ in range(random.randrange(3, 40))))
" >"$TMP/uneven.jsonl"
ok "influence --select-by tokens (uneven lengths)" -- "$HS" influence "$TOY" --corpus "$TMP/uneven.jsonl" --heads L1H0,L1H1,L1H2 \
  --random-controls 0 --select-fraction 0.4 --select-by tokens --out "$TMP/t.h5"
ok "influence --select-by samples (uneven lengths, the default)" -- "$HS" influence "$TOY" --corpus "$TMP/uneven.jsonl" --heads L1H0,L1H1,L1H2 \
  --random-controls 0 --select-fraction 0.4 --out "$TMP/t2.h5"
check "token share and sample share as recomputed from the files" -- "$PY" -c "
import h5py, json, math, numpy as np, sys
g, h = h5py.File(sys.argv[1])['influence'], h5py.File(sys.argv[2])['influence']
lens = [len(json.loads(l)['tokens']) for l in open(sys.argv[3])]
assert list(g['length'][()]) == lens, (list(g['length'][()]), lens)
want, acc = set(), 0
for i in g['rank'][()]:
    if acc >= 0.4 * sum(lens): break
    want.add(int(i)); acc += lens[i]
got = set(int(i) for i in np.nonzero(g['selected'][()])[0])
assert got == want, (got, want)
assert g.attrs['tokens_selected'] == acc and g.attrs['tokens_done'] == sum(lens)
assert set(int(i) for i in np.nonzero(h['selected'][()])[0]) == set(int(i) for i in h['rank'][()][:math.ceil(0.4 * 12)])
print('tokens: %d samples, %d of %d tokens; samples: %d' % (len(got), acc, sum(lens), h['selected'][()].sum()))
" "$TMP/t.h5" "$TMP/t2.h5" "$TMP/uneven.jsonl"
# The independent harness (tests/influence_check.py: modeling_llama.py's forward in float64 with the heads
# masked as HeadKV's lines 554-557 do, or z = 0; the paper's score; the selection) against the files.
PYT=$(bash scripts/find_python.sh h5py numpy torch) || { echo "FAIL: no Python with h5py, numpy and torch for tests/influence_check.py"; fail=$((fail+1)); }
for mk in zero-query zero; do for lt in all last; do
  ok "influence --masking $mk --loss-tokens $lt (uneven lengths)" -- "$HS" influence "$TOY" --corpus "$TMP/uneven.jsonl" \
    --heads L1H0,L1H1,L1H2 --random-controls 0 --select-fraction 0.4 --masking $mk --loss-tokens $lt --out "$TMP/c-$mk-$lt.h5"
  [ -n "$PYT" ] && check "the reference harness agrees ($mk, $lt)" -- "$PYT" tests/influence_check.py "$TOY" "$TMP/uneven.jsonl" "$TMP/c-$mk-$lt.h5"
done; done
ok "export --table influence" -- "$HS" export "$TMP/i.h5" --table influence --format csv --out "$TMP/i.csv"
check "the table is ranked, one row a sample" -- "$PY" -c "
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 32 and rows[0]['rank'] == '1'
assert all(float(a['score']) >= float(b['score']) for a, b in zip(rows, rows[1:]))
" "$TMP/i.csv"
ok "report" -- "$HS" report "$TMP/i.h5" --out "$TMP/i.html"
check "report draws the AttentionInfluence section" -- grep -q "AttentionInfluence</h2>" "$TMP/i.html"
# Heads from a score file: a detect result's top 2.
ok "detect for --from" -- "$HS" detect "$TOY" --out "$TMP/d.h5"
ok "influence --from --top" -- "$HS" influence "$TOY" --corpus "$C" --from "$TMP/d.h5:scores/induction/score" --top 2 --out "$TMP/i2.h5"
check "--from recorded" -- "$PY" -c "import h5py,sys; a=h5py.File(sys.argv[1])['influence'].attrs['heads_source']; assert 'top 2 of' in str(a), a" "$TMP/i2.h5"
# The paper's route to its heads: a retrieval scan (Wu et al.'s copy-paste score) first, its top 3 then
# masked. On the toy the scan ranks the recall heads L1H0, L1H1, L1H2 first, so the run equals the named one.
ok "retrieval scan for --from" -- "$HS" retrieval "$TOY" --haystack datasets/needles/toy_recall_haystack.txt \
  --needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' --lengths 24 --max-new-tokens 1 --out "$TMP/scan.h5"
ok "influence --from the scan --top 3" -- "$HS" influence "$TOY" --corpus "$C" --from "$TMP/scan.h5:scores/retrieval/score" --top 3 \
  --loss-tokens last --select-fraction 0.5 --random-controls 3 --out "$TMP/i3.h5"
check "the scan's top 3 are the recall heads; the same scores as --heads" -- "$PY" -c "
import h5py, numpy as np, sys
a, b = h5py.File(sys.argv[1])['influence'], h5py.File(sys.argv[2])['influence']
assert b.attrs['heads'][0] == 'L1H0,L1H1,L1H2', b.attrs['heads']
assert np.array_equal(a['score'][()][0], b['score'][()][0]) and np.array_equal(a['selected'][()], b['selected'][()])
" "$TMP/i.h5" "$TMP/i3.h5"

# Detection built in (the paper's route, --detect): Wu's retrieval score on the key -> value task (the
# toy recall rows on the toy vocabulary), its top share masked; on the toy the top 3 (0.375 of 8 heads)
# are the recall heads, the file keeps the score and the task, and the run equals the one naming them.
ok "influence --detect" -- "$HS" influence "$TOY" --corpus "$C" --detect --detect-trials 100 --top-share 0.375 \
  --loss-tokens last --select-fraction 0.5 --random-controls 3 --out "$TMP/idet.h5"
check "prints the detected heads" -- grep -qE "^detected L1H0,L1H1,L1H2: the top 0.375 of 8 heads \(3\) by the retrieval score on 100 key -> value trials \(toy-recall" "$TMP/out"
check "--detect: the score and the task kept; equal to --heads, bit for bit" -- "$PY" -c "
import h5py, numpy as np, sys
a, b = h5py.File(sys.argv[1])['influence'], h5py.File(sys.argv[2])['influence']
assert b.attrs['heads'][0] == 'L1H0,L1H1,L1H2', b.attrs['heads']
assert b['detect_score'].shape == (2, 4) and 'detect_score' not in a
s = b['detect_score'][()]; top = sorted(np.argsort(-s.ravel(), kind='stable')[:3]); assert list(top) == [4, 5, 6], s
assert b.attrs['top_share'] == 0.375 and b.attrs['detect_trials'] == 100 and b.attrs['detect_format'] == 'toy-recall', dict(b.attrs)
assert b.attrs['detect_passed'] >= 90
for k in ['loss', 'masked_loss', 'score', 'rank', 'selected', 'masks', 'n_tokens']:
    assert np.array_equal(a[k][()], b[k][()]), k
" "$TMP/i.h5" "$TMP/idet.h5"
# A resume compares the detection's settings (here the same two heads, L1H0 and L1H1, from 100 or 50 trials).
ok "influence --detect, top 2" -- "$HS" influence "$TOY" --corpus "$C" --detect --detect-trials 100 --top-share 0.25 --random-controls 0 --out "$TMP/idet2.h5"
expect "resume a --detect file with other detection settings" 6 "--resume: another run's file \(detect_trials: 100 vs 50\)" -- "$HS" influence "$TOY" \
  --corpus "$C" --detect --detect-trials 50 --top-share 0.25 --random-controls 0 --resume --out "$TMP/idet2.h5"

# Shards and resume: two shards (chunks of 5 samples) merged equal the unsharded run bit for bit;
# --resume of a finished file computes nothing and changes nothing; another run's file is refused.
A=("$TOY" --corpus "$C" --heads L1H0,L1H1,L1H2 --random-controls 2 --chunk 5)
ok "unsharded, chunks of 5" -- "$HS" influence "${A[@]}" --out "$TMP/u.h5"
ok "shard 0/2" -- "$HS" influence "${A[@]}" --shard 0/2 --out "$TMP/s0.h5"
ok "shard 1/2" -- "$HS" influence "${A[@]}" --shard 1/2 --out "$TMP/s1.h5"
check "a shard holds its own chunks only" -- "$PY" -c "
import h5py, sys; d = h5py.File(sys.argv[1])['influence/done'][()]
assert list(d) == [1 if (i // 5) % 2 == 0 else 0 for i in range(32)], list(d)
assert h5py.File(sys.argv[1])['influence'].attrs['complete'] == 1" "$TMP/s0.h5"
ok "merge" -- "$HS" merge "$TMP/s0.h5" "$TMP/s1.h5" --out "$TMP/m.h5"
check "merged == unsharded" -- "$PY" -c "
import h5py, numpy as np, sys
a, b = h5py.File(sys.argv[1])['influence'], h5py.File(sys.argv[2])['influence']
for k in ['loss', 'masked_loss', 'score', 'rank', 'selected', 'done', 'n_tokens']:
    assert np.array_equal(a[k][()], b[k][()]), k
assert b.attrs['shard'] == 'merged'" "$TMP/u.h5" "$TMP/m.h5"
expect "merge: a shard given twice" 6 "shard 0/2 given twice" -- "$HS" merge "$TMP/s0.h5" "$TMP/s0.h5" --out "$TMP/m2.h5"
no_file "$TMP/m2.h5"
ok "shard 1/2, masking zero" -- "$HS" influence "${A[@]}" --shard 1/2 --masking zero --out "$TMP/s1z.h5"
expect "merge: shards of two maskings" 6 "a shard of another influence run .*\(masking: zero-query vs zero\)" -- "$HS" merge "$TMP/s0.h5" "$TMP/s1z.h5" --out "$TMP/m2.h5"
no_file "$TMP/m2.h5"
ok "resume a finished file" -- "$HS" influence "${A[@]}" --resume --out "$TMP/u.h5"
check "resume computed nothing" -- grep -q "(0 forwards)" "$TMP/err"
check "resume changed nothing" -- "$PY" -c "
import h5py, numpy as np, sys
a, b = h5py.File(sys.argv[1])['influence'], h5py.File(sys.argv[2])['influence']
assert np.array_equal(a['score'][()], b['score'][()])" "$TMP/u.h5" "$TMP/m.h5"
expect "resume another run's file" 6 "--resume: another run's file \(heads" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0 --chunk 5 --resume --out "$TMP/u.h5"
expect "resume with another masking" 6 "--resume: another run's file \(masking: zero-query vs zero\)" -- "$HS" influence "${A[@]}" --masking zero --resume --out "$TMP/u.h5"

# Bad input: one line, exit code, nothing left.
printf '{"text": "1a2b"}\nnot json\n' >"$TMP/bad.jsonl"
expect "corpus line not JSON" 5 "bad.jsonl:2: not a JSON object" -- "$HS" influence "$TOY" --corpus "$TMP/bad.jsonl" --heads L1H0 --out "$TMP/b.h5"
no_file "$TMP/b.h5"
# The corpus is read before --detect decodes its trials (800 of up to 4096 tokens take hours on a CPU):
# a bad corpus is refused with no detection run (no "detected" line).
out=$("$HS" influence "$TOY" --corpus "$TMP/bad.jsonl" --detect --detect-trials 100 --out "$TMP/b.h5" 2>&1); rc=$?
if [ "$rc" -eq 5 ] && grep -q "bad.jsonl:2: not a JSON object" <<<"$out" && ! grep -q "^detected" <<<"$out"; then
  pass=$((pass+1))
else
  fail=$((fail+1)); echo "FAIL a bad corpus with --detect is refused before the detection: exit $rc, output: $out"
fi
no_file "$TMP/b.h5"
printf '{"words": 3}\n' >"$TMP/notext.jsonl"
expect "corpus line without text" 5 "notext.jsonl:1: has neither a string \"text\" nor a list \"tokens\"" -- "$HS" influence "$TOY" --corpus "$TMP/notext.jsonl" --heads L1H0 --out "$TMP/b.h5"
no_file "$TMP/b.h5"
printf '{"tokens": [1, 9999]}\n' >"$TMP/range.jsonl"
expect "token id out of range" 5 "range.jsonl:1: token id 9999 out of range" -- "$HS" influence "$TOY" --corpus "$TMP/range.jsonl" --heads L1H0 --out "$TMP/b.h5"
: >"$TMP/empty.jsonl"
expect "empty corpus" 5 "empty.jsonl: no samples" -- "$HS" influence "$TOY" --corpus "$TMP/empty.jsonl" --heads L1H0 --out "$TMP/b.h5"
expect "missing corpus" 5 "nope.jsonl" -- "$HS" influence "$TOY" --corpus "$TMP/nope.jsonl" --heads L1H0 --out "$TMP/b.h5"
expect "no heads" 2 "give --detect, --heads, or --from FILE.h5:DATASET with --top K" -- "$HS" influence "$TOY" --corpus "$C" --out "$TMP/b.h5"
expect "head outside the model" 2 "--heads" -- "$HS" influence "$TOY" --corpus "$C" --heads L9H0 --out "$TMP/b.h5"
expect "--heads with --from" 2 "excludes" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0 --from "$TMP/d.h5:scores/induction/score" --top 1 --out "$TMP/b.h5"
expect "bad --loss-tokens" 2 "--loss-tokens" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0 --loss-tokens first --out "$TMP/b.h5"
expect "bad --masking" 2 "headscope: error: --masking: 'mean': expected zero-query or zero$" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0 --masking mean --out "$TMP/b.h5"
expect "bad --select-by" 2 "headscope: error: --select-by: 'words': expected tokens or samples$" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0 --select-by words --out "$TMP/b.h5"
expect "--select-fraction above 1" 2 "--select-fraction" -- "$HS" influence "$TOY" --corpus "$C" --heads L1H0 --select-fraction 1.5 --out "$TMP/b.h5"
expect "--top too large" 2 "--top: 99 is more than the model's 8 heads" -- "$HS" influence "$TOY" --corpus "$C" --from "$TMP/d.h5:scores/induction/score" --top 99 --out "$TMP/b.h5"
no_file "$TMP/b.h5"
echo "cli-influence: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
