#!/usr/bin/env bash
# One benchmark command (docs/performance.md records its output). Every figure is a ratio measured
# in this one run, on checkpoints the script makes itself (random weights, no downloads):
#   1. forward efficiency: achieved FLOP/s of a batch-1 x 512 fp32 forward over the FLOP/s of a plain
#      512^3 libtorch product measured in the same run
#   2. against Python eager (scripts/bench_eager.py, same BLAS and threads): batch 1 and 8, T 128, 512
#   3. capture overhead: forward with the induction/previous/duplicate stripes reduced, over plain
#   4. memory: peak resident memory of `headscope detect` at T = 512 .. 4096 (beyond the weights)
#   5. bf16 against fp32: forward speed and the induction/previous-token score differences
#   6. against the peers a user would pick instead, from PyPI in the virtual environment of
#      scripts/setup_peers.sh (skipped with one line when it is absent; nothing is downloaded here):
#      transformers (eager and sdpa forward) and TransformerLens (forward, run_with_cache patterns) at
#      every shape; full run only: the needle scan (`headscope retrieval`) against the Retrieval_Head
#      reference decode loop per trial (scripts/bench_peers.py needle), and the 144-head zero-ablation
#      sweep against TransformerLens run_with_hooks (scripts/bench_ablation.sh)
# A ratio is refused (printed as "refused") when either side failed or when the two sides' logits
# differ by more than the tolerance below.
# Usage: scripts/bench.sh [--smoke]   (--smoke: a tiny model, seconds; what CI runs)
# Env: HEADSCOPE_BIN (default build/headscope; ctest sets it, so a build-torch2/ run benchmarks its own
# binary), BENCH_DIR (default /tmp/headscope-bench), REPS (default 5), BENCH_SHAPES (batch:tokens list,
# default "1:128 1:512 8:128 8:512"; at 8 x 512 each GPT-2-small forward takes ~12 s here),
# HEADSCOPE_PEERS_VENV (the peers' environment, default .venv-peers), NEEDLE_LENGTHS (default "1000 4000"),
# NEEDLE_STEPS (decode steps per needle trial, default 16), PEERS_ONLY=1 (sections 6 only),
# PEERS_PARTS (default "forward needle study ablation": which parts of section 6 run; study =
# scripts/bench_needle_study.sh, the whole needle study against the reference pipeline).
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=0; [ "${1:-}" = "--smoke" ] && SMOKE=1
HS=${HEADSCOPE_BIN:-build/headscope}
[ -x "$HS" ] || { echo "bench.sh: build first (bash scripts/build.sh)" >&2; exit 1; }
PY=$(bash scripts/find_python.sh torch numpy) || exit 1
DIR=${BENCH_DIR:-/tmp/headscope-bench}; mkdir -p "$DIR"
THREADS=$(nproc); REPS=${REPS:-5}
TIME=/usr/bin/time; [ -x "$TIME" ] || TIME=""

if [ $SMOKE = 1 ]; then
  MODEL="$DIR/smoke"; GQA="$DIR/smoke-gqa"
  [ -f "$MODEL/config.json" ] || "$PY" scripts/make_bench_model.py "$MODEL" --layers 2 --heads 4 --d-model 64 --d-ff 128 --vocab 512 --ctx 512 >/dev/null
  [ -f "$GQA/config.json" ] || "$PY" scripts/make_bench_model.py "$GQA" --layers 2 --heads 4 --kv-heads 2 --d-model 64 --d-ff 128 --vocab 512 --ctx 512 >/dev/null
  SHAPES="1:64 4:64"; EFF_T=128; MEM_TS="128 192 256"; REPS=2
else
  MODEL="$DIR/gpt2s-llama"; GQA="$DIR/gqa-llama"
  [ -f "$MODEL/config.json" ] || "$PY" scripts/make_bench_model.py "$MODEL" >/dev/null
  [ -f "$GQA/config.json" ] || "$PY" scripts/make_bench_model.py "$GQA" --heads 12 --kv-heads 4 >/dev/null
  SHAPES=${BENCH_SHAPES:-"1:128 1:512 8:128 8:512"}; EFF_T=512; MEM_TS="512 1024 1536 2048 2560 3072 3584 4096"
fi

