#!/usr/bin/env bash
# detect / export / top on the command line: bad input gets one clear line, a documented exit
# code and no output file; good runs print ranked heads; plot_scores.py draws the heatmaps.
# Usage: cli_detect.sh path/to/headscope
set -u
HS="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"

for cmd in detect export top; do
  "$HS" "$cmd" --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL $cmd --help has no example"; }
done
"$HS" detect --help | grep -q "detector (--tokens-file" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL detect --help omits the conventions"; }

if [ -z "$TD" ]; then
  echo "skipped the test-data checks: ../shared/testdata not found"
  echo "cli-detect: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit
fi
M="$TD/stories260K/stories260K.bin"
O="$TMP/x.h5"

expect "unknown probe" 2 "unknown probe 'bogus' \(valid: induction, previous-token" -- "$HS" detect "$M" --probe induction,bogus --out "$O"
no_file "$O"
expect "context" 5 "context of 512" -- "$HS" detect "$M" --seq-len 300 --out "$O"
no_file "$O"
: >"$TMP/empty.txt"
expect "empty tokens file" 5 "empty.txt: no sequences" -- "$HS" detect "$M" --tokens-file "$TMP/empty.txt" --out "$O"
no_file "$O"
printf '1,2,3\n1,5,700\n' >"$TMP/range.txt"
expect "id out of range" 5 "range.txt:2: token id 700 out of range" -- "$HS" detect "$M" --tokens-file "$TMP/range.txt" --out "$O"
no_file "$O"
printf '1,2,x\n' >"$TMP/bad.txt"
expect "bad id" 5 "bad.txt:1: 'x' is not a token id" -- "$HS" detect "$M" --tokens-file "$TMP/bad.txt" --out "$O"
python3 -c "print(','.join(['5']*600))" >"$TMP/long.txt"
expect "long sequence" 5 "long.txt:1: sequence of 600 tokens exceeds" -- "$HS" detect "$M" --tokens-file "$TMP/long.txt" --out "$O"
expect "missing file" 5 "nope.txt" -- "$HS" detect "$M" --tokens-file "$TMP/nope.txt" --out "$O"
expect "unwritable" 6 "cannot create" -- "$HS" detect "$M" --seq-len 5 --batch 1 --out "$TMP/no/such/dir/x.h5"
expect "token range" 2 "token-range" -- "$HS" detect "$M" --token-range 10,1000 --out "$O"
expect "token range syntax" 2 "expected lo,hi" -- "$HS" detect "$M" --token-range 10 --out "$O"
expect "loss needs stripe" 2 "induction-loss needs the stripe" -- "$HS" detect "$M" --probe induction-loss --tokens-file "$TMP/range.txt" --out "$O"
expect "error measure" 2 "error-measure" -- "$HS" detect "$M" --tokens-file "$TMP/range.txt" --error-measure max --out "$O"
no_file "$O"

ok "detect stripe" -- "$HS" detect "$M" --probe induction,previous-token,induction-loss --seq-len 10 --batch 4 --out "$O"
check "summary ranks 5 heads" -- grep -qE '^previous-token +(L[0-9]+H[0-9]+ [0-9.]+ ){4}L[0-9]+H[0-9]+ [0-9.]+$' "$TMP/out"
check "summary baseline" -- grep -q "baseline" "$TMP/out"
expect "no clobber" 6 "exists" -- "$HS" detect "$M" --seq-len 5 --out "$O"
printf 'Tom went to the park. Tom went to the park.\nThe cat sat.\n' >"$TMP/text.txt"
ok "detect text, append" -- "$HS" detect "$M" --probe duplicate-token --text-file "$TMP/text.txt" --out "$O" --append
ok "top" -- "$HS" top "$O" --probe previous-token -k 3
check "top has 3 ranked rows" -- test "$(grep -cE '^[123] +L[0-9]+H[0-9]+ +[0-9.]+$' "$TMP/out")" -eq 3
ok "top ascending" -- "$HS" top "$O" --probe induction-loss -k 2 --ascending
expect "top unknown probe" 2 "no probe 'nope' \(the file has: duplicate-token, induction" -- "$HS" top "$O" --probe nope
expect "top missing file" 6 "no such file" -- "$HS" top "$TMP/none.h5" --probe induction
ok "export all csv" -- "$HS" export "$O" --format csv
check "export rows" -- test "$(wc -l <"$TMP/out")" -eq $((1 + 4 * 40))
ok "export tsv file" -- "$HS" export "$O" --table scores/induction --format tsv --out "$TMP/i.tsv"
check "tsv header" -- grep -qP '^probe\tlayer\thead\tvalue\t' "$TMP/i.tsv"
expect "export bad table" 2 "no score table /scores/nope" -- "$HS" export "$O" --table scores/nope --format csv
expect "export bad format" 2 "expected csv, tsv or json" -- "$HS" export "$O" --format xml

PLOT="$ROOT/scripts/plot_scores.py"
if python3 -c 'import h5py, matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import h5py, matplotlib' 2>/dev/null; then
  ok "plot" -- python3 "$PLOT" "$O" --out-dir "$TMP/plots" --format png
  check "plot files" -- test -s "$TMP/plots/induction.png" -a -s "$TMP/plots/previous-token.png" -a -s "$TMP/plots/induction-loss.png"
  ok "plot svg" -- python3 "$PLOT" "$O" --out-dir "$TMP/plots" --format svg --probe induction
  check "svg" -- grep -q "<svg" "$TMP/plots/induction.svg"
else
  echo "skipped plot_scores.py: no Python with h5py and matplotlib"
fi
echo "cli-detect: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
