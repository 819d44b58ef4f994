#!/usr/bin/env bash
# Throughput of `headscope influence` (AttentionInfluence) on the CPU, and its cost against one
# forward per sample per masking, measured in one run with the same binary: --max-rows 1 (one sample
# under one masking a forward) against 8 and 64 rows a forward (samples x head sets as rows of shared
# forwards). Model: a random-weight Llama
# (scripts/make_bench_model.py: 8 layers, d_model 512, 8 heads, 4 kv heads, vocab 8192); corpus: N
# random-token samples of T tokens; 4 masked heads in layer 4 plus 5 random controls (7 losses a
# sample). Prints a table for docs/performance.md ("AttentionInfluence").
# Usage: scripts/bench_influence.sh [THREADS] [N] [T] [CONTROLS]
set -euo pipefail
cd "$(dirname "$0")/.."
HS=${HEADSCOPE_BIN:-build/headscope}
[ -x "$HS" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
THREADS=${1:-2}; N=${2:-64}; T=${3:-512}; CONTROLS=${4:-5}
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
  "$HS" -q influence "$W/model" --corpus "$W/corpus.jsonl" --heads L4H0,L4H2,L4H5,L4H7 --random-controls "$CONTROLS" \
    --threads "$THREADS" --max-rows "$1" --force --out "$W/i$1.h5" >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
times=()
for R in 1 8 64; do times+=("$(run "$R")"); done
/usr/bin/python3 - "$W" "$N" "$T" "${times[@]}" <<'PY'
import sys, h5py, numpy as np
w, n, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secs = dict(zip([1, 8, 64], map(float, sys.argv[4:7])))
f = {r: h5py.File(f"{w}/i{r}.h5")["influence"] for r in secs}
print("| --max-rows (rows a forward: samples x losses) | seconds | samples/s | tokens/s | forwards |")
print("| --- | --- | --- | --- | --- |")
for r, s in secs.items():
    print(f"| {r}{' (one sample, one masking a forward)' if r == 1 else ''} | {s:.1f} | {n / s:.2f} | {n * t / s:.0f} | {f[r].attrs['forwards']} |")
diff = max(max(np.abs(f[r]["score"][()] - f[1]["score"][()]).max(), np.abs(f[r]["loss"][()] - f[1]["loss"][()]).max()) for r in secs)
print(f"largest difference between the runs' losses and scores: {diff:.2e}")
PY
