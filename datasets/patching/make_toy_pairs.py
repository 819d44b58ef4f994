#!/usr/bin/env python3
"""Writes the toy induction model's clean/corrupted pairs for `headscope patch` (standard library only).

toy-induction-pairs.jsonl: clean = R + R[:-1] (10 distinct alphanumeric tokens, then all but the last
again; the answer is R[-1], found by induction). Corrupt: the first copy's R[-2] replaced by a fresh
token, so the previous-token head no longer marks R[-1]'s position as "after R[-2]": the keys of the
induction circuit break while the query (the last token) and the value (R[-1]) stay. Path patching the
previous-token head into the induction heads' keys restores it; into their queries or values it cannot.

toy-induction-fresh-half.jsonl: corrupt = R + fresh tokens (the repeated half replaced): induction has
nothing to copy. "wrong" is a fresh token in both files.

Run from the repository root: python3 datasets/patching/make_toy_pairs.py
"""
import json
import random

ALNUM = [chr(c) for c in range(ord("0"), ord("9") + 1)] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
        [chr(c) for c in range(ord("A"), ord("Z") + 1)]
N = 10


def write(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def key_corruption(seed, count=16):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        r = rng.sample(ALNUM, N)
        clean = r + r[:N - 1]
        fresh = [c for c in ALNUM if c not in r]
        corrupt = list(clean)
        corrupt[N - 2] = rng.choice(fresh)
        wrong = rng.choice([c for c in fresh if c != corrupt[N - 2]])
        out.append({"clean": "".join(clean), "corrupt": "".join(corrupt), "answer": r[N - 1], "wrong": wrong})
    return out


def fresh_half(seed, count=16):
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        r = rng.sample(ALNUM, N)
        clean = r + r[:N - 1]
        fresh = [c for c in ALNUM if c not in r]
        f = rng.sample(fresh, N - 1)
        wrong = rng.choice([c for c in fresh if c not in f])
        out.append({"clean": "".join(clean), "corrupt": "".join(r + f), "answer": r[N - 1], "wrong": wrong})
    return out


if __name__ == "__main__":
    write("datasets/patching/toy-induction-pairs.jsonl", key_corruption(7))
    write("datasets/patching/toy-induction-fresh-half.jsonl", fresh_half(8))
