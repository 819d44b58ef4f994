#!/usr/bin/env python3
"""Recomputes the measured KV cache of `headscope retrieval --kv-compare` from the reference codes' lines.

Usage: kv_reference_check.py OUT.h5 MODEL_DIR [--tol 1e-6]

For every (policy, column) of /retrieval/kv_compare whose policy it knows (snapkv, headkv, razor, duo,
stream:*; full), it recomputes per ablation trial the prompt cache the policy holds, following the
reference lines transcribed below, and compares the mean fraction of the full cache (kv_fraction, within
--tol) and the mean bytes (kv_bytes, within 1 byte) with the file. A column is a budget b (capacities -1)
or a fixed capacity C per query head (--kv-capacity). Written apart from headscope's C++ (numpy only):

  snapkv  FasterDecoding/SnapKV snapkv/monkeypatch/snapkv_utils.py:42 (FYYFU/HeadKV snapkv_utils.py:148):
          `if q_len < self.max_capacity_prompt: return key_states, value_states` (whole); else
          l. 62: topk(max_capacity_prompt - window_size) of the q_len - window_size prefix positions
          + the window: C per query head.
  headkv  FYYFU/HeadKV@0862a09 headkv/snapkv_utils.py ReasonSnapKVCluster: l. 347 base_capacity = C - w;
          l. 381-389 the capacities (score / sum, ** temp, / sum; total_pool_capacity = (base // beta) L H;
          min_num = base - base // beta; torch.round: half to even); l. 444 `if self.base_capacity >
          attn_score.size(-1)`: whole; l. 467-469 each head keeps indices[..., :head_capacity] + the window.
  razor   mindspore-ai/golden-stick@a50ddc93 attention_wrappers.py _compress (l. 188-204), local_capacity =
          sink + recent (+ 1 with the virtual token): a compressed KV head holds len(_compress(cache)).
  duo     mit-han-lab/duo-attention: a streaming KV head holds min(F, sink + recent) (scripts/niah.sh's
          sink 64, recent 256); with the attribute duo_select = sparsity (the default) it keeps whole the
          groups duo_attn/utils.py l. 353-373 selects at sparsity 1 - b (np.quantile over the gates made
          distinct by the tie noise), whose count full_groups is checked to be.

headscope's own choices the check follows as documented (docs/methods.md, "KV-cache policies"): a whole
cache counts as the full one (fraction 1); SnapKV's and HeadKV's cache is counted per query head (after
repeat_kv) against the KV heads' full cache L K F; a budget b gives C = round(b F K / H) (half away
from zero); an order policy keeps whole the most KV groups whose mean measured fraction stays within
the column's budget (a capacity column's budget: the mean of min(1, C H / (K F))), and full_groups is
checked to be that count (duo under --duo-select sparsity: the reference's, above). The importance HeadKV reads is the file's score its score_sources attribute
names (NaN as 0).

Recomputed for `compress_at` = prompt (F = the prompt's length) and tail (F = the prompt's length less
the attribute tail_tokens: duo-attention eval/LongBench/pred.py l. 125, simulation_start_idx). Exit 0 when every known entry
agrees, 1 otherwise (the differences printed), 2 when a file cannot be read.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

try:
    import h5py
except ImportError:  # pragma: no cover
    print("kv_reference_check: needs h5py", file=sys.stderr)
    sys.exit(2)

GROUP = "/retrieval/kv_compare"


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def half_away(x):
    """std::llround for x >= 0."""
    return int(math.floor(x + 0.5))


def golden_stick_compress(cache_len, sink_size, local_capacity, use_virtual_token):
    """attention_wrappers.py _compress on the positions of the cache: the entries it returns."""
    cache = list(range(cache_len))
    if cache_len <= local_capacity:
        return cache
    if not use_virtual_token:
        drop_cache_len = cache_len - local_capacity
        left = cache[:sink_size]
        right = cache[drop_cache_len + sink_size:]
        return left + right
    drop_cache_len = cache_len - local_capacity + 1
    left = cache[:sink_size]
    middle = cache[sink_size:drop_cache_len + sink_size]
    middle = ["mean of %d" % len(middle)]  # ops.mean(middle, axis=0, keep_dims=True): one entry
    right = cache[drop_cache_len + sink_size:]
    return left + middle + right


def headkv_capacities(score, base_capacity_plus_window, window_size, beta, temp):
    """ReasonSnapKVCluster.__init__ l. 347, 381-389 (score: [L, H], NaN as 0)."""
    L, H = score.shape
    base_capacity = base_capacity_plus_window - window_size
    head_score_list = np.nan_to_num(score.astype(np.float64).reshape(-1), nan=0.0)
    head_score_list = head_score_list / sum(head_score_list)
    head_score_list = np.power(head_score_list, temp)
    head_score_list = head_score_list / np.sum(head_score_list)
    total_attention = head_score_list.reshape(L, H)
    total_pool_capacity = (base_capacity // beta) * L * H
    min_num = base_capacity - base_capacity // beta
    return np.round(total_attention * total_pool_capacity + min_num).astype(np.int64)  # half to even, as torch.round


def snapkv_entries(F, C, w, L, H):
    """Entries of one trial's cache (L H heads), or None for a cache left whole."""
    if F < C:  # q_len < max_capacity_prompt
        return None
    n = max(0, F - w)
    return L * H * (min(max(C - w, 0), n) + min(w, F))  # topk(C - w) of the prefix + the window


def headkv_entries(F, C, w, caps):
    if C - w > F - w:  # self.base_capacity > attn_score.size(-1)
        return None
    prefix = list(range(max(0, F - w)))  # the sorted indices' count
    return int(sum(len(prefix[:int(c)]) + w for c in caps.reshape(-1)))  # indices[..., :head_capacity] + window


