#!/usr/bin/env python3
"""Ada-KV's and CriticalAdaKV's selection as NVIDIA/kvpress runs it, step by step, on random tensors: the
independent check of headscope's adakv and critical-adakv policies (probes/needle/kv/kv_adakv.h).

Usage: adakv_reference.py generate OUT.json [--seed 7]   random cases and the reference's kept positions
       adakv_reference.py check FIXTURE.json             recomputes every case of FIXTURE from its inputs
                                                          and compares; exit 0 when all agree, 1 otherwise

tests/fixtures/adakv/reference.json is this script's `generate` output; tests/test_kv_policy.cpp runs
headscope's selection on each case's inputs and requires the same kept positions (exactly) and the same
scores and value norms (1e-6 / 1e-5 relative); tests/cli_kv_compare.sh runs `check` on the fixture, so
the fixture is what this code computes. Followed (not imported: kvpress needs transformers and a model)
from kvpress@8bb29b9 (NVIDIA/kvpress):
  kvpress/presses/snapkv_press.py    l. 95-103   SnapKVPress.score's tail: the window mean (done by the
                                                 caller: `pooled` is headscope's max-pooled window mean per
                                                 query head), the group mean, the window padded at max + 1
  kvpress/presses/adakv_press.py     l. 59-77    AdaKVPress.compress
  kvpress/presses/criticalkv_press.py l. 57-76   CriticalKVPress.vwl1norm; l. 145-193 CriticalAdaKVPress.compress
A case is kept only when torch.topk's order among tied scores (the window's max + 1, the safeguard's
finfo.max) cannot change the kept set (tie_free below), since the reference leaves that order open.
"""
import argparse
import json
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F


def snapkv_tail(pooled, num_key_value_heads, window_size):
    """snapkv_press.py l. 98-103 on [1, H, n] window-mean scores (already pooled)."""
    bsz, num_heads, n = pooled.shape
    num_key_value_groups = num_heads // num_key_value_heads
    scores = pooled.view(bsz, num_key_value_heads, num_key_value_groups, n)  # l. 99
    scores = scores.mean(2)  # l. 100
    return F.pad(scores, (0, window_size), value=scores.max().item() + 1)  # l. 103


def vwl1norm(values, module):
    """criticalkv_press.py l. 57-76: per KV head and position, the L1 norm of v W_O^h averaged over the group."""
    bsz, num_key_value_heads, k_len, _ = values.shape
    groups = module.config.num_attention_heads // num_key_value_heads
    wo = module.o_proj.weight.transpose(0, 1)  # l. 61
    wo = wo.view(module.config.num_attention_heads, module.config.head_dim, module.config.hidden_size)  # l. 62
    v = values[:, :, None].expand(bsz, num_key_value_heads, groups, k_len, values.shape[-1])  # repeat_kv (l. 63)
    v = v.reshape(bsz, num_key_value_heads * groups, k_len, values.shape[-1])
    norms = []
    for head in range(v.size(1)):  # l. 68-71
        norms.append(torch.norm(v[:, head].matmul(wo[head].unsqueeze(0)), p=1, dim=-1))
    out = torch.stack(norms, dim=1)  # l. 74
    return out.view(bsz, num_key_value_heads, module.num_key_value_groups, k_len).mean(dim=2)  # l. 75


def kept_from_pruned(bsz, num_key_value_heads, k_len, indices):
    """The masked_key_indices of l. 74-77 (adakv) / 190-193 (critical) turned into the kept positions."""
    keep = torch.ones(bsz * num_key_value_heads * k_len, dtype=torch.bool)
    keep[indices] = False  # batch 0: the flat index is head * k_len + position
    return keep.view(num_key_value_heads, k_len)


