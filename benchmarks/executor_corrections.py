"""The schedule executor's shipped corrections: fitted on earlier GPU tune runs, each run scored out of sample.

    python benchmarks/executor_corrections.py RUN.json [RUN.json ...] [-o python/tilecomm/executor_corrections.json]

Each RUN.json is a profile written by ``python -m tilecomm.tune --device cuda`` (its ``cuda_points``
keep the executor's forced-algorithm records). The shipped constants (``executor_model.CONSTANTS``) are
kept; every algorithm's latency and bandwidth corrections at every world size measured are fitted
(``executor_model.fit_corrections``). Each run is then left out in turn: corrections fitted on the
others, scored on it against the constants without corrections (the decision tables' regret: the
chosen algorithm's time over the fastest one's, mean / worst per peer memory and world size). With
``-o``, the corrections fitted on every run are written there.
"""

import argparse
import json
import os
import sys
from collections import defaultdict

from tilecomm import executor_model


def records(path):
    with open(path) as f:
        return json.load(f).get("cuda_points", {}).get("cuda_executor", [])


def scores(recs, section):
    """{(memory, world): (mean, worst)} of the tables from `section` on one run's records."""
    out = defaultdict(list)
    for (memory, world, _), entries in executor_model.regret(recs, section).items():
        out[(memory, world)] += [e[1] for e in entries]
    return {k: (sum(v) / len(v), max(v)) for k, v in out.items()}


def write(path, fitted_on, constants, corrections):
    """The corrections as JSON, one algorithm a line, factors to 4 significant digits, with the constants
    they were fitted against."""
    lines = ["{", f' "fitted_on": {json.dumps(fitted_on)},', f' "constants": {json.dumps(constants, sort_keys=True)},',
             ' "corrections": {']
    for i, (memory, worlds) in enumerate(sorted(corrections.items())):
        lines.append(f'  "{memory}": {{')
        for j, (world, per_algo) in enumerate(sorted(worlds.items(), key=lambda kv: int(kv[0]))):
            lines.append(f'   "{world}": {{')
            items = sorted(per_algo.items())
            for k, (name, c) in enumerate(items):
                factors = ", ".join(f'"{part}": {float(f"{c[part]:.4g}")!r}' for part in ("latency", "bandwidth"))
                lines.append(f'    "{name}": {{{factors}}}' + ("," if k < len(items) - 1 else ""))
            lines.append("   }" + ("," if j < len(worlds) - 1 else ""))
        lines.append("  }" + ("," if i < len(corrections) - 1 else ""))
    lines += [" }", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("-o", "--output", default="")
    args = ap.parse_args(argv)
    names = [os.path.basename(p) for p in args.runs]
    if len(set(names)) < len(names):
        sys.exit("executor_corrections: two runs have the same file name; the table names runs by it")
    runs = {name: records(p) for name, p in zip(names, args.runs)}
    empty = [name for name, recs in runs.items() if not executor_model.samples(recs)]
    if empty:
        sys.exit(f"executor_corrections: no executor records in {', '.join(empty)}")
    print("| run left out | memory | world | constants alone: mean / worst | corrected: mean / worst |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, recs in runs.items():
        others = [r for other, rs in runs.items() if other != name for r in rs]
        section, _ = executor_model.fit_corrections(others, executor_model.CONSTANTS)
        before, after = scores(recs, executor_model.CONSTANTS), scores(recs, section)
        for key in sorted(before):
            (b_mean, b_worst), (a_mean, a_worst) = before[key], after[key]
            print(f"| {name} | {key[0]} | {key[1]} | {b_mean:.3f} / {b_worst:.2f} | {a_mean:.3f} / {a_worst:.2f} |")
    if args.output:
        every = [r for rs in runs.values() for r in rs]
        section, notes = executor_model.fit_corrections(every, executor_model.CONSTANTS)
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        write(args.output, sorted(runs), executor_model.CONSTANTS,
              {m: section[m].get("corrections", {}) for m in executor_model.MEMORIES})
        print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
