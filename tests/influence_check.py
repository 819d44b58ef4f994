#!/usr/bin/env python3
"""An independent check of `headscope influence` on a Llama-family checkpoint, following the reference lines.

    influence_check.py MODEL_DIR CORPUS.jsonl RESULT.h5

CORPUS holds {"tokens": [ids]} lines (the ones RESULT was computed on, uncut). For set 0 of RESULT
(its `heads` attribute) this recomputes, in float64 and plain torch sharing nothing with the C++ code:

- the forward of transformers' modeling_llama.py (RMSNorm, rotate_half RoPE, causal softmax attention,
  SwiGLU MLP), with the heads masked as the file's `masking` attribute says:
  zero-query: the retrieval-head code's masking, FYYFU/HeadKV Important_Head/source/modeling_llama.py
    (commit 0862a09) lines 554-557 (the same lines in nightdessert/Retrieval_Head
    faiss_attn/source/modeling_llama.py): `query_states[:, h, :, :] = 0` after RoPE, before the
    causal (flash) attention;
  zero: the head's attention output (before o_proj) set to 0;
- each sample's mean next-token NLL over positions 1..T-1 (`loss_tokens` all) or of its last token
  (`last`), unmasked and masked, and score = (masked - loss) / loss (Hua et al. 2025);
- the selection: samples in order of that score (highest first, ties in corpus order), by `select_by`
  tokens: while the tokens taken are below select_fraction x all tokens (the sample reaching it kept);
  samples: the first ceil(select_fraction x N).

It prints the largest differences and exits 1 when a loss differs by more than 1e-5, a score by more
than 1e-5 (2 + |score|) / loss, or the selected set differs.
"""
import json
import math
import struct
import sys

import h5py
import numpy as np
import torch

F64 = torch.float64


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        dt = {"F32": "<f4", "F16": "<f2"}.get(t["dtype"])
        if dt is None:
            raise SystemExit(f"{path}: tensor {name} has dtype {t['dtype']}, which this check does not read")
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dt).astype(np.float64).reshape(t["shape"]))
    return out


def rms_norm(x, w, eps):  # LlamaRMSNorm
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, base):  # apply_rotary_pos_emb with rotate_half, x [H, T, d]
    d, T = x.shape[-1], x.shape[-2]
    f = 1.0 / (base ** (torch.arange(0, d, 2, dtype=F64) / d))
    ang = torch.outer(torch.arange(T, dtype=F64), f)
    emb = torch.cat([ang, ang], -1)
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * emb.cos() + rotated * emb.sin()


def forward(c, sd, tok, masked, masking):
    """logits [T, V]; masked: {(layer, head)}."""
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    eps, base = c["rms_norm_eps"], c.get("rope_theta", 10000.0)
    T = len(tok)
    x = sd["model.embed_tokens.weight"][torch.tensor(tok)]
    causal = torch.arange(T).unsqueeze(0) <= torch.arange(T).unsqueeze(1)
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms_norm(x, sd[p + "input_layernorm.weight"], eps)
        q = (h @ sd[p + "self_attn.q_proj.weight"].t()).view(T, H, d).transpose(0, 1)
        k = (h @ sd[p + "self_attn.k_proj.weight"].t()).view(T, K, d).transpose(0, 1)
        v = (h @ sd[p + "self_attn.v_proj.weight"].t()).view(T, K, d).transpose(0, 1)
        q, k = rope(q, base), rope(k, base)
        if masking == "zero-query":  # HeadKV modeling_llama.py lines 554-557
            for (ml, mh) in masked:
                if ml == l:
                    q[mh] = 0
        k, v = k.repeat_interleave(H // K, 0), v.repeat_interleave(H // K, 0)  # repeat_kv
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        s = s.masked_fill(~causal, float("-inf"))  # the causal mask, kept
        z = torch.softmax(s, -1) @ v  # [H, T, d]
        if masking == "zero":
            for (ml, mh) in masked:
                if ml == l:
                    z[mh] = 0
        x = x + z.transpose(0, 1).reshape(T, H * d) @ sd[p + "self_attn.o_proj.weight"].t()
        h = rms_norm(x, sd[p + "post_attention_layernorm.weight"], eps)
        g = h @ sd[p + "mlp.gate_proj.weight"].t()
        x = x + ((g * torch.sigmoid(g)) * (h @ sd[p + "mlp.up_proj.weight"].t())) @ sd[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, sd["model.norm.weight"], eps)
    return x @ sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).t()


def nll(logits, tok, last_only):
    lp = torch.log_softmax(logits, -1)
    pos = range(len(tok) - 2, len(tok) - 1) if last_only else range(len(tok) - 1)
    return -sum(lp[p, tok[p + 1]].item() for p in pos) / len(pos)


def parse_heads(text):
    out = []
    for name in text.split(","):
        l, h = name[1:].split("H")
        out.append((int(l), int(h)))
    return out


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    model, corpus, result = sys.argv[1:]
    c = json.load(open(model + "/config.json"))
    if c["architectures"][0] != "LlamaForCausalLM":
        raise SystemExit(f"{model}: {c['architectures'][0]}: this check follows modeling_llama.py only")
    sd = read_safetensors(model + "/model.safetensors")
    samples = [json.loads(line)["tokens"] for line in open(corpus) if line.strip()]
    g = h5py.File(result)["influence"]
    a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
    heads0 = a["heads"][0]
    heads0 = heads0.decode() if isinstance(heads0, bytes) else heads0
    masked, masking, last_only = parse_heads(heads0), a["masking"], a["loss_tokens"] == "last"
    if int(a["max_tokens"]) < max(len(s) for s in samples):
        raise SystemExit(f"{result}: samples were cut to {a['max_tokens']} tokens; this check needs them whole")
    loss, mloss, score = [], [], []
    for tok in samples:
        base = nll(forward(c, sd, tok, [], masking), tok, last_only)
        m = nll(forward(c, sd, tok, masked, masking), tok, last_only)
        loss.append(base), mloss.append(m), score.append((m - base) / base)
    f_loss, f_m, f_s = g["loss"][()], g["masked_loss"][()][0], g["score"][()][0]
    d_loss = max(max(abs(x - y) for x, y in zip(loss, f_loss)), max(abs(x - y) for x, y in zip(mloss, f_m)))
    bad_score = [i for i in range(len(samples)) if abs(f_s[i] - score[i]) > 1e-5 * (2 + abs(score[i])) / loss[i]]
    # The selection from this check's own scores.
    order = sorted(range(len(samples)), key=lambda i: (-score[i], i))
    frac, by = float(a["select_fraction"]), a["select_by"]
    want, taken = set(), 0
    total = sum(len(s) for s in samples)
    for k, i in enumerate(order):
        if by == "samples" and k >= math.ceil(frac * len(samples) - 1e-9):
            break
        if by == "tokens" and taken >= frac * total - 1e-9 * max(1, total):
            break
        want.add(i)
        taken += len(samples[i])
    got = set(int(i) for i in np.nonzero(g["selected"][()])[0])
    print(f"influence_check: {len(samples)} samples, heads {heads0}, masking {masking}, loss_tokens {a['loss_tokens']}: "
          f"largest loss difference {d_loss:.2e}; scores outside the bound: {len(bad_score)}; "
          f"selected {len(got)} (by {by} {frac}: {taken} of {total} tokens here), same set: {got == want}")
    ok = d_loss <= 1e-5 and not bad_score and got == want
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
