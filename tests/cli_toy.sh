#!/usr/bin/env bash
# train-toy on the command line: bad input gets one line naming the folder and a documented exit
# code, and leaves nothing half-written; a short run writes a folder the rest of headscope reads.
# Usage: cli_toy.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"
no_stage() { ! ls -d "$1".tmp-* >/dev/null 2>&1; }

"$HS" train-toy --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL train-toy --help has no example"; }
expect "unknown task" 3 "unknown toy task 'copying'" -- "$HS" train-toy --task copying --out "$TMP/m"
check "unknown task leaves nothing" -- test ! -e "$TMP/m"
check "no stage left (task)" -- no_stage "$TMP/m"
expect "missing --out" 2 "out" -- "$HS" train-toy --task induction
expect "negative steps" 2 "steps" -- "$HS" train-toy --task induction --steps -3 --out "$TMP/m"

touch "$TMP/afile"
expect "parent is a file" 6 "afile/sub: cannot create the output folder" -- "$HS" train-toy --task induction --out "$TMP/afile/sub"
expect "out is a file" 6 "afile: exists and is not a folder" -- "$HS" train-toy --task induction --out "$TMP/afile" --force
if [ "$(id -u)" -ne 0 ]; then  # root writes anywhere: permission bits test nothing there
  mkdir "$TMP/ro"; chmod 555 "$TMP/ro"
  expect "read-only parent" 6 "ro/m: cannot create the output folder" -- "$HS" train-toy --task induction --out "$TMP/ro/m"
fi

mkdir "$TMP/full"; echo keep >"$TMP/full/x"
expect "non-empty without --force" 6 "full: folder exists and is not empty" -- "$HS" train-toy --task induction --out "$TMP/full"
check "old folder kept" -- grep -q keep "$TMP/full/x"
check "no stage left (full)" -- no_stage "$TMP/full"

ok "short run" -- "$HS" -q train-toy --task recall --steps 5 --threads 1 --out "$TMP/r"
for f in config.json model.safetensors tokenizer.json training_log.json; do
  check "short run wrote $f" -- test -s "$TMP/r/$f"
done
check "short run summary" -- grep -q "trained toy-recall: 5 steps" "$TMP/out"
check "no stage left (run)" -- no_stage "$TMP/r"
ok "info reads it" -- "$HS" info "$TMP/r"
ok "tokenizer reads it" -- "$HS" tokenize "$TMP/r" --text "ab?a"
check "tokenize ids" -- grep -qE '^\[1, 16, 17, 2, 16\]' "$TMP/out"
expect "rerun without --force" 6 "not empty" -- "$HS" train-toy --task recall --steps 5 --threads 1 --out "$TMP/r"
ok "rerun with --force" -- "$HS" -q train-toy --task recall --steps 5 --threads 1 --seed 2 --out "$TMP/r" --force
check "forced run replaced the folder" -- grep -q '"seed": 2' "$TMP/r/training_log.json"
check "no old folder left" -- test -z "$(ls -d "$TMP"/r.old-* 2>/dev/null)"

echo "cli-toy: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
