"""Sweeps tilecomm against Gloo on this host and prints a markdown summary.

    python benchmarks/cpu_sweep.py --worlds 2,4,8 -b 8 -e 64M -f 8 --jsonl results.jsonl

Runs ``python -m tilecomm.bench`` once per world size (it spawns its own ranks),
collects its JSONL records, and prints one table per collective: size, tilecomm
and Gloo mean time per call (the slowest rank's), and their ratio.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="8")
    ap.add_argument("-n", default="10")
    ap.add_argument("-w", default="2")
    ap.add_argument("--collective", default="all")
    ap.add_argument("--jsonl", default="")
    args = ap.parse_args()
    path = args.jsonl or tempfile.mktemp(suffix=".jsonl")
    if os.path.exists(path):
        os.remove(path)
    for w in args.worlds.split(","):
        cmd = [sys.executable, "-m", "tilecomm.bench", "--np", w, "-b", args.b, "-e", args.e, "-f", args.f,
               "-n", args.n, "-w", args.w, "--collective", args.collective, "--jsonl", path]
        print("#", " ".join(cmd[1:]), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            rows[(r["collective"], r["world"], r["bytes"])][r["backend"]] = r
    by_coll = collections.defaultdict(list)
    for (coll, world, nbytes), rec in sorted(rows.items()):
        by_coll[coll].append((world, nbytes, rec))
    for coll, items in by_coll.items():
        print(f"\n### {coll}\n")
        print("| world | bytes | tilecomm (us) | gloo (us) | tilecomm/gloo | tilecomm busbw (GB/s) | #wrong |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for world, nbytes, rec in items:
            t, g = rec.get("tilecomm"), rec.get("gloo")
            if not t or not g:
                continue
            print(f"| {world} | {nbytes} | {t['time_us']:.1f} | {g['time_us']:.1f} | {t['time_us'] / g['time_us']:.3f} "
                  f"| {t['busbw_gbs']:.3f} | {t['wrong'] + g['wrong']} |")


if __name__ == "__main__":
    main()
