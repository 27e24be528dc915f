"""Where an eager CUDA collective spends its host time: per-call host cost and a profile of one call.

    python benchmarks/host_path.py --worlds 2,4 --bytes 1024 -n 200

Needs a CUDA build of tilecomm (with NVSHMEM for the fcollect row) and, with several ranks on one GPU, the
MPS daemon (`scripts/gpu-run benchmarks/host_path.py ...` starts it). For float32 all_gather_into_tensor and all_reduce of
--bytes per rank (tilecomm, auto selection) and NVSHMEM's fcollect, it measures on every rank:

- ``host_us``: wall time of -n back-to-back calls on the host divided by -n, the fastest of 5 such
  loops (the GPU work is a few microseconds per call, so the host is the bottleneck and this is its
  cost per call);
- ``event_us``: the timing of the comparison scripts (gpu_compare.py: a barrier, then one call between
  CUDA events), median over -n calls;

and, on rank 0, the host stages of the all_reduce and operator rows (tilecomm.host_stages: the
backend's part of a call, stage by stage) and torch.profiler's table of 50 calls (CPU time per
operator and per CUDA runtime call: how many event records, stream waits and launches one
collective makes).

The rows that take a tilecomm all_reduce apart by layers: ``backend`` calls the group's tilecomm
backend directly (a synchronous AllreduceOptions: no torch.distributed Python, no c10d dispatcher);
``op`` and ``op_all_gather`` are tilecomm's operators (torch.ops.tilecomm, through the dispatcher);
``symm_one_shot`` and ``symm_two_shot`` are SymmetricMemory's one_shot_all_reduce and
two_shot_all_reduce_, one operator each. For scale,
``event_record`` is torch.cuda.Event.record and ``capture_query`` torch.cuda.is_current_stream_capturing,
each called from Python (torch's Python around one runtime call; the profiler's table gives the
runtime calls' own cost).

With --paired A,B[,C...], the rows' host_us are set side by side in a way that machine drift cannot
move: --rounds rounds, each a loop of -n calls of every named row, in the order A B ... in even rounds
and reversed in odd ones (a steady drift then adds as much to each row); a round's figure per row is
the slowest rank's. It prints each row's median over the rounds and, for every row against the first,
the median and the 10th-90th percentiles of the per-round differences and how many rounds the first
was faster.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_compare import _timed, run_worlds, symmetric_buffer, symmetric_memory  # noqa: E402
from tilecomm.bench import parse_size  # noqa: E402


def _loop_time(fn, iters):
    """The host's time per call of one loop of `iters` back-to-back calls (the GPU drained after it)."""
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    took = time.perf_counter() - start
    torch.cuda.synchronize()
    return took / iters


def _host_cost(fn, iters, loops=5):
    """The host's time per call: the fastest of `loops` loops of `iters` back-to-back calls."""
    _loop_time(fn, 10)  # warm-up
    return min(_loop_time(fn, iters) for _ in range(loops))


def _round_order(rows, r):
    """The rows' order in round r: as named in even rounds, reversed in odd ones (a steady drift adds
    as much to every row over two rounds)."""
    order = list(range(rows))
    return order if r % 2 == 0 else order[::-1]


def _paired(calls, names, iters, rounds, gloo):
    """Per round, every named call's loop time (µs per call, the slowest rank's); orders alternate."""
    for name in names:
        _loop_time(calls[name], 10)  # warm-up
    times = torch.zeros(len(names), rounds, dtype=torch.float64)
    for r in range(rounds):
        for i in _round_order(len(names), r):
            dist.barrier(group=gloo)
            times[i, r] = _loop_time(calls[names[i]], iters) * 1e6
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=gloo)
    return times


def _paired_report(names, times):
    """Lines: each row's median, and every row against the first (median difference, p10-p90, wins)."""
    def q(x, *at):
        return torch.quantile(x, torch.tensor(at, dtype=x.dtype)).tolist()

    lines = [f"  {n:<14} median host_us={q(times[i], 0.5)[0]:7.2f}" for i, n in enumerate(names)]
    for i in range(1, len(names)):
        d = times[0] - times[i]
        lo, mid, hi = q(d, 0.1, 0.5, 0.9)
        wins = int((d < 0).sum().item())
        lines.append(f"  {names[0]} - {names[i]}: median {mid:+.2f} µs (p10 {lo:+.2f}, p90 {hi:+.2f}); "
                     f"{names[0]} faster in {wins} of {d.numel()} rounds")
    return lines


