#!/usr/bin/env bash
# The GPU device check, everything in one call on the lent GPU machine (nvcc, cmake, ninja,
# a Python with a CUDA PyTorch and transformers; none of Debian's -dev packages; no network):
#   1. report the machine (GPU, driver, glibc, libstdc++, CUDA toolkit, torch, transformers) and what is
#      missing;
#   2. unpack the Debian packages of scripts/device_debs.sh (.device/debs, carried) into .device/prefix
#      and check that the machine's glibc / libstdc++ are new enough for them;
#   3. build headscope with scripts/build.sh --torch against that Python's torch (build-torch2/, tests
#      off unless --with-tests), linking the unpacked libraries (rpath into .device/prefix);
#   4. CPU against CUDA, fp32: logits, detector scores and retrieval scores (per trial where h5py exists)
#      on the shared test checkpoints, and logits of a random Llama at the Llama-3.2-1B shape;
#   5. each against Hugging Face transformers on the same random 1B checkpoint in the same run, bf16 on
#      the GPU: prefill tokens/s at 4k and 16k, the needle scan (retrieval + LOCOS) at 4k/16k/32k against
#      the Retrieval_Head reference loop, the 144-head zero-ablation sweep against transformers (a
#      pre-hook zeroing one head's z) and TransformerLens (when installed) on the GPT-2-small-shaped
#      model of scripts/bench_ablation.py, and the fraction of
#      the GPU's measured bf16 GEMM rate (8192^3, torch) the forward reaches;
#   6. write OUT/device_check.json, OUT/device_table.md and OUT/log (OUT: $OUT when the device tool
#      sets it, else .device/out). Back here: `scripts/device_check.sh --record OUT/device_check.json`
#      puts the table into docs/performance.md's GPU section.
# A failed step is recorded (rc and the last lines of its log) and the script goes on: the first CUDA
# run is expected to find bugs, and one call must bring back everything it can.
#
# Usage: bash scripts/device_check.sh [options]
#   --dry-run          no GPU: steps 1-3 only (unpack, check every argument, configure and compile one
#                      object, or everything with --full-build), then print the commands of 4-5
#   --full-build       with --dry-run: build the whole binary (20-30 min on the 2-core machine)
#   --python PY        the Python whose torch is built against and which runs the peers (default:
#                      $HEADSCOPE_TORCH2_VENV/bin/python, .venv-torch2/bin/python, then python3)
#   --peers-python PY  the Python for transformers / TransformerLens (default: --python)
#   --debs DIR         the carried .deb files (default .device/debs)
#   --out DIR          results (default $OUT or .device/out)
#   --work DIR         scratch for the random checkpoints (default /tmp/headscope-device)
#   --skip-build       use an existing build-torch2/headscope
#   --with-tests       build the doctest suites too (and run ctest -R unit_ on the CPU build)
#   --prefill LIST     prefill lengths (default 4096,16384)
#   --needle LIST      needle context lengths (default 4000,16000,32000)
#   --steps N          decode steps per needle trial (default 16)
#   --reps N           timed repetitions (default 5)
#   --record JSON      no build, no GPU: write JSON's table into docs/performance.md (between the
#                      device-check markers) and exit
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

DRY=0; FULL_BUILD=0; SKIP_BUILD=0; WITH_TESTS=0; RECORD=""
PY=""; PEERS_PY=""; DEBS=.device/debs; OUTDIR="${OUT:-.device/out}"; WORK=/tmp/headscope-device
PREFILL=4096,16384; NEEDLE=4000,16000,32000; STEPS=16; REPS=5
die() { echo "device_check.sh: $*" >&2; exit 2; }
need_arg() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
is_list() { [[ "$1" =~ ^[0-9]+(,[0-9]+)*$ ]]; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --full-build) FULL_BUILD=1 ;;
    --skip-build) SKIP_BUILD=1 ;;
    --with-tests) WITH_TESTS=1 ;;
    --python) need_arg "$@"; PY="$2"; shift ;;
    --peers-python) need_arg "$@"; PEERS_PY="$2"; shift ;;
    --debs) need_arg "$@"; DEBS="$2"; shift ;;
    --out) need_arg "$@"; OUTDIR="$2"; shift ;;
    --work) need_arg "$@"; WORK="$2"; shift ;;
    --prefill) need_arg "$@"; is_list "$2" || die "--prefill wants a comma-separated list of token counts, got '$2'"; PREFILL="$2"; shift ;;
    --needle) need_arg "$@"; is_list "$2" || die "--needle wants a comma-separated list of token counts, got '$2'"; NEEDLE="$2"; shift ;;
    --steps) need_arg "$@"; [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "--steps wants a positive integer, got '$2'"; STEPS="$2"; shift ;;
    --reps) need_arg "$@"; [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "--reps wants a positive integer, got '$2'"; REPS="$2"; shift ;;
    --record) need_arg "$@"; RECORD="$2"; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
  shift
