#!/usr/bin/env bash
# Makes the small virtual environment scripts/make_gguf.py runs in: PyPI's gguf (llama.cpp's own
# gguf-py: GGUFWriter, GGUFReader, quants) and numpy. No torch: make_gguf.py reads safetensors
# with numpy. Idempotent: an environment that already has the pinned gguf is left as it is.
#   bash scripts/setup_gguf.sh        # last line of stdout: the environment's python
# Env:
#   HEADSCOPE_GGUF_VENV   where (default .venv-gguf in the repository root; git ignores it)
# Without PyPI it says so on stderr and exits 3 (make_gguf_fixtures.sh then prints "SKIPPED").
# gguf 0.18.0 is the gguf-py of llama.cpp 21a493304229 (2026-04-12), the converter make_gguf.py
# follows; its constants/tensor_mapping/quants differ from that commit's only in architectures
# headscope does not read (gemma4, NVFP4, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
venv="${HEADSCOPE_GGUF_VENV:-$repo/.venv-gguf}"
gguf_pin="0.18.0"
py="$venv/bin/python"
have() {
  "$py" -c "import numpy, gguf
from importlib.metadata import version
assert version('gguf') == '$gguf_pin', version('gguf')" 2>/dev/null
}
if [ -x "$py" ] && have; then echo "$py"; exit 0; fi

if [ ! -x "$py" ]; then
  if ! python3 -m venv "$venv" 2>/dev/null; then  # Debian: ensurepip comes with python3-venv
    rm -rf "$venv"
    echo "setup_gguf.sh: 'python3 -m venv' failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
# PyPI reachable? One small index query, bounded in time.
if ! timeout 60 "$py" -m pip index versions gguf >/dev/null 2>&1; then
  echo "setup_gguf.sh: PyPI is unreachable (pip index versions gguf failed or timed out): no gguf environment" >&2
  exit 3
fi
timeout 600 "$py" -m pip install -q --disable-pip-version-check "gguf==$gguf_pin" numpy >&2
have || { echo "setup_gguf.sh: installed, but '$py' cannot import gguf $gguf_pin and numpy" >&2; exit 1; }
"$py" -c 'from importlib.metadata import version as v
print("gguf environment: gguf", v("gguf"), "numpy", v("numpy"))' >&2
echo "$py"
