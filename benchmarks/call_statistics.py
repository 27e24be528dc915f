"""Two figures of one timed loop, pass after pass: the median call and the loop's time per call.

    python benchmarks/call_statistics.py --world 8 --collective broadcast --algos binomial_tree,pipelined_chain -b 2K

Spawns the ranks itself. Each algorithm runs in a group of its own (``TILECOMM_ALGO``), and each
pass times every algorithm once as ``python -m tilecomm.tune`` times a point (``bench.time_case``: a
barrier, ``-w`` warm-up calls, ``-n`` back-to-back calls). The passes here run back to back at one
size; tune's sweep the other sizes in between (docs/selector.md, "Tuning"). Per algorithm it
prints, over the passes, the two figures time_case gives: the median over the calls of one call's
time (the slowest rank's at each call), and the loop's wall time divided by ``-n`` (the slowest
rank's), which is nccl-tests' time and the one tune keeps; with the least and the spread of each.
"""

import argparse
import statistics

import torch
import torch.distributed as dist

from tilecomm import bench, launch


def _rank(rank, world, args):
    import tilecomm  # noqa: F401,PLC0415  (registers the backend)

    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    timing = dist.new_group(backend="gloo")
    groups = bench._algo_groups(args.collective, args.algos, world)
    figures = {name: ([], []) for name in groups}
    for _ in range(args.passes):
        for name, g in groups.items():
            case = bench.Case(args.collective, args.bytes, torch.float32, dist.ReduceOp.SUM, rank, world, g)
            per_call, times = bench.time_case(case, args.iters, args.warmup, timing)
            figures[name][0].append(float(times.quantile(0.5)) * 1e6)
            figures[name][1].append(per_call * 1e6)
    if rank == 0:
        print(f"{args.collective}, {args.bytes} B, world {world}: {args.passes} passes of {args.iters} calls, us")
        for name, (medians, loops) in figures.items():
            for label, v in (("median call", medians), ("loop per call", loops)):
                print(f"  {name:28s} {label:14s} least {min(v):7.1f}  median {statistics.median(v):7.1f}  "
                      f"most {max(v):7.1f}  | " + " ".join(f"{x:.0f}" for x in v))
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--collective", default="broadcast", help="a collective tune times (default broadcast)")
    p.add_argument("--algos", default="all", help="comma-separated algorithm names, or all")
    p.add_argument("-b", "--bytes", type=bench.parse_size, default=2048)
    p.add_argument("-n", "--iters", type=int, default=40)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--passes", type=int, default=12)
    args = p.parse_args(argv)
    launch.run(_rank, args.world, args)


if __name__ == "__main__":
    main()
