#!/usr/bin/python3
"""Independent check of `headscope fv-heads` (function-vector heads, Todd et al. 2024).

Usage: tests/fv_check.py MODEL_DIR FILE.h5 [GROUP] [--tol 1e-6]

Reads the prompts headscope drew (/patching/<GROUP>/clean_tokens, corrupt_tokens, their lengths and
answers) and recomputes the average indirect effect of every head with its own Llama forward
(safetensors read by hand, rotate_half RoPE, RMSNorm, GQA, gated SiLU MLP), one prompt a forward as
the reference runs them (batch size 1), following ericwtodd/function_vectors:
  - get_mean_head_activations (src/utils/extract_utils.py l. 83-105): each head's slice of o_proj's
    input at the last token, averaged over the clean prompts;
  - replace_activation_w_avg, last_token_only (src/utils/intervention_utils.py l. 55-59, 66-75): that
    mean put at the last token of one head of o_proj's input, then o_proj;
  - activation_replacement_per_class_intervention (src/compute_indirect_effect.py l. 66-88): the
    indirect effect = softmax(patched logits)[answer] - softmax(corrupted logits)[answer] at the last
    token; compute_indirect_effect (l. 129-146) keeps one per prompt, and the AIE is their mean.
Shares no code with headscope. Prints the largest difference from the file's scores and exits 1
when it exceeds the tolerance (default 1e-6 absolute in probability: float32 forwards in two implementations).
"""
import json
import struct
import sys

import h5py
import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info["dtype"])
        a, b = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").copy()).view(*info["shape"])
    # tied weights stored under one name only (tinystories-656k keeps lm_head.weight)
    for k, v in meta.items():
        if v in out and k not in out:
            out[k] = out[v]
    return out


class Llama:
    def __init__(self, folder):
        c = json.load(open(f"{folder}/config.json"))
        w = read_safetensors(f"{folder}/model.safetensors")
        self.L, self.H = c["num_hidden_layers"], c["num_attention_heads"]
        self.K = c.get("num_key_value_heads", self.H)
        self.D = c["hidden_size"]
        self.dh = c.get("head_dim") or self.D // self.H
        self.eps, self.theta = c["rms_norm_eps"], c.get("rope_theta", 10000.0)
        emb = w.get("model.embed_tokens.weight", w.get("lm_head.weight"))
        self.emb = emb
        self.unemb = w.get("lm_head.weight", emb) if not c.get("tie_word_embeddings") else emb
        self.norm = w["model.norm.weight"]
        self.layers = []
        for l in range(self.L):
            p = f"model.layers.{l}."
            self.layers.append({k: w[p + n] for k, n in [
                ("an", "input_layernorm.weight"), ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"),
                ("v", "self_attn.v_proj.weight"), ("o", "self_attn.o_proj.weight"),
                ("mn", "post_attention_layernorm.weight"), ("g", "mlp.gate_proj.weight"), ("u", "mlp.up_proj.weight"),
                ("d", "mlp.down_proj.weight")]})

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x):  # [T, n, dh], rotate_half
        T = x.shape[0]
        inv = 1.0 / (self.theta ** (torch.arange(0, self.dh, 2, dtype=torch.float32) / self.dh))
        f = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        e = torch.cat([f, f], -1)
        c, s = e.cos()[:, None], e.sin()[:, None]
        x1, x2 = x[..., : self.dh // 2], x[..., self.dh // 2:]
        return x * c + torch.cat([-x2, x1], -1) * s

    def forward(self, ids, z_edit=None):
        """Logits at the last token; z_edit(layer, z [T, H, dh]) may return a replacement for o_proj's input."""
        x = self.emb[torch.tensor(ids)]
        T = len(ids)
        mask = torch.full((T, T), float("-inf")).triu(1)
        zs = []
        for l, p in enumerate(self.layers):
            h = self.rms(x, p["an"])
            q = self.rope((h @ p["q"].T).view(T, self.H, self.dh))
            k = self.rope((h @ p["k"].T).view(T, self.K, self.dh))
            v = (h @ p["v"].T).view(T, self.K, self.dh)
            g = self.H // self.K
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            a = (torch.einsum("qhd,khd->hqk", q, k) / self.dh ** 0.5 + mask).softmax(-1)
            z = torch.einsum("hqk,khd->qhd", a, v)
            if z_edit is not None:
                z = z_edit(l, z)
            zs.append(z)
            x = x + z.reshape(T, self.H * self.dh) @ p["o"].T
            h = self.rms(x, p["mn"])
            x = x + (torch.nn.functional.silu(h @ p["g"].T) * (h @ p["u"].T)) @ p["d"].T
        return self.rms(x, self.norm)[-1] @ self.unemb.T, zs


def main():
    args = [a for a in sys.argv[1:]]
    tol = 1e-6
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    if len(args) not in (2, 3):
        print(__doc__)
        return 2
    folder, path = args[0], args[1]
    group = args[2] if len(args) == 3 else "fv"
    torch.set_grad_enabled(False)
    m = Llama(folder)
    with h5py.File(path, "r") as f:
        g = f[f"patching/{group}"]
        clean, corrupt = g["clean_tokens"][()], g["corrupt_tokens"][()]
        cl, rl = g["clean_lengths"][()], g["corrupt_lengths"][()]
        ca, ra = g["clean_answer"][()], g["corrupt_answer"][()]
        scores = g["scores"][()]
        p_clean_file, p_corrupt_file = float(g["metric_clean"][0]), float(g["metric_corrupt"][0])
    # Mean activations over the clean prompts at the last token.
    mean = torch.zeros(m.L, m.H, m.dh, dtype=torch.float64)
    p_clean = 0.0
    for i in range(len(cl)):
        logits, zs = m.forward([int(t) for t in clean[i, : cl[i]]])
        p_clean += logits.softmax(-1)[int(ca[i])].item()
        for l in range(m.L):
            mean[l] += zs[l][-1].double()
    mean = (mean / len(cl)).float()
    p_clean /= len(cl)
    # The indirect effect of each head on each corrupted prompt.
    ie = np.zeros((len(rl), m.L, m.H))
    p_corrupt = 0.0
    for i in range(len(rl)):
        ids = [int(t) for t in corrupt[i, : rl[i]]]
        ans = int(ra[i])
        base = m.forward(ids)[0].softmax(-1)[ans].item()
        p_corrupt += base
        for l in range(m.L):
            for h in range(m.H):
                def edit(layer, z, l=l, h=h):
                    if layer != l:
                        return z
                    z = z.clone()
                    z[-1, h] = mean[l, h]
                    return z
                ie[i, l, h] = m.forward(ids, edit)[0].softmax(-1)[ans].item() - base
    p_corrupt /= len(rl)
    aie = ie.mean(0)
    diff = np.abs(aie - scores).max()
    print(f"{path}:{group}: {m.L}x{m.H} heads, {len(cl)} clean and {len(rl)} corrupted prompts")
    print(f"  p(answer) clean {p_clean:.6f} (file {p_clean_file:.6f}), corrupted {p_corrupt:.6f} (file {p_corrupt_file:.6f})")
    top = np.argsort(-aie.ravel())[:5]
    print("  top heads here:", ", ".join(f"L{j // m.H}H{j % m.H} {aie.ravel()[j]:+.6f}" for j in top))
    print(f"  largest |AIE difference| {diff:.3g} (tolerance {tol:g})")
    bad = diff > tol or abs(p_clean - p_clean_file) > tol or abs(p_corrupt - p_corrupt_file) > tol
    print("  FAIL" if bad else "  ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
