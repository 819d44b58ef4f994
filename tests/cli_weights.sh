#!/usr/bin/env bash
# Command-line behaviour of the weight probes (maps, copy-suppression, dla, qk-spectrum, successor): bad
# relation, prompt and task files get one clear line naming the file, exit code 5 (data), no stack trace and no
# output file left behind; short relations are reported, never skipped silently.
# Usage: cli_weights.sh path/to/headscope
set -u
HS="$1"
EXPECT_MAX_LINES=999  # warnings about skipped relations may precede the error
source "$(dirname "$0")/lib_cli.sh"

for cmd in maps copy-suppression dla qk-spectrum successor; do
  "$HS" "$cmd" --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL $cmd --help has no example"; }
done

if [ -n "$TD" ]; then
  M="$TD/tinystories-656k"
  S="$TD/stories260K/stories260K.bin"
  printf '{"a": 1}' >"$TMP/obj.json"
  expect "relation not a list" 5 "obj.json: object form needs a \"pairs\" list" -- "$HS" maps "$M" --relations "$TMP/obj.json" --out "$TMP/m.h5"
  no_file "$TMP/m.h5"
  printf '[["cat", "dog"], ["one", 2]]' >"$TMP/badpair.json"
  expect "pair not strings" 5 "badpair.json: entry 1 is not a \[source, target\] string pair" -- "$HS" maps "$M" --relations "$TMP/badpair.json" --out "$TMP/m.h5"
  printf 'not json' >"$TMP/nojson.json"
  expect "relation not json" 5 "nojson.json: not valid JSON" -- "$HS" maps "$M" --relations "$TMP/nojson.json" --out "$TMP/m.h5"
  # stories260K's 512-token vocabulary: these words are single tokens, "qwzxvbnmkj" is not.
  printf '[["the", "the"], ["and", "and"], ["qwzxvbnmkj", "qwzxvbnmkj"]]' >"$TMP/short.json"
  expect "too few pairs" 5 "relation 'short' .*short.json.*: 2 of 3 pairs are single tokens, need 30" -- "$HS" maps "$S" --relations "$TMP/short.json" --out "$TMP/m.h5"
  no_file "$TMP/m.h5"
  printf '[["the","a"],["and","with"],["was","said"],["he","she"],["she","he"],["it","you"],["to","on"],["day","day"],["big","big"],["his","her"],["her","his"],["they","you"],["play","play"],["on","in"],["in","on"],["so","so"]]' >"$TMP/words.json"
  # One short relation next to a usable one: the usable one is scored, the short one counted in a warning.
  expect "short relation reported" 0 "warning: relation 'short'.*2 of 3.*skipped" -- "$HS" maps "$S" --relations "$TMP/short.json,$TMP/words.json" --min-pairs 10 --out "$TMP/m.h5" --dynamic --suppression
  printf '[{"prompt": "Once upon a time there was a", "correct": "big", "incorrect": "qwzxvbnmkjhgf"}]' >"$TMP/p.json"
  expect "answer not one token" 5 "p.json: prompt 0: answer 'qwzxvbnmkjhgf' is not a single token" -- "$HS" dla "$S" --prompts "$TMP/p.json" --out "$TMP/d.h5"
  no_file "$TMP/d.h5"
  printf '[{"prompt": "x"}]' >"$TMP/p2.json"
  expect "prompt missing keys" 5 "p2.json: entry 0 has no string \"correct\"" -- "$HS" dla "$S" --prompts "$TMP/p2.json" --out "$TMP/d.h5"
  printf '[{"prompt": "Once upon a time there was a", "correct": "big", "incorrect": "day"}, {"prompt": "Tom and Sue went to", "correct": "the", "incorrect": "a"}]' >"$TMP/ok.json"
  ok "dla" -- "$HS" dla "$S" --prompts "$TMP/ok.json" --out "$TMP/d.h5" --per-position
  ok "copy-suppression" -- "$HS" copy-suppression "$S" --out "$TMP/c.h5" --block-size 100
  printf 'Tom had a ball. Tom gave the ball to Sue. Sue said thank you to Tom and they played with the ball.' >"$TMP/t.txt"
  ok "copy-suppression dynamic" -- "$HS" copy-suppression "$S" --out "$TMP/c2.h5" --n-tokens 50 --text-file "$TMP/t.txt"
  expect "bad n-tokens" 2 "--n-tokens: 99999 tokens: outside" -- "$HS" copy-suppression "$S" --out "$TMP/c3.h5" --n-tokens 99999
  # qk-spectrum: prints the lowest and highest heads, which `top` reads back from the file in the same order.
  ok "qk-spectrum" -- "$HS" qk-spectrum "$S" --out "$TMP/q.h5" --top 3
  check "qk-spectrum prints lowest and highest" -- grep -qE "^lowest +L[0-9]+H[0-9]+ [0-9.]+ " "$TMP/out"
  low=$(awk '/^lowest/ {print $2}' "$TMP/out"); high=$(awk '/^highest/ {print $2}' "$TMP/out")
  "$HS" top "$TMP/q.h5" --probe qk_rank -k 1 >"$TMP/top" 2>/dev/null
  check "top reads qk_rank back (highest)" -- grep -qE "^1 +$high " "$TMP/top"
  "$HS" top "$TMP/q.h5" --probe qk_rank -k 1 --ascending >"$TMP/top" 2>/dev/null
  check "top reads qk_rank back (lowest)" -- grep -qE "^1 +$low " "$TMP/top"
  # --append next to another command's scores of the same model; refused for another model's file.
  ok "qk-spectrum --append" -- "$HS" qk-spectrum "$S" --out "$TMP/c.h5" --append --top 0
  "$HS" top "$TMP/c.h5" --probe copy-suppression -k 1 >/dev/null 2>&1 && "$HS" top "$TMP/c.h5" --probe qk_rank -k 1 >/dev/null 2>&1 \
    && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL qk-spectrum --append lost a group"; }
  expect "qk-spectrum --append, other model" 6 "q.h5" -- "$HS" qk-spectrum "$M" --out "$TMP/q.h5" --append
  expect "qk-spectrum --top negative" 2 "--top -1: need 0 or more" -- "$HS" qk-spectrum "$S" --out "$TMP/q2.h5" --top -1
  no_file "$TMP/q2.h5"
  expect "qk-spectrum no model" 4 "nonexistent" -- "$HS" qk-spectrum "$TMP/nonexistent.bin" --out "$TMP/q2.h5"
  no_file "$TMP/q2.h5"
  # successor: tinystories-656k spells a word as "▁" then the word (the "piece" form): the letters and
  # the digits 1-9 are single tokens, so numbers keeps 8 of its 199 pairs (per-pair skipping) and the
  # other tasks are skipped; each is said so.
  PY=$(bash "$(dirname "$0")/../scripts/find_python.sh" h5py numpy) || { echo "FAIL: no Python with h5py"; exit 1; }
  ROOT="$(cd "$(dirname "$0")/.." && pwd)"
  ok "successor (default tasks)" -- "$HS" successor "$M" --out "$TMP/s.h5" --top 3
  check "successor prints the scored tasks" -- grep -qE "^  L[0-9]+H[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$TMP/out"
  check "successor prints the pairs skipped" -- grep -q "^successor score (33 pairs in 2 tasks; 255 pairs skipped for a multi-token word)" "$TMP/out"
  check "successor prints the heads above 0.4" -- grep -q "^successor heads (score > 0.4): none$" "$TMP/out"
  check "successor reports a skipped task" -- grep -q "task 'days': 0 of 8 words are single tokens, no pair of two: skipped" "$TMP/err"
  check "successor reports skipped pairs" -- grep -q "task 'numbers': 9 of 200 words are single tokens (piece form): 191 of 199 pairs skipped" "$TMP/err"
  check "successor: the file's shapes and attributes" -- "$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1]); g=f['scores/successor']; assert g['task_score'].shape==(2,2,8), g['task_score'].shape; assert list(g.attrs['tasks'])==['numbers','letters']; assert g['successor_rank'].shape==(2,8,33); assert g['successor_head'].shape==(2,8); assert g.attrs['threshold']==0.4; assert g.attrs['embedding']=='reference' and g.attrs['ties']=='success'; assert g.attrs['n_skipped_pairs']==255; assert list(g.attrs['task_skipped_pairs'])==[191,19,9,7,12,6,11,0]" "$TMP/s.h5"
  # The independent check (tests/successor_check.py: test_successor_head.py's lines in numpy, its own BPE).
  ok "successor_check: its BPE against the tokenizer vectors" -- "$PY" "$ROOT/tests/successor_check.py" "$M" --self-test "$TD/tokenizer_vectors.json"
  ok "successor_check: the default run agrees with the reference lines" -- "$PY" "$ROOT/tests/successor_check.py" "$M" "$TMP/s.h5"
  ok "successor --embedding headscope --ties fail" -- "$HS" successor "$M" --embedding headscope --ties fail --out "$TMP/s-former.h5" --top 0
  ok "successor_check: headscope's options agree" -- "$PY" "$ROOT/tests/successor_check.py" "$M" "$TMP/s-former.h5" --embedding headscope --ties fail
  check "successor_check: the two representations differ on the fixture" -- bash -c "! \"$PY\" \"$ROOT/tests/successor_check.py\" \"$M\" \"$TMP/s-former.h5\" >/dev/null"
  # A planted copy (L1H3 a successor head on a task file with a wrap-around and a multi-token pair, L1H5
  # zeroed): heads above 0.4, the wrap and ties, each checked against the reference lines.
  printf '{"letter_cycle": ["A","B","C","D","E","F","G","H","A"], "digits": ["1","2","3","4","5","6","7","8","9"], "teens": ["8","9","10","11"]}' >"$TMP/cycle.json"
  ok "successor_check --plant" -- "$PY" "$ROOT/tests/successor_check.py" "$M" --tasks "$TMP/cycle.json" --plant "$TMP/planted"
  for ties in success fail; do
    ok "successor on the planted copy (ties $ties)" -- "$HS" successor "$TMP/planted" --tasks "$TMP/cycle.json" --ties $ties --out "$TMP/p-$ties.h5" --top 2
    ok "successor_check: planted, ties $ties" -- "$PY" "$ROOT/tests/successor_check.py" "$TMP/planted" "$TMP/p-$ties.h5" --tasks "$TMP/cycle.json" --ties $ties
  done
  check "planted: the successor head and the zeroed head (ties succeed) pass 0.4" -- "$PY" -c "import h5py,sys; g=h5py.File(sys.argv[1])['scores/successor']; assert list(g.attrs['successor_heads'])==['L1H3','L1H5'], g.attrs['successor_heads']; assert g['score'][1,3]==1.0 and g['score'][1,5]==1.0; assert g['successor_head'][()].sum()==2; assert list(g.attrs['task_skipped_pairs'])==[0,0,2]; assert list(g['target_tokens'][()])[7]==list(g['source_tokens'][()])[0]" "$TMP/p-success.h5"
  check "planted: with --ties fail only the successor head passes" -- "$PY" -c "import h5py,sys; g=h5py.File(sys.argv[1])['scores/successor']; assert list(g.attrs['successor_heads'])==['L1H3']; assert g['score'][1,5]==0.0" "$TMP/p-fail.h5"
  ok "successor report" -- "$HS" report "$TMP/s.h5" --out "$TMP/s.html"
  check "report: the successor per-task table and the skipped tasks" -- grep -q "<td>numbers</td><td>200</td><td>piece</td>.*<td>letters</td><td>26</td><td>piece</td>.*days (0 of 8 words single tokens)" "$TMP/s.html"
  "$HS" successor "$M" --print-tasks >"$TMP/tasks.json" 2>/dev/null
  check "successor --print-tasks: days wrap" -- grep -qzE '"days": \[[^]]*"Sunday",[^]]*"Monday"' "$TMP/tasks.json"
  check "successor --print-tasks is a task file" -- "$HS" successor "$M" --tasks "$TMP/tasks.json" --out "$TMP/s2.h5" --top 0
  check "successor --tasks FILE = the default" -- "$PY" -c "import h5py,sys,numpy as np; a=h5py.File(sys.argv[1])['scores/successor/score'][()]; b=h5py.File(sys.argv[2])['scores/successor/score'][()]; assert np.array_equal(a,b)" "$TMP/s.h5" "$TMP/s2.h5"
  printf '{"days": ["Monday", "Tuesday"]}' >"$TMP/multi.json"
  expect "successor: no single-token pair" 5 "multi.json: no task has a pair of single-token words" -- "$HS" successor "$M" --tasks "$TMP/multi.json" --out "$TMP/s3.h5"
  no_file "$TMP/s3.h5"
  printf '{}' >"$TMP/empty.json"
  expect "successor: empty task list" 5 "empty.json: no tasks" -- "$HS" successor "$M" --tasks "$TMP/empty.json" --out "$TMP/s3.h5"
  printf '{"a": ["x", "y"' >"$TMP/trunc.json"
  expect "successor: truncated JSON" 5 "trunc.json:1: not valid JSON" -- "$HS" successor "$M" --tasks "$TMP/trunc.json" --out "$TMP/s3.h5"
  printf '{"a": ["x", "y", "x", "z"]}' >"$TMP/twice.json"
  expect "successor: a repeat that is not a wrap" 5 "twice.json: task \"a\" lists \"x\" twice" -- "$HS" successor "$M" --tasks "$TMP/twice.json" --out "$TMP/s3.h5"
  no_file "$TMP/s3.h5"
  expect "successor: bad embedding" 2 "--embedding: 'foo' is not reference, headscope, effective or raw" -- "$HS" successor "$M" --embedding foo --out "$TMP/s3.h5"
  expect "successor: bad ties" 2 "--ties: 'maybe' is not success or fail" -- "$HS" successor "$M" --ties maybe --out "$TMP/s3.h5"
  expect "successor: bad threshold" 2 "--threshold" -- "$HS" successor "$M" --threshold 2 --out "$TMP/s3.h5"
  no_file "$TMP/s3.h5"
  expect "successor: no --out" 2 "--out is required" -- "$HS" successor "$M"
else
  echo "skipped the test-data checks: ../shared/testdata not found"
fi
echo "cli-weights: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
