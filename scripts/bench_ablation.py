"""Ablation-sweep benchmark helpers (docs/performance.md, "Ablation sweeps").

  bench_ablation.py make DIR        a GPT-2-small-shaped model with random weights (12 layers x 12
                                    heads, d_model 768, vocab 50257; std 0.02, LayerNorm 1/0) as
                                    DIR/config.json + DIR/model.safetensors, 2 rows of 128 random
                                    ids as DIR/tokens.txt, and DIR/single.yaml (a single zero sweep)
  bench_ablation.py eager DIR --threads N [--layers 0,11]
                                    the Python-eager baseline: GPT-2 written directly in PyTorch,
                                    z hooked before c_proj, one forward per ablated head in one
                                    process; prints JSON with seconds per head (and the metric per
                                    head, to check against headscope)
  bench_ablation.py tl DIR --threads N --tokenizer TOKDIR [--layers 0,11] [--compat]
                                    the TransformerLens baseline (run in the virtual environment of
                                    scripts/setup_peers.sh): the checkpoint loaded by transformers'
                                    GPT2LMHeadModel, wrapped by TransformerLens 4's TransformerBridge
                                    (4.0 removed HookedTransformer), one run_with_hooks per head with
                                    that head's hook_z zeroed, as the TransformerLens tutorials do;
                                    --compat: enable_compatibility_mode() first (HookedTransformer's
                                    folded LayerNorm and centred weights). Same JSON as eager
  bench_ablation.py hf DIR --threads N [--layers 0,11] [--device cuda]
                                    plain transformers (no TransformerLens): GPT2LMHeadModel (sdpa),
                                    a forward pre-hook on each layer's attn.c_proj zeroing one head's
                                    64 columns of z, one forward per head. Same JSON as eager
The metric is headscope's `loss` at `positions: all`: mean next-token cross-entropy per row,
averaged over the rows.
"""
import argparse, json, math, os, struct, sys, time

import numpy as np
import torch

L, H, D, V, P, T, B = 12, 12, 768, 50257, 1024, 128, 2


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for k, a in tensors.items():
        b = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# The reader bench_eager.py already has (F32/F16 safetensors, no safetensors package needed).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_eager import load as read_safetensors  # noqa: E402


def make(d):
    d = os.path.abspath(d)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    r = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    t = {"wte.weight": r(V, D), "wpe.weight": r(P, D), "ln_f.weight": np.ones(D), "ln_f.bias": np.zeros(D)}
    for l in range(L):
        p = f"h.{l}."
        t.update({p + "ln_1.weight": np.ones(D), p + "ln_1.bias": np.zeros(D),
                  p + "attn.c_attn.weight": r(D, 3 * D), p + "attn.c_attn.bias": np.zeros(3 * D),
                  p + "attn.c_proj.weight": r(D, D), p + "attn.c_proj.bias": np.zeros(D),
                  p + "ln_2.weight": np.ones(D), p + "ln_2.bias": np.zeros(D),
                  p + "mlp.c_fc.weight": r(D, 4 * D), p + "mlp.c_fc.bias": np.zeros(4 * D),
                  p + "mlp.c_proj.weight": r(4 * D, D), p + "mlp.c_proj.bias": np.zeros(D)})
    write_safetensors(f"{d}/model.safetensors", t)
    json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_embd": D,
               "n_layer": L, "n_head": H, "n_positions": P, "n_inner": None, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256,
               "tie_word_embeddings": True}, open(f"{d}/config.json", "w"), indent=1)
    toks = rng.integers(0, V, size=(B, T))
    with open(f"{d}/tokens.txt", "w") as f:
        for row in toks:
            f.write(",".join(map(str, row)) + "\n")
    with open(f"{d}/loop.yaml", "w") as f:  # the first and last layers, one forward per head
        f.write(f"""# Written by scripts/bench_ablation.py: the heads of layers 0 and 11 (one-forward-per-head timing).
model: {d}
seed: 0
data:
  rows: {{kind: tokens, file: {d}/tokens.txt}}
studies:
  - name: single
    sweep: single
    heads: {{layers: [0, 11]}}
    mode: zero
    metric: {{kind: loss, data: rows, positions: all}}
""")
    with open(f"{d}/single.yaml", "w") as f:
        f.write(f"""# Written by scripts/bench_ablation.py: a single zero sweep of all 144 heads.
model: {d}
seed: 0
data:
  rows: {{kind: tokens, file: {d}/tokens.txt}}
studies:
  - name: single
    sweep: single
    mode: zero
    metric: {{kind: loss, data: rows, positions: all}}
""")


