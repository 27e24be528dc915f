"""The CUDA issue's targets counted from benchmarks/gpu_compare.py records: auto against the best of the others.

    python benchmarks/target_table.py graph_a.jsonl graph_b.jsonl graph_c.jsonl
    python benchmarks/target_table.py run.jsonl --entry tilecomm:auto_op --against symm_mem:two_shot,nvshmem:reduce

Each file is one run of gpu_compare.py (a record per world and size); all must use one timing method
and one dtype. For every point (world, bytes) the table gives, from the run in the middle of the
ratios, auto's time and the best of the --against entries (default: SymmetricMemory's one_shot and
two_shot), then auto over that best in every run, their median, and, from --hbm-from (64 MiB), the
HBM bound over auto's time ("bound" is the least traffic an all_reduce moves at the rate of a
device-to-device copy of the same run). The last lines count the points where auto is at or below
the best, per run and by the median ratio, and give the range of the HBM fraction against the
issue's 60%. An entry that failed in a run (text instead of a time), or is absent, leaves that run
out of the point.
"""

from __future__ import annotations

import argparse
import json
import statistics

from ab_table import _size


def load(paths: list[str]) -> list[dict]:
    """One {(world, bytes): record} per file; refuses files that mix timings or dtypes."""
    runs, kinds = [], set()
    for path in paths:
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        kinds |= {(r.get("timing", "barrier"), r.get("dtype", "float32")) for r in recs}
        runs.append({(r["world"], r["bytes"]): r for r in recs})
    if len(kinds) > 1:
        raise SystemExit(f"target_table: the runs mix timings or dtypes {sorted(kinds)}; compare one at a time")
    return runs


def _time(rec: dict, key: str) -> float | None:
    v = rec.get(key)
    return v if isinstance(v, (int, float)) else None


def rows(runs: list[dict], entry: str, against: list[str], hbm_from: int) -> list[dict]:
    """Per point: {world, bytes, ratios (one per run that timed it), auto, best, median, hbm (or None)}."""
    out = []
    for world, nbytes in sorted(set().union(*runs)):
        cells = []  # (ratio, auto, best, bound) per run
        for run in runs:
            rec = run.get((world, nbytes))
            if rec is None:
                continue
            a = _time(rec, entry)
            others = [t for t in (_time(rec, k) for k in against) if t is not None]
            if a is None or not others:
                continue
            cells.append((a / min(others), a, min(others), rec.get("bound_us")))
        if not cells:
            continue
        mid = sorted(cells)[(len(cells) - 1) // 2]
        hbm = [c[3] / c[1] for c in cells] if nbytes >= hbm_from and all(c[3] for c in cells) else None
        out.append(dict(world=world, bytes=nbytes, ratios=[c[0] for c in cells], auto=mid[1], best=mid[2],
                        median=statistics.median(c[0] for c in cells), hbm=hbm))
    return out


def table(rs: list[dict], nruns: int, entry: str, against: list[str]) -> str:
    lines = [f"| world | bytes | {entry} | best of {', '.join(against)} | ratio per run | median | bound / auto |",
             "| ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in rs:
        hbm = ", ".join(f"{h:.0%}" for h in r["hbm"]) if r["hbm"] else ""
        ratios = ", ".join(f"{x:.3f}" for x in r["ratios"])
        lines.append(f"| {r['world']} | {_size(r['bytes'])} | {r['auto']:.1f} | {r['best']:.1f} | {ratios} | "
                     f"{r['median']:.3f} | {hbm} |")
    per_run = [sum(1 for r in rs if len(r["ratios"]) == nruns and r["ratios"][i] <= 1) for i in range(nruns)]
    full = sum(1 for r in rs if len(r["ratios"]) == nruns)
    lines.append("")
    lines.append(f"at or below, per run: {', '.join(map(str, per_run))} of {full} points timed in every run; "
                 f"by the median ratio: {sum(1 for r in rs if r['median'] <= 1)} of {len(rs)}")
    hbm = [h for r in rs if r["hbm"] for h in r["hbm"]]
    if hbm:
        lines.append(f"HBM bound over auto: {min(hbm):.0%}-{max(hbm):.0%} (target 60%: "
                     f"{'met' if min(hbm) >= 0.6 else 'missed'})")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="gpu_compare.py --jsonl files, one per run")
    ap.add_argument("--entry", default="tilecomm:auto")
    ap.add_argument("--against", default="symm_mem:one_shot,symm_mem:two_shot")
    ap.add_argument("--hbm-from", type=int, default=64 << 20, help="bytes from which the HBM fraction is given")
    args = ap.parse_args(argv)
    runs = load(args.runs)
    against = args.against.split(",")
    print(table(rows(runs, args.entry, against, args.hbm_from), len(runs), args.entry, against))


if __name__ == "__main__":
    main()
