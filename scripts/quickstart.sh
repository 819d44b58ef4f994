#!/usr/bin/env bash
# The README's main command: install, build, train the two ground-truth toy models (cached), run
# the head probes on the induction model, and say in words what was found, checked against the
# heads that ablation established during training (models/toy-*/training_log.json).
#
#   bash scripts/quickstart.sh            # everything
#   THREADS=2 SEED=1 bash scripts/quickstart.sh
# Models land in models/toy-induction and models/toy-recall; results in out/: the detectors' scores
# (toy-induction.h5), the needle test on the recall model (toy-recall-needle.h5: retrieval + LOCOS
# scores, zero-query ablation of the top heads against random controls), the YAML ablation study
# (toy-induction-ablation.h5), and one HTML report of all three (report.html).
# A model is retrained only when its training_log.json is missing or has other steps, seed or
# recipe version (src/train/train.cpp kRecipeVersion).
set -euo pipefail
cd "$(dirname "$0")/.."

SEED="${SEED:-1}"
THREADS="${THREADS:-0}"            # 0: every core (the weights depend on the thread count)
INDUCTION_STEPS="${INDUCTION_STEPS:-2000}"
RECALL_STEPS="${RECALL_STEPS:-3000}"

bash scripts/install_deps.sh
bash scripts/build.sh
HS=build/headscope

RECIPE=$(grep -o 'kRecipeVersion = [0-9]*' src/train/train.cpp | grep -o '[0-9]*$')  # the training recipe's version
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

# The needle test on the recall model: its own task (keys a-h as distractors in a haystack of
# digits, the needle "qZ" asks for Z after "?q"), scored both ways from one greedy step per trial,
# then the top three LOCOS heads' queries zeroed against five random sets of three.
echo "== headscope retrieval models/toy-recall (needle test: 5 lengths x 5 depths x 8 needles)"
"$HS" -q retrieval models/toy-recall --haystack datasets/needles/toy_recall_haystack.txt \
  --needles datasets/needles/toy_recall_needles.jsonl --template '{context}?{question}' \
  --lengths 24,48,72,96,120 --depths 0,25,50,75,100 --max-new-tokens 1 \
  --ablate-top 3 --ablation zero-query --random-controls 5 --seed 1 --out out/toy-recall-needle.h5 --force
echo "== headscope run datasets/experiments/toy-induction.yaml"
"$HS" -q run datasets/experiments/toy-induction.yaml --force >/dev/null
PY=$(bash scripts/find_python.sh h5py numpy)
echo "== do the needle test and the ablation study agree with the training logs?"
"$PY" - out/toy-recall-needle.h5 out/toy-induction-ablation.h5 models/toy-recall/training_log.json \
  models/toy-induction/training_log.json <<'EOF'
import json, sys
import h5py, numpy as np

needle_h5, study_h5, rec_log, ind_log = sys.argv[1:5]
rg = json.load(open(rec_log))["ground_truth"]
ig = json.load(open(ind_log))["ground_truth"]

def name(i, H):
    return f"L{i // H}H{i % H}"

def text(x):
    return x.decode() if isinstance(x, bytes) else str(x)

with h5py.File(needle_h5, "r") as f:
    truth = sorted(rg.get("retrieval_heads") or [])
    k = max(1, len(truth))
    N = f["retrieval/trials/passed"].shape[0]
    acc0 = float(f["retrieval"].attrs["accuracy"])
    print(f"toy-recall needle test: {N} trials, accuracy {acc0:.3f}")
    for probe, what in (("retrieval", "copy score, 1 = a perfect copier"), ("locos", "logit contribution")):
        s = f[f"scores/{probe}/score"][()]
        H = s.shape[1]
        flat = s.reshape(-1)
        top = [int(i) for i in np.argsort(-flat, kind="stable")[:k]]
        shown = ", ".join(f"{name(i, H)} {flat[i]:.2f}" for i in top)
        verdict = "agrees" if sorted(name(i, H) for i in top) == truth else "DISAGREES"
        print(f"  top {k} by {probe} ({what}): {shown}; training's causal set {', '.join(truth)}: {verdict}")
    flagged = [text(x) for x in f["scores/retrieval"].attrs["flagged"]]
    print(f"  flagged as retrieval heads (score > 0.1): {', '.join(flagged) or 'none'}")
    a = f["retrieval/ablation"]
    acc = a["accuracy"][()]
    heads = [text(h) for h in a.attrs["heads"]]
    ctl = acc[1:]
    print(f"  zero-query ablation of {heads[0]}: accuracy {acc0:.3f} -> {acc[0]:.3f}; {len(ctl)} random sets of "
          f"{len(heads[0].split(','))} other heads: mean {ctl.mean():.3f} (min {ctl.min():.3f}, max {ctl.max():.3f})")
    ok = sorted(heads[0].split(",")) == truth and acc[0] < ctl.min()
    print(f"    ground truth {'agrees' if ok else 'DISAGREES'}: training's ablation of {', '.join(truth)} together "
          f"gives accuracy {rg['retrieval_heads_joint_ablation']:.3f} (intact {rg['baseline']:.3f})")

