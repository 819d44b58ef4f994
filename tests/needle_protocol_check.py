#!/usr/bin/env python3
"""Compares scripts/needle_reference.py's JSONL with headscope's HDF5 result of the same grid.

Usage: needle_protocol_check.py REFERENCE.jsonl HEADSCOPE.h5 [--tol 1e-5] [--rtol 0] [--max-lines 40]
       needle_protocol_check.py REFERENCE.jsonl OUT.h5 --emulate   (writes the JSONL in headscope's file
           layout, for testing this check itself: tests/cli_protocol.sh perturbs it and expects a failure)

Trials are matched by (length, depth, needle). Exact: prompt ids, needle span, answer span,
generated tokens, passed, the number of answer steps, the ablated pass's tokens. Within --tol
(absolute) + --rtol x |reference value|: rouge1_recall, rougeL_f, retrieval [L, H], lplus/lminus/locos [L, H] (null in the JSONL
= NaN in the file), and with headscope's --dump-steps the per-step credit/lplus/lminus [steps, L, H].
Prints each trial's differences and, per quantity, the largest difference seen; exit 0 when
everything agrees, 1 with the per-trial differences otherwise, 2 when a file cannot be read.

headscope's file (docs/hdf5-schema.md; the names below in one place, NAMES):
  /retrieval (attribute protocol), /retrieval/trials/{prompt_tokens [N, T] -1 padded, needle_span,
  answer_span [N, 2], length, depth, needle [N], generated [N, S] -1 padded, response, rouge1_recall,
  rougeL_f, passed [N], answer_steps [N] (a count) or [N, S] (-1 padded step indices),
  retrieval, locos, lplus, lminus [N, L, H]}, /retrieval/steps/{credit, lplus, lminus} [N, S, L, H]
  (NaN past each trial's end), /retrieval/ablation/generated [Sets, N, S] (set 0 compared),
  /retrieval/ablation/query_mean [L, H, d] (mean-query: compared with the calibration mean).
"""
import argparse
import json
import math
import sys

import numpy as np

NAMES = {
    "group": "/retrieval",
    "trials": "/retrieval/trials",
    "steps": "/retrieval/steps",
    "ablation": "/retrieval/ablation",
    "prompt": "prompt_tokens",
    "needle_span": "needle_span",
    "answer_span": "answer_span",
    "length": "length",
    "depth": "depth",
    "needle": "needle",
    "generated": "generated",
    "response": "response",
    "rouge1_recall": "rouge1_recall",
    "rougeL_f": "rougeL_f",
    "passed": "passed",
    "answer_steps": "answer_steps",
    "matrices": ["retrieval", "lplus", "lminus", "locos"],
    "step_matrices": {"credit": "credit", "lplus": "lplus", "lminus": "lminus"},
    "ablated_generated": "generated",
    "baseline_generated": "baseline_generated",
    "query_mean": "query_mean",
}


def unpad(row):
    row = [int(x) for x in row]
    while row and row[-1] == -1:
        row.pop()
    return row


def as_str(x):
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    return str(x)


