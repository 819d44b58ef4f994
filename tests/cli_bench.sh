#!/usr/bin/env bash
# scripts/bench.sh --smoke: the benchmark script runs end to end on a tiny model it makes, and every
# ratio it reports came from two sides that ran and agreed (no "refused" line). Times are not
# asserted (docs/performance.md records the full run).
# Usage: cli_bench.sh path/to/headscope
set -u
HS="$1"
source "$(dirname "$0")/lib_cli.sh"
if ! bash scripts/find_python.sh torch numpy >/dev/null 2>&1; then
  echo "cli-bench: skipped (no Python with torch and numpy)"; echo "cli-bench: 0 passed, 0 failed"; exit 0
fi
BENCH_DIR="$TMP/bench" bash scripts/bench.sh --smoke >"$TMP/bench.out" 2>&1; rc=$?
check "bench.sh --smoke exits 0" -- test "$rc" -eq 0
check "no refused ratio" -- bash -c "! grep -q refused '$TMP/bench.out'"
check "eager comparison at every shape" -- test "$(grep -c 'process settings' "$TMP/bench.out")" -eq 4
check "efficiency line" -- grep -q "forward efficiency" "$TMP/bench.out"
check "memory lines" -- test "$(grep -c 'MiB beyond' "$TMP/bench.out")" -eq 3
check "memory fit line" -- grep -q "^linear fit: .* MiB per 1024 tokens" "$TMP/bench.out"
check "bf16 line" -- grep -q "bfloat16 forward" "$TMP/bench.out"
# Section 6 (the peers): compared when scripts/setup_peers.sh's environment exists, else one line.
check "peers compared or skipped in one line" -- grep -qE "^peers: (skipped \(no venv; run scripts/setup_peers.sh\)|torch )" "$TMP/bench.out"
# The machine's limits (`bench --limits`, and beside the forward's figures): both printed and positive,
# never compared with a size.
"$HS" -q bench "$TMP/bench/smoke" --limits --json >"$TMP/limits.json" 2>&1
check "bench --limits: GEMM rate, read and copy bandwidth over 1 GiB" -- /usr/bin/python3 -c "import json, sys
j = json.load(open('$TMP/limits.json'))
sys.exit(0 if min(j[k] for k in ('gemm_gflops_512_float32', 'memory_read_gbs', 'memory_copy_gbs')) > 0 and j['memory_buffer_bytes'] == 1 << 30 else 1)"
check "bench prints the bandwidth beside the GEMM rate" -- bash -c "'$HS' -q bench '$TMP/bench/smoke' --batch 1 --seq 16 --reps 1 | grep -q '^memory read .* GB/s, copy'"
[ "$fail" -eq 0 ] || cat "$TMP/bench.out"
echo "cli-bench: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
