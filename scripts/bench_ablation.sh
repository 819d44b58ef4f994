#!/usr/bin/env bash
# Ablation-sweep benchmark (docs/performance.md, "Ablation sweeps"): a single zero sweep of all
# 144 heads of a GPT-2-small-shaped random model on 2 rows of 128 tokens, measured in this one run
#   - batched: `headscope run` as shipped (configurations batched, shared prefix),
#   - loop:    `headscope run --batch-rows 2 --no-prefix-reuse` (one forward per head),
#   - eager:   scripts/bench_ablation.py eager (Python-eager PyTorch, z hooked, one forward per head).
# Usage: scripts/bench_ablation.sh [WORK_DIR] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/headscope-bench-ablation}; THREADS=${2:-$(nproc)}
PY=$(bash scripts/find_python.sh torch numpy)
HS=build/headscope
[ -x "$HS" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
[ -f "$DIR/model.safetensors" ] || "$PY" scripts/bench_ablation.py make "$DIR"
sweep() {  # sweep NAME YAML [options]: prints "configurations seconds" of study single (file writes excluded)
  "$HS" -v run "$DIR/$2.yaml" --out "$DIR/$1.h5" --force "${@:3}" 2>"$DIR/$1.log" >"$DIR/$1.out"
  sed -n 's/^study single: \([0-9]*\) configurations in \([0-9.]*\) s.*/\1 \2/p' "$DIR/$1.log"
}
export OMP_NUM_THREADS=$THREADS
for y in single loop; do sed -i '/^threads:/d' "$DIR/$y.yaml" && sed -i "2a threads: $THREADS" "$DIR/$y.yaml"; done
# Every one-forward-per-head configuration costs the same, so the loop and eager time the 24 heads
# of layers 0 and 11 (the sweep as shipped must run all 144: its prefix sharing depends on the layer).
batched=$(sweep batched single)
loop=$(sweep loop loop --batch-rows 2 --no-prefix-reuse)
eager=$("$PY" scripts/bench_ablation.py eager "$DIR" --threads "$THREADS" --layers 0,11)
"$PY" - "$batched" "$loop" "$eager" "$DIR" <<'PYEOF'
import json, re, sys
(nb, b), (nl, l), e = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()], json.loads(sys.argv[3])
# The run's summary line names the 5 most harmful heads with their metric: check them against eager.
line = open(sys.argv[4] + "/batched.out").read()
got = {k: float(v) for k, v in re.findall(r"L(\d+H\d+) ([0-9.]+)", line)}
line_loop = open(sys.argv[4] + "/loop.out").read()
got_loop = {k: float(v) for k, v in re.findall(r"L(\d+H\d+) ([0-9.]+)", line_loop)}
diff = max(abs(v - e["metric"]["L" + k]) for k, v in got_loop.items())
base = float(re.search(r"baseline ([0-9.]+)", line).group(1))
print(f"check: baseline {base:.4f} (eager {e['baseline']:.4f}); max |headscope - eager| over the {len(got_loop)} heads the loop printed {diff:.1e}")
pb, pl, pe = b / nb, l / nl, e["per_head_s"]  # per configuration (headscope's include the baseline)
print(f"GPT-2-small-shaped random model, 2 x 128 tokens, single zero sweep, {e['threads']} threads (python torch {e['torch']})")
print(f"{'':34s}{'ms/head':>10s}{'vs eager':>10s}")
for name, v in [("headscope batched + shared prefix", pb), ("headscope one forward per head", pl), ("python eager, hooked z", pe)]:
    print(f"{name:34s}{v*1e3:10.1f}{pe/v:9.2f}x")
PYEOF
