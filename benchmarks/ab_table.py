"""The table of an A/B written by scripts/gpu-ab: per point and entry, each build's median and the paired difference.

    python benchmarks/ab_table.py ab.jsonl --keys tilecomm:registered,symm_mem:two_shot
    python benchmarks/ab_table.py ab.jsonl --keys all_reduce:ll:graph --script gpu_latency.py
    python benchmarks/ab_table.py ab.jsonl --keys tilecomm:registered:busy_us --script gpu_kernels.py

gpu-ab runs its rounds in the order A B B A A B ..., so rounds 1-2, 3-4, ... each hold one round of
either build, adjacent in time. For every point (world, bytes, and dtype where the records carry one)
and every entry in --keys, the table gives A's and B's medians over their rounds, "B - A" the median
of the pairs' differences, and "pairs" how many pairs had B below A. Entries the builds share
unchanged show the noise of a pair. Records of other scripts or batches are left out with --script
and --batch; a round missing from one build leaves its pair out. gpu_kernels.py writes a record per
entry ({"entry": ..., "cycle_us": ..., ...}); its keys are ENTRY:FIELD (tilecomm:registered:busy_us).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def _size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _numbers(r: dict) -> dict:
    """A record's values by key: those of a record of one entry (gpu_kernels.py) as ENTRY:FIELD."""
    return {f"{r['entry']}:{k}": v for k, v in r.items()} if "entry" in r else r


def rows(records: list[dict], keys: list[str]) -> list[dict]:
    """One row per point and key: {world, bytes, dtype, key, a, b, diff, below, pairs}; points in
    ascending (world, dtype, bytes), keys in the order given; a key no record of the point has is left out."""
    values = defaultdict(dict)  # (world, dtype, bytes, key) -> {(build, round): value}
    for r in records:
        numbers = _numbers(r)
        for k in keys:
            if isinstance(numbers.get(k), (int, float)):
                values[(r["world"], r.get("dtype", ""), r["bytes"], k)][(r["build"], r["round"])] = float(numbers[k])
    out = []
    points = sorted({p[:3] for p in values})
    for world, dtype, nbytes in points:
        for k in keys:
            v = values.get((world, dtype, nbytes, k))
            if not v:
                continue
            a = [x for (b, _), x in v.items() if b == "A"]
            b = [x for (b, _), x in v.items() if b == "B"]
            diffs = []
            for first in range(1, max(r for _, r in v) + 1, 2):  # rounds first and first + 1
                pa = v.get(("A", first), v.get(("A", first + 1)))
                pb = v.get(("B", first), v.get(("B", first + 1)))
                if pa is not None and pb is not None:
                    diffs.append(pb - pa)
            out.append(dict(world=world, dtype=dtype, bytes=nbytes, key=k,
                            a=statistics.median(a) if a else None, b=statistics.median(b) if b else None,
                            diff=statistics.median(diffs) if diffs else None,
                            below=sum(d < 0 for d in diffs), pairs=len(diffs)))
    return out


def markdown(table: list[dict]) -> str:
    """The rows as a markdown table, one line per point and key."""
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    dtypes = any(r["dtype"] for r in table)
    head = ["world", "bytes"] + (["dtype"] if dtypes else []) + ["entry", "A", "B", "B - A", "pairs"]
    lines = ["| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for r in table:
        cells = [str(r["world"]), _size(r["bytes"])] + ([r["dtype"]] if dtypes else []) + [
            r["key"], num(r["a"], ".2f"), num(r["b"], ".2f"), num(r["diff"], "+.2f"), f"{r['below']} of {r['pairs']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl", help="the records scripts/gpu-ab wrote")
    ap.add_argument("--keys", required=True, help="the entries to tabulate, comma-separated")
    ap.add_argument("--script", default="", help="only the records of this benchmark script (e.g. gpu_latency.py)")
    ap.add_argument("--batch", default="", help="only the records of this batch")
    args = ap.parse_args(argv)
    with open(args.jsonl) as f:
        records = [json.loads(line) for line in f if line.strip()]
    records = [r for r in records if "build" in r and "round" in r
               and (not args.script or r.get("script") == args.script)
               and (not args.batch or r.get("batch") == args.batch)]
    if not records:
        raise SystemExit(f"ab_table: no A/B records in {args.jsonl} (with the --script / --batch given)")
    batches = sorted({str(r.get("batch", "")) for r in records})
    if len(batches) > 1:  # their rounds share numbers
        raise SystemExit(f"ab_table: {args.jsonl} holds several batches ({', '.join(batches)}): pick one with --batch")
    print(markdown(rows(records, args.keys.split(","))))


if __name__ == "__main__":
    main()
