#!/usr/bin/env bash
# Makes the virtual environment of the peers scripts/bench.sh compares against (section 6) and
# scripts/bench_ablation.sh times (the TransformerLens row): PyPI's torch, transformers,
# transformer_lens and h5py. Idempotent: an environment that already imports them is left as it is.
#   bash scripts/setup_peers.sh
# Env:
#   HEADSCOPE_PEERS_VENV   where (default .venv-peers in the repository root; git ignores it)
#   HEADSCOPE_TORCH2_VENV  a virtual environment that already has PyPI's torch (default .venv-torch2,
#                          the one scripts/test_torch2.sh makes, when present): its site-packages is
#                          put on the new environment's path (a .pth file), so pip sees torch installed
#                          and does not download the ~3 GB CUDA wheel a second time
#   PEERS_UNPINNED=1       the newest transformers / transformer_lens instead of the versions measured
# Without PyPI it says so and exits 3 (bench.sh then prints "peers: skipped").
# Versions measured in docs/performance.md (2026-12-02): torch 2.15.0, transformers 5.24.0,
# transformer_lens 4.3.0 (4.x has no HookedTransformer: TransformerBridge is its model class).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
venv="${HEADSCOPE_PEERS_VENV:-$repo/.venv-peers}"
torch_venv="${HEADSCOPE_TORCH2_VENV:-$repo/.venv-torch2}"
pins=(transformers==5.24.0 transformer_lens==4.3.0 h5py)
[ "${PEERS_UNPINNED:-0}" = 1 ] && pins=(transformers transformer_lens h5py)
py="$venv/bin/python"
have() { "$py" -c 'import torch, transformers, transformer_lens, h5py' 2>/dev/null; }
report() {
  "$py" -c 'from importlib.metadata import version as v
print("peers ready: torch", v("torch"), "transformers", v("transformers"), "transformer_lens", v("transformer_lens"))' 2>/dev/null
  echo "  $py"
}
if [ -x "$py" ] && have; then report; exit 0; fi

if [ ! -x "$py" ]; then
  if ! python3 -m venv "$venv" 2>/dev/null; then  # Debian: ensurepip comes with python3-venv
    rm -rf "$venv"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-venv
    python3 -m venv "$venv"
  fi
fi
if ! "$py" -c 'import torch' 2>/dev/null; then
  tp="$torch_venv/bin/python"
  if [ -x "$tp" ] && "$tp" -c 'import torch' 2>/dev/null &&
     [ "$("$tp" -c 'import sys; print(sys.version_info[:2])')" = "$("$py" -c 'import sys; print(sys.version_info[:2])')" ]; then
    site_t=$("$tp" -c 'import site; print(site.getsitepackages()[0])')
    site_v=$("$py" -c 'import site; print(site.getsitepackages()[0])')
    echo "$site_t" > "$site_v/zz-torch-from-$(basename "$torch_venv").pth"
    echo "setup_peers.sh: torch $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) from $torch_venv (no second download)"
  fi
fi
# PyPI reachable? One small index query, bounded in time, before anything large.
if ! timeout 60 "$py" -m pip index versions transformer_lens >/dev/null 2>&1; then
  echo "setup_peers.sh: PyPI is unreachable (pip index versions transformer_lens failed or timed out):" >&2
  echo "  no peers' environment; scripts/bench.sh prints 'peers: skipped'" >&2
  exit 3
fi
"$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch first when the environment has none (PyPI's wheel is the CUDA build: ~3 GB with its libraries).
"$py" -c 'import torch' 2>/dev/null || "$py" -m pip install -q torch
"$py" -m pip install -q "${pins[@]}"
have || { echo "setup_peers.sh: installed, but '$py' still cannot import torch, transformers, transformer_lens, h5py" >&2; exit 1; }
report
