#!/usr/bin/env python3
"""Draw the plots of a headscope result file for papers (PNG, SVG or PDF), with the layout choices of
`headscope report`'s HTML page (viridis for scores; blue-white-red centred at 0 for signed values;
top-k in dark blue, random controls as orange points with min..max bars):
  - a layer x head heatmap for every /scores/<probe>/score table (diverging when signed: dla, locos,
    or any negative value);
  - /ablation/<study>: single-head sweeps as a layer x head heatmap of the metric change, cumulative
    studies as metric against k with the random controls, pruning as metric against fraction pruned;
  - /retrieval/trials: the needle grid, mean ROUGE-1 recall per depth (rows) x length (columns).

Example: scripts/plot_scores.py scores.h5 --out-dir plots --format png

Needs h5py and matplotlib. When the running Python lacks them, the script re-executes itself
with /usr/bin/python3 (Debian's python3-h5py / python3-matplotlib); when neither has them it
says so and exits with status 3.
"""
import argparse
import os
import sys

FALLBACK_PYTHON = "/usr/bin/python3"
REEXEC_MARK = "HEADSCOPE_PLOT_REEXEC"


def import_or_reexec():
    try:
        import h5py  # noqa: F401
        import matplotlib  # noqa: F401
        return
    except ImportError as e:
        missing = e.name
    same = os.path.realpath(sys.executable) == os.path.realpath(FALLBACK_PYTHON)
    if not os.environ.get(REEXEC_MARK) and not same and os.access(FALLBACK_PYTHON, os.X_OK):
        os.environ[REEXEC_MARK] = "1"
        os.execv(FALLBACK_PYTHON, [FALLBACK_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    sys.stderr.write(
        f"plot_scores.py: error: no Python here has h5py and matplotlib ({missing} missing in "
        f"{sys.executable}); install them (apt install python3-h5py python3-matplotlib, "
        f"or pip install h5py matplotlib)\n")
    sys.exit(3)


MAIN, CONTROL, CONTROL_EDGE = "#3b528b", "#e9a23b", "#c77c02"  # as in src/report/report.cpp's CSS


def load_tables(path, wanted):
    import h5py
    tables = []
    with h5py.File(path, "r") as f:
        if "scores" not in f:
            return tables
        for probe in sorted(f["scores"].keys()):
            if wanted and probe not in wanted:
                continue
            g = f["scores"][probe]
            if "score" not in g:
                continue
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
            tables.append((probe, g["score"][()], attrs))
    if wanted:
        missing = sorted(set(wanted) - {t[0] for t in tables})
        if missing:
            raise SystemExit(f"plot_scores.py: error: {path}: no probe(s) {', '.join(missing)}")
    return tables


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def heatmap(values, title, out_path, signed=False, xlabel="head", ylabel="layer", xticks=None, yticks=None,
            label="score", vmin=None, vmax=None):
    import numpy as np
    plt = pyplot()
    rows, cols = values.shape
    fig, ax = plt.subplots(figsize=(max(4, 0.45 * min(cols, 40) + 2), max(3, 0.4 * min(rows, 40) + 1.5)))
    finite = values[np.isfinite(values)]
    if signed or (finite.size and finite.min() < 0):
        m = float(np.abs(finite).max()) if finite.size else 1.0
        im = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-m, vmax=m, origin="upper")
    else:
        im = ax.imshow(values, aspect="auto", cmap="viridis", origin="upper", vmin=vmin, vmax=vmax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    step_c, step_r = max(1, (cols + 15) // 16), max(1, (rows + 23) // 24)  # the HTML page's tick spacing
    ax.set_xticks(range(0, cols, step_c))
    ax.set_yticks(range(0, rows, step_r))
    if xticks is not None:
        ax.set_xticklabels([xticks[i] for i in range(0, cols, step_c)])
    if yticks is not None:
        ax.set_yticklabels([yticks[i] for i in range(0, rows, step_r)])
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)


def draw(probe, score, attrs, out_path):
    conv = attrs.get("convention", "")
    heatmap(score, f"{probe} ({conv})" if conv else probe, out_path, signed=probe in ("dla", "locos"))


def strs(ds):
    return [x.decode() if isinstance(x, bytes) else str(x) for x in ds[()]]


def draw_ablation(name, g, out_dir, fmt):
    """Plots of one /ablation/<study> group (docs/hdf5-schema.md names); returns the files written."""
    import numpy as np
    plt = pyplot()
    masks, metric, kind = g["masks"][()], g["metric"][()].astype("f8"), strs(g["kind"])
    S, L, H = masks.shape
    k = g["k"][()] if "k" in g else masks.reshape(S, -1).sum(1)
    mname = g.attrs.get("metric", "metric")
    mname = mname.decode() if isinstance(mname, bytes) else str(mname)
    base = metric[kind.index("baseline")] if "baseline" in kind else np.nan
    out = []
    if "single" in kind:
        d = np.full(L * H, np.nan)
        for s in range(S):
            if kind[s] == "single" and masks[s].sum() == 1:
                d[int(np.flatnonzero(masks[s])[0])] = metric[s] - base
        p = os.path.join(out_dir, f"ablation-{name}-single.{fmt}")
        heatmap(d.reshape(L, H), f"{name}: change of {mname} when one head is ablated", p, signed=True,
                label=f"{mname} - baseline")
        out.append(p)
    for what in ("cumulative", "prune"):
        if what not in kind:
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        if what == "cumulative":
            xs = [0] + [k[s] for s in range(S) if kind[s] == "cumulative"]
            ys = [base] + [metric[s] for s in range(S) if kind[s] == "cumulative"]
            o = np.argsort(xs)
            ax.plot(np.array(xs)[o], np.array(ys)[o], "-o", color=MAIN, label="top-k heads ablated")
            ctl = {}
            for s in range(S):
                if kind[s] == "control":
                    ctl.setdefault(k[s], []).append(metric[s])
            if ctl:
                for kk, v in ctl.items():
                    ax.scatter([kk] * len(v), v, s=14, color=CONTROL, edgecolor=CONTROL_EDGE, alpha=0.7, zorder=3)
                    ax.vlines(kk, min(v), max(v), color=CONTROL_EDGE, lw=2)
                kk = sorted(ctl)
                ax.plot(kk, [np.mean(ctl[x]) for x in kk], "--o", color=CONTROL_EDGE, ms=4,
                        label="random controls (mean; points, min..max)")
            ax.set_xlabel("k (heads ablated)")
        else:
            fr = [0.0] + [masks[s].sum() / (L * H) for s in range(S) if kind[s] == "prune"]
            ys = [base] + [metric[s] for s in range(S) if kind[s] == "prune"]
            o = np.argsort(fr)
            ax.plot(np.array(fr)[o], np.array(ys)[o], "-o", color=MAIN, label="pruned, lowest importance first")
            ax.set_xlabel("fraction of heads pruned")
        ax.set_ylabel(mname)
        ax.set_title(f"{name} ({what})")
        ax.grid(color="#eeeeee")
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(out_dir, f"ablation-{name}-{what}.{fmt}")
        fig.savefig(p)
        plt.close(fig)
        out.append(p)
    return out


def draw_needle_grid(t, out_dir, fmt):
    """The needle-in-a-haystack grid of /retrieval/trials (docs/hdf5-schema.md names)."""
    import numpy as np
    ln, dp, rc = t["length"][()], t["depth"][()], t["rouge1_recall"][()].astype("f8")
    ls, ds = sorted(set(ln.tolist())), sorted(set(dp.tolist()))
    grid = np.array([[rc[(ln == l) & (dp == d)].mean() if ((ln == l) & (dp == d)).any() else np.nan for l in ls]
                     for d in ds])
    p = os.path.join(out_dir, f"needle-grid.{fmt}")
    heatmap(grid, "needle test: mean ROUGE-1 recall", p, xlabel="context length", ylabel="depth %",
            xticks=[str(x) for x in ls], yticks=[str(x) for x in ds], label="ROUGE-1 recall", vmin=0, vmax=1)
    return [p]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="HDF5 result file written by headscope detect")
    ap.add_argument("--out-dir", default=".", help="folder for the images (created if needed)")
    ap.add_argument("--format", default="png", choices=["png", "svg", "pdf"])
    ap.add_argument("--probe", action="append", help="only this probe (repeatable)")
    args = ap.parse_args()
    if not os.path.exists(args.file):
        sys.stderr.write(f"plot_scores.py: error: {args.file}: no such file\n")
        return 6
    import_or_reexec()
    import h5py
    tables = load_tables(args.file, args.probe)
    with h5py.File(args.file, "r") as f:
        studies = [] if args.probe else [n for n in f.get("ablation", {}) if "masks" in f["ablation"][n]]
        trials = not args.probe and "retrieval/trials/rouge1_recall" in f
        if not tables and not studies and not trials:
            sys.stderr.write(f"plot_scores.py: error: {args.file}: no score tables, ablation studies or retrieval trials\n")
            return 6
        os.makedirs(args.out_dir, exist_ok=True)
        for probe, score, attrs in tables:
            out = os.path.join(args.out_dir, f"{probe}.{args.format}")
            draw(probe, score, attrs, out)
            print(out)
        for name in studies:
            for out in draw_ablation(name, f["ablation"][name], args.out_dir, args.format):
                print(out)
        if trials:
            for out in draw_needle_grid(f["retrieval/trials"], args.out_dir, args.format):
                print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
