#!/usr/bin/env python3
"""Draw a layer x head heatmap for every /scores/<probe>/score table of a headscope result file.

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


def load_tables(path, wanted):
    import h5py
    tables = []
    with h5py.File(path, "r") as f:
        if "scores" not in f:
            raise SystemExit(f"plot_scores.py: error: {path}: no /scores group")
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


def draw(probe, score, attrs, out_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n_layers, n_heads = score.shape
    fig, ax = plt.subplots(figsize=(max(4, 0.45 * n_heads + 2), max(3, 0.4 * n_layers + 1.5)))
    im = ax.imshow(score, aspect="auto", cmap="viridis", origin="upper")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    conv = attrs.get("convention", "")
    ax.set_title(f"{probe} ({conv})" if conv else probe)
    fig.colorbar(im, ax=ax, label="score")
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="HDF5 result file written by headscope detect")
    ap.add_argument("--out-dir", default=".", help="folder for the images (created if needed)")
    ap.add_argument("--format", default="png", choices=["png", "svg"])
    ap.add_argument("--probe", action="append", help="only this probe (repeatable)")
    args = ap.parse_args()
    if not os.path.exists(args.file):
        sys.stderr.write(f"plot_scores.py: error: {args.file}: no such file\n")
        return 6
    import_or_reexec()
    tables = load_tables(args.file, args.probe)
    if not tables:
        sys.stderr.write(f"plot_scores.py: error: {args.file}: no score tables\n")
        return 6
    os.makedirs(args.out_dir, exist_ok=True)
    for probe, score, attrs in tables:
        out = os.path.join(args.out_dir, f"{probe}.{args.format}")
        draw(probe, score, attrs, out)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
