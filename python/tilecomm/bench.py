"""nccl-tests-style benchmark of torch.distributed collectives.

    python -m tilecomm.bench -b 8 -e 64M -f 2 --np 4 --backend tilecomm,gloo -c 1

Spawns its own ranks (or runs under torchrun) and prints, per collective,
backend and size, the nccl-tests columns (size, count, type, redop, root,
time(us), algbw, busbw, #wrong; time is nccl-tests' average over back-to-back
calls, the slowest rank's) plus p50/p99 of each call's time (the slowest rank's), and the time ratio to the last backend listed (tilecomm/gloo by default). ``--jsonl``
writes one JSON record per row. Bus bandwidth uses nccl-tests' factors:
all_reduce 2(p-1)/p; all_gather, reduce_scatter, all_to_all (p-1)/p;
broadcast, reduce 1. gather, scatter and barrier are timed when named in
``--collective`` (bus factor 1; a barrier moves no bytes).

``--device cuda`` puts the buffers on the GPU (rank r on GPU r % count; with
``--backend tilecomm,nccl`` the ratio is to NCCL): the mean is nccl-tests' (one
synchronize after the back-to-back calls), the percentiles come from a second
loop that synchronizes after each call. ``--graph`` (CUDA) captures the
``-n`` calls in one CUDA graph and times its replay; ``--replays R`` replays it R
times and keeps the fastest replay (one that caught a descheduled rank is dropped).

``--hosts 2x4`` (or a comma list of one name per rank) gives the ranks
simulated host names (TILECOMM_HOSTNAME): shared memory inside a host, TCP
between. ``--link-bytes`` adds a column with the payload bytes the busiest rank
sent over TCP per call (tilecomm.stats), the traffic that would cross hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from tilecomm._dist import all_gather_single, reduce_scatter_single

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]
# Also timed when named (and by tilecomm.tune); not part of "all".
MORE_COLLECTIVES = ["gather", "scatter", "barrier"]
BLOCKED = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")  # n is p blocks, one per rank
DTYPES = {
    "float": torch.float32,
    "float32": torch.float32,
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "double": torch.float64,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def bus_factor(coll: str, p: int) -> float:
    if coll == "all_reduce":
        return 2 * (p - 1) / p
    if coll in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0


def sizes(lo: int, hi: int, factor: int):
    n = lo
    while n <= hi:
        yield n
        n = n * factor if factor > 1 else n + max(1, lo)


class Case:
    """Buffers and one call of a collective on a total buffer of `nbytes`."""

    def __init__(self, coll, nbytes, dtype, op, rank, world, group, device="cpu"):
        self.coll, self.op, self.rank, self.world, self.group = coll, op, rank, world, group
        self.device = torch.device(device)
        esize = torch.empty((), dtype=dtype).element_size()
        per_rank = coll in BLOCKED
        count = max(nbytes // esize, 0) if coll != "barrier" else 0
        if per_rank:
            count = -(-count // world) * world  # a whole block per rank
        self.count = count
        self.nbytes = count * esize
        self.dtype = dtype
        blk = count // world if per_rank else count
        self.start = self._pattern(count if coll in ("reduce_scatter", "all_to_all", "scatter") else blk)
        self.inp = self.start.clone()
        if coll in ("all_gather", "all_to_all"):
            self.out = torch.empty(count, dtype=dtype, device=self.device)
        elif coll in ("reduce_scatter", "scatter"):
            self.out = torch.empty(blk, dtype=dtype, device=self.device)
        elif coll == "gather":
            self.out = [torch.empty(blk, dtype=dtype, device=self.device) for _ in range(world)] if rank == 0 else None
        else:
            self.out = self.inp

    def _pattern(self, n):
        # Small integers: exact in every dtype and under sum for any world size.
        base = (torch.arange(n, dtype=torch.int64) % 7 + self.rank + 1)
        return base.to(self.dtype).to(self.device)

    def reset(self):
        if self.coll in ("all_reduce", "reduce", "broadcast"):
            self.inp.copy_(self.start)

    def run(self):
        c, g = self.coll, self.group
        if c == "all_reduce":
            dist.all_reduce(self.inp, op=self.op, group=g)
        elif c == "all_gather":
            all_gather_single(self.out, self.inp, group=g)
        elif c == "reduce_scatter":
            reduce_scatter_single(self.out, self.inp, op=self.op, group=g)
        elif c == "broadcast":
            dist.broadcast(self.inp, src=0, group=g)
        elif c == "reduce":
            dist.reduce(self.inp, dst=0, op=self.op, group=g)
        elif c == "all_to_all":
            dist.all_to_all_single(self.out, self.inp, group=g)
        elif c == "gather":
            dist.gather(self.inp, self.out, dst=0, group=g)
        elif c == "scatter":
            dist.scatter(self.out, list(self.inp.chunk(self.world)) if self.rank == 0 else None, src=0, group=g)
        elif c == "barrier":
            dist.barrier(group=g)

    def result(self):
        return torch.cat(self.out) if isinstance(self.out, list) else self.out


def expected(case: Case):
    """Closed-form result of one call from freshly reset buffers (SUM only), or None."""
    p, dt, n = case.world, case.dtype, case.count

    def pattern(r, m):
        return (torch.arange(m, dtype=torch.int64) % 7 + r + 1).to(dt)

    c = case.coll
    if c == "all_reduce" or (c == "reduce" and case.rank == 0):
        return sum(pattern(r, n).to(torch.float64) for r in range(p)).to(dt) if p else None
    if c == "broadcast":
        return pattern(0, n)
    if c == "all_gather":
        return torch.cat([pattern(r, n // p) for r in range(p)])
    if c == "reduce_scatter":
        full = sum(pattern(r, n).to(torch.float64) for r in range(p))
        return full[case.rank * (n // p) : (case.rank + 1) * (n // p)].to(dt)
    if c == "all_to_all":
        b = n // p
        return torch.cat([pattern(r, n)[case.rank * b : (case.rank + 1) * b] for r in range(p)])
    if c == "gather" and case.rank == 0:
        return torch.cat([pattern(r, n // p) for r in range(p)])
    if c == "scatter":
        return pattern(0, n)[case.rank * (n // p) : (case.rank + 1) * (n // p)]
    return None


def time_case(case: Case, iters: int, warmup: int, timing_group, graph: bool = False, replays: int = 1):
    """(mean, per-iteration times): nccl-tests' method, the wall time of `iters`
    back-to-back calls divided by `iters`, the slowest rank's; and each call's
    own time, the slowest rank's, for the percentiles. With `graph`, the calls are
    captured once and the fastest of `replays` replays is the time of each."""
    cuda = case.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times = [0.0] * (iters + 1)  # a plain list: bookkeeping stays out of the timed loop's way
    dist.barrier(group=timing_group)
    # Warm-up after the barrier: the barrier releases ranks at different moments
    # (by up to a millisecond with Gloo); these calls absorb that skew.
    for _ in range(warmup):
        case.run()
    sync()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                case.run()
        sync()
        fastest = float("inf")
        for _ in range(replays):
            dist.barrier(group=timing_group)
            start = time.perf_counter()
            g.replay()
            sync()
            fastest = min(fastest, (time.perf_counter() - start) / max(iters, 1))
        times = [fastest] * (iters + 1)
    else:
        start = time.perf_counter()
        for i in range(iters):
            t0 = time.perf_counter()
            case.run()
            times[i] = time.perf_counter() - t0
        sync()
        times[iters] = (time.perf_counter() - start) / max(iters, 1)
        if cuda:  # each call's own time needs a synchronize after it
            for i in range(iters):
                t0 = time.perf_counter()
                case.run()
                sync()
                times[i] = time.perf_counter() - t0
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=timing_group)
    return float(t[iters]), t[:iters]


def check_case(case: Case, timing_group):
    case.reset()
    case.run()
    exp = expected(case)
    wrong = 0
    if exp is not None:
        wrong = int((case.result().cpu().to(torch.float64) != exp.to(torch.float64)).sum())
    t = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(t, group=timing_group)
    return int(t)


def _print_rows(coll, world, args, rows, out):
    """One line per backend; ratio = this backend's mean time / the last backend's (Gloo by default)."""
    means = [t[0] for _, _, t, _ in rows if t is not None]
    ref = means[-1] if means else None
    for b, case, timing, wrong in rows:
        if timing is None:
            print(f"{b:>30} {case.nbytes:>11} failed: {wrong}")
            continue
        mean, times = timing
        p50, p99 = float(times.quantile(0.5)), float(times.quantile(0.99))
        algbw = case.nbytes / mean / 1e9 if mean > 0 else 0.0
        busbw = algbw * bus_factor(coll, world)
        root = 0 if coll in ("broadcast", "reduce", "gather", "scatter") else -1
        redop = args.op if coll in ("all_reduce", "reduce_scatter", "reduce") else "none"
        ratio = mean / ref if ref else float("nan")
        tcp = getattr(case, "tcp_bytes", None)
        print(
            f"{b:>30} {case.nbytes:>11} {case.count:>10} {args.datatype:>8} {redop:>5} {root:>4} "
            f"{mean * 1e6:>10.2f} {algbw:>8.3f} {busbw:>8.3f} {wrong:>6} {p50 * 1e6:>9.2f} "
            f"{p99 * 1e6:>9.2f} {ratio:>6.3f}" + ("" if not args.link_bytes else f" {tcp if tcp is not None else float('nan'):>11.0f}"),
            flush=True,
        )
        if out:
            rec = dict(
                collective=coll, backend=b, world=world, bytes=case.nbytes, count=case.count,
                dtype=args.datatype, op=redop, time_us=mean * 1e6, p50_us=p50 * 1e6, p99_us=p99 * 1e6,
                algbw_gbs=algbw, busbw_gbs=busbw, wrong=wrong, ratio=ratio,
            )
            if args.hosts:
                rec["hosts"] = args.hosts
            if args.device != "cpu":
                rec["device"], rec["graph"] = args.device, args.graph
                if args.graph:
                    rec["replays"] = args.replays
            used = _peer_memory(case.group) if args.device == "cuda" and b.startswith("tilecomm") else None
            if used or os.environ.get("TILECOMM_TRANSPORT"):
                rec["transport"] = used or os.environ["TILECOMM_TRANSPORT"]
            if tcp is not None:
                rec["tcp_bytes_per_call"] = tcp
            out.write(json.dumps(rec) + "\n")
            out.flush()


def _algo_groups(coll, spec, world):
    """{"tilecomm:<algo>": group} for each algorithm of coll named in spec ("all" or a comma list)."""
    from tilecomm import algorithms  # noqa: PLC0415

    wanted = [a.short for a in algorithms.for_collective(coll)] if spec == "all" else spec.split(",")
    groups = {}
    for a in algorithms.for_collective(coll):
        if a.short in wanted or a.name in wanted:
            # Rank 0's settings are read at group creation: this group runs only this algorithm.
            os.environ["TILECOMM_ALGO"] = f"{coll}:{a.short}"
            groups[f"tilecomm:{a.short}"] = dist.new_group(backend="tilecomm")
    os.environ.pop("TILECOMM_ALGO", None)
    return groups


def host_names(spec: str, world: int) -> list[str]:
    """--hosts: "HxG" (H hosts of G consecutive ranks) or one name per rank, comma-separated."""
    if "x" in spec and "," not in spec:
        h, g = (int(v) for v in spec.split("x"))
        names = [f"host{r // g}" for r in range(h * g)]
    else:
        names = spec.split(",")
    if len(names) != world:
        raise SystemExit(f"--hosts {spec!r} names {len(names)} ranks, but --np is {world}")
    return names


def _tcp_sent(group):
    import tilecomm  # noqa: PLC0415

    return tilecomm.stats(group)["tcp"]["bytes_sent"]


def _peer_memory(group):
    """The peer memory a tilecomm group's CUDA kernels used, where it reports one."""
    import tilecomm  # noqa: PLC0415

    return tilecomm.gpu_topology(group).get("transport")


