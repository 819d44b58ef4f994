#!/usr/bin/env python3
"""Writes result files holding every kind of group `headscope report` draws, with the fixed names of
docs/hdf5-schema.md and issues 10 (retrieval) and 11 (ablation). Used by tests/cli_report.sh and to
try the page without running a model.
Usage: make_report_fixture.py OUT_DIR   -> OUT_DIR/all.h5, OUT_DIR/all_b.h5 (same shapes, other values)
"""
import os
import sys

import h5py
import numpy as np

L, H = 3, 4


def write(path, seed):
    rng = np.random.default_rng(seed)
    s = lambda *shape: rng.random(shape).astype("f4")
    with h5py.File(path, "w") as f:
        m = f.create_group("meta")
        for k, v in dict(tool="headscope", tool_version="0.1.0", git_commit="test", model_path="models/fixture",
                         weights_sha256="00ff" * 16, architecture="llama2c", family="llama",
                         command_line="make_report_fixture.py", utc_time="2026-01-01T00:00:00Z").items():
            m.attrs[k] = v
        for k in ("n_layers", "n_kv_heads"):
            m.attrs[k] = np.int64(L if k == "n_layers" else H)
        m.attrs["n_heads"] = np.int64(H)
        for p in ("induction", "previous-token", "duplicate-token", "attention-sink", "induction-loss", "retrieval"):
            g = f.create_group(f"scores/{p}")
            g["score"] = s(L, H)
            g.attrs["probe"] = p
            g.attrs["convention"] = "stripe"
            g.attrs["description"] = f"fixture scores for {p}"
        f["scores/induction-loss/baseline"] = np.array([1.5], "f4")
        g = f.create_group("scores/locos")
        sc = (rng.standard_normal((L, H)) * 0.3).astype("f4")
        g["score"], g["ci_low"], g["ci_high"] = sc, sc - 0.1, sc + 0.1
        g = f.create_group("scores/dla")
        g["score"] = (rng.standard_normal((L, H))).astype("f4")
        g["mlp"] = s(2, L)
        g["logit_diff"] = s(2)
        g = f.create_group("scores/copy-suppression")
        g["score"] = s(L, H)
        for c in ("ov_median_rank", "qk_median_rank", "ov_frac_rank0"):
            g[c] = s(L, H)
        for rel in ("country_capital", "plural"):
            g = f.create_group(f"scores/maps/{rel}")
            g["score"] = s(L, H)
            g.attrs["category"] = "factual"
            g.attrs["n_pairs_kept"] = np.int64(20)
        # Ablation: single sweep, cumulative with controls, pruning.
        S = 1 + L * H
        masks = np.zeros((S, L, H), "u1")
        for i in range(L * H):
            masks[1 + i].flat[i] = 1
        a = f.create_group("ablation/single")
        a["masks"], a["metric"] = masks, (2 + s(S)).astype("f4")
        a["metric_rows"] = s(S, 5)
        a["kind"] = np.array(["baseline"] + ["single"] * (L * H), dtype=h5py.string_dtype())
        a["k"] = np.array([0] + [1] * (L * H), "i8")
        a["control_seed"] = -np.ones(S, "i8")
        a.attrs["mode"], a.attrs["metric"], a.attrs["dataset"] = "zero", "loss", "repeats"
        ks, kinds, ms, seeds, mets = [0], ["baseline"], [np.zeros((L, H), "u1")], [-1], [2.0]
        for k in (1, 2, 3):
            mk = np.zeros(L * H, "u1"); mk[:k] = 1
            ks.append(k); kinds.append("cumulative"); ms.append(mk.reshape(L, H)); seeds.append(-1); mets.append(2 + k)
            for c in range(3):
                mk = np.zeros(L * H, "u1"); mk[rng.choice(np.arange(k, L * H), k, replace=False)] = 1
                ks.append(k); kinds.append("control"); ms.append(mk.reshape(L, H)); seeds.append(c); mets.append(2 + 0.1 * k + 0.05 * c)
        a = f.create_group("ablation/cumulative")
        a["masks"], a["metric"] = np.stack(ms), np.array(mets, "f4")
        a["kind"] = np.array(kinds, dtype=h5py.string_dtype())
        a["k"], a["control_seed"] = np.array(ks, "i8"), np.array(seeds, "i8")
        a.attrs["mode"], a.attrs["metric"] = "zero", "loss"
        a = f.create_group("ablation/prune")
        pm = [np.zeros(L * H, "u1")]
        for n in (3, 6, 9):
            mk = np.zeros(L * H, "u1"); mk[:n] = 1; pm.append(mk)
        a["masks"] = np.stack(pm).reshape(-1, L, H)
        a["metric"] = np.array([2, 2.1, 2.5, 4], "f4")
        a["kind"] = np.array(["baseline", "prune", "prune", "prune"], dtype=h5py.string_dtype())
        a.attrs["mode"], a.attrs["metric"] = "zero", "loss"
        # Retrieval: trials on a 2 x 3 length x depth grid, two needles each.
        t = f.create_group("retrieval/trials")
        lengths, depths = [40, 80], [0, 50, 100]
        rows = [(l, d, n) for l in lengths for d in depths for n in (0, 1)]
        N = len(rows)
        t["length"] = np.array([r[0] for r in rows], "i8")
        t["depth"] = np.array([r[1] for r in rows], "i8")
        t["needle"] = np.array([r[2] for r in rows], "i8")
        rec = s(N)
        t["rouge1_recall"], t["passed"] = rec, (rec > 0.5).astype("i8")
        t["response"] = np.array([f"answer <{i}>" for i in range(N)], dtype=h5py.string_dtype())
        t["retrieval"], t["locos"] = s(N, L, H), s(N, L, H)
        t.attrs["max_new_tokens"] = np.int64(1)
        ab = f.create_group("retrieval/ablation")
        am = np.zeros((4, L, H), "u1"); am[0, 1, :3] = 1; am[1, 0, :3] = 1; am[2, 2, 1:] = 1; am[3, 0, 1:] = 1
        ab["masks"], ab["rouge1_recall"], ab["accuracy"] = am, s(4, N), np.array([0.1, 0.9, 0.95, 0.85], "f4")
        ab.attrs["ablation"], ab.attrs["baseline_accuracy"] = "zero-query", 0.95


os.makedirs(sys.argv[1], exist_ok=True)
write(os.path.join(sys.argv[1], "all.h5"), 1)
write(os.path.join(sys.argv[1], "all_b.h5"), 2)
