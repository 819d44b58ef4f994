#!/usr/bin/env python3
"""An independent check of `headscope rerank --dump` (QRHead's calibrated attention and its scores).

    qrhead_check.py MODEL_DIR DUMP.json [--tol 1e-5]

MODEL_DIR: a Llama-family Hugging Face checkpoint (config.json, model.safetensors). DUMP: what
`headscope rerank ... --dump DUMP.json` wrote (each example's prompt tokens, the query's start, the
null query's tokens, the documents' spans [start, end), the heads, and headscope's scores). Written
apart from headscope's C++ (plain torch in float64), following princeton-pli/QRHead (commit 7a668e7)
src/qrretriever/attn_retriever.py:

  score_per_token_attention_to_query (lines 323-353): the model run on the prompt, the query tokens'
      post-RoPE queries against every key (_get_attn_weights, lines 355-376: q / sqrt(d) @ k^T, the
      causal mask, softmax), `attn_weights.mean(1)`: the mean over the query tokens -> [L, H, S];
  score_docs (lines 197-217): the same with the null query after the same prefix (the reference
      reuses the KV cache up to query_span[0]; here the null prompt is run whole, which computes the
      same keys), per_token_scores_CAL = query - null over the first min_length keys;
  score_docs_per_head_for_detection (lines 301-312): per document and head, the span's CAL values x,
      threshold = x.mean() - 2 * x.std() (unbiased), the values above it summed;
  score_docs (lines 229-247): CAL summed over the heads first (per token), then the same threshold
      and sum per document.

It prints the largest differences and exits 1 when a per-head score or a document score differs by
more than --tol (absolute, plus --tol x |value|) or a ranking differs where the scores are apart by
more than 10 x --tol; 2 when an input cannot be read.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import torch

F64 = torch.float64


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        lo, hi = meta["data_offsets"]
        kind = {"F32": np.float32, "F16": np.float16}[meta["dtype"]]
        arr = np.frombuffer(blob[lo:hi], dtype=kind).astype(np.float64).reshape(meta["shape"])
        tensors[name] = torch.from_numpy(arr.copy())
    return tensors


def rmsnorm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half_rope(x, theta):  # x [heads, T, d], Hugging Face's rotate_half layout
    d, T = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=F64) / d))
    freqs = torch.outer(torch.arange(T, dtype=F64), inv)
    emb = torch.cat([freqs, freqs], -1)
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * emb.cos() + half * emb.sin()


def attention_rows(cfg, w, tokens, q0):
    """Every layer's softmax rows of positions q0.. over all keys, averaged over those rows: [L, H, T]."""
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    T = len(tokens)
    emb = w.get("model.embed_tokens.weight", w.get("lm_head.weight"))
    x = emb[torch.tensor(tokens)]
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
    out = []
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        h = rmsnorm(x, w[pre + "input_layernorm.weight"], eps)
        q = (h @ w[pre + "self_attn.q_proj.weight"].T).view(T, H, d).transpose(0, 1)
        k = (h @ w[pre + "self_attn.k_proj.weight"].T).view(T, K, d).transpose(0, 1)
        v = (h @ w[pre + "self_attn.v_proj.weight"].T).view(T, K, d).transpose(0, 1)
        q, k = rotate_half_rope(q, theta), rotate_half_rope(k, theta)
        k, v = k.repeat_interleave(H // K, 0), v.repeat_interleave(H // K, 0)  # repeat_kv
        logits = (q / math.sqrt(d)) @ k.transpose(1, 2)  # line 365-366: scale the queries first
        logits = logits.masked_fill(~allowed, torch.finfo(F64).min)  # line 383: the causal mask's min
        probs = torch.exp(logits - torch.logsumexp(logits, -1, keepdim=True))  # lines 374-375
        out.append(probs[:, q0:, :].mean(1))  # line 349: mean over the query tokens
        z = (probs @ v).transpose(0, 1).reshape(T, H * d)
        x = x + z @ w[pre + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, w[pre + "post_attention_layernorm.weight"], eps)
        gate = h @ w[pre + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * (h @ w[pre + "mlp.up_proj.weight"].T)) @ w[pre + "mlp.down_proj.weight"].T
    return torch.stack(out)


def kept_sum(x):  # lines 244-247 / 304-311 on the last dimension
    thr = x.mean(-1, keepdim=True) - 2 * x.std(-1, keepdim=True)
    return (x * (x > thr)).sum(-1)


def parse_heads(text):
    out = []
    for name in text.split(","):
        layer, head = name[1:].split("H")
        out.append((int(layer), int(head)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("dump")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    try:
        cfg = json.load(open(f"{a.model_dir}/config.json"))
        w = load_safetensors(f"{a.model_dir}/model.safetensors")
        dump = json.load(open(a.dump))
    except (OSError, ValueError, KeyError) as e:
        print(f"qrhead_check: {e}", file=sys.stderr)
        return 2
    L, H = dump["L"], dump["H"]
    heads = parse_heads(dump["heads"])
    worst_head = worst_doc = 0.0
    bad = []
    for ex in dump["examples"]:
        toks, qs = ex["tokens"], ex["query_start"]
        with torch.no_grad():
            real = attention_rows(cfg, w, toks, qs)
            null = attention_rows(cfg, w, toks[:qs] + ex["null_query"], qs)
        n = min(real.shape[-1], null.shape[-1])
        cal = real[:, :, :n] - null[:, :, :n]
        per_token = sum(cal[l, h] for (l, h) in heads)
        got_ph = np.array(ex["per_head"]).reshape(len(ex["spans"]), L, H)
        doc_scores = []
        for di, (s, e) in enumerate(ex["spans"]):
            ph = kept_sum(cal[:, :, s:e]).numpy()
            diff = np.abs(ph - got_ph[di])
            worst_head = max(worst_head, float(diff.max()))
            if (diff > a.tol * (1 + np.abs(ph))).any():
                bad.append(f"line {ex['line']} doc {di}: per-head scores differ by up to {diff.max():.3g}")
            doc_scores.append(float(kept_sum(per_token[s:e])))
        for di, (want, got) in enumerate(zip(doc_scores, ex["scores"])):
            worst_doc = max(worst_doc, abs(want - got))
            if abs(want - got) > a.tol * (1 + abs(want)):
                bad.append(f"line {ex['line']} doc {di}: score {got} (headscope) vs {want} (reference lines)")
        order = sorted(range(len(doc_scores)), key=lambda i: -doc_scores[i])
        for x, y in zip(order, ex["ranking"]):
            if x != y and abs(doc_scores[x] - doc_scores[y]) > 10 * a.tol:
                bad.append(f"line {ex['line']}: ranking {ex['ranking']} (headscope) vs {order} (reference lines)")
                break
    print(f"qrhead_check: {len(dump['examples'])} examples, heads {dump['heads']}: largest difference per-head "
          f"{worst_head:.3g}, document scores {worst_doc:.3g} (tolerance {a.tol:g})")
    for b in bad[:20]:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
