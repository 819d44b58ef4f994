#!/usr/bin/env bash
# Shards on a real Slurm: a one-node cluster (munged, slurmctld, slurmd started here as root with a
# configuration under a temporary folder; SLURM_CONF points at it, nothing under /etc is changed)
# runs a needle scan and a YAML sweep of the CI toy models as 4-task job arrays through
# scripts/slurm/submit.sh, each followed by its dependent merge job (--dependency=afterok), and the
# merged files must equal unsharded runs bit for bit (tests/h5_same.py). One needle task is
# cancelled mid-way (scancel), its merge is refused, then it is resubmitted alone with --resume and
# the new merge equals the unsharded run too. Every daemon started here is stopped by process id,
# also when a check fails. Before the cluster: --shard slurm's own checks (no Slurm needed).
# Installs Debian's slurm-wlm and munge when missing; skips, saying why, where it cannot (not root,
# no apt, no network).
# Usage: cli_slurm.sh path/to/headscope
set -u
HS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
cd "$ROOT"
N="$ROOT/datasets/needles"
REC="$(ci_toy recall)" || { echo "FAIL: no CI toy recall model"; exit 1; }
IND="$(ci_toy induction)" || { echo "FAIL: no CI toy induction model"; exit 1; }
PY="$(bash scripts/find_python.sh h5py numpy)" || { echo "FAIL: no Python with h5py (scripts/install_deps.sh installs it)"; exit 1; }
same() { "$PY" "$ROOT/tests/h5_same.py" "$1" "$2"; }

# The scan: 2 lengths x 5 depths x 8 needles = 80 trials, 3 named heads ablated + 2 random controls,
# one thread (shards and the unsharded run must compute alike to agree bit for bit).
NEEDLE=("$REC" --haystack "$N/toy_recall_haystack.txt" --needles "$N/toy_recall_needles.jsonl" --template '{context}?{question}'
        --lengths 24,40 --max-new-tokens 1 --ablate L1H0,L1H1,L1H2 --random-controls 2 --seed 1 --threads 1)
sed 's/^threads: 2/threads: 1/' datasets/experiments/toy-induction.yaml >"$TMP/sweep.yaml"

# ---- --shard slurm, and the files one task writes, without a cluster ----
expect "slurm outside an array" 2 "--shard 'slurm': SLURM_ARRAY_TASK_ID is not set" -- \
  env -u SLURM_ARRAY_TASK_ID "$HS" retrieval "${NEEDLE[@]}" --shard slurm --out "$TMP/x.h5"
no_file "$TMP/x.h5"
expect "slurm index beyond count" 2 "array task 5 of 4 tasks" -- \
  env SLURM_ARRAY_TASK_ID=5 SLURM_ARRAY_TASK_COUNT=4 "$HS" run "$TMP/sweep.yaml" --model "$IND" --shard slurm --out "$TMP/x.h5"
expect "slurm/N not a number" 2 "expected slurm/N" -- env SLURM_ARRAY_TASK_ID=1 "$HS" run "$TMP/sweep.yaml" --model "$IND" --shard slurm/x --out "$TMP/x.h5"
expect "top-K from this run in a shard" 2 "--ablate-top without --from" -- \
  "$HS" retrieval "$REC" --haystack "$N/toy_recall_haystack.txt" --needles "$N/toy_recall_needles.jsonl" --lengths 24 --ablate-top 3 --shard 0/2 --out "$TMP/x.h5"
no_file "$TMP/x.h5"
ok "unsharded needle scan" -- "$HS" retrieval "${NEEDLE[@]}" --out "$TMP/needle-full.h5"
ok "unsharded sweep" -- "$HS" run "$TMP/sweep.yaml" --model "$IND" --out "$TMP/sweep-full.h5"
ok "slurm shard 1 of 2 (from the environment)" -- env SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_COUNT=2 \
  "$HS" retrieval "${NEEDLE[@]}" --shard slurm --out "$TMP/l1.h5"
