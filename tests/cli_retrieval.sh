#!/usr/bin/env bash
# retrieval on the command line: bad input gets one clear line, a documented exit code and no
# output file; runs on stories260K and tinystories-656k with a TinyStories haystack write a file
# that top/export read; the --help example runs as written.
# Usage: cli_retrieval.sh path/to/headscope
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
N="$ROOT/datasets/needles"

"$HS" retrieval --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL retrieval --help has no example"; }
for f in haystack.txt needles.jsonl tinystories_haystack.txt tinystories_needles.jsonl toy_recall_haystack.txt toy_recall_needles.jsonl; do
  check "shipped $f" -- test -s "$N/$f"
done

if [ -z "$TD" ]; then
  echo "skipped the test-data checks: ../shared/testdata not found"
  echo "cli-retrieval: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
fi
TD="$(cd "$TD" && pwd)"
M="$TD/stories260K/stories260K.bin"
O="$TMP/r.h5"
H=(--haystack "$N/tinystories_haystack.txt" --needles "$N/tinystories_needles.jsonl")

expect "depth range" 2 "depths: 120 is outside \[0, 100\]" -- "$HS" retrieval "$M" "${H[@]}" --lengths 60 --depths 0,120 --out "$O"
no_file "$O"
expect "template" 2 "template: has no \{question\}" -- "$HS" retrieval "$M" "${H[@]}" --lengths 60 --template '{context} Answer:' --out "$O"
no_file "$O"
expect "length beyond context" 2 "--lengths: length 600: .* beyond the model's context of 512" -- "$HS" retrieval "$M" "${H[@]}" --lengths 600 --out "$O"
no_file "$O"
expect "both length options" 2 "at most one of --lengths and --lengths-range" -- "$HS" retrieval "$M" "${H[@]}" --lengths 60 --lengths-range 40:80:3 --out "$O"
expect "unknown score" 2 "unknown score 'copy'" -- "$HS" retrieval "$M" "${H[@]}" --score retrieval,copy --out "$O"
expect "bad ablation" 2 "ablation 'mean': expected zero-query, mean-query, zero or stream" -- "$HS" retrieval "$M" "${H[@]}" --ablate L0H0 --ablation mean --out "$O"
expect "bad head" 2 "L9H0 is outside the model" -- "$HS" retrieval "$M" "${H[@]}" --lengths 60 --ablate L9H0 --out "$O"
no_file "$O"
printf '{"needle": "Lily had a pet frog named Pip and she loved him very much every single day.", "question": "Lily had a pet frog named", "answer": "Pip"}\n' >"$TMP/long.jsonl"
expect "needle longer than context" 5 "long.jsonl:1: the needle has [0-9]+ tokens, no shorter than the context length 8" -- "$HS" retrieval "$M" --haystack "$N/tinystories_haystack.txt" --needles "$TMP/long.jsonl" --lengths 8 --out "$O"
no_file "$O"
printf '{"needle": "Lily had a frog.", "question": "q", "answer": "Pip"}\n' >"$TMP/ans.jsonl"
expect "answer not in needle" 5 "ans.jsonl:1: the answer \"Pip\" is not in the needle" -- "$HS" retrieval "$M" --haystack "$N/tinystories_haystack.txt" --needles "$TMP/ans.jsonl" --lengths 60 --out "$O"
no_file "$O"
printf '{"needle": "Lily had a frog.", "question": "q", "answer": "frog"}\n{"needle": "Pip was a frog.", "question": "q", "answer": "frog Pip"}\n' >"$TMP/span.jsonl"
expect "answer not locatable" 5 "span.jsonl:2: the answer \"frog Pip\" is not in the needle's decoded tokens" -- "$HS" retrieval "$M" --haystack "$N/tinystories_haystack.txt" --needles "$TMP/span.jsonl" --lengths 60 --out "$O"
no_file "$O"
expect "bad stop rule" 2 "stop: stop rule 'newlines': expected newline, eos, none, wu or locos" -- "$HS" retrieval "$M" "${H[@]}" --stop newlines --out "$O"
expect "bad ablation scope" 2 "ablation-scope: ablation scope 'prefill': expected all or decode" -- "$HS" retrieval "$M" "${H[@]}" --ablate L0H0 --ablation-scope prefill --out "$O"
no_file "$O"
printf '{"needle": "Lily had a frog.", "question": "q", "answer": "frog"}\nnot json\n' >"$TMP/bad.jsonl"
expect "bad needles line" 5 "bad.jsonl:2: not a JSON object" -- "$HS" retrieval "$M" --haystack "$N/tinystories_haystack.txt" --needles "$TMP/bad.jsonl" --lengths 60 --out "$O"
no_file "$O"
printf '  \n\n' >"$TMP/empty.txt"
expect "empty haystack" 5 "empty.txt: the haystack is empty" -- "$HS" retrieval "$M" --haystack "$TMP/empty.txt" --needles "$N/tinystories_needles.jsonl" --lengths 60 --out "$O"
no_file "$O"
expect "missing haystack" 5 "nope.txt" -- "$HS" retrieval "$M" --haystack "$TMP/nope.txt" --needles "$N/tinystories_needles.jsonl" --lengths 60 --out "$O"
no_file "$O"
expect "from without top" 2 "--from needs --ablate-top" -- "$HS" retrieval "$M" "${H[@]}" --from x.h5:scores/locos/score --out "$O"

