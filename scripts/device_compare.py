"""Comparisons for scripts/device_check.sh: each subcommand reads the outputs of the steps before it and
appends one row {check, headscope, peer, result} per figure to --rows (JSON lines).

  cpu-cuda --name N --bench CPU.out CUDA.out [--scores CPU.json CUDA.json]
      headscope bench --json logits probes, and `headscope export --format json` detector scores
  retrieval --h5py 0|1 CPU.h5 CUDA.h5 --json CPU.json CUDA.json
      per-trial retrieval / LOCOS scores and greedy tokens (h5py), else the exported aggregate scores
  gemm              the GPU's bf16 product rate, 8192^3 (torch); prints JSON
  prefill --seq T HEADSCOPE.out HF.out --gemm GEMM.out
  needle --length L HEADSCOPE.out HF.out
  ablation HEADSCOPE.out TL.out
"""
import argparse, json, re, sys


def last_json(path):
    """The last JSON object in a step's output (headscope bench prints a multi-line one)."""
    text = open(path).read()
    i = text.rfind("\n{")
    i = 0 if text.startswith("{") and i < 0 else i + 1
    for start in [i] + [m.start() for m in re.finditer(r"^\{", text, re.M)][::-1]:
        try:
            return json.loads(text[start:])
        except Exception:
            continue
    raise SystemExit(f"no JSON in {path}")


def add(rows, check, hs, peer, result):
    r = {"check": check, "headscope": hs, "peer": peer, "result": result}
    print(json.dumps(r))
    if rows:
        with open(rows, "a") as f:
            f.write(json.dumps(r) + "\n")


def maxdiff(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def cpu_cuda(a):
    c, g = last_json(a.bench[0]), last_json(a.bench[1])
    d = maxdiff(c["logits_probe"], g["logits_probe"])
    scale = max(1.0, max(abs(x) for x in c["logits_probe"]))
    add(a.rows, f"{a.name}: logits {a.what} (16 values)", "", "", f"max diff {d:.2e} ({'ok' if d <= 1e-3 * scale else 'DIFFERENT'})")
    if a.scores:
        sc, sg = json.load(open(a.scores[0])), json.load(open(a.scores[1]))
        key = lambda r: (r.get("probe"), r.get("layer"), r.get("head"))  # noqa: E731
        vc = {key(r): r["value"] for r in sc if isinstance(r.get("value"), (int, float))}
        vg = {key(r): r["value"] for r in sg if isinstance(r.get("value"), (int, float))}
        common = set(vc) & set(vg)
        d = max((abs(vc[k] - vg[k]) for k in common), default=float("nan"))
        add(a.rows, f"{a.name}: detector scores CPU vs CUDA ({len(common)} values)", "", "",
            f"max diff {d:.2e} ({'ok' if d <= 1e-4 else 'DIFFERENT'})")


def retrieval(a):
    if a.h5py == "1":
        import h5py
        import numpy as np
        c, g = h5py.File(a.files[0], "r")["retrieval/trials"], h5py.File(a.files[1], "r")["retrieval/trials"]
        same = bool((c["generated"][()] == g["generated"][()]).all())
        dr = float(np.nanmax(np.abs(c["retrieval"][()] - g["retrieval"][()])))
        dl = float(np.nanmax(np.abs(c["locos"][()] - g["locos"][()]))) if "locos" in c else float("nan")
        add(a.rows, f"tinystories-656k needle: per-trial scores CPU vs CUDA ({c['generated'].shape[0]} trials)", "", "",
            f"greedy tokens {'same' if same else 'DIFFERENT'}; retrieval max diff {dr:.2e}, LOCOS {dl:.2e}")
    else:
        sc, sg = json.load(open(a.json[0])), json.load(open(a.json[1]))
        key = lambda r: (r.get("probe"), r.get("layer"), r.get("head"))  # noqa: E731
        vc = {key(r): r["value"] for r in sc if isinstance(r.get("value"), (int, float))}
        vg = {key(r): r["value"] for r in sg if isinstance(r.get("value"), (int, float))}
        common = set(vc) & set(vg)
        d = max((abs(vc[k] - vg[k]) for k in common if vc[k] == vc[k]), default=float("nan"))
        add(a.rows, "tinystories-656k needle: scores CPU vs CUDA (aggregate; no h5py for per-trial)", "", "", f"max diff {d:.2e}")


def gemm(a):
    import time
    import torch
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        x @ y
    torch.cuda.synchronize()
    tflops = 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12
    add(a.rows, "GPU bf16 GEMM rate (8192^3, torch)", "", "", f"{tflops:.0f} TFLOP/s")
    print(json.dumps({"gemm_tflops_bf16": tflops}))


def prefill(a):
    h, p = last_json(a.files[0]), last_json(a.files[1])
    g = last_json(a.gemm)["gemm_tflops_bf16"]
    ths, tp = a.seq / h["forward_s"], a.seq / p["forward_s"]
    d = maxdiff(h["logits_probe"], p["logits_probe"])
    frac = h["forward_gflops"] / 1e3 / g
    add(a.rows, f"prefill 1 x {a.seq}, bf16, tokens/s", f"{ths:,.0f}", f"transformers sdpa {tp:,.0f}",
        f"{ths / tp:.2f}x; forward at {frac:.2f} of the bf16 GEMM rate; logits differ by {d:.2e} (bf16)")


def needle(a):
    hs = float(re.search(r"seconds ([0-9.]+)", open(a.files[0]).read()).group(1))
    r = last_json(a.files[1])
    per = hs / r["trials"]
    add(a.rows, f"needle scan at {a.length} tokens (retrieval + LOCOS), s/trial", f"{per:.2f}",
        f"reference loop {r['mean_trial_s']:.2f}",
        f"{r['mean_trial_s'] / per:.2f}x; greedy tokens {'same' if r['same_tokens'] else 'DIFFERENT (bf16)'}, "
        f"score diff {r['max_score_diff']:.2e}")


def ablation(a):
    m = re.search(r"study single: (\d+) configurations in ([0-9.]+) s", open(a.files[0]).read())
    n, s = int(m.group(1)), float(m.group(2))
    t = last_json(a.files[1])
    per = s / n
    add(a.rows, "144-head zero-ablation sweep (GPT-2-small shape, 2 x 128), ms/head", f"{per * 1e3:.1f}",
        f"{a.peer} {t['per_head_s'] * 1e3:.1f}", f"{t['per_head_s'] / per:.2f}x (baseline loss {t['baseline']:.4f})")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("cpu-cuda"); p.add_argument("--name", required=True); p.add_argument("--bench", nargs=2, required=True)
    p.add_argument("--what", default="CPU vs CUDA (fp32)")
    p.add_argument("--scores", nargs=2)
    p = sub.add_parser("retrieval"); p.add_argument("--h5py", default="0"); p.add_argument("files", nargs=2); p.add_argument("--json", nargs=2)
    p = sub.add_parser("gemm")
    p = sub.add_parser("prefill"); p.add_argument("--seq", type=int, required=True); p.add_argument("files", nargs=2); p.add_argument("--gemm", required=True)
    p = sub.add_parser("needle"); p.add_argument("--length", type=int, required=True); p.add_argument("files", nargs=2)
    p = sub.add_parser("ablation"); p.add_argument("files", nargs=2); p.add_argument("--peer", default="peer")
    for p in sub.choices.values():
        p.add_argument("--rows")
    a = ap.parse_args()
    {"cpu-cuda": cpu_cuda, "retrieval": retrieval, "gemm": gemm, "prefill": prefill, "needle": needle, "ablation": ablation}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
