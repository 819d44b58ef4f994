#!/usr/bin/env bash
# Forward-pass benchmark: headscope against a Python-eager PyTorch implementation of the same
# model, both measured in this one run on the same shape and thread count (docs/performance.md).
# Usage: scripts/bench_forward.sh [MODEL_DIR] [BATCH] [SEQ]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-../shared/testdata/tinystories-656k}
B=${2:-8}; T=${3:-256}; THREADS=$(nproc)
PY=$(bash scripts/find_python.sh torch numpy)
HS=build/headscope
[ -x "$HS" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
hs_json=$("$HS" -q bench "$MODEL" --batch "$B" --seq "$T" --reps 21 --threads "$THREADS" --json)
py_json=$("$PY" scripts/bench_eager.py "$MODEL" --batch "$B" --seq "$T" --reps 21 --threads "$THREADS")
"$PY" - "$hs_json" "$py_json" <<'PYEOF'
import json, sys
h, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"model {h['model']}  batch {h['batch']} x seq {h['seq']}  threads {h['threads']}  (python torch {p['torch']})")
print(f"{'':28s}{'headscope':>12s}{'python eager':>14s}{'ratio':>8s}")
for k, name in [("forward_s", "forward (ms)"), ("forward_pattern_capture_s", "forward + pattern reduce (ms)")]:
    print(f"{name:28s}{h[k]*1e3:12.2f}{p[k]*1e3:14.2f}{p[k]/h[k]:8.2f}x")
print(f"headscope: {h['tokens_per_s']:.0f} tok/s, {h['forward_gflops']:.1f} GFLOP/s; machine fp32 GEMM {h['gemm_gflops_512']:.1f} GFLOP/s")
PYEOF