def _worker(rank, world, args):
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if args.hosts:
        os.environ["TILECOMM_HOSTNAME"] = host_names(args.hosts, world)[rank]
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    if "tilecomm" in backends:
        import tilecomm  # noqa: F401,PLC0415
    dist.init_process_group("gloo" if "tilecomm" not in backends else "tilecomm", rank=rank, world_size=world)
    base = {}
    for b in backends:
        base[b] = dist.group.WORLD if (b == "tilecomm" or len(backends) == 1) else dist.new_group(backend=b)
    timing = base.get("gloo") or dist.new_group(backend="gloo")
    dtype = DTYPES[args.datatype]
    op = OPS[args.op]
    colls = COLLECTIVES if args.collective == "all" else args.collective.split(",")
    out = open(args.jsonl, "a") if (args.jsonl and rank == 0) else None
    for coll in colls:
        groups = dict(base)
        if args.algo and "tilecomm" in backends:
            extra = _algo_groups(coll, args.algo, world)
            # Order: tilecomm (auto), each algorithm, then the other backends (the ratio's base last).
            groups = {"tilecomm": base["tilecomm"], **extra, **{b: g for b, g in base.items() if b != "tilecomm"}}
        if rank == 0:
            print(f"\n# {coll}  world={world}  dtype={args.datatype}  op={args.op}")
            print(
                f"#{'backend':>29} {'size':>11} {'count':>10} {'type':>8} {'redop':>5} {'root':>4} "
                f"{'time(us)':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6} {'p50(us)':>9} {'p99(us)':>9} {'ratio':>6}"
                + (f" {'tcpB/call':>11}" if args.link_bytes else "")
            )
        for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor):
            rows = []
            for b in groups:
                case = Case(coll, nbytes, dtype, op, rank, world, groups[b], args.device)
                counted = args.link_bytes and b.startswith("tilecomm")
                try:
                    before = _tcp_sent(groups[b]) if counted else 0
                    mean, times = time_case(case, args.iters, args.warmup, timing, args.graph, args.replays)
                    if counted:
                        sent = torch.tensor([(_tcp_sent(groups[b]) - before) / (args.iters + args.warmup)])
                        dist.all_reduce(sent, op=dist.ReduceOp.MAX, group=timing)
                        case.tcp_bytes = float(sent)
                    wrong = check_case(case, timing) if args.check else 0
                except (RuntimeError, ValueError) as e:
                    rows.append((b, case, None, str(e).splitlines()[0][:80]))
                    continue
                rows.append((b, case, (mean, times), wrong))
            if rank == 0:
                _print_rows(coll, world, args, rows, out)
    if out:
        out.close()
    dist.destroy_process_group()


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tilecomm.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=1 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    p.add_argument("-o", "--op", default="sum", choices=sorted(OPS))
    p.add_argument("--np", type=int, default=4, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--backend", default="tilecomm,gloo", help="comma-separated; ratio is relative to the last")
    p.add_argument(
        "--collective",
        default="all",
        help=f"comma-separated of {','.join(COLLECTIVES + MORE_COLLECTIVES)}, or all (= {','.join(COLLECTIVES)})",
    )
    p.add_argument("--algo", default="", help="also time tilecomm with each named algorithm forced (or 'all')")
    p.add_argument("--jsonl", default="", help="append one JSON record per row to this file")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the buffers live")
    p.add_argument("--graph", action="store_true", help="CUDA: time the replay of a graph of -n captured calls")
    p.add_argument("--replays", type=int, default=1, help="--graph: replays of the graph; the fastest is kept")
    p.add_argument("--hosts", default="", help="simulated hosts: HxG, or one name per rank (comma-separated)")
    p.add_argument("--link-bytes", action="store_true", help="add the busiest rank's TCP bytes per call")
    return p


def main(argv=None):
    from tilecomm import launch  # noqa: PLC0415

    ap = build_parser()
    args = ap.parse_args(argv)
    if args.graph and args.device != "cuda":
        ap.error("--graph needs --device cuda")
    if args.replays < 1 or (args.replays > 1 and not args.graph):
        ap.error("--replays takes a positive count, and more than one needs --graph")
    launch.run(_worker, args.np, args)


if __name__ == "__main__":
    sys.exit(main())