def order_fraction(n, M, F, entries):
    return (n * F + (M - n) * entries) / (M * F)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("model")
    ap.add_argument("--tol", type=float, default=1e-6)
    a = ap.parse_args()
    try:
        with open(os.path.join(a.model, "config.json")) as fh:
            cfg = json.load(fh)
        L, H = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        K = cfg.get("num_key_value_heads", H)
        f = h5py.File(a.out, "r")
        g = f[GROUP]
        at = {k: text(v) if isinstance(v, (bytes, str)) else v for k, v in g.attrs.items()}
        trials = "/retrieval/ablation/trials" if "/retrieval/ablation/trials/prompt_tokens" in f else "/retrieval/trials"
        Fs = [int(x) for x in (f[trials + "/prompt_tokens"][()] != -1).sum(1)]
        policies = [text(p) for p in g["policies"][()]]
        budgets = [float(b) for b in g["budgets"][()]]
        capacities = [int(c) for c in g["capacities"][()]]
        kv_fraction, kv_bytes, full_groups = g["kv_fraction"][()], g["kv_bytes"][()], g["full_groups"][()]
        sources = dict(part.split(": ", 1) for part in at.get("score_sources", "").split("; ") if ": " in part)
    except (OSError, KeyError, ValueError) as e:
        print(f"kv_reference_check: {a.out}: {e}", file=sys.stderr)
        return 2
    if at.get("compress_at") == "tail":  # pred.py l. 125: simulation_start_idx = len - decoding_simulation_length
        Fs = [max(1, F - int(at["tail_tokens"])) for F in Fs]
    elif at.get("compress_at") != "prompt":
        print(f"kv_reference_check: {a.out}: compress_at is {at.get('compress_at')}; only prompt and tail are recomputed",
              file=sys.stderr)
        return 2
    w = int(at["snapkv_window"])
    M, N = L * K, len(Fs)
    per_token = float(at["full_bytes"]) / (sum(Fs) / N)  # 2 d_head elem L K
    bad = 0

    def score_of(policy):
        src = sources[policy]
        if src.startswith("this run: "):
            return f[src[len("this run: "):]][()]
        path, ds = src.rsplit(":", 1)
        return h5py.File(path, "r")[ds][()]

    for pi, pol in enumerate(policies):
        name = pol.split(":", 1)[0]
        if name not in ("full", "snapkv", "headkv", "razor", "duo", "stream"):
            print(f"{pol}: not recomputed (no reference transcribed here)")
            continue
        caps_cache = {}
        for bi, (b, C0) in enumerate(zip(budgets, capacities)):
            fr = []
            groups = None
            if name in ("razor", "duo", "stream"):
                if name == "razor":
                    comp = at["razor_compensate"] in ("true", True, 1)
                    sink, recent = int(at["razor_sink"]), int(at["razor_recent"])
                    local = sink + recent + (1 if comp else 0)
                    ent = lambda F: len(golden_stick_compress(F, sink, local, comp))
                else:
                    ent = lambda F: min(F, int(at["duo_sink"]) + int(at["duo_recent"]))
                mean = lambda n: sum(order_fraction(n, M, F, ent(F)) for F in Fs) / N
                if name == "duo" and at.get("duo_select", "budget") == "sparsity":
                    # duo-attention duo_attn/utils.py l. 353-373 at sparsity 1 - b: the gates (made distinct
                    # by the tie noise) at or above np.quantile(gates, sparsity); the count does not depend
                    # on their values
                    sp = min(1.0, max(0.0, 1.0 - float(b)))
                    vals = np.arange(M, dtype=float)
                    thr = 2 if sp >= 1 else -1 if sp <= 0 else np.quantile(vals, sp)
                    groups = int((vals >= thr).sum())
                else:
                    groups = max(n for n in range(M + 1) if mean(n) <= b + 1e-6 or n == 0)
                fr = [order_fraction(int(full_groups[pi, bi]), M, F, ent(F)) for F in Fs]
            for F in Fs:
                if name in ("razor", "duo", "stream"):
                    break
                if name == "full":
                    fr.append(1.0)
                    continue
                C = C0 if C0 > 0 else half_away(round(b, 6) * F * K / H)
                if name == "snapkv":
                    e = snapkv_entries(F, C, w, L, H)
                else:
                    if C not in caps_cache:
                        caps_cache[C] = headkv_capacities(score_of(pol), C, w, float(at["headkv_beta"]), float(at["headkv_temp"]))
                    e = headkv_entries(F, C, w, caps_cache[C])
                fr.append(1.0 if e is None else e / (L * K * F))
            ref_fraction = sum(fr) / N
            ref_bytes = sum(x * per_token * F for x, F in zip(fr, Fs)) / N
            col = f"capacity {C0}" if C0 > 0 else f"budget {b:.3f}"
            errs = []
            if abs(ref_fraction - float(kv_fraction[pi, bi])) > a.tol:
                errs.append(f"kv_fraction {float(kv_fraction[pi, bi]):.7f}, reference {ref_fraction:.7f}")
            if abs(round(ref_bytes) - int(kv_bytes[pi, bi])) > 1:
                errs.append(f"kv_bytes {int(kv_bytes[pi, bi])}, reference {ref_bytes:.1f}")
            if groups is not None and groups != int(full_groups[pi, bi]):
                errs.append(f"full_groups {int(full_groups[pi, bi])}, the reference's {groups}")
            print(f"{pol:14s} {col:14s} kv_fraction {ref_fraction:.6f} kv_bytes {ref_bytes:10.1f}  " + ("; ".join(errs) if errs else "ok"))
            bad += bool(errs)
    print(f"kv_reference_check: {bad} (policy, column) entries differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