def _rank(rank, world, args):
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // world)  # before the GPU is touched (NVSHMEM)
    os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"  # SymmetricMemory: ranks share the GPU
    import tilecomm  # (registers the backend)
    from tilecomm import nvshmem

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    n = max(1, args.bytes // 4)
    x, out, y = torch.ones(n, device=dev), torch.empty(world * n, device=dev), torch.ones(n, device=dev)
    be = dist.group.WORLD._get_backend(dev)
    sync = dist.AllreduceOptions()
    sync.asyncOp = False  # as dist.all_reduce passes it (the options' default is asynchronous)
    ev = torch.cuda.Event()
    calls = {
        "all_gather": lambda: dist.all_gather_into_tensor(out, x),
        "all_reduce": lambda: dist.all_reduce(y),
        "backend": lambda: be.allreduce([y], sync).wait(),
        # the operator (Note [Operators]): the backend call without torch.distributed's Python
        "op": lambda: torch.ops.tilecomm.all_reduce_(y, "sum", dist.group.WORLD.group_name),
        "op_all_gather": lambda: torch.ops.tilecomm.all_gather_into_tensor_out(x, dist.group.WORLD.group_name, out=out),
        "add_": lambda: y.add_(0.0),  # one plain kernel launch, for scale
        "event_record": lambda: ev.record(),
        "capture_query": torch.cuda.is_current_stream_capturing,
    }
    symm = symmetric_memory(gloo, rank)
    if symm is not None:
        sbuf = symmetric_buffer(symm, n, torch.float32, dev, gloo.group_name)
        calls["symm_one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(sbuf, "sum", gloo.group_name)
        calls["symm_two_shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(sbuf, "sum", gloo.group_name)
    try:
        sx = nvshmem.symmetric_empty(n, dtype=torch.float32)
        so = nvshmem.symmetric_empty(world * n, dtype=torch.float32)
        calls["fcollect"] = lambda: nvshmem.fcollect(so, sx)
    except ValueError as e:
        if rank == 0:
            print(f"# no fcollect row: {e}")
    if args.paired:
        names = args.paired.split(",")
        unknown = [n for n in names if n not in calls]
        if unknown:
            raise SystemExit(f"host_path: --paired names unknown rows {unknown}; rows: {', '.join(calls)}")
        times = _paired(calls, names, args.iters, args.rounds, gloo)
        if rank == 0:
            print(f"# world {world}, {args.bytes} B: {args.rounds} paired rounds of {args.iters} calls per row")
            print("\n".join(_paired_report(names, times)), flush=True)
        if args.only_paired:
            dist.barrier(group=gloo)
            dist.destroy_process_group()
            return
    row = {}
    for name, fn in calls.items():
        host = _host_cost(fn, args.iters)
        event = _timed(fn, args.iters, lambda: dist.barrier(group=gloo))
        t = torch.tensor([host, event], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        row[name] = t.tolist()
    if rank == 0:
        print(f"world={world} bytes={args.bytes} last kernel={be.cuda_last_kernel()}")
        for name, (host, event) in row.items():
            print(f"  {name:<12} host_us={host * 1e6:7.1f}  event_us={event * 1e6:7.1f}")
    for name in ("all_reduce", "op", "op_all_gather"):  # Note [Host stages]: where the backend's part goes
        with tilecomm.host_stages() as rec:
            for _ in range(args.iters):
                calls[name]()
            torch.cuda.synchronize()
        if rank == 0:
            print(f"# world {world}, {name}: host stages of rank 0 over {args.iters} calls "
                  f"(the loop's time per call: {row[name][0] * 1e6:.1f} µs)")
            print(rec.table())
    for name in ("all_gather", "all_reduce", "op"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                calls[name]()
            torch.cuda.synchronize()
        if rank == 0:
            print(f"# world {world}, {name}: torch.profiler over 50 calls (times in total; divide by 50)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--bytes", type=parse_size, default=1024)
    ap.add_argument("-n", "--iters", type=int, default=200)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--paired", default="", help="rows to time in interleaved rounds, the first against the others")
    ap.add_argument("--rounds", type=int, default=40, help="rounds of --paired")
    ap.add_argument("--only-paired", action="store_true", help="stop after the --paired rounds")
    run_worlds(_rank, ap.parse_args(), "host_path")


if __name__ == "__main__":
    main()
