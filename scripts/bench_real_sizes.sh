#!/usr/bin/env bash
# Real model sizes on this machine (docs/performance.md "Real model sizes on the 2-core CPU", issue 44):
# one needle trial (`headscope retrieval`, 1 needle at depth 50, a few greedy steps with --stop none)
# on random checkpoints of real shapes, each timed as a whole process with its peak resident memory
# (/usr/bin/time -f '%e %M'):
#   1B: a Llama-3.2-1B-shaped model (16 layers, d_model 2048, 32 query / 8 KV heads, MLP 8192, tied
#       embeddings; GPT-2's 50257-token vocabulary, which its tokenizer covers), float32, at 4k, 8k and
#       16k tokens of context;
#   ref: the 8k trial again through the transformers reference loop (scripts/bench_peers.py needle:
#       Retrieval_Head's detection loop on the very prompt headscope wrote, sdpa prefill, eager decode
#       with output_attentions), greedy tokens and the trial's score compared before a ratio is printed;
#   7b: a Llama-2-7B-shaped model (32 layers, d_model 4096, 32 heads, MLP 11008, untied) stored and run
#       in bfloat16 at 4k tokens (a ~13.5 GB checkpoint, deleted afterwards unless KEEP=1).
# Before the runs: the machine's limits (`headscope bench --limits`: fp32 GEMM rate, memory bandwidth)
# and the load average; every run is niced (NICE, default 5) and runs alone.
#   bash scripts/bench_real_sizes.sh [DIR]          (DIR default /tmp/headscope-real; needs ~20 GB free for 7b)
# Env: HEADSCOPE_BIN (default build/headscope), HEADSCOPE_PEERS_VENV (default .venv-peers), THREADS (every
# core), REAL_PARTS ("1b ref 7b"), REAL_LENGTHS (4096,8192,16384), REAL_REF_LENGTH (8192), REAL_STEPS (4),
# REAL_7B_LENGTH (4096), NICE (5), KEEP (0: delete the checkpoints this script made when it ends).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-/tmp/headscope-real}"
mkdir -p "$DIR"
HS="${HEADSCOPE_BIN:-build/headscope}"
PP="${HEADSCOPE_PEERS_VENV:-$PWD/.venv-peers}/bin/python"
PY=/usr/bin/python3
THREADS="${THREADS:-$(nproc)}"
PARTS=" ${REAL_PARTS:-1b ref 7b} "
LENGTHS="${REAL_LENGTHS:-4096,8192,16384}"
REF_LEN="${REAL_REF_LENGTH:-8192}"
STEPS="${REAL_STEPS:-4}"
LEN7B="${REAL_7B_LENGTH:-4096}"
NICE="${NICE:-5}"
TOKDIR=../shared/testdata/gpt2-tokenizer
[ -x "$HS" ] || { echo "bench_real_sizes.sh: no headscope binary at $HS" >&2; exit 2; }
[ -d "$TOKDIR" ] || { echo "bench_real_sizes.sh: no GPT-2 tokenizer at $TOKDIR" >&2; exit 2; }
"$PY" -c 'import numpy' 2>/dev/null || PY="$PP"
head -1 datasets/needles/needles.jsonl > "$DIR/needle1.jsonl"
# The longest context plus the template and the steps must fit the positions.
max_len=$(tr , '\n' <<< "$LENGTHS,$REF_LEN,$LEN7B" | sort -n | tail -1)
CTX=$(( (max_len + 4096) / 1024 * 1024 ))

made=()
cleanup() { [ "${KEEP:-0}" = 1 ] || for m in "${made[@]}"; do rm -rf "$m"; done; }
trap cleanup EXIT
make_model() {  # make_model DIR ARGS...: a random checkpoint (scripts/make_bench_model.py), unless there
  local d="$1"; shift
  [ -f "$d/config.json" ] && return 0
  echo "making $d ($*)"
  made+=("$d")
  nice -n "$NICE" "$PY" scripts/make_bench_model.py "$d" "$@" --ctx "$CTX" >/dev/null
}
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }
# The bytes of a checkpoint's tensors (its safetensors header), the weights a decode step reads.
weights_bytes() {
  "$PY" - "$1/model.safetensors" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
print(sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__"))
EOF
}

M1="$DIR/llama1b"
[[ "$PARTS" == *" 1b "* || "$PARTS" == *" ref "* ]] && make_model "$M1" --layers 16 --d-model 2048 --heads 32 --kv-heads 8 --d-ff 8192 --vocab 50257
echo "== bench_real_sizes.sh: $THREADS threads, $(date -u '+%F %T UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$HS" -q bench "$M1" --limits --threads "$THREADS" --json > "$DIR/limits.json"
"$PY" - "$DIR/limits.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"limits: float32 GEMM {j['gemm_gflops_512_float32']:.1f} GFLOP/s (512^3), memory read {j['memory_read_gbs']:.1f} GB/s, "
      f"copy {j['memory_copy_gbs']:.1f} GB/s ({j['memory_buffer_bytes'] >> 20} MiB)")
EOF

