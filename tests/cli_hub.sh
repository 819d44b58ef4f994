#!/usr/bin/env bash
# Hugging Face cache names on the command line (README "Models", src/formats/hub.h): a cache built the way
# huggingface_hub lays it out from tinystories-656k (blobs/<sha256> copies, snapshots/<commit>/<file>
# relative links, refs/main and the tag refs/v1, whose snapshot has a different config.json and no
# tokenizer.json), found through HF_HUB_CACHE or HF_HOME; `info` prints the commit, result files record
# it in /meta, --tokenizer and tokenize take names, and an unknown name is one line, exit 4, no file.
# Usage: cli_hub.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"
HS="$(cd "$(dirname "$HS")" && pwd)/$(basename "$HS")"
if [ -z "$TD" ]; then
  echo "cli-hub: skipped: ../shared/testdata not found (set HEADSCOPE_TESTDATA)"
  echo "cli-hub: 0 passed, 0 failed"; exit 0
fi
SRC="$(cd "$TD/tinystories-656k" && pwd)"
HUB="$TMP/home/hub"; REPO="$HUB/models--tiny--stories"
A=$(printf A | sha256sum | cut -c1-40); B=$(printf B | sha256sum | cut -c1-40)
mkdir -p "$REPO/blobs" "$REPO/refs" "$REPO/snapshots/$A" "$REPO/snapshots/$B"
add() {  # add COMMIT FILE CONTENT-FILE: blob named by its sha256, relative link from the snapshot
  local h; h=$(sha256sum "$3" | cut -d' ' -f1)
  [ -e "$REPO/blobs/$h" ] || cp "$3" "$REPO/blobs/$h"
  ln -s "../../blobs/$h" "$REPO/snapshots/$1/$2"
}
for f in config.json generation_config.json model.safetensors special_tokens_map.json tokenizer.json tokenizer_config.json; do
  add "$A" "$f" "$SRC/$f"
  [ "$f" = tokenizer.json ] && continue
  if [ "$f" = config.json ]; then
    sed 's/"max_position_embeddings": 512/"max_position_embeddings": 256/' "$SRC/$f" >"$TMP/config-v1.json"
    add "$B" "$f" "$TMP/config-v1.json"
  else
    add "$B" "$f" "$SRC/$f"
  fi
done
printf '%s' "$A" >"$REPO/refs/main"; printf '%s' "$B" >"$REPO/refs/v1"
export HF_HUB_CACHE="$HUB"; unset HUGGINGFACE_HUB_CACHE HF_HOME
EXPECT_MAX_LINES=1

ok "info by name" -- "$HS" info tiny/stories
check "info: the source line has the revision and commit" -- grep -qE "^source +.*Hugging Face cache tiny/stories@main -> commit $A$" "$TMP/out"
check "info: the model line is the snapshot folder" -- grep -qE "^model +$REPO/snapshots/$A$" "$TMP/out"
check "info: the tokenizer from the snapshot" -- grep -qE "^tokenizer +$REPO/snapshots/$A/tokenizer.json" "$TMP/out"
ok "info --json of a tag" -- "$HS" info tiny/stories@v1 --json --tokenizer tiny/stories
check "info --json: hub fields" -- grep -q "\"hub_commit\": \"$B\"" "$TMP/out"
check "info --json: revision and snapshot" -- grep -q '"hub_revision": "v1"' "$TMP/out"
check "info --json: v1's own config" -- grep -q '"max_seq_len": 256' "$TMP/out"
ok "info of a commit hash" -- "$HS" info "tiny/stories@$A"
check "info of a commit hash: resolved to itself" -- grep -q "tiny/stories@$A -> commit $A" "$TMP/out"
check "info of a path: source without the hub" -- bash -c "'$HS' info '$SRC' | grep -E '^source' | grep -vq 'Hugging Face'"

# The same found through HF_HOME (<HF_HOME>/hub).
ok "HF_HOME/hub" -- env -u HF_HUB_CACHE HF_HOME="$TMP/home" "$HS" info tiny/stories
check "HF_HOME/hub: the commit" -- grep -q "commit $A" "$TMP/out"

# A result file records the name, the revision and the commit; its logits equal the folder's.
ok "logits by name" -- "$HS" logits tiny/stories --text "Hello world" --out "$TMP/name.h5"
ok "logits by path" -- "$HS" logits "$SRC" --text "Hello world" --out "$TMP/path.h5"
if PY=$(bash "$(dirname "$0")/../scripts/find_python.sh" h5py numpy 2>/dev/null); then
  check "/meta: hub_repo, hub_revision, hub_commit" -- "$PY" -c "