def forward(w, tokens, ablate=None):
    """GPT-2 as modeling_gpt2.py computes it; ablate = (layer, head): that head's z := 0."""
    Bn, Tn = tokens.shape
    d = D // H
    x = w["wte.weight"][tokens] + w["wpe.weight"][:Tn]
    mask = torch.full((Tn, Tn), float("-inf")).triu(1)
    for l in range(L):
        p = f"h.{l}."
        h = torch.nn.functional.layer_norm(x, (D,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (t.view(Bn, Tn, H, d).transpose(1, 2) for t in qkv.split(D, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + mask, -1)
        z = a @ v  # [B, H, T, d]: the hook point
        if ablate is not None and ablate[0] == l:
            z = z.clone()
            z[:, ablate[1]] = 0
        x = x + z.transpose(1, 2).reshape(Bn, Tn, D) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = torch.nn.functional.layer_norm(x, (D,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        m = torch.nn.functional.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = torch.nn.functional.layer_norm(x, (D,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return x @ w["wte.weight"].T


def loss(logits, tokens):
    lp = torch.log_softmax(logits[:, :-1], -1)
    return (-lp.gather(-1, tokens[:, 1:, None]).squeeze(-1).mean(1)).mean().item()


def eager(d, threads, layers):
    torch.set_num_threads(threads)
    w = read_safetensors(f"{d}/model.safetensors")
    tokens = torch.tensor([[int(x) for x in line.split(",")] for line in open(f"{d}/tokens.txt") if line.strip()])
    with torch.inference_mode():
        base = loss(forward(w, tokens), tokens)
        t0 = time.perf_counter()
        per = {f"L{l}H{h}": loss(forward(w, tokens, (l, h)), tokens) for l in layers for h in range(H)}
        dt = time.perf_counter() - t0
    print(json.dumps({"baseline": base, "metric": per, "seconds": dt, "per_head_s": dt / len(per),
                      "torch": torch.__version__, "threads": threads}))


def tl(d, threads, layers, tokenizer, compat, device="cpu"):
    import warnings
    from functools import partial
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    from importlib.metadata import version
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast
    from transformer_lens.model_bridge import TransformerBridge
    hf = GPT2LMHeadModel.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).to(device).eval()
    b = TransformerBridge.boot_transformers(d, hf_model=hf, device=device,
                                            tokenizer=GPT2TokenizerFast.from_pretrained(tokenizer))
    if compat:
        b.enable_compatibility_mode()
    tokens = torch.tensor([[int(x) for x in line.split(",")] for line in open(f"{d}/tokens.txt") if line.strip()]).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def zero_head(z, hook, head):  # z: [batch, pos, head, d_head]
        z[:, :, head] = 0.0
        return z

    with torch.inference_mode():
        base = loss(b(tokens), tokens)
        sync()
        t0 = time.perf_counter()
        per = {f"L{l}H{h}": loss(b.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_z", partial(zero_head, head=h))]),
                                 tokens) for l in layers for h in range(H)}
        sync()
        dt = time.perf_counter() - t0
    print(json.dumps({"baseline": base, "metric": per, "seconds": dt, "per_head_s": dt / len(per),
                      "torch": torch.__version__, "transformers": version("transformers"),
                      "transformer_lens": version("transformer_lens"), "compat": compat, "threads": threads,
                      "device": device}))


def hf(d, threads, layers, device="cpu"):
    import warnings
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    from importlib.metadata import version
    from transformers import GPT2LMHeadModel
    m = GPT2LMHeadModel.from_pretrained(d, attn_implementation="sdpa", dtype=torch.float32).to(device).eval()
    tokens = torch.tensor([[int(x) for x in line.split(",")] for line in open(f"{d}/tokens.txt") if line.strip()]).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    dh = D // H

    def run(ablate=None):
        hook = None
        if ablate is not None:
            l, h = ablate

            def pre(mod, args):  # c_proj's input is z, [batch, pos, H * d_head]
                z = args[0].clone()
                z[..., h * dh:(h + 1) * dh] = 0
                return (z,)
            hook = m.transformer.h[l].attn.c_proj.register_forward_pre_hook(pre)
        try:
            return loss(m(tokens).logits, tokens)
        finally:
            if hook is not None:
                hook.remove()

    with torch.inference_mode():
        base = run()
        sync()
        t0 = time.perf_counter()
        per = {f"L{l}H{h}": run((l, h)) for l in layers for h in range(H)}
        sync()
        dt = time.perf_counter() - t0
    print(json.dumps({"baseline": base, "metric": per, "seconds": dt, "per_head_s": dt / len(per),
                      "torch": torch.__version__, "transformers": version("transformers"), "threads": threads,
                      "device": device}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["make", "eager", "tl", "hf"])
    ap.add_argument("dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", default="all", help="eager: time the heads of these layers only (e.g. 0,11): "
                    "every eager forward costs the same, so a sample gives the per-head time")
    ap.add_argument("--tokenizer", help="tl: a GPT-2 tokenizer folder (TransformerBridge loads one)")
    ap.add_argument("--compat", action="store_true", help="tl: enable_compatibility_mode() first")
    ap.add_argument("--device", default="cpu", help="tl, hf: cpu, cuda or cuda:N")
    a = ap.parse_args()
    layers = range(L) if a.layers == "all" else [int(x) for x in a.layers.split(",")]
    if a.cmd == "make":
        make(a.dir)
    elif a.cmd == "eager":
        eager(os.path.abspath(a.dir), a.threads, layers)
    elif a.cmd == "hf":
        hf(os.path.abspath(a.dir), a.threads, layers, a.device)
    else:
        if not a.tokenizer:
            sys.exit("bench_ablation.py tl: --tokenizer DIR needed")
        tl(os.path.abspath(a.dir), a.threads, layers, a.tokenizer, a.compat, a.device)