ok "shard 0/2" -- "$HS" retrieval "${NEEDLE[@]}" --shard 0/2 --out "$TMP/l0.h5"
expect "merge: a shard twice" 6 "shard 0/2 given twice" -- "$HS" merge "$TMP/l0.h5" "$TMP/l0.h5" --out "$TMP/lm.h5"
no_file "$TMP/lm.h5"
ok "shard 0/3" -- "$HS" retrieval "${NEEDLE[@]}" --shard 0/3 --out "$TMP/t0.h5"
ok "shard 2/3" -- "$HS" retrieval "${NEEDLE[@]}" --shard 2/3 --out "$TMP/t2.h5"
expect "merge: a shard missing" 6 "shard 1 of 3 missing" -- "$HS" merge "$TMP/t0.h5" "$TMP/t2.h5" --out "$TMP/lm.h5"
no_file "$TMP/lm.h5"
ok "merge two local shards" -- "$HS" merge "$TMP/l0.h5" "$TMP/l1.h5" --out "$TMP/lm.h5"
check "two local shards merged == unsharded" -- same "$TMP/needle-full.h5" "$TMP/lm.h5"
ok "shard 1/2, other lengths" -- "$HS" retrieval "${NEEDLE[@]/24,40/24,56}" --shard 1/2 --out "$TMP/o1.h5"
expect "merge: another scan" 6 "another needle scan .*lengths \[24,40\] vs \[24,56\]" -- "$HS" merge "$TMP/l0.h5" "$TMP/o1.h5" --out "$TMP/bad.h5"
no_file "$TMP/bad.h5"
expect "resume with other parameters" 6 "was run with lengths \[24,40\], not \[24,56\]" -- "$HS" retrieval "${NEEDLE[@]/24,40/24,56}" --shard 0/2 --resume --out "$TMP/l0.h5"

