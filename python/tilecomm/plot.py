"""Draws benchmark JSONL records (from ``tilecomm.bench --jsonl``) as PNG plots.

    python -m tilecomm.plot results.jsonl out.png [--world 4]

One panel per collective: bus bandwidth against size, one line per backend or
forced algorithm. Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import collections
import json


def plot(records, path, title=""):
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise SystemExit("tilecomm.plot needs matplotlib: pip install matplotlib") from None
    by_coll = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        if r["bytes"] > 0:
            by_coll[r["collective"]][r["backend"]].append((r["bytes"], r["busbw_gbs"], r["time_us"]))
    colls = sorted(by_coll)
    fig, axes = plt.subplots(len(colls), 2, figsize=(12, 3.2 * len(colls)), squeeze=False)
    for row, coll in enumerate(colls):
        for backend, pts in sorted(by_coll[coll].items()):
            pts.sort()
            xs = [p[0] for p in pts]
            style = "--" if not backend.startswith("tilecomm") else "-"
            axes[row][0].plot(xs, [p[1] for p in pts], style, marker=".", label=backend)
            axes[row][1].plot(xs, [p[2] for p in pts], style, marker=".", label=backend)
        for col, ylabel in ((0, "busbw (GB/s)"), (1, "time (us)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            if col == 1:
                ax.set_yscale("log")
            ax.set_title(f"{coll} {title}".strip())
            ax.set_xlabel("bytes")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        axes[row][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tilecomm.plot")
    ap.add_argument("jsonl")
    ap.add_argument("png")
    ap.add_argument("--world", type=int, default=0, help="only records of this world size")
    args = ap.parse_args(argv)
    with open(args.jsonl) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if args.world:
        recs = [r for r in recs if r["world"] == args.world]
    plot(recs, args.png, f"(world {args.world})" if args.world else "")


if __name__ == "__main__":
    main()
