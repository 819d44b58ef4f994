#!/usr/bin/env python3
"""An independent check of `headscope successor` (issue 43 item 4).

Recomputes the succession score of every head of a Hugging Face Llama-family checkpoint the way the
one public reimplementation runs it (curt-tigges/circuits-over-time, test_successor_head.py at
cf55760356a641b12c39fd403582e28628ce9336; the line numbers below are that file's) and compares it
with the /scores/successor group headscope wrote. Nothing here imports headscope: the weights come
from the safetensors file read with numpy, the words are tokenised by a small BPE over tokenizer.json,
and the arithmetic is float64.

What it follows:
  lines 11-19  the tasks: numbers 1-200, number words one..twenty, cardinal words first..tenth, days
               and months each ending on their first word again (Sunday -> Monday, December ->
               January), day and month prefixes (no wrap), letters A..Z; in that order.
  lines 56-59  the source rows: model.blocks[0].mlp (the MLP alone, no ln2) on the raw W_E rows,
               one mlp0_W_E for every layer (layer 0 included); W_U raw (center_unembed=False,
               fold_ln=False: line 27, 29).
  lines 67-68  logits = mlp0_W_E @ W_V W_O (per head, no biases) @ W_U.
  lines 71-83  per task: the pairs v[:-1] -> v[1:]; the candidates are set(v), the task's distinct
               tokens; a pair succeeds when its target logit == the candidates' max (ties succeed).
  line  88     accuracy = mean over every task's pairs; lines 89-90: a successor head has accuracy > 0.4
               (a float32 comparison: torch casts 0.4 to the tensor's float32).
Where the reference stops and headscope goes on (so the check does too, as docs/methods-weights.md
says): the reference raises on any multi-token word (lines 40-41); here, as in headscope, a task is
tokenised in the form with the most scorable pairs ("space": the word after the tokenizer's
word-initial space is one token, "bare", "piece": the word spelled as a lone space token then one
token), and only the pairs with a multi-token word are dropped (counted). --embedding headscope and
--ties fail check headscope's named options the same way.

Tolerance: headscope computes in float32 and this check in float64, so a pair whose target and best
other logit differ by less than --tie-tol (relative to the row's largest |logit|) may legitimately
be decided either way; such pairs are counted and the per-head scores must agree within
(near-tie pairs of that head) / N + 1e-6. Every other number (token ids, pair counts, the heads above
the threshold when no near-tie moves a head across it) must agree exactly.

Usage: successor_check.py MODEL_DIR FILE.h5 [--embedding reference|headscope] [--ties success|fail]
                          [--threshold 0.4] [--tie-tol 1e-5]
Exit 0 when everything agrees, 1 otherwise (each difference printed).
"""
import argparse
import json
import os
import struct
import sys

import h5py
import numpy as np

SPACE_TOKENS = ("\u2581", " ", "\u0120")


def reference_tasks():
    """test_successor_head.py lines 11-19 (num2words(1..20) written out)."""
    number_words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
                    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
              "November", "December"]
    return [
        ("numbers", [str(i) for i in range(1, 201)]),
        ("number_words", number_words),
        ("cardinal_words", ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
                            "tenth"]),
        ("days", days + [days[0]]),
        ("months", months + [months[0]]),
        ("day_prefixes", ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]),
        ("month_prefixes", ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]),
        ("letters", [chr(c) for c in range(ord("A"), ord("Z") + 1)]),
    ]


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
        raw = data[a:b]
        if t["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif t["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {t['dtype']}, which this check does not read")
        out[name] = arr.astype(np.float64).reshape(t["shape"])
    return out, header.get("__metadata__", {})


class Bpe:
    """Hugging Face BPE over tokenizer.json (Prepend/Replace normaliser, no pre-tokeniser, byte fallback):
    what the fixture uses. Checked against ../shared/testdata/tokenizer_vectors.json by --self-test."""

    def __init__(self, path):
        t = json.load(open(path, encoding="utf-8"))
        m = t["model"]
        if m["type"] != "BPE" or t.get("pre_tokenizer"):
            raise SystemExit(f"{path}: only a BPE model without a pre-tokenizer is read by this check")
        self.vocab = m["vocab"]
        self.unk, self.fuse_unk = m.get("unk_token"), m.get("fuse_unk", False)
        self.rank = {tuple(p.split(" ") if isinstance(p, str) else p): i for i, p in enumerate(m["merges"])}
        self.norm = t.get("normalizer") or {"type": "Sequence", "normalizers": []}
        self.id_to_tok = {i: s for s, i in self.vocab.items()}

    def normalize(self, s):
        steps = self.norm["normalizers"] if self.norm["type"] == "Sequence" else [self.norm]
        for n in steps:
            if n["type"] == "Prepend":
                s = n["prepend"] + s if s else s  # the tokenizers library prepends nothing to ""
            elif n["type"] == "Replace":
                s = s.replace(n["pattern"]["String"], n["content"])
            else:
                raise SystemExit(f"normalizer {n['type']} is not read by this check")
        return s

    def encode(self, s):
        parts = list(self.normalize(s))
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: self.rank.get((parts[i], parts[i + 1]), 1 << 60))
            if (parts[best], parts[best + 1]) not in self.rank:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        ids = []
        unk = self.vocab.get(self.unk)
        for p in parts:
            if p in self.vocab:
                ids.append(self.vocab[p])
                continue
            byte_ids = [self.vocab.get(f"<0x{b:02X}>") for b in p.encode("utf-8")]
            if all(i is not None for i in byte_ids):
                ids.extend(byte_ids)
            elif not (self.fuse_unk and ids and ids[-1] == unk):
                ids.append(unk)
        return ids


