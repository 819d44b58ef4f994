"""Python-eager baseline for `headscope bench`: the same Llama forward written directly in PyTorch
(as Hugging Face's modeling_llama.py computes it), timed on the same shape and thread count.

Usage: bench_eager.py MODEL_DIR --batch 8 --seq 256 --reps 5 --threads 2 [--patterns]
Prints JSON with forward_s (median). Reads model.safetensors itself (no safetensors package).
"""
import argparse, json, math, struct, time

import numpy as np
import torch

DT = {"F32": np.float32, "F16": np.float16}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = torch.from_numpy(np.frombuffer(data[a:b], dtype=DT[v["dtype"]]).reshape(v["shape"]).copy())
    return out


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def forward(w, c, tokens, patterns=None):
    B, T = tokens.shape
    H, K = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    D = c["hidden_size"]
    d = D // H
    eps = c.get("rms_norm_eps", 1e-6)
    inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2).float() / d))
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos()[None, None], torch.cat([ang, ang], -1).sin()[None, None]
    emb = w.get("model.embed_tokens.weight", w.get("lm_head.weight"))
    x = emb[tokens]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, d).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, K, d).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, K, d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = k.repeat_interleave(H // K, 1), v.repeat_interleave(H // K, 1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + mask, -1)
        if patterns is not None:  # the three detector stripes (induction, previous, duplicate)
            n = max(2, (T - 1) // 2)
            for back in (n - 1, 1, n):
                patterns.append(torch.diagonal(a, -back, -2, -1).sum(-1))
        z = (a @ v).transpose(1, 2).reshape(B, T, D)
        x = x + z @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + g @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"], eps)
    return x @ w.get("lm_head.weight", emb).T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    c = json.load(open(f"{a.model}/config.json"))
    w = load(f"{a.model}/model.safetensors")
    torch.manual_seed(0)
    tokens = torch.randint(0, c["vocab_size"], (a.batch, a.seq))

    def timed(fn):
        fn()
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[len(ts) // 2]

    with torch.inference_mode():
        plain = timed(lambda: forward(w, c, tokens))
        capture = timed(lambda: forward(w, c, tokens, []))
        probe = forward(w, c, tokens)[0, -1, :16].double().tolist()
    print(json.dumps({"forward_s": plain, "forward_pattern_capture_s": capture, "logits_probe": probe,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