rows=()  # "label tokens prompt_tokens seconds peak_kib weights_bytes"
run_trial() {  # run_trial LABEL MODEL TOKENS [headscope options...]: one needle trial, timed
  local label="$1" model="$2" n="$3"; shift 3
  local out="$DIR/$label-$n"
  echo "-- $label at $n tokens (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  if ! /usr/bin/time -f '%e %M' -o "$out.time" nice -n "$NICE" "$HS" -v retrieval "$model" --tokenizer "$TOKDIR" \
       --haystack datasets/needles/haystack.txt --needles "$DIR/needle1.jsonl" --lengths "$n" --depths 50 \
       --max-new-tokens "$STEPS" --stop none --score retrieval --threads "$THREADS" "$@" --out "$out.h5" --force \
       >"$out.out" 2>"$out.err"; then
    echo "$label at $n: headscope failed: $(grep -m1 -i error "$out.err" || tail -1 "$out.err")"; return 1
  fi
  read -r secs kib < "$out.time"
  echo "   $secs s, peak RSS $(gib $((kib * 1024))) GiB; $(grep -h '^time:\|time: prefill' "$out.err" | sed 's/^.*time: /time: /' | head -1)"
  local prompt; prompt=$("$PY" -c "import h5py, sys; p = h5py.File(sys.argv[1], 'r')['retrieval/trials/prompt_tokens'][()]; print(int((p[0] >= 0).sum()))" "$out.h5")
  rows+=("$label $n $prompt $secs $kib $(weights_bytes "$model")")
}

if [[ "$PARTS" == *" 1b "* ]]; then
  for n in ${LENGTHS//,/ }; do run_trial 1b "$M1" "$n" || true; done
fi
if [[ "$PARTS" == *" ref "* ]]; then
  if ! [ -x "$PP" ] || ! "$PP" -c 'import torch, transformers, h5py' 2>/dev/null; then
    echo "ref: skipped (no peers' environment at $PP: bash scripts/setup_peers.sh)"
  else
    [ -f "$DIR/1b-$REF_LEN.h5" ] || run_trial 1b "$M1" "$REF_LEN" || true
    echo "-- transformers reference loop at $REF_LEN tokens, same trial (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    if /usr/bin/time -f '%e %M' -o "$DIR/ref.time" nice -n "$NICE" "$PP" scripts/bench_peers.py needle "$M1" "$DIR/1b-$REF_LEN.h5" \
         --tokenizer "$TOKDIR" --threads "$THREADS" > "$DIR/ref.json" 2>"$DIR/ref.err"; then
      read -r rsecs rkib < "$DIR/ref.time"
      "$PY" - "$DIR/ref.json" "$DIR/1b-$REF_LEN.time" "$rsecs" "$rkib" "$DIR/1b-$REF_LEN.err" <<'EOF'
import json, re, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
hs_s, hs_kib = map(float, open(sys.argv[2]).read().split())
# headscope's trial alone (prefill + decode steps + scoring, its -v `time:` line): what the loop times
t = re.search(r"time: prefill ([0-9.]+) s, decode steps ([0-9.]+) s .*scoring ([0-9.]+) s", open(sys.argv[5]).read())
hs_trial = sum(map(float, t.groups())) if t else None
ref_loop, ref_s, ref_kib = sum(r["per_trial_s"]), float(sys.argv[3]), float(sys.argv[4])
ok = r["same_tokens"] and r["max_score_diff"] <= 1e-5
print(f"   reference: loop {ref_loop:.1f} s (whole process {ref_s:.1f} s, model load included), peak RSS {ref_kib / 2**20:.2f} GiB; "
      f"torch {r['torch']}, transformers {r.get('transformers', '?')}; prompt {r['prompt_tokens']} tokens")
print(f"   headscope {hs_s:.1f} s (whole process) against the reference loop {ref_loop:.1f} s: "
      + (f"{ref_loop / hs_s:.2f}x, against its whole process {ref_s / hs_s:.2f}x; peak RSS {hs_kib / 2**20:.2f} vs {ref_kib / 2**20:.2f} GiB"
         if ok else "NOT COMPARED: tokens or scores differ " + json.dumps(r)))
if ok and hs_trial:
    print(f"   headscope's trial {hs_trial:.1f} s (prefill + decode + scoring, no model load) against the reference loop "
          f"{ref_loop:.1f} s (the same work): {ref_loop / hs_trial:.2f}x")
EOF
    else
      echo "   the reference loop failed: $(tail -1 "$DIR/ref.err")"
    fi
  fi
fi
if [[ "$PARTS" == *" 7b "* ]]; then
  M7="$DIR/llama7b-bf16"
  make_model "$M7" --layers 32 --d-model 4096 --heads 32 --d-ff 11008 --vocab 50257 --untied --dtype bfloat16
  run_trial 7b-bf16 "$M7" "$LEN7B" --dtype bfloat16 || true
fi

echo "-- summary (weights: the checkpoint's tensors; growth: peak RSS per 1k tokens since the row above)"
printf '%-8s %7s %7s %9s %9s %11s %14s\n' model tokens prompt seconds "peak GiB" "weights GiB" "growth MiB/1k"
prev_label="" prev_n=0 prev_kib=0
for r in "${rows[@]}"; do
  read -r label n prompt secs kib wb <<< "$r"
  growth="-"
  [ "$label" = "$prev_label" ] && growth=$(awk -v a="$kib" -v b="$prev_kib" -v n="$n" -v m="$prev_n" 'BEGIN { printf "%.0f", (a - b) / 1024 / ((n - m) / 1024) }')
  printf '%-8s %7s %7s %9s %9s %11s %14s\n' "$label" "$n" "$prompt" "$secs" "$(gib $((kib * 1024)))" "$(gib "$wb")" "$growth"
  prev_label="$label" prev_n="$n" prev_kib="$kib"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