fail=0
hs_bench() { "$HS" -q bench "$1" --batch "$2" --seq "$3" --reps "$REPS" --threads "$THREADS" --json ${4:+--dtype $4}; }
py_bench() { "$PY" scripts/bench_eager.py "$1" --batch "$2" --seq "$3" --reps "$REPS" --threads "$THREADS"; }
# The process settings headscope makes for itself (src/base/preinit.h, tune_allocator in src/base/system.cpp),
# given to the eager side as environment variables: the second eager column shows how much of the
# difference is those settings and how much the forward itself.
TUNED_ENV=(OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=16
           GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=536870912)
py_bench_tuned() { env "${TUNED_ENV[@]}" "$PY" scripts/bench_eager.py "$1" --batch "$2" --seq "$3" --reps "$REPS" --threads "$THREADS"; }
# ratio.py KIND args...: small computations on the JSON outputs.
ratio() {
  "$PY" - "$@" <<'PYEOF'
import json, sys
kind = sys.argv[1]
if kind == "compare":  # headscope JSON, eager JSON, eager-with-headscope's-settings JSON, label
    h, p, q = json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
    a = h["logits_probe"]
    for other in (p, q):
        b = other["logits_probe"]
        scale = max(1.0, max(abs(x) for x in b))
        err = max(abs(x - y) for x, y in zip(a, b))
        tol = 1e-4 * scale
        if err > tol:
            print(f"{sys.argv[5]:18s} refused: logits differ by {err:.2e} > {tol:.1e}")
            sys.exit(3)
    print(f"{sys.argv[5]:18s} headscope {h['forward_s']*1e3:9.1f} ms   eager {p['forward_s']*1e3:9.1f} ms: "
          f"{p['forward_s']/h['forward_s']:5.2f}x   eager with headscope's process settings "
          f"{q['forward_s']*1e3:9.1f} ms: {q['forward_s']/h['forward_s']:5.2f}x   (per-row GEMMs "
          f"{h['forward_per_row_s']*1e3:8.1f} ms; with stripes: {h['forward_pattern_capture_s']*1e3:.1f} vs "
          f"{p['forward_pattern_capture_s']*1e3:.1f} ms; logits agree to {err:.1e})")
elif kind == "eff":
    h = json.loads(sys.argv[2])
    print(f"forward efficiency {h['forward_gflops']:.1f} GFLOP/s / GEMM {h['gemm_gflops_512']:.1f} GFLOP/s = "
          f"{h['forward_gflops']/h['gemm_gflops_512']:.2f}  (target >= 0.6)")
    print(f"capture overhead   {h['forward_pattern_capture_s']/h['forward_s']:.2f}x  (forward with 3 stripe "
          f"reductions over plain; target <= 1.25)")
elif kind == "peers":  # headscope JSON, HF eager, HF sdpa, TransformerLens ("{}": not run), label
    h, label = json.loads(sys.argv[2]), sys.argv[6]
    peers = {n: json.loads(a) for n, a in zip(("eager", "sdpa", "tl"), sys.argv[3:6])}
    peers = {n: p for n, p in peers.items() if p}
    a, errs = h["logits_probe"], []
    for n, p in peers.items():
        b = p["logits_probe"]
        err = max(abs(x - y) for x, y in zip(a, b)); tol = 1e-4 * max(1.0, max(abs(x) for x in b))
        if err > tol:
            print(f"{label:18s} refused: {n} logits differ from headscope's by {err:.2e} > {tol:.1e}")
            sys.exit(3)
        errs.append(err)
    hs = h["forward_s"]
    line = f"{label:18s} headscope {hs*1e3:8.1f} ms"
    best = min((peers[n]["forward_s"] for n in ("eager", "sdpa") if n in peers), default=None)
    for n in ("eager", "sdpa"):
        if n in peers:
            line += f" | transformers {n} {peers[n]['forward_s']*1e3:8.1f} ms"
    if best is not None:
        line += f": vs transformers' best {best/hs:5.2f}x ({'met' if best > hs else 'NOT met'})"
    if "tl" in peers:
        t = peers["tl"]
        line += (f" | TransformerLens {t['forward_s']*1e3:8.1f} ms: {t['forward_s']/hs:5.2f}x; run_with_cache patterns "
                 f"{t['forward_pattern_capture_s']*1e3:.1f} ms vs headscope stripes {h['forward_pattern_capture_s']*1e3:.1f} ms: "
                 f"{t['forward_pattern_capture_s']/h['forward_pattern_capture_s']:.2f}x")
    print(line + f"  (logits agree to {max(errs):.1e})")
elif kind == "needle":  # label, headscope seconds (whole process), trials, reference JSON[, scores]
    label, hs_s, n, r = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
    if not r.get("same_tokens") or r.get("max_score_diff", 1) > 1e-5 or r["trials"] != n:
        print(f"{label:30s} refused: the reference's greedy tokens or per-trial retrieval scores differ from headscope's "
              f"(same tokens {r.get('same_tokens')}, max score difference {r.get('max_score_diff')})")
        sys.exit(3)
    per = hs_s / n
    ratio_ = r["mean_trial_s"] / per
    print(f"{label:30s} headscope {per:7.2f} s/trial (whole process / {n} trials)   reference loop {r['mean_trial_s']:7.2f} s/trial: "
          f"{ratio_:5.2f}x  (target >= 3x: {'met' if ratio_ >= 3 else 'NOT met'}; {r['decode_steps']} decode steps, "
          f"prompts {min(r['prompt_tokens'])}-{max(r['prompt_tokens'])} tokens, same greedy tokens and per-trial scores)")
elif kind == "bf16":
    a, b = json.loads(sys.argv[2]), json.loads(sys.argv[3])
    print(f"bfloat16 forward   {b['forward_s']*1e3:.1f} ms vs float32 {a['forward_s']*1e3:.1f} ms: "
          f"{a['forward_s']/b['forward_s']:.2f}x the float32 speed (512^3 products: bfloat16 "
          f"{b['gemm_gflops_512']:.1f}, float32 {b['gemm_gflops_512_float32']:.1f} GFLOP/s)")
PYEOF
}

