#!/usr/bin/env bash
# KV policies that free memory (docs/performance.md): `retrieval --kv-compare` on the GPT-2-small-shaped
# random Llama of scripts/make_bench_model.py (12 layers x 12 heads, d_model 768, vocabulary 50257, 4096
# positions; or KV_MODEL, e.g. a GQA variant made with --kv-heads 4) at a prompt of a few thousand
# tokens, compressed at the prompt's end (the default: the decodes past the first token read the packed
# cache). Prints the table: each policy's measured peak cache (KiB) and decode step (ms) beside the full
# cache's (the header line), and the ratios at budget 0.25.
#   bash scripts/bench_kv_memory.sh [OUT_DIR]
# A random model solves no needle, so the needle scores are NaN: headkv's importance and stream's order
# are the weight-only QK rank (`headscope qk-spectrum`), as in "KV-cache policies compared in one run".
# Env: HEADSCOPE_BIN (build/headscope), THREADS (2), KV_LENGTH (3000), KV_BUDGETS (0.25,0.5),
# KV_POLICIES (full,snapkv,headkv,adakv,critical-adakv,razor,stream:QK), KV_MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-/tmp/headscope-bench/kv-memory}"
mkdir -p "$DIR"
HS="${HEADSCOPE_BIN:-build/headscope}"
[ -x "$HS" ] || { echo "bench_kv_memory.sh: no headscope binary at $HS (bash scripts/build.sh)" >&2; exit 2; }
TOK=../shared/testdata/gpt2-tokenizer
[ -d "$TOK" ] || { echo "bench_kv_memory.sh: needs $TOK (the test data)" >&2; exit 2; }
MODEL="${KV_MODEL:-$DIR/gpt2s}"
[ -f "$MODEL/config.json" ] || /usr/bin/python3 scripts/make_bench_model.py "$MODEL" >/dev/null
head -1 datasets/needles/needles.jsonl >"$DIR/needles.jsonl"
[ -f "$DIR/qk.h5" ] || "$HS" -q qk-spectrum "$MODEL" --threads "${THREADS:-2}" --out "$DIR/qk.h5" >/dev/null
QK="$DIR/qk.h5:scores/qk_rank/score"
/usr/bin/time -f '%e s, peak RSS %M KiB' "$HS" -q retrieval "$MODEL" --tokenizer "$TOK" --haystack datasets/needles/haystack.txt \
  --needles "$DIR/needles.jsonl" --lengths "${KV_LENGTH:-3000}" --depths 50 --max-new-tokens 2 --ablation-max-new-tokens 9 \
  --score retrieval --threads "${THREADS:-2}" --kv-budgets "${KV_BUDGETS:-0.25,0.5}" --kv-score "$QK" \
  --kv-compare "${KV_POLICIES:-full,snapkv,headkv,adakv,critical-adakv,razor,stream:$QK}" --force --out "$DIR/kv.h5" \
  | tee "$DIR/table.txt"
/usr/bin/python3 - "$DIR/kv.h5" <<'PYEOF'
import h5py, sys
g = h5py.File(sys.argv[1], 'r')['retrieval/kv_compare']
pol = [p.decode() if isinstance(p, bytes) else p for p in g['policies'][()]]
bud = list(g['budgets'][()])
full_b, full_ms = int(g.attrs['full_peak_cache_bytes']), float(g.attrs['full_decode_ms'])
print(f"full cache: peak {full_b / 2**20:.1f} MiB, {full_ms:.1f} ms a step ({g.attrs['timing_trial_tokens']}-token trial)")
for i, p in enumerate(pol):
    for j, b in enumerate(bud):
        pk, ms = int(g['peak_cache_bytes'][i, j]), float(g['decode_ms'][i, j])
        print(f"{p:18s} budget {b:.2f}: peak {pk / 2**20:7.1f} MiB = {pk / full_b:.3f} of the full cache's, "
              f"step {ms:7.1f} ms = {ms / full_ms:.2f}x the full cache's")
PYEOF
