#!/usr/bin/env bash
# Command-line behaviour: bad input gets one clear line naming the file, a documented exit code,
# no stack trace, and no output file left behind. Usage: cli_test.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"

expect "no subcommand" 2 "subcommand" -- "$HS"
expect "unknown option" 2 "unknown|extras|not expected" -- "$HS" info --bogus
expect "missing model" 4 "no such file" -- "$HS" info "$TMP/nope"
for cmd in info tokenize generate logits; do
  "$HS" "$cmd" --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL $cmd --help has no example"; }
done

# A corrupt safetensors folder: header length past end of file.
mkdir -p "$TMP/bad"; printf '{"architectures":["LlamaForCausalLM"],"hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,"intermediate_size":8,"vocab_size":16}' >"$TMP/bad/config.json"
printf '\xff\xff\x00\x00\x00\x00\x00\x00{}' >"$TMP/bad/model.safetensors"
expect "header past end" 4 "model.safetensors: header length" -- "$HS" logits "$TMP/bad" --tokens 1,2 --out "$TMP/bad.h5"
no_file "$TMP/bad.h5"
printf '{"architectures":["BertModel"]}' >"$TMP/bad/config.json"
expect "unknown arch" 3 "unknown architecture 'BertModel'" -- "$HS" info "$TMP/bad"
printf '{"architectures":["LlamaForCausalLM"],"hidden_size":10,"num_hidden_layers":1,"num_attention_heads":3,"intermediate_size":8,"vocab_size":16}' >"$TMP/bad/config.json"
expect "indivisible" 3 "not divisible" -- "$HS" info "$TMP/bad"
printf 'not json' >"$TMP/bad/config.json"
expect "config not json" 3 "config.json: not valid JSON" -- "$HS" info "$TMP/bad"

if [ -n "$TD" ]; then
  M="$TD/stories260K/stories260K.bin"
  # A dtype this build cannot multiply on the CPU is refused before anything runs (never a silent
  # fallback); bfloat16 runs, with at most one measured warning line when it is slow here.
  if "$HS" logits "$M" --tokens 1,2 --dtype float16 --out "$TMP/f16.h5" 2>"$TMP/err" >/dev/null; then
    pass=$((pass+1))  # this libtorch multiplies float16 on the CPU (libtorch 2.x does)
  else
    expect "float16 refused" 2 "dtype float16: this libtorch build .* cannot multiply float16" -- \
      "$HS" logits "$M" --tokens 1,2 --dtype float16 --out "$TMP/f16.h5"
    no_file "$TMP/f16.h5"
  fi
  "$HS" logits "$M" --tokens 1,2 --dtype bfloat16 --out "$TMP/bf16.h5" 2>"$TMP/err" >/dev/null
  check "bfloat16 runs" -- test -f "$TMP/bf16.h5"
  check "bfloat16: at most one warning line" -- test "$(grep -c warning "$TMP/err")" -le 1
  # --attention fused: refused in one line where this libtorch has no fused kernel (1.13); where it
  # has one (2.x) the greedy text equals the blocked attention's. --device cuda without CUDA: one line.
  if "$HS" info --system | grep -q "^libtorch *1\."; then
    expect "fused attention refused on libtorch 1.x" 2 "--attention fused: this build's libtorch 1\..* has no fused attention" -- \
      "$HS" logits "$M" --tokens 1,2 --attention fused --out "$TMP/fused.h5"
    no_file "$TMP/fused.h5"
  else
    ok "generate --attention fused" -- "$HS" generate "$M" --steps 200 --attention fused
    cmp -s "$TMP/out" "$TD/stories260K/expected_greedy_200.txt" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL fused greedy 200 differs from expected_greedy_200.txt"; }
  fi
  if ! "$HS" info --system | grep -q "libtorch uses CUDA"; then
    expect "no CUDA" 2 "--device cuda: this libtorch build or machine has no CUDA" -- "$HS" logits "$M" --tokens 1,2 --device cuda --out "$TMP/cuda.h5"
    no_file "$TMP/cuda.h5"
  fi
  expect "bad device" 2 "--device 'gpu0': expected cpu, cuda or cuda:N" -- "$HS" logits "$M" --tokens 1,2 --device gpu0 --out "$TMP/cuda.h5"
  head -c 1000 "$M" >"$TMP/trunc.bin"
  expect "truncated bin" 4 "trunc.bin: truncated" -- "$HS" info "$TMP/trunc.bin"
  expect "token out of range" 5 "token id 9999 out of range" -- "$HS" logits "$M" --tokens 1,9999 --out "$TMP/x.h5"
  no_file "$TMP/x.h5"
  expect "bad token list" 5 "'abc' is not a token id" -- "$HS" logits "$M" --tokens 1,abc --out "$TMP/x.h5"
  ok "logits" -- "$HS" logits "$M" --text "Tom and Sue went to the park" --out "$TMP/park.h5"
  expect "no clobber" 6 "exists" -- "$HS" logits "$M" --tokens 1,2 --out "$TMP/park.h5"
  ok "force" -- "$HS" logits "$M" --tokens 1,2 --out "$TMP/park.h5" --force
  ok "tokenize" -- "$HS" tokenize "$M" --text "Hello"
  grep -qE '^\[1, ' "$TMP/out" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL tokenize output: $(cat "$TMP/out")"; }
  printf '{"model": {"type": "Unigram"}}' >"$TMP/tok.json"
  expect "bad tokenizer" 5 "tok.json" -- "$HS" tokenize "$TMP/tok.json" --text hi
  ok "generate" -- "$HS" generate "$M" --steps 200
  cmp -s "$TMP/out" "$TD/stories260K/expected_greedy_200.txt" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL greedy 200 differs from expected_greedy_200.txt"; }