with h5py.File(study_h5, "r") as f:
    truth = sorted(ig.get("induction_heads") or [])
    g = f["ablation/cumulative"]
    kind = [text(x) for x in g["kind"][()]]
    label = [text(x) for x in g["label"][()]]
    metric, masks, kk = g["metric"][()], g["masks"][()], g["k"][()]
    H = masks.shape[2]
    base = float(metric[kind.index("baseline")])
    print(f"toy-induction ablation study (datasets/experiments/toy-induction.yaml: zero ablation, repeated-half "
          f"loss, intact {base:.3f} nats)")
    for i, kd in enumerate(kind):
        if kd != "cumulative":
            continue
        ctl = [metric[j] for j in range(len(kind)) if kind[j] == "control" and kk[j] == kk[i]]
        heads = ",".join(name(int(x), H) for x in np.flatnonzero(masks[i].reshape(-1)))
        extra = f"; random sets of {kk[i]}: mean {np.mean(ctl):.3f} (max {np.max(ctl):.3f})" if ctl else ""
        print(f"  {label[i]} by induction score ({heads}): {metric[i]:.3f}{extra}")
    k = len(truth)
    at_k = [i for i in range(len(kind)) if kind[i] == "cumulative" and kk[i] == k]
    if at_k:
        i = at_k[0]
        top = sorted(name(int(x), H) for x in np.flatnonzero(masks[i].reshape(-1)))
        joint = ig.get("induction_heads_joint_ablation", float("nan"))
        # Agreement: the top k by score are the training's set, and ablating them does at least half
        # of what training measured for that set (over the intact loss).
        ok = top == truth and metric[i] - base >= 0.5 * (joint - ig["baseline"])
        print(f"    ground truth {'agrees' if ok else 'DISAGREES'}: the top {k} by induction score are {', '.join(top)}, "
              f"training's induction set {', '.join(truth)}; ablated together {metric[i]:.2f} nats here, "
              f"{joint:.2f} in training")
        prev = set(ig.get("previous_token_heads") or [])
        ctl = [j for j in range(len(kind)) if kind[j] == "control" and kk[j] == k]
        if prev and ctl:
            has = [j for j in ctl if prev & {name(int(x), H) for x in np.flatnonzero(masks[j].reshape(-1))}]
            pool = sorted({name(int(x), H) for j in ctl for x in np.flatnonzero(masks[j].reshape(-1))})
            with_prev = [metric[j] for j in has]
            without = [metric[j] for j in ctl if j not in has]
            print(f"    random sets of {k} are drawn from the heads outside the sweep ({', '.join(pool)}, ...): "
                  f"{len(has)} of {len(ctl)} include the previous-token head {', '.join(sorted(prev))}, the circuit's "
                  f"first half" + (f" ({np.mean(with_prev):.2f} nats)" if with_prev else "")
                  + (f", the others {np.mean(without):.2f} nats" if without else "")
                  + "; controls exclude the heads under test, not the rest of the circuit")
EOF
echo "results: out/toy-induction.h5 (detect), out/toy-recall-needle.h5 (retrieval), out/toy-induction-ablation.h5 (run);"
echo "  headscope top/export read them; ground truth: models/toy-*/training_log.json"
"$HS" -q report out/toy-induction.h5 out/toy-recall-needle.h5 out/toy-induction-ablation.h5 --out out/report.html --force \
  --title "headscope quickstart: toy models"
echo "report: $(pwd)/out/report.html (one self-contained page: open it in any browser, no network needed)"