def adakv(scores, compression_ratio, alpha_safeguard):
    """adakv_press.py l. 59-77, scores [1, K, P] (the press's score(), already computed)."""
    scores = scores.clone()
    bsz, num_key_value_heads, k_len = scores.shape  # l. 61
    n_kept = int(k_len * (1 - compression_ratio))  # l. 64
    n_safe = int(n_kept * alpha_safeguard)  # l. 65
    top_indices = torch.topk(scores, n_safe, dim=-1).indices  # l. 66
    scores.scatter_(-1, top_indices, torch.finfo(scores.dtype).max)  # l. 67
    n_pruned = num_key_value_heads * (k_len - n_kept)  # l. 70
    indices = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices.flatten()  # l. 71
    return kept_from_pruned(bsz, num_key_value_heads, k_len, indices), n_kept


def critical_adakv(scores, values, module, compression_ratio, alpha_safeguard, epsilon, first_stage_ratio):
    """criticalkv_press.py l. 145-193."""
    scores = scores.clone()
    bsz, num_key_value_heads, k_len = scores.shape  # l. 146
    n_kept = int(k_len * (1 - compression_ratio))  # l. 149
    n_safe = int(n_kept * alpha_safeguard)  # l. 150
    top_indices = torch.topk(scores, n_safe, dim=-1).indices  # l. 151
    scores.scatter_(-1, top_indices, torch.finfo(scores.dtype).max)  # l. 152
    budget_scores = scores.scatter(-1, top_indices, torch.finfo(scores.dtype).max).reshape(bsz, -1)  # l. 159-160
    top_indices = torch.topk(budget_scores, n_kept * num_key_value_heads, dim=-1).indices  # l. 161
    head_of = top_indices // k_len  # l. 162
    head_budgets = torch.zeros(num_key_value_heads, dtype=torch.int64)  # l. 163
    head_budgets.scatter_add_(0, head_of.flatten(), torch.ones_like(head_of.flatten()))  # l. 164
    first = (head_budgets * first_stage_ratio).to(torch.int64).tolist()  # l. 167
    top_k_index = torch.topk(scores, max(first), sorted=True, dim=-1).indices  # l. 168
    for h in range(num_key_value_heads):  # l. 169-171
        scores[:, h, :].scatter_(-1, top_k_index[:, h, : first[h]], torch.finfo(scores.dtype).max)
    projected_norm = vwl1norm(values, module)  # l. 174
    scores = (scores + epsilon) * projected_norm  # l. 175
    top_k_index = torch.topk(scores, int(max(head_budgets)), sorted=True, dim=-1).indices  # l. 176
    for h in range(num_key_value_heads):  # l. 177-179
        scores[:, h, :].scatter_(-1, top_k_index[:, h, : head_budgets[h]], torch.finfo(scores.dtype).max)
    n_pruned = num_key_value_heads * (k_len - n_kept)  # l. 186
    indices = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices.flatten()  # l. 187
    return kept_from_pruned(bsz, num_key_value_heads, k_len, indices), head_budgets, n_safe