echo "== headscope bench.sh ($( [ $SMOKE = 1 ] && echo smoke || echo full )): $THREADS threads, $("$HS" -q info --system 2>/dev/null | grep -E '^(libtorch|BLAS)' | tr -s ' ' | paste -sd';')"
if [ "${PEERS_ONLY:-0}" != 1 ]; then
echo "-- 1, 3. efficiency and capture overhead ($MODEL, 1 x $EFF_T)"
if j=$(hs_bench "$MODEL" 1 "$EFF_T"); then ratio eff "$j"; else echo "refused: headscope bench failed"; fail=1; fi

echo "-- 2. against Python eager (same model, BLAS, threads; median of $REPS)"
for m in "$MODEL" "$GQA"; do
  for s in $SHAPES; do
    B=${s%:*}; T=${s#*:}
    if h=$(hs_bench "$m" "$B" "$T") && p=$(py_bench "$m" "$B" "$T") && q=$(py_bench_tuned "$m" "$B" "$T"); then
      ratio compare "$h" "$p" "$q" "$(basename "$m") ${B}x${T}" || fail=1
    else
      echo "$(basename "$m") ${B}x${T}: refused (a side failed)"; fail=1
    fi
  done
done

echo "-- 4. peak resident memory of detect (induction, previous-token; one row [BOS, R, R])"
W=$(du -m "$MODEL/model.safetensors" | cut -f1)
prev=""; mem_pts=""
for T in $MEM_TS; do
  n=$(( (T - 1) / 2 ))
  if [ -n "$TIME" ]; then
    if $TIME -f "%M" -o "$DIR/rss" "$HS" -q detect "$MODEL" --probe induction,previous-token --seq-len "$n" --batch 1 \
         --out "$DIR/mem.h5" --force --threads "$THREADS" >/dev/null 2>"$DIR/err"; then
      rss=$(( $(tail -1 "$DIR/rss") / 1024 ))
      line="T=$((2*n+1)): peak $rss MiB ($((rss - W)) MiB beyond the $W MiB of weights)"
      [ -n "$prev" ] && line="$line, +$((rss - prev)) MiB since the previous T"
      echo "$line"; prev=$rss
      mem_pts="$mem_pts $((2*n+1)):$rss"
    else
      echo "T=$T: detect failed: $(head -1 "$DIR/err")"; fail=1
    fi
  else
    echo "no /usr/bin/time (apt-get install time): memory not measured"; break
  fi
done

# Linear or not: a least-squares line through the points (glibc's heap grows in steps, so single
# increments mislead), and what one layer's whole [H, T, T] fp32 pattern would take at the largest T.
H=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['num_attention_heads'])" "$MODEL/config.json" 2>/dev/null || echo 0)
if [ -n "$mem_pts" ] && [ "$(echo $mem_pts | wc -w)" -ge 3 ]; then
  "$PY" - "$H" $mem_pts <<'PYEOF'