done
[ $FULL_BUILD = 1 ] && [ $DRY = 0 ] && die "--full-build goes with --dry-run (a device run always builds everything)"
for n in ${NEEDLE//,/ }; do [ "$n" -le 40000 ] || die "--needle $n: the 1B checkpoint has 40960 positions"; done
for n in ${PREFILL//,/ }; do [ "$n" -le 40960 ] || die "--prefill $n: the 1B checkpoint has 40960 positions"; done

# --- --record: the table into docs/performance.md -------------------------------------------------
record_table() {  # JSON -> markdown table on stdout
  python3 - "$1" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
m = j.get("machine", {})
print(f"Run of {j.get('date', '?')}, commit {j.get('commit', '?')}: {m.get('gpu', '?')}, driver {m.get('driver', '?')}, "
      f"torch {m.get('torch', '?')}, transformers {m.get('transformers', '?')}, glibc {m.get('glibc', '?')}. "
      f"Command: `{j.get('command', 'bash scripts/device_check.sh')}`.")
print()
print("| check | headscope | peer | ratio / result |")
print("| --- | --- | --- | --- |")
for r in j.get("rows", []):
    print(f"| {r.get('check', '')} | {r.get('headscope', '')} | {r.get('peer', '')} | {r.get('result', '')} |")
fails = [s for s in j.get("steps", []) if s.get("rc", 0) != 0]
if fails:
    print()
    print("Steps that failed: " + "; ".join(f"{s['name']} (rc {s['rc']}: {s.get('tail', '').strip().splitlines()[-1] if s.get('tail', '').strip() else ''})" for s in fails))
PYEOF
}
if [ -n "$RECORD" ]; then
  [ -f "$RECORD" ] || die "--record: no file '$RECORD'"
  table=$(record_table "$RECORD") || die "--record: cannot read '$RECORD'"
  python3 - docs/performance.md "$table" <<'PYEOF'
import sys
p, table = sys.argv[1], sys.argv[2]
s = open(p).read()
b, e = "<!-- device-check:begin -->", "<!-- device-check:end -->"
if b not in s or e not in s:
    sys.exit("docs/performance.md has no device-check markers")
i, k = s.index(b) + len(b), s.index(e)
open(p, "w").write(s[:i] + "\n" + table + "\n" + s[k:])
PYEOF
  echo "device_check.sh: the table of $RECORD is in docs/performance.md"; exit 0
fi

# --- bookkeeping ------------------------------------------------------------------------------------
mkdir -p "$OUTDIR" || die "cannot create --out $OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
LOG="$OUTDIR/log"; : > "$LOG"
STEPS_JSONL="$OUTDIR/steps.jsonl"; : > "$STEPS_JSONL"
ROWS_JSONL="$OUTDIR/rows.jsonl"; : > "$ROWS_JSONL"
say() { echo "== $*" | tee -a "$LOG"; }
# step NAME CMD...: runs CMD (output to the log and OUT/NAME.out), records its rc; in --dry-run a GPU
# step (name starting with gpu-) is only printed.
step() {
  local name="$1"; shift
  if [ $DRY = 1 ] && [[ "$name" == gpu-* ]]; then
    printf 'would run [%s]:' "$name"; printf ' %q' "$@"; echo
    return 0
  fi
  say "$name: $*"
  local t0=$SECONDS
  "$@" > "$OUTDIR/$name.out" 2>&1
  local rc=$?
  cat "$OUTDIR/$name.out" >> "$LOG"
  local tail_; tail_=$(tail -5 "$OUTDIR/$name.out")
  python3 -c 'import json,sys; print(json.dumps({"name": sys.argv[1], "rc": int(sys.argv[2]), "seconds": int(sys.argv[3]), "tail": sys.argv[4]}))' \
    "$name" "$rc" "$((SECONDS - t0))" "$tail_" >> "$STEPS_JSONL"
  [ $rc -eq 0 ] || echo "   step $name failed (rc $rc): $(echo "$tail_" | tail -1)" | tee -a "$LOG"
  return $rc
}
row() {  # row CHECK HEADSCOPE PEER RESULT
  python3 -c 'import json,sys; print(json.dumps(dict(zip(["check","headscope","peer","result"], sys.argv[1:]))))' "$@" >> "$ROWS_JSONL"
  printf '   %s | %s | %s | %s\n' "$@" | tee -a "$LOG"
}

# --- 1. the machine ---------------------------------------------------------------------------------
if [ -z "$PY" ]; then
  for c in "${HEADSCOPE_TORCH2_VENV:-}/bin/python" "$REPO/.venv-torch2/bin/python" "$(command -v python3)"; do
    [ -x "$c" ] && "$c" -c 'import torch' 2>/dev/null && { PY="$c"; break; }
  done
fi
[ -n "$PY" ] && [ -x "$PY" ] || die "no Python with torch (--python PY)"
"$PY" -c 'import torch' 2>/dev/null || die "--python $PY cannot import torch"
PEERS_PY="${PEERS_PY:-$PY}"
say "machine"
missing=()
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
[ -n "$gpu" ] || missing+=("nvidia-smi / a GPU")
for t in cmake nvcc ninja g++ readelf; do command -v "$t" >/dev/null || missing+=("$t"); done
torch_v=$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null)
tf_v=$("$PEERS_PY" -c 'import transformers; print(transformers.__version__)' 2>/dev/null) || missing+=("transformers (in $PEERS_PY)")
tl_v=$("$PEERS_PY" -c 'from importlib.metadata import version; print(version("transformer_lens"))' 2>/dev/null) || tl_v=""
"$PEERS_PY" -c 'import numpy' 2>/dev/null || missing+=("numpy (in $PEERS_PY; make_bench_model.py)")
HAVE_H5PY=0; "$PEERS_PY" -c 'import h5py' 2>/dev/null && HAVE_H5PY=1
libstdcxx=$(g++ -print-file-name=libstdc++.so.6 2>/dev/null)
glibcxx_max=$(strings "$libstdcxx" 2>/dev/null | grep -o '^GLIBCXX_3\.4\.[0-9]*$' | sort -t. -k3 -n | tail -1)
{
  echo "   uname: $(uname -srm)"
  echo "   GPU: ${gpu:-none}"
  echo "   glibc $glibc, libstdc++ $libstdcxx (up to ${glibcxx_max:-?})"
  echo "   cmake: $(cmake --version 2>/dev/null | head -1); nvcc: $(nvcc --version 2>/dev/null | tail -1); ninja: $(ninja --version 2>/dev/null)"
  echo "   python $PY: torch $torch_v; peers $PEERS_PY: transformers ${tf_v:-none}, transformer_lens ${tl_v:-none}, h5py $HAVE_H5PY"
  echo "   missing: ${missing[*]:-nothing}"
} | tee -a "$LOG"
if [ $DRY = 0 ] && [ -z "$gpu" ]; then
  echo "device_check.sh: no GPU here (nvidia-smi found none); use --dry-run on a machine without one" | tee -a "$LOG"; exit 1
fi

# --- 2. the carried Debian packages -----------------------------------------------------------------
PREFIX="$REPO/.device/prefix"
unpack_deb() {  # unpack_deb FILE DEST: dpkg-deb, or Python's ar + tar reader when dpkg-deb is absent
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  python3 - "$1" "$2" <<'PYEOF'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not an ar archive"
i = 8
while i < len(data):
    name, size = data[i:i+16].decode().strip(), int(data[i+48:i+58])
    body = data[i+60:i+60+size]
    if name.startswith("data.tar"):
        if name.endswith(".zst"):
            import zstandard  # Debian 12 packages are xz; zstd only for newer ones
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
            mode = "r:"
        else:
            mode = "r:*"
        tarfile.open(fileobj=io.BytesIO(body), mode=mode).extractall(sys.argv[2])
    i += 60 + size + (size & 1)
PYEOF
}
have_system_deps() {
  pkg-config --exists libpcre2-8 2>/dev/null && [ -f /usr/include/hdf5/serial/hdf5.h -o -f /usr/include/hdf5.h ] &&
    [ -f /usr/include/fmt/core.h ] && [ -f /usr/include/yaml-cpp/yaml.h ] && [ -f /usr/include/CLI/CLI.hpp ] &&
    [ -f /usr/include/nlohmann/json.hpp ] && [ -f /usr/include/openssl/evp.h ]
}
USE_PREFIX=0
if [ -f "$DEBS/MANIFEST" ]; then
  USE_PREFIX=1
  say "unpacking $(wc -l < "$DEBS/MANIFEST") packages of $DEBS into $PREFIX"
  rm -rf "$PREFIX"; mkdir -p "$PREFIX"
  while read -r pkg ver file; do
    [ -f "$DEBS/$file" ] || { echo "   missing $DEBS/$file ($pkg $ver)" | tee -a "$LOG"; continue; }
    unpack_deb "$DEBS/$file" "$PREFIX" || echo "   could not unpack $file" | tee -a "$LOG"
  done < "$DEBS/MANIFEST"
  # Absolute links (/usr/lib/...) point at the machine's root: make them point inside the prefix.
  find "$PREFIX" -type l | while read -r l; do
    t=$(readlink "$l"); case "$t" in /*) ln -sfn "$PREFIX$t" "$l" ;; esac
  done
  # pkg-config files name prefix=/usr.
  for pc in "$PREFIX"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$PREFIX"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i "s|^prefix=/usr|prefix=$PREFIX/usr|" "$pc"
  done
  # What these libraries need of the machine's C and C++ runtimes.
  if command -v readelf >/dev/null; then
    need_glibc=$(find "$PREFIX" -name '*.so*' -type f -exec readelf -V {} + 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1)
    need_glibcxx=$(find "$PREFIX" -name '*.so*' -type f -exec readelf -V {} + 2>/dev/null | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n -u | tail -1)
    echo "   the packages need ${need_glibc:-?} (machine: glibc $glibc) and ${need_glibcxx:-?} (machine: ${glibcxx_max:-?})" | tee -a "$LOG"
    if [ -n "$need_glibc" ] && [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "${need_glibc#GLIBC_}" "$glibc" | sort -V | tail -1)" != "$glibc" ]; then
      echo "   MISSING: glibc ${need_glibc#GLIBC_} or newer (Debian 12's packages); this machine has $glibc" | tee -a "$LOG"
    fi
    if [ -n "$need_glibcxx" ] && [ -n "$glibcxx_max" ] && [ "$(printf '%s\n%s\n' "$need_glibcxx" "$glibcxx_max" | sort -V | tail -1)" != "$glibcxx_max" ]; then
      echo "   MISSING: $need_glibcxx (gcc 12's libstdc++); this machine's libstdc++ has up to $glibcxx_max" | tee -a "$LOG"
    fi
  fi
  LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu"
  export PKG_CONFIG="$PREFIX/usr/bin/pkgconf"
  export PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$PREFIX/usr/share/pkgconfig"
  export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPENSSL_ROOT_DIR="$PREFIX/usr"
  export HDF5_ROOT="$LIBDIR/hdf5/serial"  # Debian's serial flavour: include/, lib/ and libhdf5.so there
  export HEADSCOPE_EXTRA_PREFIX="$PREFIX/usr;$LIBDIR/hdf5/serial"
  export HEADSCOPE_LDFLAGS="-Wl,-rpath-link,$LIBDIR -Wl,-rpath,$LIBDIR"
  export CMAKE_INCLUDE_PATH="$PREFIX/usr/include/hdf5/serial"
  export CMAKE_LIBRARY_PATH="$LIBDIR/hdf5/serial:$LIBDIR"
  "$PKG_CONFIG" --modversion libpcre2-8 >/dev/null 2>&1 || echo "   pkgconf from the prefix does not run here: PCRE2 will not be found" | tee -a "$LOG"
elif have_system_deps; then
  say "no $DEBS/MANIFEST: using the machine's own -dev packages"
else
  die "no $DEBS/MANIFEST and the machine lacks the -dev packages: run scripts/device_debs.sh where apt works and carry .device/debs"
fi

# --- 3. build -------------------------------------------------------------------------------------
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || die "cannot ask $PY for torch's cmake prefix"
command -v ninja >/dev/null && [ ! -f build-torch2/CMakeCache.txt ] && export CMAKE_GENERATOR=Ninja
cmake_args="-DHS_BUILD_TESTS=$([ $WITH_TESTS = 1 ] && echo ON || echo OFF)"
if [ $USE_PREFIX = 1 ]; then
  # FindHDF5 without h5cc (the prefix's h5cc would answer with /usr paths): no wrapper, the serial
  # flavour's header folder and library named.
  cmake_args="$cmake_args -DHDF5_C_COMPILER_EXECUTABLE=$PREFIX/no-h5cc -DHDF5_C_INCLUDE_DIR=$PREFIX/usr/include/hdf5/serial"
  cmake_args="$cmake_args -DHDF5_hdf5_LIBRARY_RELEASE=$LIBDIR/hdf5/serial/libhdf5.so"
  # Debian's libcrypto.so link and headers from the prefix.
  cmake_args="$cmake_args -DOPENSSL_INCLUDE_DIR=$PREFIX/usr/include -DOPENSSL_CRYPTO_LIBRARY=$LIBDIR/libcrypto.so -DOPENSSL_SSL_LIBRARY=$LIBDIR/libssl.so"
  cmake_args="$cmake_args -DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG"
fi
export HEADSCOPE_CMAKE_ARGS="$cmake_args"
HS="$REPO/build-torch2/headscope"
if [ $SKIP_BUILD = 1 ]; then
  [ -x "$HS" ] || die "--skip-build: no $HS"
elif [ $DRY = 1 ] && [ $FULL_BUILD = 0 ]; then
  # One object of the library (the precompiled header first): configure + compile, not the ~25 min build.
  if [ "${CMAKE_GENERATOR:-}" = Ninja ] || grep -q 'CMAKE_GENERATOR:INTERNAL=Ninja' build-torch2/CMakeCache.txt 2>/dev/null; then
    tgt=CMakeFiles/headscope_core.dir/src/base/util.cpp.o
  else
    tgt=src/base/util.cpp.o
  fi
  HEADSCOPE_BUILD_TARGET="$tgt" step build-one-object bash scripts/build.sh --torch "$TORCH_PREFIX" ||
    { echo "device_check.sh --dry-run: the configure or the compile failed (see $OUTDIR/build-one-object.out)"; exit 1; }
  echo "   configure + one object ($tgt) built against $TORCH_PREFIX; the device run builds everything (--full-build here)" | tee -a "$LOG"
else
  step build bash scripts/build.sh --torch "$TORCH_PREFIX" || { echo "device_check.sh: the build failed; nothing else can run"; exit 1; }
  ldd "$HS" 2>&1 | grep -E 'not found' | sed 's/^/   MISSING at run time: /' | tee -a "$LOG"
  if [ $WITH_TESTS = 1 ]; then step ctest-cpu bash -c "cd build-torch2 && ctest -R unit_ --output-on-failure --timeout 600"; fi
fi

# --- 4. CPU against CUDA ------------------------------------------------------------------------------
# What headscope sees of the machine: libtorch, threads, BLAS, the CUDA devices and their bf16 GEMM rate.
step gpu-info-system "$HS" info --system
TD=""; for c in ../shared/testdata shared/testdata .device/testdata; do [ -z "$TD" ] && [ -d "$c" ] && TD="$c"; done
[ -n "$TD" ] || echo "   no test data (../shared/testdata, shared/testdata or .device/testdata): the shared-checkpoint checks are skipped" | tee -a "$LOG"
mkdir -p "$WORK"
CMP="$REPO/scripts/device_compare.py"
if [ -n "$TD" ]; then
  for m in "$TD/stories260K/stories260K.bin" "$TD/tinystories-656k"; do
    n=$(basename "$m" .bin)
    # fp32 on both (--dtype auto would give bfloat16 on CUDA); on CUDA the default attention is the
    # fused kernel, so the blocked one runs too and both are held to the CPU's logits.
    for d in cpu cuda; do
      step "gpu-logits-$n-$d" "$HS" -q bench "$m" --device "$d" --dtype float32 --batch 2 --seq 64 --reps 1 --json
      step "gpu-detect-$n-$d" bash -c "'$HS' -q detect '$m' --probe induction,previous-token,duplicate-token --seq-len 50 --batch 8 --device $d --dtype float32 --out '$WORK/detect-$n-$d.h5' --force && '$HS' export '$WORK/detect-$n-$d.h5' --format json --out '$WORK/detect-$n-$d.json'"
    done
    step "gpu-logits-$n-cuda-blocked" "$HS" -q bench "$m" --device cuda --dtype float32 --attention blocked --batch 2 --seq 64 --reps 1 --json
    [ $DRY = 1 ] || step "cmp-cpu-cuda-$n" "$PEERS_PY" "$CMP" cpu-cuda --name "$n" --bench "$OUTDIR/gpu-logits-$n-cpu.out" "$OUTDIR/gpu-logits-$n-cuda.out" \
      --scores "$WORK/detect-$n-cpu.json" "$WORK/detect-$n-cuda.json" --rows "$ROWS_JSONL"
    [ $DRY = 1 ] || step "cmp-cpu-cuda-blocked-$n" "$PEERS_PY" "$CMP" cpu-cuda --name "$n" --what "CPU vs CUDA blocked attention (fp32)" \
      --bench "$OUTDIR/gpu-logits-$n-cpu.out" "$OUTDIR/gpu-logits-$n-cuda-blocked.out" --rows "$ROWS_JSONL"
  done
  m="$TD/tinystories-656k"
  for d in cpu cuda; do
    step "gpu-retrieval-tiny-$d" bash -c "'$HS' -q retrieval '$m' --dtype float32 --haystack datasets/needles/tinystories_haystack.txt --needles datasets/needles/tinystories_needles.jsonl --lengths 100,200 --depths 0,50,100 --max-new-tokens 8 --device $d --out '$WORK/retr-$d.h5' --force && '$HS' export '$WORK/retr-$d.h5' --format json --out '$WORK/retr-$d.json'"
  done
  [ $DRY = 1 ] || step cmp-retrieval "$PEERS_PY" "$CMP" retrieval --h5py "$HAVE_H5PY" "$WORK/retr-cpu.h5" "$WORK/retr-cuda.h5" \
    --json "$WORK/retr-cpu.json" "$WORK/retr-cuda.json" --rows "$ROWS_JSONL"
fi
# The Llama-3.2-1B shape: 16 layers, d_model 2048, 32 query / 8 key-value heads, MLP 8192, vocab 128256,
# tied embeddings; 40960 positions for the 32k needle (fp32 on disk: 4.9 GB).
M1B="$WORK/llama-1b"
step gpu-make-1b bash -c "[ -f '$M1B/config.json' ] || '$PEERS_PY' scripts/make_bench_model.py '$M1B' --layers 16 --heads 32 --kv-heads 8 --d-model 2048 --d-ff 8192 --vocab 128256 --ctx 40960"
for d in cpu cuda; do step "gpu-logits-1b-$d" "$HS" -q bench "$M1B" --device "$d" --dtype float32 --batch 1 --seq 128 --reps 1 --json; done
[ $DRY = 1 ] || step cmp-1b "$PEERS_PY" "$CMP" cpu-cuda --name llama-1b --bench "$OUTDIR/gpu-logits-1b-cpu.out" "$OUTDIR/gpu-logits-1b-cuda.out" --rows "$ROWS_JSONL"

# --- 5. against transformers on the GPU (bf16) ----------------------------------------------------------
step gpu-gemm "$PEERS_PY" "$CMP" gemm --rows "$ROWS_JSONL"
for T in ${PREFILL//,/ }; do
  step "gpu-prefill-$T-headscope" "$HS" -q bench "$M1B" --device cuda --dtype bfloat16 --batch 1 --seq "$T" --reps "$REPS" --json
  step "gpu-prefill-$T-hf" "$PEERS_PY" scripts/bench_peers.py forward "$M1B" --peer hf-sdpa --device cuda --dtype bfloat16 --batch 1 --seq "$T" --reps "$REPS"
  [ $DRY = 1 ] || step "cmp-prefill-$T" "$PEERS_PY" "$CMP" prefill --seq "$T" "$OUTDIR/gpu-prefill-$T-headscope.out" "$OUTDIR/gpu-prefill-$T-hf.out" \
    --gemm "$OUTDIR/gpu-gemm.out" --rows "$ROWS_JSONL"
done
TOK=""; [ -n "$TD" ] && [ -f "$TD/gpt2-tokenizer/vocab.json" ] && TOK="$TD/gpt2-tokenizer"
if [ -n "$TOK" ]; then
  head -1 datasets/needles/needles.jsonl > "$WORK/needle1.jsonl"
  for L in ${NEEDLE//,/ }; do
    step "gpu-needle-$L-headscope" bash -c "t0=\$(date +%s.%N); '$HS' -q retrieval '$M1B' --tokenizer '$TOK' --needles '$WORK/needle1.jsonl' --lengths $L --depths 25,75 --max-new-tokens $STEPS --stop none --score retrieval,locos --device cuda --dtype bfloat16 --out '$WORK/needle-$L.h5' --force >/dev/null && awk -v a=\$t0 -v b=\$(date +%s.%N) 'BEGIN { print \"seconds\", b - a }'"
    step "gpu-needle-$L-hf" "$PEERS_PY" scripts/bench_peers.py needle "$M1B" "$WORK/needle-$L.h5" --tokenizer "$TOK" --device cuda --dtype bfloat16
    [ $DRY = 1 ] || step "cmp-needle-$L" "$PEERS_PY" "$CMP" needle --length "$L" "$OUTDIR/gpu-needle-$L-headscope.out" "$OUTDIR/gpu-needle-$L-hf.out" --rows "$ROWS_JSONL"
  done
else
  echo "   no gpt2-tokenizer in the test data: the needle scan is skipped" | tee -a "$LOG"
fi
ABL="$WORK/ablation"
step gpu-ablation-make bash -c "[ -f '$ABL/model.safetensors' ] || '$PEERS_PY' scripts/bench_ablation.py make '$ABL' && sed 's/^seed: 0/seed: 0\ndevice: cuda\ndtype: float32/' '$ABL/single.yaml' > '$ABL/single-cuda.yaml'"
step gpu-ablation-headscope "$HS" -v run "$ABL/single-cuda.yaml" --out "$ABL/batched.h5" --force
step gpu-ablation-hf "$PEERS_PY" scripts/bench_ablation.py hf "$ABL" --device cuda --layers 0,11
[ $DRY = 1 ] || step cmp-ablation-hf "$PEERS_PY" "$CMP" ablation --peer "transformers, pre-hook on c_proj" "$OUTDIR/gpu-ablation-headscope.out" "$OUTDIR/gpu-ablation-hf.out" --rows "$ROWS_JSONL"
if [ -n "$tl_v" ] && [ -n "$TOK" ]; then
  step gpu-ablation-tl "$PEERS_PY" scripts/bench_ablation.py tl "$ABL" --device cuda --layers 0,11 --tokenizer "$TOK" --compat
  [ $DRY = 1 ] || step cmp-ablation-tl "$PEERS_PY" "$CMP" ablation --peer "TransformerLens run_with_hooks" "$OUTDIR/gpu-ablation-headscope.out" "$OUTDIR/gpu-ablation-tl.out" --rows "$ROWS_JSONL"
else
  echo "   TransformerLens not installed in $PEERS_PY (or no tokenizer): the ablation sweep has no peer" | tee -a "$LOG"
fi

# --- 6. results -----------------------------------------------------------------------------------------
if [ $DRY = 1 ]; then
  echo "device_check.sh --dry-run: done (build steps and arguments checked; the GPU commands are printed above)"
  exit 0
fi
python3 - "$OUTDIR" "$REPO" "$PY" "$PEERS_PY" <<'PYEOF'
import json, os, subprocess, sys, datetime
out, repo, py, ppy = sys.argv[1:5]
rd = lambda f: [json.loads(l) for l in open(os.path.join(out, f)) if l.strip()]
sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
j = {"date": datetime.date.today().isoformat(), "commit": sh(f"git -C {repo} rev-parse --short HEAD"),
     "command": "bash scripts/device_check.sh", "machine": {
         "gpu": sh("nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1"),
         "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1"),
         "glibc": sh("getconf GNU_LIBC_VERSION"),
         "torch": sh(f"{py} -c 'import torch; print(torch.__version__)'"),
         "transformers": sh(f"{ppy} -c 'import transformers; print(transformers.__version__)'")},
     "steps": rd("steps.jsonl"), "rows": rd("rows.jsonl")}
json.dump(j, open(os.path.join(out, "device_check.json"), "w"), indent=1)
PYEOF
bash "$0" --record "$OUTDIR/device_check.json" >/dev/null 2>&1 || true   # docs/performance.md in this copy
record_table "$OUTDIR/device_check.json" > "$OUTDIR/device_table.md"
cp docs/performance.md "$OUTDIR/performance.md" 2>/dev/null || true
cat "$OUTDIR/device_table.md"
echo "device_check.sh: $OUTDIR/device_check.json, device_table.md, log"
