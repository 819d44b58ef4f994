#!/usr/bin/env bash
# The needle study against the reference pipeline (scripts/bench.sh section 6d; docs/performance.md
# "The needle study"). On the GPT-2-small-shaped random checkpoint with GPT-2's tokenizer, one grid
# of lengths x depths x needles under `--protocol wu` (Retrieval_Head's trials), 16 greedy steps a
# trial (--stop none: the same work on both sides):
#   (a) the scan alone: `headscope retrieval --score retrieval` against the reference detection loop
#       (bench_peers.py needle: sdpa prefill, eager decode with output_attentions, retrieval_calculate);
#   (b) the whole study: the scan, then the top 3 heads' queries zeroed at decode steps (Wu's
#       masking) and 5 random control sets, against the detection loop followed by
#       needle_in_haystack_with_mask.py's loop once per head set (bench_peers.py study), in one warm
#       process.
# headscope is timed as a whole process (model load included); the reference from its loaded model.
# Every greedy token and score is compared before a ratio is printed.
# Beside the ratios, the machine's limits measured in the same run (`headscope bench --limits`: the
# float32 512^3 GEMM rate, a 1 GiB streaming read) and the scan against them:
#   prefill rate = prefill FLOPs / headscope's prefill seconds (its log), as a fraction of the GEMM rate;
#     FLOPs = L x (C x 2 (D (Dq + 2 Dkv) + Dq D + 3 D F) + 4 H dh x K): C the prompt positions headscope
#     prefilled (its log: all positions less those taken from kept prefills), K the keys they attended to,
#     counted on the prompts' prefix tree (each distinct prefix position p once, p + 1 keys; the positions
#     headscope prefilled beyond the tree, chunk alignment, at the tree's mean keys);
#   decode step = decode seconds / decode forwards (its log), against the weights' bytes (the safetensors
#     tensors a step reads; an untied embedding's rows aside) / the measured read bandwidth.
#   bash scripts/bench_needle_study.sh [OUT_DIR]
# Env: HEADSCOPE_BIN (default build/headscope), HEADSCOPE_PEERS_VENV (default .venv-peers), THREADS
# (default: every core), STUDY_LENGTHS (512,1024,1536,2048), STUDY_DEPTHS (0,20,40,60,80,100),
# STUDY_NEEDLES (2), STUDY_STEPS (16), STUDY_MODEL (a checkpoint folder; default: made by
# scripts/make_bench_model.py), STUDY_HS_ARGS (more headscope options, split on spaces; default ""
# headscope's defaults: --batch auto --sweep-rows auto, which the log line "batching:" reports; e.g.
# "--batch 6 --sweep-rows 36" for the setting measured before the defaults chose rows themselves),
# STUDY_PARTS (default "scan study"; "scan": only (a), the scan and its limits, a few minutes instead of ~17).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-/tmp/headscope-bench/study}"
mkdir -p "$DIR"
HS="${HEADSCOPE_BIN:-build/headscope}"
PP="${HEADSCOPE_PEERS_VENV:-$PWD/.venv-peers}/bin/python"
THREADS="${THREADS:-$(nproc)}"
TOKDIR=../shared/testdata/gpt2-tokenizer
LENGTHS="${STUDY_LENGTHS:-512,1024,1536,2048}"
DEPTHS="${STUDY_DEPTHS:-0,20,40,60,80,100}"
STEPS="${STUDY_STEPS:-16}"
[ -x "$HS" ] || { echo "bench_needle_study.sh: no headscope binary at $HS" >&2; exit 2; }
[ -x "$PP" ] && "$PP" -c 'import torch, transformers, h5py' 2>/dev/null ||
  { echo "needle study: skipped (no peers' environment at $PP: bash scripts/setup_peers.sh)"; exit 0; }
[ -d "$TOKDIR" ] || { echo "needle study: skipped (no $TOKDIR)"; exit 0; }
MODEL="${STUDY_MODEL:-/tmp/headscope-bench/gpt2s-llama}"
[ -f "$MODEL/config.json" ] || "$PP" scripts/make_bench_model.py "$MODEL" >/dev/null
head -"${STUDY_NEEDLES:-2}" datasets/needles/study_needles.jsonl > "$DIR/needles.jsonl"
common=("$MODEL" --tokenizer "$TOKDIR" --protocol wu --haystack datasets/needles/haystack.txt --needles "$DIR/needles.jsonl"
        --lengths "$LENGTHS" --depths "$DEPTHS" --max-new-tokens "$STEPS" --stop none --score retrieval --threads "$THREADS")
