#!/usr/bin/env bash
# Patching benchmark (docs/performance.md, "Patching"): on a GPT-2-small-shaped random checkpoint
# (12 layers x 12 heads, d_model 768, vocab 50257; scripts/bench_ablation.py make) and PAIRS pairs of
# 128 random tokens (the second half corrupted), measured in this one run:
#   - exact:       `headscope patch --method exact --what z` (144 patches, every position each; batched,
#                  the corrupted prefix below the patched layer shared)
#   - attribution: `headscope patch --method attribution --what z --positions each` (all 144 heads x 128
#                  positions from 2 forwards + 1 backward)
# Prints both wall times (from the files' `seconds` attribute: the computation, not the loading), the
# forwards each ran, and the ratios: exact per head over attribution, and exact per (head, position)
# (144 x 128 patches; extrapolated from the per-head run, each patch costing the same) over attribution.
# Usage: scripts/bench_patching.sh [WORK_DIR] [THREADS]   (PAIRS, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/headscope-bench-patching}; THREADS=${2:-$(nproc)}; PAIRS=${PAIRS:-2}
PY=$(bash scripts/find_python.sh torch numpy)
HS=${HEADSCOPE_BIN:-build/headscope}
[ -x "$HS" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
mkdir -p "$DIR"
[ -f "$DIR/model.safetensors" ] || "$PY" scripts/bench_ablation.py make "$DIR" >/dev/null
"$PY" - "$DIR/pairs.jsonl" "$PAIRS" <<'PYEOF'
import json, random, sys
rng = random.Random(1)
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2])):
        clean = [rng.randrange(50257) for _ in range(128)]
        corrupt = clean[:64] + [rng.randrange(50257) for _ in range(64)]
        f.write(json.dumps({"clean": clean, "corrupt": corrupt, "answer": rng.randrange(50257),
                            "wrong": rng.randrange(50257)}) + "\n")
PYEOF
run() { "$HS" -q patch "$DIR" --pairs "$DIR/pairs.jsonl" --metric logit-diff --what z --threads "$THREADS" --top 0 \
          --out "$DIR/$1.h5" --force "${@:2}" >/dev/null; }
run exact --method exact
run attribution --method attribution --positions each
"$PY" - "$DIR" "$PAIRS" "$THREADS" <<'PYEOF'
import sys
import h5py
d, pairs, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def read(name):
    with h5py.File(f"{d}/{name}.h5") as f:
        g = f["patching"][next(iter(f["patching"]))]
        return float(g.attrs["seconds"]), int(g.attrs["forwards"]), g["scores"].shape
ex_s, ex_f, ex_shape = read("exact")
at_s, at_f, at_shape = read("attribution")
print(f"patching, GPT-2-small shape, {pairs} pairs x 128 tokens, {threads} threads")
print(f"exact        {ex_s:8.2f} s  {ex_f:4d} forwards  scores {list(ex_shape)}  (144 heads, every position)")
print(f"attribution  {at_s:8.2f} s  {at_f:4d} forwards  scores {list(at_shape)}  (144 heads x 128 positions; + 1 backward)")
print(f"ratio exact per head / attribution: {ex_s / at_s:.1f}x")
print(f"ratio exact per (head, position), 144 x 128 patches extrapolated at the per-head patch cost, / attribution: "
      f"{ex_s * 128 / at_s:.0f}x")
PYEOF
