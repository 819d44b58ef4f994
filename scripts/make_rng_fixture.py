#!/usr/bin/env python3
"""Writes tests/data/reference_rng.json: draws of numpy's legacy RandomState and of CPython's
random.Random, which tests/test_reference_rng.cpp requires src/reference_rng.{h,cpp} to reproduce
draw for draw, and LOCOS's bootstrap interval (logit_contrib.py: RandomState(seed).randint,
float32 means, np.percentile 2.5 / 97.5, astype(float32)) on a fixed sample, which
probes/needle's numpy-compatible bootstrap must reproduce to the last float32 digit.

    /usr/bin/python3 scripts/make_rng_fixture.py > tests/data/reference_rng.json

Needs numpy (Debian's python3-numpy or any virtual environment that has it).
"""
import json
import random
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("make_rng_fixture.py: needs numpy (apt-get install python3-numpy, or run it with a Python that has it)")

out = {"numpy_version": np.__version__, "python_version": sys.version.split()[0]}

# RandomState(seed).randint(0, n, size=m): the ranges LOCOS's bootstrap draws (n = passing trials).
out["randint"] = []
for seed, n, m in [(42, 10, 10), (42, 37, 37), (0, 1000, 25), (7, 2, 40), (42, 1, 5), (123, 65536, 8), (5, 3, 100)]:
    rs = np.random.RandomState(seed)
    draws = [rs.randint(0, n, size=m).tolist() for _ in range(3)]  # three calls: the stream continues
    out["randint"].append({"seed": seed, "n": n, "size": m, "draws": draws})

# random.Random(seed): getrandbits, shuffle (nolima_ablation.py calibrate_mean_activations) and
# sample (nolima_ablation.py select_random_heads: rng.sample(all_heads, k)).
out["python"] = []
for seed in [42, 0, 1, 2**32 + 5, 123456789]:
    r = random.Random(seed)
    bits = [r.getrandbits(k) for k in (1, 5, 17, 32, 31, 8)]
    r = random.Random(seed)
    x = list(range(50))
    r.shuffle(x)
    r = random.Random(seed)
    s_small = r.sample(range(20), 7)
    s_big = r.sample(range(1024), 12)
    s_tiny = r.sample(range(300), 3)
    out["python"].append({"seed": seed, "getrandbits": bits, "shuffle50": x, "sample20_7": s_small,
                          "sample1024_12_then_300_3": [s_big, s_tiny]})

# LOCOS's bootstrap (logit_contrib.py lines 1387-1396) on a fixed float32 sample [N, 3, 4].
rng = np.random.RandomState(2024)
S = rng.standard_normal((23, 3, 4)).astype(np.float32)
boot = np.random.RandomState(42)
means = np.empty((1000, 3, 4), dtype=np.float32)
for b in range(1000):
    idx = boot.randint(0, len(S), size=len(S))
    means[b] = S[idx].mean(axis=0)
low = np.percentile(means, 2.5, axis=0).astype(np.float32)
high = np.percentile(means, 97.5, axis=0).astype(np.float32)
out["bootstrap"] = {"seed": 42, "resamples": 1000, "samples": S.tolist(),
                    "low": [float(v) for v in low.ravel()], "high": [float(v) for v in high.ravel()],
                    "low_hex": [v.tobytes().hex() for v in low.ravel()],
                    "high_hex": [v.tobytes().hex() for v in high.ravel()]}
json.dump(out, sys.stdout, indent=None)
sys.stdout.write("\n")