def word_ids(tok, words, form):
    """One token id per word in `form`, -1 where the word is not one token so."""
    out = []
    for w in words:
        # The tokenizer's own Prepend normaliser is the word-initial space, so " word" is encode(word).
        ids = tok.encode(w)
        if form in ("space", "bare"):
            out.append(ids[0] if len(ids) == 1 else -1)
        else:
            ok = len(ids) == 2 and tok.id_to_tok[ids[0]] in SPACE_TOKENS
            out.append(ids[1] if ok else -1)
    return out


def scorable(ids):
    return sum(1 for a, b in zip(ids[:-1], ids[1:]) if a >= 0 and b >= 0)


def tokenize(tok, tasks):
    out = []
    for name, words in tasks:
        best = None
        for form in ("space", "bare", "piece"):
            ids = word_ids(tok, words, form)
            if scorable(ids) > (scorable(best[1]) if best else 0):
                best = (form, ids)
        out.append((name, words, best))
    return out


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def write_safetensors(path, tensors, meta):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = np.ascontiguousarray(t, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def plant(a, w, meta, cfg, mlp0, w_e, w_u, plans):
    """L1H3: its o_proj columns solved so that, on the reference's source rows, each pair's successor gets
    logit 8 and every other candidate 0 (exact while the distinct sources are at most d_head); L1H5:
    o_proj columns 0, so every logit ties (1.0 under the reference's ties, 0 under --ties fail)."""
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg["hidden_size"] // H
    l, h = 1, 3
    srcs = list(dict.fromkeys(s for _, _, p in plans for s, _ in p))
    cols = list(dict.fromkeys(c for _, cand, _ in plans for c in cand))
    if len(srcs) > d:
        raise SystemExit(f"--plant: {len(srcs)} distinct sources, more than d_head {d}: not exact")
    kv = h // (H // KV)
    z = mlp0(w_e[srcs]) @ w[f"model.layers.{l}.self_attn.v_proj.weight"][kv * d:(kv + 1) * d].T  # [S, d]
    y = np.zeros((len(srcs), len(cols)))
    for _, cand, pairs in plans:
        for s, t in pairs:
            y[srcs.index(s), cols.index(t)] = 8.0
    b = np.linalg.lstsq(z, y, rcond=None)[0]  # [d, C]: z b = y
    wo_h = np.linalg.pinv(w_u[cols]) @ b.T  # [D, d]: W_U[cols] wo_h = b^T
    o = w[f"model.layers.{l}.self_attn.o_proj.weight"].copy()
    o[:, h * d:(h + 1) * d] = wo_h
    o[:, 5 * d:6 * d] = 0
    w[f"model.layers.{l}.self_attn.o_proj.weight"] = o
    os.makedirs(a.plant, exist_ok=True)
    for f in os.listdir(a.model):
        if not f.endswith(".safetensors") and os.path.isfile(os.path.join(a.model, f)):
            with open(os.path.join(a.model, f), "rb") as src, open(os.path.join(a.plant, f), "wb") as dst:
                dst.write(src.read())
    write_safetensors(os.path.join(a.plant, "model.safetensors"), w, meta)
    print(f"successor_check: planted L{l}H{h} on {len(srcs)} sources, zeroed L{l}H5, wrote {a.plant}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("h5", nargs="?")
    ap.add_argument("--embedding", default="reference", choices=["reference", "headscope"])
    ap.add_argument("--ties", default="success", choices=["success", "fail"])
    ap.add_argument("--threshold", type=float, default=0.4)
    ap.add_argument("--tie-tol", type=float, default=1e-5)
    ap.add_argument("--tasks", help="a task file as headscope reads it (JSON {name: [word, ...]}) instead of lines 11-19")
    ap.add_argument("--self-test", metavar="VECTORS", help="check the BPE against tokenizer_vectors.json and exit")
    ap.add_argument("--plant", metavar="OUT_DIR", help="write a copy of MODEL with L1H3 planted as a successor head on "
                    "--tasks (exactly, under the reference's representation) and L1H5's output zeroed, and exit")
    a = ap.parse_args()

    tok = Bpe(os.path.join(a.model, "tokenizer.json"))
    if a.self_test:
        cases = [c for c in json.load(open(a.self_test))["cases"] if c.get("tinystories") is not None]
        bad = [c["text"] for c in cases if tok.encode(c["text"]) != c["tinystories"]]
        print(f"successor_check: BPE on {len(cases)} reference encodings, {len(bad)} differ {bad}")
        return 1 if bad or not cases else 0

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    if cfg.get("model_type") != "llama" or cfg.get("hidden_act") != "silu":
        raise SystemExit("this check reads Llama-family checkpoints (gated silu MLP, RMSNorm) only")
    w, meta = read_safetensors(os.path.join(a.model, "model.safetensors"))
    w_u = w.get("lm_head.weight", w.get("model.embed_tokens.weight"))
    w_e = w.get("model.embed_tokens.weight", w_u if cfg.get("tie_word_embeddings") else None)
    L, H, KV = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg["hidden_size"]
    d = D // H

    def mlp0(x):  # model.blocks[0].mlp: the gated MLP alone (lines 58-59)
        p = "model.layers.0.mlp."
        return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T

    task_list = list(json.load(open(a.tasks)).items()) if a.tasks else reference_tasks()
    tasks = tokenize(tok, task_list)
    kept = [(n, words, b) for n, words, b in tasks if b is not None]
    # Per task: the distinct single-token ids (set(v), line 77) and the scorable pairs (lines 71-72).
    plans = []
    for name, words, (form, ids) in kept:
        cand = list(dict.fromkeys(i for i in ids if i >= 0))
        pairs = [(s, t) for s, t in zip(ids[:-1], ids[1:]) if s >= 0 and t >= 0]
        plans.append((name, cand, pairs))
    N = sum(len(p) for _, _, p in plans)
    if a.plant:
        return plant(a, w, meta, cfg, mlp0, w_e, w_u, plans)
    success = np.zeros((L, H, N))
    near = np.zeros((L, H), dtype=int)
    for l in range(L):
        for h in range(H):
            kv = h // (H // KV)
            wv = w[f"model.layers.{l}.self_attn.v_proj.weight"][kv * d:(kv + 1) * d]  # [d, D]
            wo = w[f"model.layers.{l}.self_attn.o_proj.weight"][:, h * d:(h + 1) * d]  # [D, d]
            ov = wv.T @ wo.T  # [D, D]: W_V W_O (line 67)
            i = 0
            for _, cand, pairs in plans:
                src = np.array([s for s, _ in pairs])
                x = w_e[src]
                if a.embedding == "reference":
                    x = mlp0(x)  # every layer reads mlp0_W_E
                elif l > 0:  # headscope's option: MLP0(norm2_0(W_E)), raw W_E at layer 0
                    x = mlp0(rms_norm(x, w["model.layers.0.post_attention_layernorm.weight"], cfg["rms_norm_eps"]))
                logits = x @ ov @ w_u[cand].T  # [pairs, candidates] (line 68)
                tcol = np.array([cand.index(t) for _, t in pairs])
                tl = logits[np.arange(len(pairs)), tcol]
                others = logits.copy()
                others[np.arange(len(pairs)), tcol] = -np.inf
                best_other = others.max(1) if logits.shape[1] > 1 else np.full(len(pairs), -np.inf)
                ok = tl >= best_other if a.ties == "success" else tl > best_other  # line 83: target == max
                success[l, h, i:i + len(pairs)] = ok
                scale = np.abs(logits).max(1) + 1e-30
                exact = logits.max(1) == logits.min(1)  # a row of equal logits (a zero head) ties in float32 too
                near[l, h] += int(((np.abs(tl - best_other) <= a.tie_tol * scale) & ~exact).sum())
                i += len(pairs)
    accuracy = success.mean(-1)  # line 88
    # Line 90: accuracy is a float32 tensor and torch casts the scalar 0.4 to float32 before comparing.
    above = accuracy.astype(np.float32) > np.float32(a.threshold)
    heads = [f"L{l}H{h}" for l in range(L) for h in range(H) if above[l, h]]
    skipped = {n: (len(words) - 1) - (scorable(b[1]) if b else 0) for n, words, b in tasks}
    print(f"successor_check: {N} pairs in {len(plans)} tasks ({sum(skipped.values())} pairs skipped for a multi-token "
          f"word), {L * H} heads, embedding {a.embedding}, ties {a.ties}; successor heads (> {a.threshold}): "
          f"{', '.join(heads) or 'none'}; best {accuracy.max():.4f}")
    if not a.h5:
        return 0

    errors = []
    g = h5py.File(a.h5, "r")["scores/successor"]

    def attr(k):
        v = g.attrs[k]
        return [x.decode() if isinstance(x, bytes) else x for x in v] if isinstance(v, np.ndarray) else (
            v.decode() if isinstance(v, bytes) else v)

    for k, want in (("embedding", a.embedding), ("ties", a.ties)):
        if attr(k) != want:
            errors.append(f"attribute {k}: {attr(k)!r}, expected {want!r}")
    if attr("tasks") != [n for n, _, _ in plans]:
        errors.append(f"tasks {attr('tasks')} != {[n for n, _, _ in plans]}")
    if list(attr("task_skipped_pairs")) != [skipped[n] for n, _ in task_list]:
        errors.append(f"task_skipped_pairs {list(attr('task_skipped_pairs'))} != {[skipped[n] for n, _ in task_list]}")
    if int(attr("n_skipped_pairs")) != sum(skipped.values()):
        errors.append(f"n_skipped_pairs {attr('n_skipped_pairs')} != {sum(skipped.values())}")
    src = [s for _, _, p in plans for s, _ in p]
    dst = [t for _, _, p in plans for _, t in p]
    if list(g["source_tokens"][()]) != src or list(g["target_tokens"][()]) != dst:
        errors.append("source_tokens / target_tokens differ from the check's pairs")
    score = g["score"][()].astype(np.float64)
    if score.shape != (L, H):
        errors.append(f"score shape {score.shape} != {(L, H)}")
    else:
        diff = np.abs(score - accuracy)
        allowed = near / N + 1e-6
        for l, h in zip(*np.where(diff > allowed)):
            errors.append(f"L{l}H{h}: headscope {score[l, h]:.6f}, check {accuracy[l, h]:.6f} "
                          f"(allowed {allowed[l, h]:.2e}: {near[l, h]} near-tie pairs)")
        task_score = g["task_score"][()]
        i = 0
        for k, (name, _, pairs) in enumerate(plans):
            want = success[:, :, i:i + len(pairs)].mean(-1)
            tallowed = near / max(len(pairs), 1) + 1e-6
            if np.any(np.abs(task_score[k] - want) > tallowed):
                errors.append(f"task_score of {name} differs by {np.abs(task_score[k] - want).max():.2e}")
            i += len(pairs)
        moved = near.sum() > 0 and np.any(np.abs(accuracy - a.threshold) <= near / N)
        if not moved and list(attr("successor_heads")) != heads:
            errors.append(f"successor_heads {list(attr('successor_heads'))} != {heads}")
        sh = g["successor_head"][()]
        if not moved and not np.array_equal(sh, above.astype(sh.dtype)):
            errors.append("successor_head mask differs from score > threshold")
        print(f"successor_check: max |score - check| {diff.max():.2e} over {L * H} heads; near-tie pairs "
              f"{int(near.sum())} (tie-tol {a.tie_tol:g})")
    for e in errors:
        print("DIFF", e)
    print("successor_check: " + ("agree" if not errors else f"{len(errors)} differences"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
