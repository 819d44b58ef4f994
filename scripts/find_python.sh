#!/usr/bin/env bash
# Prints a Python interpreter that can import every module named as an argument, or explains on
# stderr and exits 1. Debian's python3-torch/h5py/numpy/matplotlib live under /usr/bin/python3,
# which may not be the python3 first on PATH.
set -u
for py in "${HEADSCOPE_PYTHON:-}" /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
  [ -n "$py" ] && [ -x "$py" ] || continue
  if "$py" -c "import $(IFS=,; echo "$*")" 2>/dev/null; then echo "$py"; exit 0; fi
done
echo "no Python with: $* (install python3 $(printf 'python3-%s ' "$@") from Debian, or set HEADSCOPE_PYTHON)" >&2
exit 1
