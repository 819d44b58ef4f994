#!/usr/bin/env bash
# Streaming heads (issue 23) on the command line, on the CI toy recall model (its training log proves
# L1H0, L1H1, L1H2 carry recall and L0H1 is the previous-token head): bad window flags get one clear
# line and exit 2; streaming every head but the retrieval set (sink 1, recent 4) keeps accuracy >= 0.95
# at lengths 24-96 (0.9 at 120, where L0H0 needs the long range too), streaming only the retrieval set
# drops it to <= 0.2 from 48 on (recent 2; <= 0.3 with recent 4); streaming
# L0H1 with recent 2 keeps >= 0.95 while zeroing it costs most trials (streaming is not ablation);
# the LOCOS-ordered sweep reaches the baseline at the fraction holding the three causal heads and the
# random orders' mean stays below it there; HeadKV's R2 score (--score r2) is written, ranks L1H0-2
# first, orders a sweep (--order r2) and merges from shards (one killed and
# resumed) bit for bit. Prints the figures it gets.
# Usage: cli_stream.sh path/to/headscope
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
N="$ROOT/datasets/needles"
TOY="$(ci_toy recall)" || { echo "FAIL: no toy recall model"; exit 1; }
O="$TMP/s.h5"
A=("$TOY" --haystack "$N/toy_recall_haystack.txt" --needles "$N/toy_recall_needles.jsonl" --template '{context}?{question}'
   --max-new-tokens 1 --threads 1)

expect "negative sink" 2 "error: --sink: -1 is negative" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --ablate L0H1 --ablation stream --sink -1 --out "$O"
no_file "$O"
expect "recent 0" 2 "--recent: 0 must be at least 1" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --stream-sweep --recent 0 --out "$O"
no_file "$O"
expect "bad fraction" 2 "--full-fractions: '1.5' is not a fraction in \[0, 1\]" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --stream-sweep --full-fractions 0,1.5 --out "$O"
expect "no sweep rows" 2 "--sweep-rows: '0' is not auto or a count of at least 1" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --stream-sweep --sweep-rows 0 --out "$O"
no_file "$O"
expect "sharded sweep" 2 "--stream-sweep: not sharded" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --stream-sweep --shard 0/2 --out "$O"
no_file "$O"
expect "bad order file" 6 "nope.h5: no such file" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --stream-sweep --order "$TMP/nope.h5:scores/x" --out "$O"
no_file "$O"
expect "order not computed" 2 "--order locos: .*--score" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --score retrieval --stream-sweep --order locos --out "$O"
no_file "$O"

read -r L H < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('n_layer', c.get('num_hidden_layers')), c.get('n_head', c.get('num_attention_heads')))" "$TOY/config.json")
others=""
for ((l = 0; l < L; l++)); do for ((h = 0; h < H; h++)); do
  case "L${l}H${h}" in L1H0|L1H1|L1H2) ;; *) others="$others${others:+,}L${l}H${h}" ;; esac
done; done
# accuracy LINE-PREFIX: the accuracy printed after it ("ablation heads ... accuracy 0.975 (baseline ...").
abl_acc() { sed -n 's/^ablation heads .* accuracy \([0-9.]*\) (baseline \([0-9.]*\)).*/\1 \2/p' "$TMP/out"; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }

# Measured on the CI model (3000 steps): streaming every other head (sink 1, recent 4) keeps >= 0.95
# up to 96 tokens and 0.900 at 112-120 (the issue asked >= 0.95 up to 128): the layer-0 head L0H0
# (ablating it costs 0.107 in the training log) needs the long range there: streaming it alone
# gives 0.925 at 112 and 120, and streaming every head but L1H0-2 and L0H0 keeps >= 0.95 (checked
# at 120 below). Streaming the retrieval set with recent 4 leaves 0.300 at 48-64 and 120 (the
# depth-100 trials keep their needle inside a 4-key window and always pass: 0.2 of the grid); with
# recent 2 it leaves 0.000-0.050, the issue's <= 0.2.
for len in 24 48 80 96 120; do
  ok "stream all but the retrieval set, length $len" -- "$HS" -q retrieval "${A[@]}" --lengths "$len" --ablate "$others" --ablation stream --sink 1 --recent 4 --out "$TMP/a$len.h5"
  read -r acc base < <(abl_acc)
  echo "length $len: baseline $base; every head but L1H0-2 streaming (sink 1, recent 4): $acc"
  want=0.95; [ "$len" -gt 96 ] && want=0.85
  check "length $len: streaming the other heads keeps >= $want ($acc)" -- ge "$acc" "$want"
  for rec in 4 2; do
    ok "stream the retrieval set, length $len, recent $rec" -- "$HS" -q retrieval "${A[@]}" --lengths "$len" --ablate L1H0,L1H1,L1H2 --ablation stream --sink 1 --recent "$rec" --out "$TMP/b$len-$rec.h5"
    read -r acc base < <(abl_acc)
    echo "length $len: L1H0-2 streaming (sink 1, recent $rec): $acc"
    want=0.2; [ "$rec" = 4 ] && { want=0.3; [ "$len" -ge 80 ] && [ "$len" -le 96 ] && want=0.2; }
    [ "$len" -ge 48 ] && check "length $len: streaming the retrieval set (recent $rec) drops to <= $want ($acc)" -- le "$acc" "$want"
  done