import h5py, sys
m = h5py.File(sys.argv[1], 'r')['meta'].attrs
s = lambda k: m[k].decode() if isinstance(m[k], bytes) else str(m[k])
assert s('hub_repo') == 'tiny/stories' and s('hub_revision') == 'main' and s('hub_commit') == sys.argv[2], dict(m)
assert s('model_path').endswith('/snapshots/' + sys.argv[2]), s('model_path')
assert 'model_format' in m" "$TMP/name.h5" "$A"
  check "/meta of a path: empty hub fields" -- "$PY" -c "
import h5py, sys
m = h5py.File(sys.argv[1], 'r')['meta'].attrs
s = lambda k: m[k].decode() if isinstance(m[k], bytes) else str(m[k])
assert s('hub_repo') == '' and s('hub_revision') == '' and s('hub_commit') == '', dict(m)" "$TMP/path.h5"
  check "logits by name = logits by path" -- "$PY" -c "
import h5py, sys, numpy as np
a, b = (h5py.File(p, 'r') for p in sys.argv[1:3])
assert np.array_equal(a['logits'][()], b['logits'][()]) and np.array_equal(a['logits'][()].shape, b['logits'][()].shape)" "$TMP/name.h5" "$TMP/path.h5"
else
  check "/meta records the commit" -- grep -qa "$A" "$TMP/name.h5"
  echo "cli-hub: no Python with h5py: /meta checked by a byte search only"
fi

# Tokenizers by name: tokenize, --tokenizer (v1 has no tokenizer.json of its own).
ok "tokenize by name" -- "$HS" tokenize tiny/stories --text "Hello world"
cp "$TMP/out" "$TMP/tok-name"
ok "tokenize by path" -- "$HS" tokenize "$SRC" --text "Hello world"
check "tokenize: name = path" -- cmp -s "$TMP/out" "$TMP/tok-name"
ok "v1 with --tokenizer by name" -- "$HS" logits tiny/stories@v1 --tokenizer tiny/stories --text "Hello" --out "$TMP/v1.h5"
expect "v1 without a tokenizer" 5 "snapshots/$B: no tokenizer found next to the model" -- \
  "$HS" -q logits tiny/stories@v1 --text "Hello" --out "$TMP/v1b.h5"
no_file "$TMP/v1b.h5"

# Unknown names: one line naming the cache root and the fetch command; no output file.
expect "unknown name" 4 "^headscope: error: other/model: no such file or folder, and not in the Hugging Face cache: $HUB \(from \\\$HF_HUB_CACHE\) has no models--other--model; fetch it with \`hf download other/model\`" -- \
  "$HS" -q logits other/model --text "Hello" --out "$TMP/x.h5"
no_file "$TMP/x.h5"
expect "unknown revision" 4 "tiny/stories@v2: revision v2 is not in the Hugging Face cache: .*cached revisions: main, v1.*hf download tiny/stories --revision v2" -- \
  "$HS" -q logits tiny/stories@v2 --text "Hello" --out "$TMP/x.h5"
no_file "$TMP/x.h5"
expect "unknown --tokenizer name" 5 "other/tok: no such file or folder, and not in the Hugging Face cache" -- \
  "$HS" -q logits tiny/stories --tokenizer other/tok --text "Hello" --out "$TMP/x.h5"
no_file "$TMP/x.h5"
expect "tokenize: unknown name" 5 "other/tok: no such file or folder, and not in the Hugging Face cache" -- \
  "$HS" -q tokenize other/tok --text "Hello"
printf '' >"$REPO/refs/empty"
expect "empty ref" 4 "$REPO/refs/empty: empty ref file" -- "$HS" -q info tiny/stories@empty
rm "$REPO/snapshots/$A/model.safetensors"; ln -s "../../blobs/$(printf x | sha256sum | cut -d' ' -f1)" "$REPO/snapshots/$A/model.safetensors"
expect "missing blob" 4 "snapshots/$A/model.safetensors: a link to a missing blob" -- \
  "$HS" -q logits tiny/stories --text "Hello" --out "$TMP/x.h5"
no_file "$TMP/x.h5"
# A path that exists wins over the name.
mkdir -p "$TMP/cwd/tiny"; ln -s "$REPO/snapshots/$B" "$TMP/cwd/tiny/stories"
ok "a path wins over a name" -- bash -c "cd '$TMP/cwd' && '$HS' info tiny/stories --tokenizer '$SRC'"
check "a path wins: v1's context, no hub source" -- bash -c "grep -qE '^context +256' '$TMP/out' && ! grep -q 'Hugging Face' '$TMP/out'"

echo "cli-hub: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