def module_for(H, K, d, D, weight):
    cfg = SimpleNamespace(num_attention_heads=H, head_dim=d, hidden_size=D)
    return SimpleNamespace(config=cfg, o_proj=SimpleNamespace(weight=weight), num_key_value_groups=H // K)


def run_case(c):
    """The reference on one case's inputs: its kv scores, value norms and kept positions."""
    H, K, w, C, P = c["H"], c["K"], c["window"], c["C"], c["P"]
    pooled = torch.tensor(c["pooled"], dtype=torch.float32).view(1, H, P - w)
    values = torch.tensor(c["values"], dtype=torch.float32).view(1, K, P, c["d"])
    o_out = torch.tensor(c["o_out"], dtype=torch.float32).view(H, c["d"], c["D"])
    weight = o_out.reshape(H * c["d"], c["D"]).transpose(0, 1)  # o_proj.weight [D, H d], whose transpose l. 61-62 view
    module = module_for(H, K, c["d"], c["D"], weight)
    ratio = 1 - (C + 0.5) / P  # so that int(P (1 - ratio)) = C
    scores = snapkv_tail(pooled, K, w)
    keep_ada, n_kept = adakv(scores, ratio, c["alpha"])
    keep_crit, budgets, n_safe = critical_adakv(scores, values, module, ratio, c["alpha"], c["epsilon"], c["first_stage"])
    assert n_kept == C, (n_kept, C)
    # tie_free: every head's window (P - n positions at max + 1) is inside what stage 1 promotes, so
    # topk's order among the window's ties cannot change stage 2; C >= w keeps every window in adakv.
    first = (budgets * c["first_stage"]).to(torch.int64)
    tie_free = C >= w and bool((torch.maximum(first, torch.tensor(n_safe)) >= w).all())
    return {
        "kv_scores": scores[0].flatten().tolist(),
        "vo": vwl1norm(values, module)[0].flatten().tolist(),
        "keep_adakv": [torch.nonzero(keep_ada[k]).flatten().tolist() for k in range(K)],
        "keep_critical": [torch.nonzero(keep_crit[k]).flatten().tolist() for k in range(K)],
        "head_budgets": budgets.tolist(),
    }, tie_free


def random_case(gen, H, K, n, w, C, alpha, d=4, D=6):
    # Window-mean-like scores, each head's scale apart so that budgets move between heads.
    scale = torch.exp(1.5 * torch.randn(H, 1, generator=gen))
    pooled = (torch.rand(H, n, generator=gen) ** 3) * scale
    values = torch.randn(K, n + w, d, generator=gen) * (torch.rand(K, n + w, 1, generator=gen) + 0.2)
    o_out = torch.randn(H, d, D, generator=gen) / d**0.5
    return {"H": H, "K": K, "window": w, "P": n + w, "C": C, "alpha": alpha, "epsilon": 1e-4, "first_stage": 0.5, "d": d, "D": D,
            "pooled": pooled.flatten().tolist(), "values": values.flatten().tolist(), "o_out": o_out.flatten().tolist()}


# (H, K, prefix n, window w, C, alpha): MHA and GQA, the floor inside the window (n_safe <= w) and past
# it, alpha 0 (no floor) and 1 (every head its own C: per-head SnapKV), budgets near w and near P.
SHAPES = [(4, 4, 36, 4, 12, 0.2), (4, 4, 36, 4, 30, 0.2), (4, 2, 40, 3, 16, 0.2), (6, 3, 28, 2, 10, 0.5),
          (8, 2, 40, 6, 24, 0.2), (4, 4, 36, 4, 12, 0.0), (4, 2, 30, 2, 14, 1.0), (2, 2, 20, 2, 21, 0.2)]


def generate(path, seed):
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for H, K, n, w, C, alpha in SHAPES:
        for _ in range(2):
            for attempt in range(100):
                c = random_case(gen, H, K, n, w, C, alpha)
                ref, tie_free = run_case(c)
                if tie_free:
                    break
            else:
                raise SystemExit(f"no tie-free case for {(H, K, n, w, C, alpha)}")
            c.update(ref)
            cases.append(c)
    with open(path, "w") as f:
        json.dump({"source": "tests/adakv_reference.py generate --seed %d (kvpress@8bb29b9)" % seed, "cases": cases}, f)
    print(f"{path}: {len(cases)} cases")


def check(path):
    cases = json.load(open(path))["cases"]
    bad = 0
    for i, c in enumerate(cases):
        ref, tie_free = run_case(c)
        same = tie_free and all(ref[k] == c[k] for k in ("keep_adakv", "keep_critical", "head_budgets"))
        same = same and ref["kv_scores"] == c["kv_scores"]
        same = same and max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(ref["vo"], c["vo"])) < 1e-6
        if not same:
            bad += 1
            print(f"case {i} (H {c['H']}, K {c['K']}, C {c['C']}): the fixture is not the reference's output")
    print(f"{path}: {len(cases) - bad} of {len(cases)} cases equal the reference")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["generate", "check"])
    ap.add_argument("path")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    if a.what == "generate":
        generate(a.path, a.seed)
        return 0
    return check(a.path)


if __name__ == "__main__":
    sys.exit(main())
