#!/usr/bin/env python3
"""DuoAttention's deployment selection, transcribed from mit-han-lab/duo-attention@fe93c31
duo_attn/utils.py l. 353-373 (sparsify_attention_heads) and l. 332 (load_attn_pattern's np.clip),
run with numpy on the cases of tests/test_duo_sparsity.cpp; prints the expected thresholds (hex) and
masks that the C++ test holds. The reference's noise, np.random.uniform(0, 1e-6, shape), is replaced by
the case's fixed noise so that the selection is reproducible (the reference draws it unseeded).

Usage: /usr/bin/python3 tests/duo_sparsity_check.py   (numpy 1.24: np.quantile's default "linear")

With --file OUT.h5 --study NAME it checks a `headscope run` duo-gates study's deployment instead: the
fitted gates /ablation/NAME/duo/alpha_kv [L, K] through the same lines at the file's deploy_sparsity,
with the tie noise headscope draws (std::mt19937_64(deploy_noise_seed), each draw (u >> 11) 2^-53 1e-6,
over the gates row-major; the generator transcribed below and checked against the C++ standard's
10000th value), or alpha_kv < deploy_threshold for select threshold; the study's `duo` configuration
must stream exactly the query heads of the KV heads not kept full, and the attributes deploy_quantile
(bit for bit) and deploy_streamed must be the threshold and the returned sparsity. Exit 0 when they
agree, 1 otherwise, 2 when the file cannot be read.
"""
import argparse
import math
import sys
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


class MT19937_64:
    """std::mt19937_64 (the C++ standard's mersenne_twister_engine parameters)."""
    M = (1 << 64) - 1

    def __init__(self, seed):
        self.mt = [seed & self.M]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & self.M)
        self.i = 312

    def __call__(self):
        if self.i >= 312:
            for k in range(312):
                x = (self.mt[k] & 0xFFFFFFFF80000000) | (self.mt[(k + 1) % 312] & 0x7FFFFFFF)
                xa = x >> 1
                if x & 1:
                    xa ^= 0xB5026F5AA96619E9
                self.mt[k] = self.mt[(k + 156) % 312] ^ xa
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.M


def tie_noise(n, seed):
    g = MT19937_64(seed)
    return np.array([(g() >> 11) * 2.0 ** -53 * 1e-6 for _ in range(n)])


def check_file(path, study):
    import h5py
    g = MT19937_64(5489)  # [rand.predef]: the 10000th invocation of a default-constructed mt19937_64
    for _ in range(9999):
        g()
    assert g() == 9981545732273789042, "the MT19937-64 transcription is wrong"
    try:
        f = h5py.File(path, "r")
        duo = f[f"ablation/{study}/duo"]
        alpha_kv = duo["alpha_kv"][()].astype(np.float64)
        at = dict(duo.attrs)
        kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in f[f"ablation/{study}/kind"][()]]
        masks = f[f"ablation/{study}/masks"][()]
    except (OSError, KeyError) as e:
        print(f"{path}: {e}")
        return 2
    L, K = alpha_kv.shape
    H = masks.shape[2]
    sel = at["deploy_select"]
    sel = sel.decode() if isinstance(sel, bytes) else str(sel)
    bad = []
    if sel == "sparsity":
        sp = float(at["deploy_sparsity"])
        noise = tie_noise(L * K, int(at["deploy_noise_seed"])).reshape(L, K)
        full, returned, thr = sparsify_attention_heads(np.clip(alpha_kv.copy(), 0, 1), None, sp, noise)
        if float(thr).hex() != float(at["deploy_quantile"]).hex():
            bad.append(f"quantile {float(thr).hex()} != the file's {float(at['deploy_quantile']).hex()}")
    else:
        full = (alpha_kv >= float(at["deploy_threshold"])).astype(float)
        returned = 1 - np.mean(full)
    if abs(float(returned) - float(at["deploy_streamed"])) > 1e-12:
        bad.append(f"streamed share {returned} != the file's {at['deploy_streamed']}")
    want = np.repeat((full == 0).astype(np.uint8), H // K, axis=1)
    got = masks[kinds.index("duo")].astype(np.uint8)
    if not np.array_equal(want, got):
        bad.append(f"duo's streamed heads\n{got}\n!= the reference's\n{want}")
    print(f"{path} /ablation/{study}: select {sel}, {int((full == 0).sum())} of {L * K} KV heads streamed, "
          f"{'agrees' if not bad else 'DIFFERS: ' + '; '.join(bad)}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file")
    ap.add_argument("--study", default="duo")
    a = ap.parse_args()
    if a.file:
        sys.exit(check_file(a.file, a.study))
    for name, (g, n, sps) in (("A", case_a()), ("B", case_b())):
        for s in sps:
            full, sp, thr = sparsify_attention_heads(np.clip(g.copy(), 0, 1), None, s, n)
            mask = "".join(str(int(x)) for x in full.ravel())
            print(f"{name} sparsity {float(s).hex()} threshold {float(thr).hex()} returned_sparsity {float(sp).hex()} mask {mask}")


if __name__ == "__main__":
    main()
