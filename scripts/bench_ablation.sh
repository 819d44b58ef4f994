#!/usr/bin/env bash
# Ablation-sweep benchmark (docs/performance.md, "Ablation sweeps"): a single zero sweep of all
# 144 heads of a GPT-2-small-shaped random model on 2 rows of 128 tokens, measured in this one run
#   - batched: `headscope run` as shipped (configurations batched, shared prefix),
#   - loop:    `headscope run --batch-rows 2 --no-prefix-reuse` (one forward per head),
#   - eager:   scripts/bench_ablation.py eager (Python-eager PyTorch, z hooked, one forward per head),
#   - TransformerLens (when scripts/setup_peers.sh's environment exists): scripts/bench_ablation.py tl,
#     run_with_hooks with one head's hook_z zeroed per forward, plain and in compatibility mode; the
#     faster of the two is the TransformerLens figure (the peer at its best).
# Usage: scripts/bench_ablation.sh [WORK_DIR] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp/headscope-bench-ablation}; THREADS=${2:-$(nproc)}
PY=$(bash scripts/find_python.sh torch numpy)
HS=${HEADSCOPE_BIN:-build/headscope}
[ -x "$HS" ] || { echo "build first: bash scripts/build.sh" >&2; exit 1; }
TOKDIR=""; for c in ../shared/testdata/gpt2-tokenizer shared/testdata/gpt2-tokenizer; do [ -z "$TOKDIR" ] && [ -f "$c/vocab.json" ] && TOKDIR="$c"; done
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
tl="{}"; tlc="{}"
if ! PP=$(bash scripts/find_peers.sh 2>/dev/null); then
  echo "peers: skipped (no venv; run scripts/setup_peers.sh)"
elif [ -z "$TOKDIR" ]; then
  echo "peers: TransformerLens skipped (no ../shared/testdata/gpt2-tokenizer: TransformerBridge needs a tokenizer)"
else
  tl=$("$PP" scripts/bench_ablation.py tl "$DIR" --threads "$THREADS" --layers 0,11 --tokenizer "$TOKDIR" 2>"$DIR/tl.err" | tail -1) || { echo "TransformerLens failed: $(tail -1 "$DIR/tl.err")"; tl="{}"; }
  tlc=$("$PP" scripts/bench_ablation.py tl "$DIR" --threads "$THREADS" --layers 0,11 --tokenizer "$TOKDIR" --compat 2>"$DIR/tlc.err" | tail -1) || { echo "TransformerLens (compatibility mode) failed: $(tail -1 "$DIR/tlc.err")"; tlc="{}"; }
fi
"$PY" - "$batched" "$loop" "$eager" "$DIR" "$tl" "$tlc" <<'PYEOF'
import json, re, sys
(nb, b), (nl, l), e = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()], json.loads(sys.argv[3])
tls = [t for t in (json.loads(sys.argv[5]), json.loads(sys.argv[6])) if t]
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
# TransformerLens: its losses must equal eager's (same model, same metric) before a ratio is printed.
refused = False
for t in tls:
    mode = "compatibility mode" if t["compat"] else "plain"
    d = max(abs(t["metric"][k] - e["metric"][k]) for k in e["metric"])
    db = abs(t["baseline"] - e["baseline"])
    ok = d <= 1e-3 and db <= 1e-3
    print(f"TransformerLens {t['transformer_lens']} ({mode}, transformers {t['transformers']}, torch {t['torch']}): "
          f"{t['per_head_s']*1e3:.1f} ms/head; loss vs eager: baseline {db:.1e}, max over {len(e['metric'])} heads {d:.1e}"
          + ("" if ok else "  REFUSED (> 1e-3)"))
    refused |= not ok
if tls and not refused:
    best = min(tls, key=lambda t: t["per_head_s"])
    r = best["per_head_s"] / pb
    print(f"ablation sweep vs TransformerLens run_with_hooks ({'compatibility mode' if best['compat'] else 'plain'}, its faster): "
          f"{best['per_head_s']*1e3:.1f} vs {pb*1e3:.1f} ms/head: {r:.2f}x  (target >= 3x: {'met' if r >= 3 else 'NOT met'})")
elif tls:
    print("ablation sweep vs TransformerLens: refused (losses differ)")
PYEOF