done
others4="${others/L0H0,/}"
ok "stream all but L1H0-2 and L0H0, length 120" -- "$HS" -q retrieval "${A[@]}" --lengths 120 --ablate "$others4" --ablation stream --sink 1 --recent 4 --out "$TMP/c.h5"
read -r acc base < <(abl_acc)
echo "length 120: every head but L1H0-2 and L0H0 streaming (sink 1, recent 4): $acc (baseline $base)"
check "length 120: streaming all but L1H0-2 and L0H0 keeps >= 0.95 ($acc)" -- ge "$acc" 0.95

ok "stream L0H1" -- "$HS" -q retrieval "${A[@]}" --lengths 24,48,80,120 --ablate L0H1 --ablation stream --sink 0 --recent 2 --out "$TMP/p.h5"
read -r acc_s base < <(abl_acc)
ok "zero L0H1" -- "$HS" -q retrieval "${A[@]}" --lengths 24,48,80,120 --ablate L0H1 --ablation zero --out "$TMP/z.h5"
read -r acc_z base < <(abl_acc)
echo "L0H1 (previous-token head): baseline $base, streaming (sink 0, recent 2) $acc_s, zero-ablated $acc_z"
check "streaming L0H1 with recent 2 keeps >= 0.95 ($acc_s)" -- ge "$acc_s" 0.95
check "zeroing L0H1 costs most trials ($acc_z <= 0.5)" -- le "$acc_z" 0.5

# The sweep ordered by this run's LOCOS: the fraction 3 / (L H) holds exactly the three causal heads.
f3=$(awk -v n="$((L * H))" 'BEGIN { printf "%.6f", 3 / n }')
ok "LOCOS-ordered sweep" -- "$HS" -q retrieval "${A[@]}" --lengths 48,96 --stream-sweep --order locos --sink 1 --recent 4 --full-fractions "0,$f3,1" --random-orders 3 --seed 2 --out "$O"
cat "$TMP/out"
cp "$TMP/out" "$TMP/out.batched"
row=$(awk -v f="$f3" '$1 != "" && $1 + 0 == f + 0 && NF >= 6 { print; exit }' < <(sed -n '/^    full/,$p' "$TMP/out"))
base=$(sed -n 's/^baseline accuracy \([0-9.]*\).*/\1/p' "$TMP/out")
read -r _ heads _ acc _ rnd <<<"$row"
rmean=$(awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; print s / NF }' <<<"$rnd")
echo "sweep at $heads full heads: LOCOS order $acc, random orders $rnd (mean $rmean), baseline $base"
check "the LOCOS order reaches the baseline with the three causal heads full ($acc vs $base)" -- ge "$acc" "$(awk -v b="$base" 'BEGIN { print b - 0.02 }')"
# A random order whose first three heads hold L1H0 or L1H1 keeps the task too (each alone keeps 0.95
# in the training log), so the random orders' mean, not each of them, must stay below.
check "random orders need more: their mean stays below the LOCOS order's ($rmean < $acc)" -- awk -v a="$rmean" -v b="$acc" 'BEGIN { exit !(a < b - 0.05) }'
# The distinct head sets decode as rows of shared forwards (--sweep-rows, default 8); one row a forward
# prints the same curve.
ok "the same sweep, one row a forward" -- "$HS" -q retrieval "${A[@]}" --lengths 48,96 --stream-sweep --order locos --sink 1 --recent 4 --full-fractions "0,$f3,1" --random-orders 3 --seed 2 --sweep-rows 1 --out "$TMP/s1.h5"
check "--sweep-rows 1 prints the same curve as the batched sweep" -- diff <(sed -n '/^streaming sweep/,$p' "$TMP/out") <(sed -n '/^streaming sweep/,$p' "$TMP/out.batched")
ok "report" -- "$HS" -q report "$O" --out "$TMP/r.html"
check "the report draws the streaming curve" -- grep -q "Retrieval: streaming heads" "$TMP/r.html"