read -r -a extra <<< "${STUDY_HS_ARGS-}"
common+=("${extra[@]}")

secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
run_hs() {  # run_hs OUT LOG ARGS...: headscope's whole-process seconds
  local out="$1" log="$2"; shift 2
  local t0; t0=$(date +%s.%N)
  "$HS" retrieval "${common[@]}" "$@" --out "$out" --force >"$log.out" 2>"$log.err" ||
    { echo "headscope failed: $(grep -m1 error "$log.err")" >&2; return 1; }
  secs "$t0"
}

"$HS" -q bench "$MODEL" --limits --threads "$THREADS" --json > "$DIR/limits.json"
echo "needle study: $(basename "$MODEL"), lengths $LENGTHS x depths $DEPTHS x $(wc -l <"$DIR/needles.jsonl") needles, $STEPS steps, $THREADS threads; headscope $HS ${extra[*]}"
# (a) the scan alone
hs_scan=$(run_hs "$DIR/scan.h5" "$DIR/scan")
ref_scan=$("$PP" scripts/bench_peers.py needle "$MODEL" "$DIR/scan.h5" --tokenizer "$TOKDIR" --threads "$THREADS" | tail -1)
# (b) the whole study
PARTS="${STUDY_PARTS:-scan study}"
case " $PARTS " in *" study "*) ;; *" scan "*) PARTS=scan ;; *) echo "bench_needle_study.sh: STUDY_PARTS is 'scan' or 'scan study', not '$PARTS'" >&2; exit 2 ;; esac
hs_study=- ref_study=null
if [ "$PARTS" != scan ]; then
  hs_study=$(run_hs "$DIR/study.h5" "$DIR/study" --ablate-top 3 --random-controls 5)
  ref_study=$("$PP" scripts/bench_peers.py study "$MODEL" "$DIR/study.h5" --tokenizer "$TOKDIR" --threads "$THREADS" | tail -1)
fi

MODEL="$MODEL" "$PP" - "$hs_scan" "$ref_scan" "$hs_study" "$ref_study" "$DIR" <<'EOF'
import json, re, struct, sys
import h5py, os
MODEL = os.environ["MODEL"]