import sys
h = int(sys.argv[1]); pts = [tuple(map(int, a.split(":"))) for a in sys.argv[2:]]
n = len(pts); mt = sum(t for t, _ in pts) / n; mm = sum(m for _, m in pts) / n
b = sum((t - mt) * (m - mm) for t, m in pts) / sum((t - mt) ** 2 for t, _ in pts); a = mm - b * mt
dev = max(abs(m - (a + b * t)) for t, m in pts); tmax = max(t for t, _ in pts)
print(f"linear fit: {b * 1024:.1f} MiB per 1024 tokens + {a:.0f} MiB, every point within {dev:.0f} MiB of the line "
      f"(one layer's [{h}, {tmax}, {tmax}] fp32 pattern alone: {h * tmax * tmax * 4 / 2**20:.0f} MiB)")
PYEOF
fi

echo "-- 5. bfloat16 against float32"
if a=$(hs_bench "$MODEL" 1 "$EFF_T") && b=$(hs_bench "$MODEL" 1 "$EFF_T" bfloat16 2>"$DIR/bf16.err"); then
  ratio bf16 "$a" "$b"; grep -h "warning" "$DIR/bf16.err" | head -1
else
  echo "bfloat16: refused (a side failed)"; fail=1
fi
echo "-- 5b. score differences bfloat16 causes (max |bf16 - fp32| over heads; detect's stripe scores)"
PYH=$(bash scripts/find_python.sh h5py numpy 2>/dev/null) || PYH=""
TD=""; for c in ../shared/testdata shared/testdata; do [ -z "$TD" ] && [ -d "$c" ] && TD="$c"; done
TOYDIR=${HEADSCOPE_CI_TOY_DIR:-build/ci-toy}
cases=()
[ -n "$TD" ] && cases+=("$TD/stories260K/stories260K.bin|--seq-len 50 --batch 20 --token-range 259,512")
[ -n "$TD" ] && cases+=("$TD/tinystories-656k|--seq-len 50 --batch 20 --token-range 259,2048")
for t in induction recall; do [ -f "$TOYDIR/$t/config.json" ] && cases+=("$TOYDIR/$t|--seq-len 25 --batch 32 --token-range 6,68"); done
[ -f "models/toy-induction/config.json" ] && cases+=("models/toy-induction|--seq-len 25 --batch 32 --token-range 6,68")
if [ -z "$PYH" ]; then echo "no Python with h5py: score differences not computed"; fi
for c in "${cases[@]}"; do
  [ -n "$PYH" ] || break
  m=${c%%|*}; args=${c#*|}
  if "$HS" -q detect "$m" --probe induction,previous-token $args --out "$DIR/f32.h5" --force >/dev/null 2>&1 &&
     "$HS" -q detect "$m" --probe induction,previous-token $args --dtype bfloat16 --out "$DIR/bf16.h5" --force >/dev/null 2>&1; then
    "$PYH" - "$DIR/f32.h5" "$DIR/bf16.h5" "$m" <<'PYEOF'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
parts = []
for p in ("induction", "previous-token"):
    x, y = a[f"/scores/{p}/score"][()], b[f"/scores/{p}/score"][()]
    parts.append(f"{p} {np.abs(x - y).max():.4f} (top head {'same' if x.argmax() == y.argmax() else 'DIFFERENT'})")
print(f"{sys.argv[3]}: " + ", ".join(parts))
PYEOF
  else
    echo "$m: detect failed"; fail=1
  fi
done
fi  # PEERS_ONLY

echo "-- 6. against the peers: PyPI transformers and TransformerLens ($MODEL; logits checked before any ratio)"
TOKDIR=""; for c in ../shared/testdata/gpt2-tokenizer shared/testdata/gpt2-tokenizer; do [ -z "$TOKDIR" ] && [ -f "$c/vocab.json" ] && TOKDIR="$c"; done
if ! PP=$(bash scripts/find_peers.sh 2>/dev/null); then
  echo "peers: skipped (no venv; run scripts/setup_peers.sh)"
else
  echo "peers: $("$PP" -c 'from importlib.metadata import version as v
print("torch", v("torch"), "| transformers", v("transformers"), "| transformer_lens", v("transformer_lens"))' 2>/dev/null), $THREADS threads, median of $REPS"
  [ -n "$TOKDIR" ] || echo "peers: TransformerLens skipped (no ../shared/testdata/gpt2-tokenizer: TransformerBridge needs a tokenizer)"
  pf() {  # pf PEER B T: one peer's forward JSON, "{}" when it failed (said on stdout)
    local o
    if o=$("$PP" scripts/bench_peers.py forward "$MODEL" --peer "$1" --batch "$2" --seq "$3" --reps "$REPS" --threads "$THREADS" \
             ${TOKDIR:+--tokenizer "$TOKDIR"} 2>"$DIR/peer.err" | tail -1) && [ -n "$o" ]; then echo "$o"
    else echo "{}"; echo "peer $1 ${2}x$3 failed: $(tail -1 "$DIR/peer.err")" >&2; fi
  }
  PARTS=" ${PEERS_PARTS:-forward needle study ablation} "
  [[ "$PARTS" == *" forward "* ]] || SHAPES_P=""
  for s in ${SHAPES_P-$SHAPES}; do
    B=${s%:*}; T=${s#*:}
    tl="{}"
    if h=$(hs_bench "$MODEL" "$B" "$T"); then
      e=$(pf hf-eager "$B" "$T"); sd=$(pf hf-sdpa "$B" "$T"); [ -n "$TOKDIR" ] && tl=$(pf tl "$B" "$T")
      if [ "$e" = "{}" ] || [ "$sd" = "{}" ] || { [ -n "$TOKDIR" ] && [ "$tl" = "{}" ]; }; then
        echo "$(basename "$MODEL") ${B}x${T}: refused (a peer failed)"; fail=1
      else
        ratio peers "$h" "$e" "$sd" "$tl" "$(basename "$MODEL") ${B}x${T}" || fail=1
      fi
    else
      echo "$(basename "$MODEL") ${B}x${T}: refused (headscope failed)"; fail=1
    fi
  done
  if [ $SMOKE = 1 ]; then
    echo "peers: needle scan and ablation sweep not run in --smoke (full run only)"
  elif [ -z "$TOKDIR" ]; then
    echo "peers: needle scan and ablation sweep skipped (no ../shared/testdata/gpt2-tokenizer)"
  else
    echo "-- 6b. needle scan: headscope retrieval against the Retrieval_Head reference loop (transformers), per trial"
    head -1 datasets/needles/needles.jsonl > "$DIR/needle1.jsonl"
    STEPS=${NEEDLE_STEPS:-16}
    [[ "$PARTS" == *" needle "* ]] || NEEDLE_LENGTHS=" "
    for L in ${NEEDLE_LENGTHS:-1000 4000}; do
      for sc in retrieval retrieval,locos; do
        t0=$(date +%s.%N)
        if "$HS" -q retrieval "$MODEL" --tokenizer "$TOKDIR" --needles "$DIR/needle1.jsonl" --lengths "$L" --depths 25,75 \
             --max-new-tokens "$STEPS" --stop none --score "$sc" --threads "$THREADS" --out "$DIR/needle-$sc.h5" --force \
             >/dev/null 2>"$DIR/needle.err"; then
          hs_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
          [ "$sc" = retrieval ] && ref=$("$PP" scripts/bench_peers.py needle "$MODEL" "$DIR/needle-$sc.h5" --tokenizer "$TOKDIR" \
                                          --threads "$THREADS" 2>"$DIR/ref.err" | tail -1)
          if [ -n "${ref:-}" ]; then
            ratio needle "T=$L --score $sc" "$hs_s" 2 "$ref" || fail=1
          else
            echo "T=$L: refused (the reference loop failed: $(tail -1 "$DIR/ref.err"))"; fail=1
          fi
        else
          echo "T=$L --score $sc: refused (headscope retrieval failed: $(head -1 "$DIR/needle.err"))"; fail=1
        fi
      done
    done
    if [[ "$PARTS" == *" study "* ]]; then
      echo "-- 6d. needle study: scan, top-3 ablation and 5 random controls (Wu's protocol) against the reference pipeline"
      HEADSCOPE_BIN="$HS" THREADS="$THREADS" STUDY_MODEL="$MODEL" bash scripts/bench_needle_study.sh "$DIR/study" || fail=1
    fi
    if [[ "$PARTS" == *" ablation "* ]]; then
      echo "-- 6c. 144-head zero-ablation sweep against TransformerLens run_with_hooks (scripts/bench_ablation.sh)"
      HEADSCOPE_BIN="$HS" bash scripts/bench_ablation.sh "${BENCH_ABLATION_DIR:-$DIR/ablation}" "$THREADS" || fail=1
    fi
  fi
fi
exit $fail
