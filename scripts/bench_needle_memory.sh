#!/usr/bin/env bash
# Peak memory of `headscope retrieval` against context length on a random-weight Llama with 4096
# positions (scripts/make_bench_model.py), with the default query-chunked prefill and with the
# whole prompt prefilled at once (--prefill-chunk 8192: one [H, T, T] score block per layer).
# Prints a table for docs/performance.md. Usage: scripts/bench_needle_memory.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
HS=build/headscope
[ -x "$HS" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
TOK=../shared/testdata/tinystories-656k/tokenizer.json
[ -f "$TOK" ] || { echo "needs $TOK (the test data)" >&2; exit 1; }
THREADS=${1:-2}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
/usr/bin/python3 scripts/make_bench_model.py "$W/model" --layers 4 --d-model 256 --heads 8 --kv-heads 4 --d-ff 512 --vocab 2048 --ctx 4096 >/dev/null
N=datasets/needles
peak() {  # peak RSS in MiB of one needle run: context length $1, prefill chunk $2
  /usr/bin/time -f '%M' -o "$W/rss" "$HS" -q retrieval "$W/model" --tokenizer "$TOK" --threads "$THREADS" \
    --haystack $N/haystack.txt --needles $N/needles.jsonl --lengths "$1" --depths 50 --max-new-tokens 8 \
    --prefill-chunk "$2" --force --out "$W/o.h5" >/dev/null 2>"$W/err"
  echo $(( $(cat "$W/rss") / 1024 ))
}
# The template adds about 25 tokens and 8 new tokens follow: contexts stop 64 short of 4096.
echo "| context tokens | peak RSS, chunk 512 (MiB) | peak RSS, one chunk (MiB) |"
echo "| --- | --- | --- |"
for L in 64 512 1024 2048 4032; do
  echo "| $L | $(peak "$L" 512) | $(peak "$L" 8192) |"
done