else
  echo "skipped the test-data checks: ../shared/testdata not found"
fi
# Process settings (src/base/preinit.h): libgomp starts with the passive wait policy (spin count 0)
# unless the user chose one; without a spare environment slot (env -i) libgomp's default stays.
spin() { env "$@" OMP_DISPLAY_ENV=VERBOSE "$HS" --version 2>&1 | sed -n "s/.*GOMP_SPINCOUNT = '\([0-9]*\)'.*/\1/p"; }
check "OpenMP workers sleep when idle (GOMP_SPINCOUNT 0)" -- test "$(spin X=1)" = 0
check "the user's OMP_WAIT_POLICY wins" -- test "$(spin OMP_WAIT_POLICY=ACTIVE)" = 30000000000
check "env -i: libgomp's default kept" -- test "$(spin -i)" = 300000
# The build's commit (scripts/git_commit.cmake, run at every build): a checkout's short hash, -dirty when a
# tracked file changed, "unknown" outside a checkout; the header is rewritten only when its text changes.
if command -v git >/dev/null && command -v cmake >/dev/null; then
  G="$TMP/gitrepo"; H="$TMP/commit.h"; mkdir -p "$G"
  gc() { cmake -DSRC="$1" -DOUT="$H" -P scripts/git_commit.cmake >/dev/null 2>&1; sed -n 's/^#define HS_GIT_COMMIT "\(.*\)"$/\1/p' "$H"; }
  git -C "$G" init -q && echo a >"$G/f" && git -C "$G" add f &&
    git -C "$G" -c user.name=t -c user.email=t@t commit -qm one
  h=$(git -C "$G" rev-parse --short HEAD)
  check "commit: a clean checkout's short hash" -- test "$(gc "$G")" = "$h"
  touch -d '2000-01-01' "$H"; gc "$G" >/dev/null
  check "commit: the header not rewritten when unchanged" -- test "$(stat -c %Y "$H")" = "$(date -d '2000-01-01' +%s)"
  echo b >"$G/f"
  check "commit: -dirty when a tracked file changed" -- test "$(gc "$G")" = "$h-dirty"
  mkdir -p "$TMP/nogit"
  check "commit: unknown outside a checkout" -- test "$(GIT_CEILING_DIRECTORIES="$TMP" gc "$TMP/nogit")" = unknown
fi
echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
