#!/usr/bin/env python3
"""Checks a `headscope report` page (the HTML file, or the DOM headless Chromium dumped from it)
against the HDF5 files it was made from: every [L, H] score group has a heatmap with exactly one
cell per head whose title reads `<probe> L<l>H<h> <value>` with the file's value (4 decimals,
tolerance 5e-5) and whose data-value equals it (1e-6 relative); the single-sweep heatmap equals
metric - baseline; the needle grid equals the mean ROUGE-1 recall per (depth, length).
Usage: check_report_dom.py PAGE.html FILE.h5 [MORE.h5 ...]   (exit 1 with a line per failure)
"""
import sys
from html.parser import HTMLParser

import h5py
import numpy as np


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.maps = {}          # (file index, dataset) -> list of [data-value, title]
        self.file = -1
        self.cur = None
        self.in_title = False
        self.remote = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("src", "href", "srcset", "action", "data"):
            v = a.get(k)
            if v is not None and not v.startswith("#"):
                self.remote.append(f"{tag} {k}={v}")
        if tag == "div" and "data-file" in a:
            self.file += 1
        if tag == "svg" and a.get("class") == "heatmap":
            ds = a["data-dataset"]
            key = (self.file if not ds.startswith("diff:") else -1, ds)
            self.cur = self.maps.setdefault(key, [])
        if tag == "rect" and a.get("class") == "cell" and self.cur is not None:
            self.cur.append([float(a["data-value"]), ""])
        if tag == "title" and self.cur is not None and self.cur:
            self.in_title = True

    def handle_endtag(self, tag):
        if tag == "svg":
            self.cur = None
        if tag == "title":
            self.in_title = False

    def handle_data(self, data):
        if self.in_title:
            self.cur[-1][1] += data


def main():
    page = Page()
    page.feed(open(sys.argv[1], encoding="utf-8").read())
    errors = []
    if page.remote:
        errors.append(f"external references: {page.remote[:3]}")
    checked = 0

    def compare(key, label, want, name):
        nonlocal checked
        cells = page.maps.get(key)
        if cells is None:
            errors.append(f"no heatmap for {key}")
            return
        want = np.asarray(want, "f8")
        if len(cells) != want.size:
            errors.append(f"{key}: {len(cells)} cells, want {want.size}")
            return
        for i, ((dv, title), w) in enumerate(zip(cells, want.flat)):
            parts = title.rsplit(" ", 1)
            exp = f"{label} {name(i)}"
            if len(parts) != 2 or parts[0] != exp or not (np.isnan(w) and parts[-1] == "nan" or abs(float(parts[-1]) - w) <= 5.01e-5):
                errors.append(f"{key} cell {i}: title '{title}', want '{exp} {w:.4f}'")
            if not (np.isnan(w) and np.isnan(dv)) and abs(dv - w) > 1e-6 * max(1, abs(w)):
                errors.append(f"{key} cell {i}: data-value {dv}, want {w}")
            checked += 1

    heads = lambda H: (lambda i: f"L{i // H}H{i % H}")
    for fi, path in enumerate(sys.argv[2:]):
        with h5py.File(path, "r") as f:
            for p, g in f.get("scores", {}).items():
                items = [(p, g)] if "score" in g else [(f"{p}/{r}", g[r]) for r in g if "score" in g[r]]
                for label, gg in items:
                    sc = gg["score"][()]
                    compare((fi, f"/scores/{label}/score"), label, sc, heads(sc.shape[1]))
            if "ablation/single" in f:
                a = f["ablation/single"]
                masks, metric, kind = a["masks"][()], a["metric"][()], [k.decode() if isinstance(k, bytes) else k for k in a["kind"][()]]
                base = metric[kind.index("baseline")]
                L, H = masks.shape[1:]
                want = np.full(L * H, np.nan)
                for s, k in enumerate(kind):
                    if k == "single":
                        want[np.flatnonzero(masks[s])[0]] = metric[s] - base
                compare((fi, "/ablation/single/metric"), f"single:Δ{a.attrs['metric']}", want, heads(H))
            if "retrieval/trials" in f:
                t = f["retrieval/trials"]
                ln, dp, rc = t["length"][()], t["depth"][()], t["rouge1_recall"][()]
                ls, ds = sorted(set(ln)), sorted(set(dp))
                want = [[rc[(ln == l) & (dp == d)].mean() for l in ls] for d in ds]
                compare((fi, "/retrieval/trials/rouge1_recall"), "recall", want,
                        lambda i: f"length={ls[i % len(ls)]} depth={ds[i // len(ls)]}%")
    if len(sys.argv) > 3:  # difference heatmaps, later file minus the first
        with h5py.File(sys.argv[2], "r") as a, h5py.File(sys.argv[3], "r") as b:
            for p in a["scores"]:
                if "score" in a["scores"][p] and p in b["scores"] and "score" in b["scores"][p]:
                    d = b[f"scores/{p}/score"][()].astype("f8") - a[f"scores/{p}/score"][()]
                    compare((-1, f"diff:1:{p}"), f"Δ{p}", d, heads(d.shape[1]))
    for e in errors[:20]:
        print("check_report_dom:", e)
    print(f"check_report_dom: {checked} cells checked, {len(errors)} problems")
    sys.exit(1 if errors or checked == 0 else 0)


main()