class Report:
    def __init__(self, tol, max_lines, rtol=0.0):
        self.tol, self.max_lines, self.rtol = tol, max_lines, rtol
        self.maxdiff = {}
        self.lines = {}
        self.n_bad = 0
        self.general = []

    def num(self, key, qty, ref, got):
        """Compares arrays (None / NaN = absent). Records the largest difference."""
        r = None if ref is None else np.asarray(ref, dtype=np.float64)
        g = None if got is None else np.asarray(got, dtype=np.float64)
        if r is None and (g is None or np.all(np.isnan(g))):
            return
        if r is None:
            self.add(key, f"{qty}: reference null (not scored), headscope has values (max |x| {np.nanmax(np.abs(g)):.6g})")
            return
        if g is None or np.all(np.isnan(g)) and not np.all(np.isnan(r)):
            self.add(key, f"{qty}: headscope has no value (NaN), reference {self.short(r)}")
            return
        if r.shape != g.shape:
            self.add(key, f"{qty}: shape {tuple(g.shape)} in headscope, {tuple(r.shape)} in the reference")
            return
        nan_r, nan_g = np.isnan(r), np.isnan(g)
        if (nan_r != nan_g).any():
            idx = tuple(np.argwhere(nan_r != nan_g)[0])
            self.add(key, f"{qty}: NaN at {idx} on one side only (reference {r[idx]}, headscope {g[idx]})")
            return
        d = np.where(nan_r, 0.0, np.abs(r - g))
        m = float(d.max()) if d.size else 0.0
        self.maxdiff[qty] = max(self.maxdiff.get(qty, 0.0), m)
        excess = d - (self.tol + self.rtol * np.where(nan_r, 0.0, np.abs(r)))
        if d.size and excess.max() > 0:
            idx = tuple(int(i) for i in np.unravel_index(int(excess.argmax()), d.shape)) if d.ndim else ()
            m = float(d[idx])
            self.add(key, f"{qty}: max |diff| {m:.3g} at {idx}: reference {r[idx]:.9g}, headscope {g[idx]:.9g}")

    @staticmethod
    def short(a):
        a = np.asarray(a)
        return f"{a.shape} max |x| {np.nanmax(np.abs(a)):.6g}" if a.size else "[]"

    def exact(self, key, qty, ref, got, explain=None):
        if ref != got:
            msg = f"{qty}: reference {self.clip(ref)}, headscope {self.clip(got)}"
            if isinstance(ref, list) and isinstance(got, list):
                i = next((i for i, (x, y) in enumerate(zip(ref, got)) if x != y), min(len(ref), len(got)))
                msg += f" (first difference at index {i}; lengths {len(ref)} vs {len(got)})"
            if explain:
                msg += f"; {explain}"
            self.add(key, msg)
            return False
        return True

    @staticmethod
    def clip(v):
        s = json.dumps(v)
        return s if len(s) <= 160 else s[:150] + "...]"

    def add(self, key, msg):
        self.lines.setdefault(key, []).append(msg)

    def print(self):
        bad = 0
        for msg in self.general:
            print(f"FAIL {msg}")
        for key in sorted(self.lines, key=lambda k: (k[0], k[1], k[2])):
            bad += 1
            print(f"trial (length {key[0]}, depth {key[1]:g}, needle {key[2]}):")
            for i, m in enumerate(self.lines[key]):
                if i >= self.max_lines:
                    print(f"  ... {len(self.lines[key]) - i} more")
                    break
                print(f"  {m}")
        print("largest differences: " + (", ".join(f"{k} {v:.3g}" for k, v in sorted(self.maxdiff.items())) or "none compared"))
        return bad


def emulate(recs, out):
    """Writes the reference JSONL as headscope's file contract (NAMES), so that the check can be tested."""
    import h5py
    meta = next((r["meta"] for r in recs if "meta" in r), {})
    tr = [r for r in recs if "length" in r]
    cal = next((r for r in recs if "calibration_mean" in r), None)
    N, L, H = len(tr), meta["n_layers"], meta["n_heads"]

    def pad(rows, width=None):
        w = max([len(x) for x in rows] + [1]) if width is None else width
        a = np.full((len(rows), w), -1, dtype=np.int64)
        for i, x in enumerate(rows):
            a[i, :len(x)] = x
        return a

    def m(x):
        return np.full((L, H), np.nan) if x is None else np.asarray(x, dtype=np.float64)

    with h5py.File(out, "w") as f:
        g = f.create_group(NAMES["group"])
        g.attrs["protocol"] = meta.get("protocol", "")
        t = f.create_group(NAMES["trials"])
        t[NAMES["prompt"]] = pad([r["prompt"] for r in tr])
        t[NAMES["needle_span"]] = np.array([r["needle_span"] for r in tr], dtype=np.int64)
        t[NAMES["answer_span"]] = np.array([r["answer_span"] for r in tr], dtype=np.int64)
        t[NAMES["length"]] = np.array([r["length"] for r in tr], dtype=np.int64)
        t[NAMES["depth"]] = np.array([r["depth"] for r in tr], dtype=np.float32)
        t[NAMES["needle"]] = np.array([r["needle"] for r in tr], dtype=np.int64)
        S = max([len(r["generated"]) for r in tr] + [1])
        t[NAMES["generated"]] = pad([r["generated"] for r in tr], S)
        t[NAMES["response"]] = np.array([r["response"].encode() for r in tr], dtype=h5py.string_dtype())
        t[NAMES["rouge1_recall"]] = np.array([r["rouge1_recall"] for r in tr], dtype=np.float32)
        t[NAMES["rougeL_f"]] = np.array([r["rougeL_f"] for r in tr], dtype=np.float32)
        t[NAMES["passed"]] = np.array([int(r["passed"]) for r in tr], dtype=np.int32)
        t[NAMES["answer_steps"]] = np.array([len(r["answer_steps"]) for r in tr], dtype=np.int64)
        for q in NAMES["matrices"]:
            t[q] = np.stack([m(r[q]) for r in tr]).astype(np.float32)
        st = f.create_group(NAMES["steps"])
        for q, name in NAMES["step_matrices"].items():
            a = np.full((N, S, L, H), np.nan, dtype=np.float32)
            for i, r in enumerate(tr):
                for j, s in enumerate(r["steps"]):
                    a[i, j] = m(s[q])
            st[name] = a
        if any("ablated_generated" in r for r in tr):
            ab = f.create_group(NAMES["ablation"])
            rows = [r.get("ablated_generated", []) for r in tr]
            ab[NAMES["ablated_generated"]] = pad(rows)[None]
            if any("eval_generated" in r for r in tr):
                ab[NAMES["baseline_generated"]] = pad([r.get("eval_generated", []) for r in tr])
            if cal is not None:
                ab[NAMES["query_mean"]] = np.asarray(cal["calibration_mean"], dtype=np.float32)


