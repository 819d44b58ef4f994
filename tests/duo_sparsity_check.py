#!/usr/bin/env python3
"""DuoAttention's deployment selection, transcribed from mit-han-lab/duo-attention@fe93c31
duo_attn/utils.py l. 353-373 (sparsify_attention_heads) and l. 332 (load_attn_pattern's np.clip),
run with numpy on the cases of tests/test_duo_sparsity.cpp; prints the expected thresholds (hex) and
masks that the C++ test holds. The reference's noise, np.random.uniform(0, 1e-6, shape), is replaced by
the case's fixed noise so that the selection is reproducible (the reference draws it unseeded).

Usage: /usr/bin/python3 tests/duo_sparsity_check.py   (numpy 1.24: np.quantile's default "linear")
"""
import math
import numpy as np


def sparsify_attention_heads(full_attention_heads, threshold=None, sparsity=None, noise=None):
    # l. 354-355, the noise fixed
    full_attention_heads += noise
    if sparsity is not None:  # l. 357-360
        threshold = np.quantile(full_attention_heads, sparsity)
    else:
        assert threshold is not None, "Either threshold or sparsity must be provided"
    if sparsity >= 1:  # l. 364-369
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    full_attention_heads = (full_attention_heads >= threshold).astype(float)  # l. 371-372
    sparsity = 1 - np.mean(full_attention_heads)
    return full_attention_heads, sparsity, threshold


def case_a():
    g = np.array([[1, 1, 0.3, 0.3], [0, 0, 0.7, 0.1]], dtype=float)
    n = np.array([[3e-7, 1e-7, 5e-7, 2e-7], [9e-7, 4e-7, 6e-7, 8e-7]])
    return g, n, [0, 0.1, 0.25, 0.3, 0.5, 0.75, 0.9, 1]


def case_b():
    i = np.arange(28 * 8)
    g = np.round(np.abs(np.sin(i * 0.37)), 2)
    g[::17] = 1.0
    g[5::23] = 0.0
    g[3] = 1.25   # clipped to 1 (load_attn_pattern)
    g[4] = -0.5   # clipped to 0
    n = ((i * 7919) % 1000) * 1e-9
    return g.reshape(28, 8), n.reshape(28, 8), [0.1, 0.5, 0.75, 1 / 3, 0.9, 0.05]


def main():
    for name, (g, n, sps) in (("A", case_a()), ("B", case_b())):
        for s in sps:
            full, sp, thr = sparsify_attention_heads(np.clip(g.copy(), 0, 1), None, s, n)
            mask = "".join(str(int(x)) for x in full.ravel())
            print(f"{name} sparsity {float(s).hex()} threshold {float(thr).hex()} returned_sparsity {float(sp).hex()} mask {mask}")


if __name__ == "__main__":
    main()
