#!/usr/bin/env bash
# Prints the Python of the peers' virtual environment (scripts/setup_peers.sh) when it can import
# transformers, transformer_lens and h5py; otherwise says so on stderr and exits 1.
# The environment: $HEADSCOPE_PEERS_VENV, else .venv-peers in the repository root.
set -u
cd "$(dirname "$0")/.."
venv="${HEADSCOPE_PEERS_VENV:-$PWD/.venv-peers}"
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c 'import torch, transformers, transformer_lens, h5py' 2>/dev/null; then
  echo "$py"; exit 0
fi
echo "no peers' virtual environment at $venv (run scripts/setup_peers.sh)" >&2
exit 1
