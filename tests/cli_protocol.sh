#!/usr/bin/env bash
# retrieval --protocol wu|locos builds and scores its trials exactly as the reference codes do: on
# tinystories-656k (SentencePiece-style BPE, BOS added, GQA 8/4) and on a tiny random Qwen2 with
# GPT-2's byte-level BPE (GQA 4/2, an EOS list in generation_config.json), headscope's file equals
# scripts/needle_reference.py (an independent transformers implementation that follows
# retrieval_head_detection.py and LOCOS's logit_contrib.py line by line) trial by trial: prompt ids,
# spans, generated tokens, the ablated pass's tokens exactly; ROUGE, retrieval credit, L+, L-, LOCOS
# (per trial and per step, --dump-steps) within 1e-5 (tests/needle_protocol_check.py). The check
# itself is tested first: the harness's own output written in headscope's layout passes, and a
# perturbed copy fails. Needs the peers' venv ($HEADSCOPE_PEERS_VENV, else .venv-peers: torch,
# transformers, rouge_score, h5py) and ../shared/testdata; skips, saying so, without them, and skips
# the headscope comparison while `retrieval --help` has no --protocol.
# Usage: cli_protocol.sh path/to/headscope   (HEADSCOPE_PROTOCOL_KEEP=DIR keeps the JSONL, HDF5 and
# check outputs there)
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
N="$ROOT/datasets/needles"
keep() {
  [ -n "${HEADSCOPE_PROTOCOL_KEEP:-}" ] || return 0
  mkdir -p "$HEADSCOPE_PROTOCOL_KEEP" && cp -r "$TMP"/*.jsonl "$TMP"/*.h5 "$TMP"/check-*.txt "$TMP/data" "$TMP/models" "$HEADSCOPE_PROTOCOL_KEEP"/ 2>/dev/null
  echo "kept the runs in $HEADSCOPE_PROTOCOL_KEEP"
}
skip() { keep; echo "cli-protocol: skipped: $1"; echo "cli-protocol: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }

venv="${HEADSCOPE_PEERS_VENV:-$ROOT/.venv-peers}"
PY="$venv/bin/python"
[ -x "$PY" ] || skip "no peers' virtual environment at $venv (scripts/setup_peers.sh, or set HEADSCOPE_PEERS_VENV)"
"$PY" -c 'import torch, transformers, rouge_score, h5py' 2>/dev/null ||
  skip "the peers' environment at $venv lacks torch, transformers, rouge_score or h5py ($venv/bin/pip install rouge-score)"
[ -n "$TD" ] || skip "../shared/testdata not found (tinystories-656k, gpt2-tokenizer)"
TD="$(cd "$TD" && pwd)"
TS="$TD/tinystories-656k"
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error

ok "tiny Qwen2 + GPT-2 tokenizer checkpoint" -- "$PY" "$ROOT/scripts/make_tiny_hf.py" "$TMP/models" --testdata "$TD"
QW="$TMP/models/qwen2-gpt2tok"
# Reference layouts (our own data): Wu et al. read part{i}/*.txt raw, LOCOS parses p1.txt's JSON rows.
# tinystories: real_needle = the needle sentence (Wu's search finds it), its first word (answer
# steps, passes), the answer (not found: no credit under wu, the needle span under locos).
layout() {  # layout NAME HAYSTACK NEEDLES PICK REAL
  for style in raw json; do
    ok "layout $1 $style" -- "$PY" "$ROOT/scripts/make_reference_layout.py" --haystack "$2" --needles "$3" \
      --pick "$4" --real-needle "$5" --style "$style" --out "$TMP/data/$1-$style"
  done
}
layout ts "$N/tinystories_haystack.txt" "$N/tinystories_needles.jsonl" 0,1,2 needle,first,answer
layout qw "$N/haystack.txt" "$N/needles.jsonl" 0,6,7 answer,answer,needle
# Every real_needle inside its needle too, so that Wu's trial construction is compared on its own
# even where headscope refuses an answer its search does not find in the needle (the reference does
# not: find_needle_idx returns (-1, -1) and the trial runs uncredited, WU:249-259, 287).
layout tsn "$N/tinystories_haystack.txt" "$N/tinystories_needles.jsonl" 0,1,2 needle
layout qwn "$N/haystack.txt" "$N/needles.jsonl" 0,6,7 needle,answer,needle
GRID=(--lengths 300,400 --depths 0,50,100)

# case NAME MODEL PROTOCOL DATA ABLATION: the harness's trials into $TMP/NAME.jsonl.
reference() {
  ok "harness $1" -- "$PY" "$ROOT/scripts/needle_reference.py" --model "$2" --protocol "$3" --haystack-dir "$4" \
    "${GRID[@]}" --ablate L0H1,L1H2 --ablation "$5" --threads 1 --out "$TMP/$1.jsonl"
  grep -h "found their answer span" "$TMP/out" || true
}
reference ts-locos "$TS" locos "$TMP/data/ts-json" mean-query
reference qw-locos "$QW" locos "$TMP/data/qw-json" zero-query
reference tsn-wu "$TS" wu "$TMP/data/tsn-raw" zero-query
reference qwn-wu "$QW" wu "$TMP/data/qwn-raw" zero-query

# The check can fail: the harness's own output in headscope's layout passes; perturbed, it fails.
if [ -s "$TMP/ts-locos.jsonl" ]; then
  ok "emulated file" -- "$PY" "$ROOT/tests/needle_protocol_check.py" "$TMP/ts-locos.jsonl" "$TMP/emu.h5" --emulate
  ok "the check passes its own output" -- "$PY" "$ROOT/tests/needle_protocol_check.py" "$TMP/ts-locos.jsonl" "$TMP/emu.h5"
  "$PY" - "$TMP/emu.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    p = f["/retrieval/trials/prompt_tokens"]; r = p[1]; r[3] += 1; p[1] = r
    s = f["/retrieval/steps/lplus"]; x = s[4]; x[0, 1, 2] += 1e-4; s[4] = x
EOF
  "$PY" "$ROOT/tests/needle_protocol_check.py" "$TMP/ts-locos.jsonl" "$TMP/emu.h5" >"$TMP/out" 2>&1
  check "the check fails a perturbed file (exit 1)" -- test $? -eq 1
  check "it names the prompt difference" -- grep -q "prompt ids: .*first difference at index 3" "$TMP/out"
  check "it names the per-step L+ difference" -- grep -q "steps/lplus: max |diff| 0.0001" "$TMP/out"
fi

"$HS" retrieval --help 2>&1 | grep -q -- "--protocol" ||
  skip "the harness ran; this headscope has no retrieval --protocol yet, so nothing to compare it with"

compare() {  # compare NAME MODEL PROTOCOL DATA ABLATION
  if ! "$HS" -q retrieval "$2" --protocol "$3" --haystack-dir "$4" "${GRID[@]}" \
      --ablate L0H1,L1H2 --ablation "$5" --dump-steps --threads 1 --out "$TMP/$1.h5" >"$TMP/hs-$1.txt" 2>&1; then
    fail=$((fail+1)); echo "FAIL headscope $1 (the reference ran this grid):"; tail -3 "$TMP/hs-$1.txt"; return
  fi
  pass=$((pass+1))
  # --rtol 1e-5: L+ and L- per step reach |30| on tinystories-656k, where two float32 forwards differ
  # by more than 1e-5 absolute (the harness in float32 against itself in float64: up to 8.1e-5,
  # within 1e-5 + 2.2e-6 |x|); every other quantity stays within 1e-5 absolute.
  "$PY" "$ROOT/tests/needle_protocol_check.py" "$TMP/$1.jsonl" "$TMP/$1.h5" --rtol 1e-5 >"$TMP/check-$1.txt" 2>&1
  local rc=$?
  tail -2 "$TMP/check-$1.txt"
  if [ "$rc" -eq 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $1: headscope differs from the reference:"; head -60 "$TMP/check-$1.txt"; fi
}
# A needle whose answer Wu's search cannot find in the needle's own tokens can earn no credit in any
# trial (the reference runs it uncredited, its zeros in every head's mean); headscope refuses it in
# one line naming the needles file's line (exit 5), and leaves no file.
refuse() {  # refuse NAME MODEL DATA
  "$HS" -q retrieval "$2" --protocol wu --haystack-dir "$3" "${GRID[@]}" --threads 1 --out "$TMP/$1.h5" >"$TMP/hs-$1.txt" 2>&1
  check "$1: refused (exit 5)" -- test $? -eq 5
  check "$1: one line naming needles.jsonl:LINE and Wu's search" -- grep -q "needles.jsonl:[0-9]*: Wu's answer search" "$TMP/hs-$1.txt"
  check "$1: no output file" -- test ! -e "$TMP/$1.h5"
}
refuse ts-wu "$TS" "$TMP/data/ts-raw"
refuse qw-wu "$QW" "$TMP/data/qw-raw"
compare ts-locos "$TS" locos "$TMP/data/ts-json" mean-query
compare qw-locos "$QW" locos "$TMP/data/qw-json" zero-query
compare tsn-wu "$TS" wu "$TMP/data/tsn-raw" zero-query
compare qwn-wu "$QW" wu "$TMP/data/qwn-raw" zero-query

keep
echo "cli-protocol: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