# HeadKV's R2 (--score r2; docs/methods.md, "HeadKV's R2 score"): only when asked for; written to
# /scores/r2/score; its top three are the causal heads (lengths 48,96: L1H0 0.886, L1H1 0.869, L1H2
# 0.195, then L1H3 0.146; the sweep at 3 full heads 0.988, baseline 1.000),
# so the R2-ordered sweep reaches the baseline at 3 full heads too; shards merged == unsharded.
R2O="$TMP/r2.h5"
expect "order r2 not computed" 2 "--order r2: .*--score" -- "$HS" -q retrieval "${A[@]}" --lengths 24 --stream-sweep --order r2 --out "$R2O"
no_file "$R2O"
ok "R2-ordered sweep" -- "$HS" -q retrieval "${A[@]}" --lengths 48,96 --score retrieval,locos,r2 --stream-sweep --order r2 --sink 1 --recent 4 --full-fractions "0,$f3,1" --random-orders 1 --seed 2 --out "$R2O"
cat "$TMP/out"
check "the summary prints r2" -- grep -qE '^r2 +L1H[012] [0-9.]+' "$TMP/out"
check "the sweep is ordered by this run's R2" -- grep -q "order this run: scores/r2/score" "$TMP/out"
row=$(awk -v f="$f3" '$1 != "" && $1 + 0 == f + 0 && NF >= 6 { print; exit }' < <(sed -n '/^    full/,$p' "$TMP/out"))
base=$(sed -n 's/^baseline accuracy \([0-9.]*\).*/\1/p' "$TMP/out")
read -r _ heads _ acc _ rnd <<<"$row"
echo "R2-ordered sweep at $heads full heads: $acc (baseline $base)"
check "the R2 order reaches the baseline with three full heads ($acc vs $base)" -- ge "$acc" "$(awk -v b="$base" 'BEGIN { print b - 0.02 }')"
ok "top r2" -- "$HS" top "$R2O" --probe r2 -k 3
check "R2's top three are L1H0-2" -- test "$(awk 'NR > 1 { print $2 }' "$TMP/out" | sort | tr '\n' ,)" = "L1H0,L1H1,L1H2,"
R2S=("${A[@]}" --lengths 24,40 --score r2 --seed 1)
ok "R2 alone, unsharded" -- "$HS" -q retrieval "${R2S[@]}" --out "$TMP/r2-full.h5"
check "--score r2 alone writes no retrieval or LOCOS score" -- test "$("$HS" top "$TMP/r2-full.h5" --probe locos -k 1 >/dev/null 2>&1; echo $?)" != 0
ok "R2 shard 0/2" -- "$HS" -q retrieval "${R2S[@]}" --shard 0/2 --out "$TMP/r2-0.h5"
ok "R2 shard 1/2" -- "$HS" -q retrieval "${R2S[@]}" --shard 1/2 --out "$TMP/r2-1.h5"
ok "R2 shards merged" -- "$HS" merge "$TMP/r2-0.h5" "$TMP/r2-1.h5" --out "$TMP/r2-merged.h5"
# Shard 0 killed (SIGKILL) after a checkpoint, then --resume: its merge equals the unsharded run too.
"$HS" -q retrieval "${R2S[@]}" --shard 0/2 --checkpoint-seconds 0 --pause-after-batch 200 --out "$TMP/r2-k.h5" >/dev/null 2>&1 &
kpid=$!
for _ in $(seq 200); do [ -s "$TMP/r2-k.h5" ] && break; sleep 0.05; done
sleep 0.3
kill -9 "$kpid" 2>/dev/null; wait "$kpid" 2>/dev/null
ok "R2 shard 0/2 resumed after SIGKILL" -- "$HS" retrieval "${R2S[@]}" --shard 0/2 --resume --out "$TMP/r2-k.h5"
check "the killed shard resumed from its checkpoint" -- grep -qE "resuming .*: [1-9][0-9]* decodes already done" "$TMP/err"
ok "R2 resumed shard merged" -- "$HS" merge "$TMP/r2-k.h5" "$TMP/r2-1.h5" --out "$TMP/r2-resumed.h5"
if PY="$(bash "$ROOT/scripts/find_python.sh" h5py numpy 2>/dev/null)"; then
  check "R2: two shards merged == unsharded (bit for bit)" -- "$PY" "$ROOT/tests/h5_same.py" "$TMP/r2-full.h5" "$TMP/r2-merged.h5"
  check "R2: a killed and resumed shard merged == unsharded (bit for bit)" -- "$PY" "$ROOT/tests/h5_same.py" "$TMP/r2-full.h5" "$TMP/r2-resumed.h5"
else
  echo "skipped the merged == unsharded check: no Python with h5py"
fi

echo "cli-stream: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