# ---- a one-node cluster ----
skip() { echo "cli-slurm: skipped the cluster: $1"; echo "cli-slurm: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }
[ "$(id -u)" -eq 0 ] || skip "needs root (it starts munged, slurmctld and slurmd)"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
  command -v apt-get >/dev/null || skip "slurm-wlm and munge are not installed and there is no apt-get"
  echo "installing slurm-wlm and munge (apt-get)"
  { DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y --no-install-recommends slurm-wlm munge ||
    { timeout 300 apt-get update && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y --no-install-recommends slurm-wlm munge; }; } \
    >"$TMP/apt.log" 2>&1 || skip "apt-get install slurm-wlm munge failed ($(tail -1 "$TMP/apt.log"))"
fi

D="$TMP/cluster"; mkdir -p "$D/state" "$D/spool" "$D/munge"; chmod 755 "$TMP" "$D"; chmod 700 "$D/munge"
PIDFILES=("$D/slurmd.pid" "$D/slurmctld.pid" "$D/munge/munged.pid")
stop_daemons() {
  [ -n "${SLURM_CONF:-}" ] && [ -f "$D/slurmctld.pid" ] && scancel --quiet --user=root 2>/dev/null
  local f p
  for f in "${PIDFILES[@]}"; do
    [ -f "$f" ] || continue
    p=$(cat "$f"); [ -n "$p" ] || continue
    kill "$p" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
}
trap 'stop_daemons; chmod -R u+w "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT
dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none && chmod 400 "$D/munge/munge.key"
munged --force --key-file="$D/munge/munge.key" --socket="$D/munge/munge.sock" --pid-file="$D/munge/munged.pid" \
  --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" || { echo "FAIL: munged did not start"; tail -3 "$D/munge/munged.log"; exit 1; }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
cat >"$D/slurm.conf" <<CONF
ClusterName=headscope-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=2
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$D/slurm.conf"
slurmctld -i || { echo "FAIL: slurmctld did not start"; tail -3 "$D/slurmctld.log"; exit 1; }
slurmd || { echo "FAIL: slurmd did not start"; tail -3 "$D/slurmd.log"; exit 1; }
for _ in $(seq 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.5; done
check "the node is up" -- sinfo -h -o %T | grep -q idle

# wait_gone JOBID...: until squeue lists none of them (bounded: 180 s in all).
deadline=$((SECONDS + 180))
wait_gone() {
  while [ "$SECONDS" -lt "$deadline" ]; do
    [ -z "$(squeue -h -j "$(IFS=,; echo "$*")" -o %i 2>/dev/null)" ] && return 0
    sleep 0.5
  done
  echo "timed out waiting for jobs $*:"; squeue; return 1
}
W="$TMP/jobs"; mkdir -p "$W"; cd "$W"
export HEADSCOPE="$HS"
# The sweep: 4 tasks and the merge, left to run.
sub=$(bash "$ROOT/scripts/slurm/submit.sh" sweep 4 "$W/sweep.h5" "$TMP/sweep.yaml" --model "$IND")
read -r _ sweep_array _ sweep_merge <<<"$sub"
# The needle scan: 4 tasks (a checkpoint after every batch, paused, so task 1 can be cancelled mid-way).
sub=$(bash "$ROOT/scripts/slurm/submit.sh" needle 4 "$W/needle.h5" "${NEEDLE[@]}" --checkpoint-seconds 0 --pause-after-batch 40)
read -r _ needle_array _ needle_merge <<<"$sub"
check "submitted ($sweep_array, $sweep_merge, $needle_array, $needle_merge)" -- test -n "$needle_merge"
S1="$W/needle.shard-1-of-4.h5"
for _ in $(seq 1200); do [ -f "$S1" ] && break; sleep 0.1; done
scancel "${needle_array}_1"
wait_gone "${needle_array}" || fail=$((fail+1))
check "task 1 left a part-done file" -- "$PY" - "$S1" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    done = f["retrieval/trials/done"][()].sum() + f["retrieval/ablation/done"][()].sum()
    print(f"cancelled task 1: {done} of its 80 decodes done, complete = {f['retrieval'].attrs['complete']}")
    sys.exit(0 if 0 < done < 80 and f["retrieval"].attrs["complete"] == 0 else 1)
PY
# slurmctld re-evaluates dependencies on its own schedule: the reason moves from Dependency to
# DependencyNeverSatisfied within a few seconds of the cancel (bounded wait).
for _ in $(seq 120); do
  reason=$(squeue -h -j "$needle_merge" -o %r)
  [ "$reason" = DependencyNeverSatisfied ] && break
  sleep 0.5
done
check "the merge waits on a dependency never satisfied ($reason)" -- test "$reason" = DependencyNeverSatisfied
scancel "$needle_merge"
expect "merge refuses the cancelled shard" 6 "shard 1/4 is incomplete .*--resume" -- \
  "$HS" merge "$W"/needle.shard-{0,1,2,3}-of-4.h5 --out "$W/early.h5"
no_file "$W/early.h5"
# Resubmitted alone: it continues its file, and a new merge waits for it.
sub=$(HS_TASKS=1 bash "$ROOT/scripts/slurm/submit.sh" needle 4 "$W/needle.h5" "${NEEDLE[@]}")
read -r _ resub_array _ resub_merge <<<"$sub"
wait_gone "$resub_array" "$resub_merge" "$sweep_array" "$sweep_merge" || fail=$((fail+1))
check "the resubmitted task resumed" -- grep -q "resuming .*decodes already done" "$W/slurm-hs-needle-${resub_array}_1.out"
check "needle scan merged by the dependent job" -- test -s "$W/needle.h5"
check "needle: merged (one task cancelled, resumed) == unsharded" -- same "$TMP/needle-full.h5" "$W/needle.h5"
check "sweep merged by the dependent job" -- test -s "$W/sweep.h5"
check "sweep: merged == unsharded" -- same "$TMP/sweep-full.h5" "$W/sweep.h5"
for f in "$W"/slurm-*.out; do grep -q "error" "$f" && { echo "--- $f"; tail -3 "$f"; }; done
cd "$ROOT"

echo "cli-slurm: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
