"""Markdown tables of per-algorithm benchmark records (``tilecomm.bench --algo all --jsonl``).

    python benchmarks/algo_tables.py results_w2.jsonl results_w4.jsonl ...

One table per (collective, world size): a row per size, a column per forced
algorithm with the median time of one call in microseconds (p50 of the slowest
rank's per-call times; the median, because with ranks sharing cores a few calls
that catch a descheduled rank dominate a short mean), the fastest in bold; then
the auto-selection's median and its ratio to the fastest forced algorithm.
"""

import collections
import json
import sys


def main(paths):
    rows = collections.defaultdict(dict)  # (coll, world) -> {(bytes, backend): time}
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                rows[(r["collective"], r["world"])][(r["bytes"], r["backend"])] = (r["p50_us"], r["wrong"])
    for (coll, world), recs in sorted(rows.items()):
        algos = sorted({b for _, b in recs if b.startswith("tilecomm:")})
        sizes = sorted({n for n, _ in recs})
        print(f"\n#### {coll}, world {world}\n")
        names = [a.split(":", 1)[1] for a in algos]
        print("| bytes | " + " | ".join(names) + " | auto | auto / best |")
        print("| ---: | " + " | ".join("---:" for _ in names) + " | ---: | ---: |")
        for n in sizes:
            times = [recs.get((n, a), (None, 0))[0] for a in algos]
            known = [t for t in times if t is not None]
            best = min(known) if known else None
            cells = []
            for a, t in zip(algos, times):
                if t is None:
                    cells.append("-")
                    continue
                wrong = recs[(n, a)][1]
                cell = f"{t:.1f}" + (f" ({wrong} wrong)" if wrong else "")
                cells.append(f"**{cell}**" if t == best else cell)
            auto = recs.get((n, "tilecomm"), (None, 0))[0]
            ratio = f"{auto / best:.2f}" if auto is not None and best else "-"
            print(f"| {n} | " + " | ".join(cells) + f" | {auto:.1f} | {ratio} |" if auto is not None else
                  f"| {n} | " + " | ".join(cells) + " | - | - |")


if __name__ == "__main__":
    main(sys.argv[1:])
