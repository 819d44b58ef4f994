#!/usr/bin/env bash
# The README's main command: install, build, train the two ground-truth toy models (cached), run
# the head probes on the induction model, and say in words what was found, checked against the
# heads that ablation established during training (models/toy-*/training_log.json).
#
#   bash scripts/quickstart.sh            # everything
#   THREADS=2 SEED=1 bash scripts/quickstart.sh
# Models land in models/toy-induction and models/toy-recall, scores in out/toy-induction.h5, the
# HTML report of them in out/report.html.
# A model is retrained only when its training_log.json is missing or has other steps, seed or
# recipe version (src/train.cpp kRecipeVersion).
set -euo pipefail
cd "$(dirname "$0")/.."

SEED="${SEED:-1}"
THREADS="${THREADS:-0}"            # 0: every core (the weights depend on the thread count)
INDUCTION_STEPS="${INDUCTION_STEPS:-2000}"
RECALL_STEPS="${RECALL_STEPS:-3000}"

bash scripts/install_deps.sh
bash scripts/build.sh
HS=build/headscope

RECIPE=2  # = kRecipeVersion in src/train.cpp
# cached DIR STEPS: true when DIR/training_log.json records these steps, this seed and recipe.
cached() {
  [ -f "$1/training_log.json" ] || return 1
  python3 - "$1/training_log.json" "$2" "$SEED" "$RECIPE" <<'EOF'
import json, sys
log = json.load(open(sys.argv[1]))
want = (int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
sys.exit(0 if (log.get("steps"), log.get("seed"), log.get("recipe_version")) == want else 1)
EOF
}

train() {  # train TASK STEPS
  local dir="models/toy-$1"
  if cached "$dir" "$2"; then
    echo "== $dir: already trained ($2 steps, seed $SEED); delete it to retrain"
  else
    echo "== training $dir ($2 steps, seed $SEED; a few minutes on 2 cores)"
    "$HS" train-toy --task "$1" --steps "$2" --seed "$SEED" --threads "$THREADS" --out "$dir" --force
  fi
}
train induction "$INDUCTION_STEPS"
train recall "$RECALL_STEPS"

mkdir -p out
# R drawn from the alphanumerics the model was trained on (ids 6..67); 2*25+1 tokens fit its 64.
echo "== headscope detect models/toy-induction"
"$HS" -q detect models/toy-induction \
  --probe induction,previous-token,duplicate-token,attention-sink,induction-loss \
  --seq-len 25 --batch 32 --token-range 6,68 --seed 0 --out out/toy-induction.h5 --force >/dev/null
echo "== headscope top out/toy-induction.h5 --probe induction -k 5"
"$HS" top out/toy-induction.h5 --probe induction -k 5
"$HS" export out/toy-induction.h5 --format json --out out/toy-induction-scores.json

echo "== what was found"
python3 - out/toy-induction-scores.json models/toy-induction/training_log.json models/toy-recall/training_log.json <<'EOF'
import json, sys

rows = json.load(open(sys.argv[1]))
ind_log, rec_log = (json.load(open(p)) for p in sys.argv[2:4])

def table(probe):
    return {(r["layer"], r["head"]): r for r in rows if r["probe"] == probe}

def best(probe):
    t = table(probe)
    return max(t, key=lambda k: t[k]["value"]), t

def name(k):
    return f"L{k[0]}H{k[1]}"

def lh(head):
    l, h = head[1:].split("H")
    return int(l), int(h)

gt = ind_log["ground_truth"]
base = gt["baseline"]
ind_k, ind_t = best("induction")
prev_k, prev_t = best("previous-token")
loss_t = table("induction-loss")
det_base = next(iter(loss_t.values()))["baseline_loss"]

print(f"toy-induction ({ind_log['steps']} steps, seed {ind_log['seed']}): repeated-half loss "
      f"{base:.3f} nats/token vs {ind_log['final_metrics']['first_occurrence_loss_mean']:.2f} on first occurrences "
      f"(chance {ind_log['final_metrics']['log_vocab']:.2f})")

def report(role, truth, t, joint_key):
    """detect's top heads for one role next to the set that training-time ablation proved causal."""
    k = max(1, len(truth))
    top = sorted(t, key=lambda x: -t[x]["value"])[:k]
    named = ", ".join(f"{name(x)} {t[x]['value']:.2f}" for x in top)
    print(f"  {role} head{'s' if k > 1 else ''} (detect, stripe score): {named}; ablating "
          + ("them one at a time" if k > 1 else "it")
          + " raises repeated-half loss from "
          + f"{det_base:.2f} to " + ", ".join(f"{loss_t[x]['value']:.2f}" for x in top) + " nats (detect induction-loss)")
    if not truth:
        print(f"    ground truth: no causal {role} head ({'; '.join(gt.get('notes', []))})")
        return
    verdict = "agrees" if sorted(truth) == sorted(name(x) for x in top) else "DISAGREES"
    alone = ", ".join(f"{n} {gt['per_head_ablation'][lh(n)[0]][lh(n)[1]]:.2f}" for n in truth)
    joint = gt.get(joint_key)
    extra = f"; all {len(truth)} together: {joint:.2f}" if joint is not None and len(truth) > 1 else ""
    print(f"    ground truth {verdict}: training's ablations (repeated-half loss {base:.2f} intact) "
          f"give alone {alone}{extra} nats")

report("induction", gt.get("induction_heads", []), ind_t, "induction_heads_joint_ablation")
report("previous-token", gt.get("previous_token_heads", []), prev_t, None)

rg = rec_log["ground_truth"]
acc = rec_log["final_metrics"]["accuracy"]
print(f"toy-recall ({rec_log['steps']} steps): exact recall accuracy "
      + ", ".join(f"{acc[n]:.3f} at {n} tokens" for n in sorted(acc, key=int)))
heads = rg.get("retrieval_heads") or []
if heads:
    each = ", ".join(f"{n} (query-to-value attention {rg['retrieval_attention'][lh(n)[0]][lh(n)[1]]:.2f}, "
                     f"ablated alone {rg['per_head_ablation'][lh(n)[0]][lh(n)[1]]:.3f})" for n in heads)
    print(f"  retrieval head{'s' if len(heads) > 1 else ''}: {each}"
          + (f"; ablating all {len(heads)} drops accuracy from {rg['baseline']:.3f} to "
             f"{rg['retrieval_heads_joint_ablation']:.3f}" if len(heads) > 1 else ""))
if rg.get("previous_token_head"):
    l, h = lh(rg["previous_token_head"])
    print(f"  {rg['previous_token_head']} is its previous-token head: ablating it drops accuracy to "
          f"{rg['per_head_ablation'][l][h]:.3f}")
if not heads:
    for n in rg.get("notes", []):
        print(f"  note: {n}")
EOF
echo "scores: out/toy-induction.h5 (headscope top/export read it); ground truth: models/toy-*/training_log.json"
"$HS" -q report out/toy-induction.h5 --out out/report.html --force --title "headscope quickstart: toy-induction"
echo "report: $(pwd)/out/report.html (one self-contained page: open it in any browser, no network needed)"