# stories260K: a full run with ablation of the top LOCOS heads and controls; top/export read it.
# The model continues the needle's sentence (3 of 18 trials pass with this template).
ok "stories260K run" -- "$HS" retrieval "$M" "${H[@]}" --template '{context} {question}' --lengths 80,160 --depths 0,50,100 --max-new-tokens 6 \
  --ablate-top 2 --random-controls 2 --out "$O"
cp "$TMP/out" "$TMP/out.run"
check "summary" -- grep -qE '^locos +(L[0-9]+H[0-9]+ -?[0-9.]+ ){4}L[0-9]+H[0-9]+ -?[0-9.]+$' "$TMP/out"
check "ablation lines" -- test "$(grep -c '^ablation' "$TMP/out")" -eq 3
ok "top locos" -- "$HS" top "$O" --probe locos -k 3
ok "top retrieval" -- "$HS" top "$O" --probe retrieval -k 3
ok "export" -- "$HS" export "$O" --table scores/locos --format csv
check "export rows" -- test "$(grep -c '^locos,' "$TMP/out")" -eq $((5 * 8))
check "passing trials" -- grep -q '^trials 18, passed [1-9]' "$TMP/out.run"
# The default rows (--batch auto --sweep-rows auto: a length's trials, times the head sets) change time,
# never a token: the run above equals one trial and one set a forward, every token, response and
# pass the same, scores within folded GEMMs' last bits (1e-5 of each dataset's largest value, as
# tests/test_needle.cpp's kBatchRelTol; measured 1.2e-7 on locos), and the log says what it chose.
"$HS" -v retrieval "$M" "${H[@]}" --template '{context} {question}' --lengths 80,160 --depths 0,50,100 --max-new-tokens 6 \
  --ablate-top 2 --random-controls 2 --out "$TMP/auto.h5" 2>"$TMP/auto.err" >/dev/null
check "auto batching logged" -- grep -qE 'batching: --batch ([2-9]|1[0-6]) \(auto: .*--sweep-rows [0-9]+ \(auto: ([2-9]|1[0-6]) x 3 head sets' "$TMP/auto.err"
# The log counts the decode forwards (headscope's time per decode step, scripts/bench_needle_study.sh):
# with --stop none and one trial a forward, 9 trials of 4 steps each.
"$HS" -v retrieval "$M" "${H[@]}" --template '{context} {question}' --lengths 80 --depths 0,50,100 --max-new-tokens 4 \
  --stop none --batch 1 --out "$TMP/fw.h5" 2>"$TMP/fw.err" >/dev/null
