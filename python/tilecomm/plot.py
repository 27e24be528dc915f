"""Draws benchmark JSONL records (from ``tilecomm.bench --jsonl``) as PNG plots.

    python -m tilecomm.plot results.jsonl out.png [--world 4] [--profile profile.json]

One row per collective: bus bandwidth and time against size, one solid line per
tilecomm backend or forced algorithm (other backends dash-dotted), and, dashed
in the same colour, the selector model's prediction for each forced algorithm
("tilecomm:<algo>" records, from ``bench --algo``) under a profile: ``--profile``,
else TILECOMM_PROFILE, else the shipped default (``--no-model`` leaves it out).
Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import argparse
import collections
import json

from tilecomm import algorithms, bench, selector, settings


def model_series(records, profile):
    """{(collective, backend, world): [(bytes, busbw GB/s, time us), ...]}: the model's prediction
    at the measured sizes of every forced algorithm ("tilecomm:<algo>"); unknown algorithms are skipped."""
    sizes = collections.defaultdict(set)
    for r in records:
        if r["backend"].startswith("tilecomm:") and r["bytes"] > 0:
            sizes[(r["collective"], r["backend"], r["world"], r.get("dtype", "float32"))].add(r["bytes"])
    out = {}
    for (coll, backend, world, dtype), ns in sorted(sizes.items()):
        short = backend.split(":", 1)[1]
        match = [a for a in algorithms.for_collective(coll) if short in (a.short, a.name)]
        if not match:
            continue
        dtype_name = str(bench.DTYPES.get(dtype, dtype)).replace("torch.", "")
        pts = []
        for n in sorted(ns):
            t = selector.predict_algo(match[0], world, n, profile, dtype_name).total_s
            busbw = n / t / 1e9 * bench.bus_factor(coll, world) if t > 0 else float("nan")
            pts.append((n, busbw, t * 1e6))
        out[(coll, backend, world)] = pts
    return out


def plot(records, path, title="", profile=None):
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
    model = model_series(records, profile) if profile is not None else {}
    colls = sorted(by_coll)
    fig, axes = plt.subplots(len(colls), 2, figsize=(12, 3.2 * len(colls)), squeeze=False)
    for row, coll in enumerate(colls):
        colour = {}
        for backend, pts in sorted(by_coll[coll].items()):
            pts.sort()
            xs = [p[0] for p in pts]
            style = "-." if not backend.startswith("tilecomm") else "-"
            (line,) = axes[row][0].plot(xs, [p[1] for p in pts], style, marker=".", label=backend)
            axes[row][1].plot(xs, [p[2] for p in pts], style, marker=".", color=line.get_color())
            colour[backend] = line.get_color()
        worlds = {w for (c, _, w) in model if c == coll}
        for (c, backend, world), pts in model.items():
            if c != coll:
                continue
            label = f"model {backend}" + (f" p={world}" if len(worlds) > 1 else "")
            xs = [p[0] for p in pts]
            axes[row][0].plot(xs, [p[1] for p in pts], "--", color=colour.get(backend), label=label, linewidth=1)
            axes[row][1].plot(xs, [p[2] for p in pts], "--", color=colour.get(backend), linewidth=1)
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
    ap.add_argument("--profile", help="profile for the model lines (default: TILECOMM_PROFILE, else the shipped one)")
    ap.add_argument("--no-model", action="store_true", help="leave out the model's predictions")
    args = ap.parse_args(argv)
    profile = None
    if not args.no_model:
        path = args.profile if args.profile is not None else settings.resolve()["TILECOMM_PROFILE"]
        try:
            profile = selector.load_profile(path or None)
        except ValueError as e:
            ap.error(str(e))
    with open(args.jsonl) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if args.world:
        recs = [r for r in recs if r["world"] == args.world]
    plot(recs, args.png, f"(world {args.world})" if args.world else "", profile)


if __name__ == "__main__":
    main()