def main():
    ap = argparse.ArgumentParser(description="Compare needle_reference.py's JSONL with headscope's HDF5.")
    ap.add_argument("reference")
    ap.add_argument("h5")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--rtol", type=float, default=0.0,
                    help="also allow rtol x |reference| (default 0: --tol absolute only)")
    ap.add_argument("--max-lines", type=int, default=40)
    ap.add_argument("--emulate", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        import h5py
    except ImportError:
        print("needle_protocol_check: no h5py in this Python", file=sys.stderr)
        return 2
    try:
        recs = [json.loads(l) for l in open(a.reference) if l.strip()]
        if a.emulate:
            emulate(recs, a.h5)
            return 0
        f = h5py.File(a.h5, "r")
    except (OSError, ValueError) as e:
        print(f"needle_protocol_check: {e}", file=sys.stderr)
        return 2
    meta = next((r["meta"] for r in recs if "meta" in r), {})
    ref_trials = [r for r in recs if "length" in r]
    cal = next((r for r in recs if "calibration_mean" in r), None)
    rep = Report(a.tol, a.max_lines, a.rtol)

    if NAMES["trials"] not in f:
        print(f"FAIL {a.h5}: no {NAMES['trials']}")
        return 1
    g = f[NAMES["group"]]
    proto = as_str(g.attrs.get("protocol", "")) if "protocol" in g.attrs else None
    if proto != meta.get("protocol"):
        rep.general.append(f"/retrieval attribute protocol is {proto!r}, the reference ran {meta.get('protocol')!r}")
    T = f[NAMES["trials"]]

    def ds(name, group=T):
        return group[name][()] if name in group else None

    lengths, depths, needles = ds(NAMES["length"]), ds(NAMES["depth"]), ds(NAMES["needle"])
    if lengths is None or depths is None or needles is None:
        print("FAIL the file has no trial keys (length, depth, needle)")
        return 1
    index = {}
    for i, (l, d, n) in enumerate(zip(lengths, depths, needles)):
        index[(int(l), round(float(d), 3), int(n))] = i
    missing = []
    for name in ("prompt", "needle_span", "answer_span", "generated", "rouge1_recall", "passed"):
        if NAMES[name] not in T:
            missing.append(f"{NAMES['trials']}/{NAMES[name]}")
    for m in NAMES["matrices"]:
        if m not in T:
            missing.append(f"{NAMES['trials']}/{m}")
    if missing:
        rep.general.append("missing datasets: " + ", ".join(missing))

    cache = {}

    def col(name, group=T):
        if (group.name, name) not in cache:
            cache[(group.name, name)] = ds(name, group)
        return cache[(group.name, name)]

    S = f[NAMES["steps"]] if NAMES["steps"] in f else None
    A = f[NAMES["ablation"]] if NAMES["ablation"] in f else None
    if S is None:
        rep.general.append(f"no {NAMES['steps']} (run headscope with --dump-steps): per-step scores not compared")
    base_set = None
    if A is not None and "masks" in A and NAMES["ablated_generated"] in A:
        masks = A["masks"][()]
        if masks.shape[0] > 1 and not masks[-1].any():
            base_set = masks.shape[0] - 1
    seen = set()
    missing_steps = set()
    wu = meta.get("protocol") == "wu"
    stop_ids = set(meta.get("stop_ids", []))
    for r in ref_trials:
        key = (int(r["length"]), round(float(r["depth"]), 3), int(r["needle"]))
        if key not in index:
            rep.add(key, "trial missing from the headscope file")
            continue
        i = index[key]
        seen.add(i)
        v = col(NAMES["prompt"])
        if v is not None:
            rep.exact(key, "prompt ids", r["prompt"], unpad(v[i]))
        for sp in ("needle_span", "answer_span"):
            v = col(NAMES[sp])
            if v is not None:
                rep.exact(key, sp, list(r[sp]), [int(x) for x in v[i]])
        v = col(NAMES["generated"])
        gen_ok = True
        if v is not None:
            got = unpad(v[i])
            explain = None
            if wu and r["generated"] and r["generated"][-1] in stop_ids and got == r["generated"][:-1]:
                explain = ("headscope leaves out the newline stop token, which Wu et al. append and score "
                           "before stopping (retrieval_head_detection.py:244-246)")
            gen_ok = rep.exact(key, "generated", r["generated"], got, explain)
        v = col(NAMES["response"])
        if v is not None:
            rep.exact(key, "response", r["response"], as_str(v[i]))
        for q in ("rouge1_recall", "rougeL_f"):
            v = col(NAMES[q])
            if v is not None:
                rep.num(key, q, r[q], v[i])
        v = col(NAMES["passed"])
        if v is not None:
            rep.exact(key, "passed", bool(r["passed"]), bool(v[i]))
        v = col(NAMES["answer_steps"])
        if v is not None:
            if v.ndim == 1:
                rep.exact(key, "answer steps (count)", len(r["answer_steps"]), int(v[i]))
            else:
                rep.exact(key, "answer steps", r["answer_steps"], unpad(v[i]))
        for m in NAMES["matrices"]:
            v = col(m)
            if v is not None:
                rep.num(key, m, r[m], v[i])
        if S is not None:
            n = len(r["steps"])
            for q, name in NAMES["step_matrices"].items():
                if name not in S:
                    missing_steps.add(name)
                    continue
                got = col(name, S)[i]
                n_file = int((~np.all(np.isnan(got.reshape(got.shape[0], -1)), axis=1)).sum())
                ref = np.array([np.full(got.shape[1:], np.nan) if s[q] is None else np.asarray(s[q], dtype=np.float64)
                                for s in r["steps"]]).reshape((n,) + got.shape[1:])
                m_ = min(n, got.shape[0])
                if gen_ok and n_file > n:
                    rep.add(key, f"steps/{name}: values past the trial's {n} steps (expected NaN)")
                if gen_ok and got.shape[0] < n:
                    rep.add(key, f"steps/{name}: {got.shape[0]} steps in the file, {n} in the reference")
                # After a generated-token difference only the steps before it are comparable.
                if not gen_ok:
                    gf = unpad(col(NAMES["generated"])[i]) if col(NAMES["generated"]) is not None else []
                    m_ = min(m_, next((j for j, (x, y) in enumerate(zip(r["generated"], gf)) if x != y),
                                      min(len(r["generated"]), len(gf))))
                rep.num(key, f"steps/{name}", ref[:m_], got[:m_])
        if "ablated_generated" in r:
            if A is None or NAMES["ablated_generated"] not in A:
                rep.add(key, f"ablation: no {NAMES['ablation']}/{NAMES['ablated_generated']} in the file")
            else:
                arr = col(NAMES["ablated_generated"], A)
                got = unpad(arr[0, i] if arr.ndim == 3 else arr[i])
                rep.exact(key, "ablated generated (set 0)", r["ablated_generated"], got)
        if "eval_generated" in r and A is not None:
            # LOCOS's ablation baseline decodes NA's prompts: a dataset of its own, or the last
            # ablation set when that set ablates no head.
            if NAMES["baseline_generated"] in A:
                rep.exact(key, "ablation baseline generated", r["eval_generated"],
                          unpad(col(NAMES["baseline_generated"], A)[i]))
            elif base_set is not None:
                rep.exact(key, f"ablation baseline generated (set {base_set}, no head ablated)", r["eval_generated"],
                          unpad(col(NAMES["ablated_generated"], A)[base_set, i]))
    for name in sorted(missing_steps):
        rep.general.append(f"no {NAMES['steps']}/{name}")
    extra = [i for i in range(len(lengths)) if i not in seen]
    if extra:
        rep.general.append(f"{len(extra)} trials in the file are not in the reference grid, e.g. "
                           f"(length {int(lengths[extra[0]])}, depth {float(depths[extra[0]]):g}, needle {int(needles[extra[0]])})")
    if cal is not None:
        if A is None or NAMES["query_mean"] not in A:
            rep.general.append(f"mean-query: no {NAMES['ablation']}/{NAMES['query_mean']} to compare with the calibration mean")
        else:
            q = A[NAMES["query_mean"]][()]
            ref = np.asarray(cal["calibration_mean"])
            if q.shape != ref.shape:
                rep.general.append(f"query_mean: shape {q.shape}, calibration mean {ref.shape}")
            else:
                d = float(np.max(np.abs(q - ref)))
                rep.maxdiff["calibration_mean"] = d
                if d > a.tol:
                    idx = np.unravel_index(int(np.argmax(np.abs(q - ref))), q.shape)
                    rep.general.append(f"query_mean: max |diff| {d:.3g} at {tuple(int(x) for x in idx)} "
                                       f"(reference {ref[idx]:.6g}, headscope {q[idx]:.6g}; "
                                       f"calibration order {cal['calibration_order']})")
    bad = rep.print()
    n = len(ref_trials)
    if bad or rep.general:
        print(f"needle_protocol_check: {bad} of {n} trials differ" + (f", {len(rep.general)} file-level problems" if rep.general else ""))
        return 1
    print(f"needle_protocol_check: all {n} trials equal ({meta.get('protocol')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
