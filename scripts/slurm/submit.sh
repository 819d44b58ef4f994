#!/usr/bin/env bash
# Submits a needle scan or a YAML sweep as a Slurm job array (one shard a task) plus a merge job that
# runs after every task succeeded (--dependency=afterok). docs/experiments.md, "On a cluster".
#   scripts/slurm/submit.sh needle N OUT.h5 MODEL [retrieval options]
#   scripts/slurm/submit.sh sweep  N OUT.h5 EXP.yaml [run options]
# HEADSCOPE: the binary (default: headscope on PATH). HS_TASKS: the array indices to submit
# (default 0-(N-1)); a task that failed or was cancelled is resubmitted alone with HS_TASKS=I: it
# continues its file (--resume) and a new merge job waits for it (the other tasks must have
# finished). sbatch's own variables (SBATCH_PARTITION, SBATCH_GRES, SBATCH_ACCOUNT, ...) pass
# through. Prints "array JOBID merge JOBID".
set -euo pipefail
usage() { echo "usage: scripts/slurm/submit.sh needle|sweep N OUT.h5 ARGS..." >&2; exit 2; }
[ $# -ge 4 ] || usage
kind="$1" n="$2" out="$3"; shift 3
case "$kind" in needle|sweep) ;; *) usage ;; esac
[[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] || { echo "submit.sh: N must be an integer >= 2 (got '$n')" >&2; exit 2; }
case "$out" in *.h5) ;; *) echo "submit.sh: OUT must end in .h5 (got '$out')" >&2; exit 2 ;; esac
dir="$(cd "$(dirname "$0")" && pwd)"
export HS_OUT="$out" HS_SHARDS="$n" HEADSCOPE="${HEADSCOPE:-headscope}"
array=$(sbatch --parsable --export=ALL --array="${HS_TASKS:-0-$((n - 1))}" "$dir/$kind.sbatch" "$@")
array="${array%%;*}"
merge=$(sbatch --parsable --export=ALL --dependency="afterok:$array" "$dir/merge.sbatch")
merge="${merge%%;*}"
echo "array $array merge $merge"