check "decode forwards logged (9 trials x 4 steps)" -- grep -q 'decode steps [0-9.]* s (36 forwards of 1.0 rows' "$TMP/fw.err"
ok "one trial a forward" -- "$HS" retrieval "$M" "${H[@]}" --template '{context} {question}' --lengths 80,160 --depths 0,50,100 --max-new-tokens 6 \
  --ablate-top 2 --random-controls 2 --batch 1 --sweep-rows 1 --out "$TMP/one.h5"
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  check "auto rows == one row a forward (tokens exact, scores 1e-5)" -- /usr/bin/python3 - "$TMP/auto.h5" "$TMP/one.h5" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
bad = []
def walk(name, x):
    y = b.get(name)
    if y is None: bad.append(name); return
    for k, v in x.attrs.items():
        if name != "meta" and k not in ("batch", "sweep_rows") and not np.array_equal(np.asarray(v), np.asarray(y.attrs.get(k))): bad.append(name + "@" + k)
    if not isinstance(x, h5py.Dataset): return
    u, w = x[()], y[()]
    if u.dtype.kind == "f":
        scale = max(1e-3, float(np.nanmax(np.abs(u))) if np.isfinite(u).any() else 0.0)
        if u.shape != w.shape or not np.array_equal(np.isnan(u), np.isnan(w)) or np.nanmax(np.abs(u - w), initial=0) > 1e-5 * scale: bad.append(name)
    elif u.shape != w.shape or list(np.ravel(u)) != list(np.ravel(w)): bad.append(name)
a.visititems(walk)
print(bad[:5]); sys.exit(1 if bad else 0)
PY
fi
# --ablate-top from the stored file, mean-query, appended to another file of the same model.
ok "ablate from file" -- "$HS" retrieval "$M" "${H[@]}" --lengths 80 --depths 50 --max-new-tokens 4 --score retrieval \
  --ablate-top 3 --from "$O:scores/locos/score" --ablation mean-query --calibration-trials 2 --ablation-scope decode --stop eos \
  --out "$TMP/f.h5"
if command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  check "h5py layout" -- /usr/bin/python3 - "$O" "$TMP/f.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    t = f["retrieval/trials"]
    N = t["passed"].shape[0]
    assert N == 2 * 3 * 3, N
    assert t["prompt_tokens"].shape[0] == N and t["generated"].shape == (N, 6)
    assert t["retrieval"].shape == (N, 5, 8) and t["locos"].shape == (N, 5, 8)
    assert len(t["response"]) == N
    sp = t["needle_span"][()]
    assert (sp[:, 1] > sp[:, 0]).all()
    asp = t["answer_span"][()]
    assert asp.shape == (N, 2) and (asp[:, 0] >= sp[:, 0]).all() and (asp[:, 1] <= sp[:, 1]).all() and (asp[:, 1] > asp[:, 0]).all()
    assert t["rougeL_f"].shape == (N,) and ((t["rougeL_f"][()] >= 0) & (t["rougeL_f"][()] <= 1)).all()
    a = f["retrieval/ablation"]
    assert a["masks"].shape == (3, 5, 8) and a["masks"][0].sum() == 2 and a["rouge1_recall"].shape == (3, N)
    assert a["rougeL_f"].shape == (3, N) and a["baseline_rougeL_f"].shape == (N,)
    assert f["retrieval"].attrs["stop"] == "newline" and f["retrieval"].attrs["ablation_scope"] == "all"
    assert (a["masks"][1:] * a["masks"][0]).sum() == 0
    for k in ("ci_low", "ci_high", "score"):
        assert f["scores/locos/" + k].shape == (5, 8)
    assert list(f["retrieval"].attrs["lengths"]) == [80, 160]
with h5py.File(sys.argv[2], "r") as f:
    a = f["retrieval/ablation"]
    assert a.attrs["ablation"] == "mean-query" and a["query_mean"].shape == (5, 8, 8)
    assert a.attrs["scope"] == "decode" and a.attrs["calibration_trials"] == 2
    assert f["retrieval"].attrs["stop"] == "eos"
    assert "locos" not in f["scores"]
PY
fi

# tinystories-656k (Hugging Face folder, its own tokenizer), and the --help example as written.
T6="$TD/tinystories-656k"
ok "tinystories-656k" -- "$HS" retrieval "$T6" "${H[@]}" --lengths-range 60:120:2 --depths 25,75 --max-new-tokens 5 --out "$TMP/t.h5"
ok "top tinystories" -- "$HS" top "$TMP/t.h5" --probe retrieval -k 3
ex=$("$HS" retrieval --help | grep -o 'Example: .*' | head -1 | sed 's/^Example: //; s#\.\./shared/testdata#'"$TD"'#; s# --out needle.h5# --out '"$TMP"'/ex.h5#')
( cd "$ROOT" && eval "$HS ${ex#headscope }" ) >"$TMP/out" 2>"$TMP/err" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL help example: $ex"; head -3 "$TMP/err"; }

echo "cli-retrieval: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
