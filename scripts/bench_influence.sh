#!/usr/bin/env bash
# Throughput of `headscope influence` (AttentionInfluence) on the CPU, and its cost against one
# forward per sample per masking, measured in one run with the same binary: the default (samples x
# head sets as rows of shared forwards, layers below the first masked layer computed once per chunk)
# against --max-rows 1 (one sample under one masking a forward). Model: a random-weight Llama
# (scripts/make_bench_model.py: 8 layers, d_model 512, 8 heads, 4 kv heads, vocab 8192); corpus: N
# random-token samples of T tokens; 4 masked heads in layer 4 plus 5 random controls (7 losses a
# sample). Prints a table for docs/performance.md ("AttentionInfluence").
# Usage: scripts/bench_influence.sh [THREADS] [N] [T]
set -euo pipefail
cd "$(dirname "$0")/.."
HS=${HEADSCOPE_BIN:-build/headscope}
[ -x "$HS" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
THREADS=${1:-2}; N=${2:-64}; T=${3:-512}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
/usr/bin/python3 scripts/make_bench_model.py "$W/model" --layers 8 --d-model 512 --heads 8 --kv-heads 4 --d-ff 1376 \
  --vocab 8192 --ctx 2048 >/dev/null
/usr/bin/python3 - "$W/corpus.jsonl" "$N" "$T" <<'PY'
import json, random, sys
rng = random.Random(0)
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2])):
        f.write(json.dumps({"tokens": [rng.randrange(8192) for _ in range(int(sys.argv[3]))]}) + "\n")
PY
run() {  # seconds of one run with --max-rows $1
  local t0 t1
  t0=$(date +%s.%N)
  "$HS" -q influence "$W/model" --corpus "$W/corpus.jsonl" --heads L4H0,L4H2,L4H5,L4H7 --random-controls 5 \
    --threads "$THREADS" --max-rows "$1" --force --out "$W/i$1.h5" >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
batched=$(run 64)
single=$(run 1)
/usr/bin/python3 - "$W/i64.h5" "$W/i1.h5" "$batched" "$single" "$N" "$T" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1])["influence"], h5py.File(sys.argv[2])["influence"]
tb, ts, n, t = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
diff = max(np.abs(a["score"][()] - b["score"][()]).max(), np.abs(a["loss"][()] - b["loss"][()]).max())
print(f"| run | seconds | samples/s | tokens/s (x 7 losses) | forwards |")
print(f"| --- | --- | --- | --- | --- |")
print(f"| rows of shared forwards (default, --max-rows 64) | {tb:.1f} | {n / tb:.2f} | {n * t / tb:.0f} | {a.attrs['forwards']} |")
print(f"| one sample x one masking a forward (--max-rows 1) | {ts:.1f} | {n / ts:.2f} | {n * t / ts:.0f} | {b.attrs['forwards']} |")
print(f"ratio {ts / tb:.2f}x; largest difference between the two runs' losses and scores: {diff:.2e}")
PY