def limits_lines(d, lim, ref_scan):
    """The scan's prefill rate against the GEMM rate and its decode step against weights / bandwidth."""
    model = ref_scan.get("model") or MODEL
    c = json.load(open(model + "/config.json"))
    L, D, F, H = c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    K, dh = c.get("num_key_value_heads", H), D // H
    Dq, Dkv = H * dh, K * dh
    log = open(d + "/scan.err").read()
    m = re.search(r"time: prefill ([0-9.]+) s, decode steps ([0-9.]+) s \((\d+) forwards of ([0-9.]+) rows", log)
    if not m:
        return "limits: headscope's log has no 'time:' line with the decode forwards (an older binary?)"
    t_pre, t_dec, fwd, rows = float(m[1]), float(m[2]), int(m[3]), float(m[4])
    prompts = [[int(x) for x in row if x >= 0] for row in h5py.File(d + "/scan.h5", "r")["retrieval/trials/prompt_tokens"][()]]
    pre = sorted(p[:-1] for p in prompts)  # each trial prefills its prompt but the last token
    tree, keys = 0, 0
    for i, p in enumerate(pre):  # the distinct prefix positions: past each prompt's common prefix with the one before
        lcp = 0
        if i:
            q = pre[i - 1]
            while lcp < min(len(p), len(q)) and p[lcp] == q[lcp]:
                lcp += 1
        tree += len(p) - lcp
        keys += sum(range(lcp + 1, len(p) + 1))
    r = re.search(r"prefill: (\d+) of (\d+) prompt positions", log)
    C = int(r[2]) - int(r[1]) if r else sum(len(p) for p in pre)
    K_keys = keys * C / tree
    flops = L * (C * 2.0 * (D * (Dq + 2 * Dkv) + Dq * D + 3 * D * F) + 4.0 * H * dh * K_keys)
    gemm, bw = lim["gemm_gflops_512_float32"], lim["memory_read_gbs"]
    with open(model + "/model.safetensors", "rb") as f:
        hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    nbytes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in hdr.items() if k != "__metadata__"}
    wbytes = sum(nbytes.values()) - (nbytes.get("model.embed_tokens.weight", 0) if "lm_head.weight" in nbytes else 0)
    step, floor = t_dec / fwd, wbytes / (bw * 1e9)
    mean_keys = sum(len(p) for p in prompts) / len(prompts)
    kv = rows * L * 2 * Dkv * 4 * mean_keys  # every row reading its own float32 prompt keys and values
    return (f"limits: float32 GEMM {gemm:.1f} GFLOP/s (512^3), memory read {bw:.1f} GB/s, copy {lim['memory_copy_gbs']:.1f} GB/s\n"
            f"    scan prefill: {flops / 1e12:.2f} TFLOP ({C} positions prefilled, {tree} in the prompts' prefix tree) in {t_pre:.2f} s = "
            f"{flops / t_pre / 1e9:.1f} GFLOP/s, {100 * flops / t_pre / 1e9 / gemm:.0f}% of the GEMM rate\n"
            f"    scan decode step: {1e3 * step:.1f} ms ({fwd} forwards of {rows:.1f} rows); weights {wbytes / 2**20:.0f} MiB / "
            f"{bw:.1f} GB/s = {1e3 * floor:.1f} ms: {step / floor:.2f}x (with each row's own KV reads, {mean_keys:.0f} keys: "
            f"{1e3 * (wbytes + kv) / (bw * 1e9):.1f} ms, {step * bw * 1e9 / (wbytes + kv):.2f}x)")

hs_scan, ref_scan, ref_study, d = float(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[4]), sys.argv[5]
hs_study = None if sys.argv[3] == "-" else float(sys.argv[3])  # STUDY_PARTS=scan: no (b)
scan_ref_s = sum(ref_scan["per_trial_s"])
ok_a = ref_scan["same_tokens"] and ref_scan["max_score_diff"] <= 1e-5
ok_b = hs_study is None or (ref_study["same_tokens"] and ref_study["same_ablated_tokens"] and ref_study["max_score_diff"] <= 1e-5)
def times(f):
    return [l.strip() for l in open(f) if l.startswith(("time:", "prefill:"))]
print(f"trials {ref_scan['trials']}, prompt tokens {min(ref_scan['prompt_tokens'])}-{max(ref_scan['prompt_tokens'])}; "
      f"{ref_study['sets'] if ref_study else 'no'} head sets; torch {ref_scan['torch']}, transformers {ref_scan.get('transformers', '?')}")
print("(a) scan alone:    headscope %7.1f s  reference %7.1f s  %s" % (
    hs_scan, scan_ref_s, f"{scan_ref_s / hs_scan:.2f}x" if ok_a else "NOT COMPARED: tokens or scores differ " + json.dumps(ref_scan)))
print("    headscope " + "; ".join(times(d + "/scan.err")))
if hs_study is None:
    print("(b) whole study:   not run (STUDY_PARTS=scan)")
else:
    print("(b) whole study:   headscope %7.1f s  reference %7.1f s  %s" % (
        hs_study, ref_study["study_s"], f"{ref_study['study_s'] / hs_study:.2f}x" if ok_b else "NOT COMPARED: tokens or scores differ " + json.dumps({k: ref_study[k] for k in ("same_tokens", "same_ablated_tokens", "max_score_diff")})))
    print("    reference: detection loop %.1f s, masked loops %.1f s; headscope %s" % (
        ref_study["scan_s"], ref_study["masked_s"], "; ".join(times(d + "/study.err"))))
limits = json.load(open(d + "/limits.json"))
print(limits_lines(d, limits, ref_scan))
print(json.dumps({"scan": {"headscope_s": hs_scan, "reference_s": scan_ref_s}, "study": {"headscope_s": hs_study, **(ref_study or {})},
                  "limits": limits}))
sys.exit(0 if ok_a and ok_b else 1)
EOF
