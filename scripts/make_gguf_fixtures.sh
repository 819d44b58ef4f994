#!/usr/bin/env bash
# Writes the GGUF test files the C++ GGUF loader is checked with (issue 37), converted the way
# llama.cpp's convert_hf_to_gguf.py does (scripts/make_gguf.py says how, and where it deviates):
#   OUTDIR/<family>-{f32,q8_0}.gguf      every folder under tests/fixtures/families
#   OUTDIR/<family>-{f16,bf16}.gguf      for gpt2, qwen3 and gemma2
#   OUTDIR/tinystories-656k-{f32,f16,bf16,q8_0}.gguf   from the test data (HEADSCOPE_TESTDATA or ../shared/testdata; skipped if absent)
#   OUTDIR/gpt2-vocab.gguf               --vocab-only from ../shared/testdata/gpt2-tokenizer
#   OUTDIR/READY                         the list of files, written last
#   bash scripts/make_gguf_fixtures.sh OUTDIR
# Idempotent: nothing is redone while OUTDIR/READY is newer than this script and make_gguf.py.
# Without PyPI (scripts/setup_gguf.sh exits 3) it prints "gguf fixtures: SKIPPED (...)" and exits 0
# with no READY file, so a test can skip on its absence.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
cd "$(dirname "$0")/.."
repo="$PWD"
mkdir -p "$1"
out="$(cd "$1" && pwd)"
# The test data as tests/testdata.h finds it: HEADSCOPE_TESTDATA if set, else ../shared/testdata.
testdata="${HEADSCOPE_TESTDATA:-$repo/../shared/testdata}"
ready="$out/READY"

if [ -f "$ready" ] && [ "$ready" -nt scripts/make_gguf.py ] && [ "$ready" -nt scripts/make_gguf_fixtures.sh ]; then
  echo "gguf fixtures: up to date in $out"
  exit 0
fi

set +e
py=$(bash scripts/setup_gguf.sh | tail -n 1)
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 3 ]; then
  echo "gguf fixtures: SKIPPED (PyPI unreachable, no gguf environment)"
  exit 0
fi
if [ "$rc" -ne 0 ] || [ ! -x "$py" ]; then
  echo "make_gguf_fixtures.sh: scripts/setup_gguf.sh failed (exit $rc)" >&2
  exit 1
fi

rm -f "$ready"
# one python process per file is ~0.3 s; the whole set (~35 files) takes ~10 s
jobs_list=()
for dir in tests/fixtures/families/*/; do
  name=$(basename "$dir")
  [ -f "$dir/config.json" ] || continue
  types="f32 q8_0"
  case "$name" in gpt2|qwen3|gemma2) types="f32 f16 bf16 q8_0" ;; esac
  for t in $types; do jobs_list+=("$dir|$name-$t.gguf|--outtype $t"); done
done
if [ -f "$testdata/tinystories-656k/model.safetensors" ]; then
  for t in f32 f16 bf16 q8_0; do
    jobs_list+=("$testdata/tinystories-656k|tinystories-656k-$t.gguf|--outtype $t")
  done
else
  echo "gguf fixtures: $testdata/tinystories-656k absent, its files skipped" >&2
fi
if [ -f "$testdata/gpt2-tokenizer/vocab.json" ]; then
  jobs_list+=("$testdata/gpt2-tokenizer|gpt2-vocab.gguf|--vocab-only")
else
  echo "gguf fixtures: $testdata/gpt2-tokenizer absent, gpt2-vocab.gguf skipped" >&2
fi

# run them a few at a time
pids=() names=()
fail=0
for j in "${jobs_list[@]}"; do
  IFS='|' read -r src file opts <<<"$j"
  # shellcheck disable=SC2086
  "$py" scripts/make_gguf.py "$src" "$out/$file" $opts &
  pids+=($!) names+=("$file")
  if [ ${#pids[@]} -ge 4 ]; then
    wait "${pids[0]}" || { echo "make_gguf_fixtures.sh: ${names[0]} failed" >&2; fail=1; }
    pids=("${pids[@]:1}") names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "make_gguf_fixtures.sh: ${names[$i]} failed" >&2; fail=1; }
done
[ "$fail" -eq 0 ] || exit 1

{
  echo "# GGUF fixtures made by scripts/make_gguf_fixtures.sh with $("$py" -c 'from importlib.metadata import version; print("gguf", version("gguf"))')"
  for j in "${jobs_list[@]}"; do IFS='|' read -r _ file _ <<<"$j"; echo "$file"; done
} > "$ready.tmp"
mv "$ready.tmp" "$ready"
echo "gguf fixtures: ${#jobs_list[@]} files in $out"
