"""What one all_reduce costs on the GPU under graph replay: its kernels' own time and the gaps between calls.

    python benchmarks/gpu_kernels.py --worlds 2,4 -b 64K -e 1M -f 4 -n 40 --jsonl out.jsonl

Needs a CUDA build of tilecomm and, with several ranks on one GPU, the MPS daemon
(`scripts/gpu-run benchmarks/gpu_kernels.py ...` starts it). For every size, each entry (tilecomm's
paths as gpu_compare.py makes them, and SymmetricMemory's one_shot_all_reduce and
two_shot_all_reduce_) is captured as -n calls in one CUDA graph, which every rank replays after a
Gloo barrier, rank 0 under torch.profiler. From the GPU activities rank 0 recorded (kernels, copies,
memsets) it gives, per entry:

- ``acts``: activities per call, and each one's name (template arguments left out);
- ``cycle_us``: the median time from one call's first activity to the next call's, what a call
  costs in a graph (gpu_compare.py --timing graph times about the same);
- ``busy_us``: the median time a call's activities run (the sum of their durations);
- ``gap_us``: cycle less busy, the time between calls when nothing of the entry runs on rank 0's
  side (the graph's launch of the next node, and the kernel's start and end);
- ``other``: activities of the replay whose count is not a multiple of the calls (left out of the above).

The first call of a replay waits for the ranks' skew after the barrier, so medians, not means. The
kernels of a rank include its waits for the peers, so a kernel's time is its own work plus the
slowest peer's lateness. Only rank 0's activities are seen. The command line is gpu_compare.py's;
--timing is not used (every entry is replayed from a graph).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import Counter

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_compare import add_dtype, parser, path_groups, run_worlds, symmetric_buffer, symmetric_memory  # noqa: E402
from tilecomm.bench import sizes  # noqa: E402

PATHS = ["auto", "one_shot", "two_shot", "registered"]


def _short(name: str) -> str:
    """A kernel's name without its return type, namespaces, template and call arguments; copies'
    and memsets' names as they are."""
    if name.startswith("void "):  # a kernel's signature
        name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
        name = name.split("<")[0].split("(")[0].split("::")[-1]
    return name


def summarize(acts: list[tuple[str, float, float]], iters: int) -> dict | None:
    """{acts, names, cycle_us, busy_us, gap_us, other} from one replay's activities (name, start, end;
    µs) of `iters` calls, or None where those that repeat every call do not split into iters calls.
    Activities whose name does not come a multiple of iters times are left out and named in `other`
    (work of the replay itself, such as the kernels with which torch's CUDAGraph.replay may first
    set its generators' state)."""
    counts = Counter(n for n, _, _ in acts)
    other = sorted(_short(n) for n, c in counts.items() if c % iters)
    acts = sorted((a for a in acts if counts[a[0]] % iters == 0), key=lambda a: a[1])
    if not acts:
        return None
    k = len(acts) // iters
    calls = [acts[i * k:(i + 1) * k] for i in range(iters)]
    if any([n for n, _, _ in call] != [n for n, _, _ in calls[0]] for call in calls):
        return None  # the calls' activities interleave: no split into calls
    cycle = [b[0][1] - a[0][1] for a, b in zip(calls, calls[1:])]
    busy = [sum(e - s for _, s, e in c) for c in calls]
    c, b = statistics.median(cycle) if cycle else float("nan"), statistics.median(busy)
    return dict(acts=k, names=[_short(n) for n, _, _ in calls[0]], cycle_us=c, busy_us=b, gap_us=c - b,
                other=other)


def _profiled_replay(fn, iters, barrier, rank):
    """The activities rank 0 recorded over one graph replay of `iters` calls of fn (other ranks: [])."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()  # eager first: sets up transports outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    barrier()
    g.replay()  # warm
    torch.cuda.synchronize()
    acts = []
    if rank == 0:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            barrier()
            g.replay()
            torch.cuda.synchronize()
        acts = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                if e.device_type == DeviceType.CUDA]
    else:
        barrier()
        g.replay()
        torch.cuda.synchronize()
    barrier()
    del g
    return acts


def _rank(rank, world, args):
    os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    grid = list(sizes(args.minbytes, args.maxbytes, args.stepfactor))
    import tilecomm  # noqa: F401  (registers the backend)

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    os.environ["TILECOMM_CUDA_IPC_BYTES"] = str(max(grid))
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    groups = path_groups(PATHS)
    symm = symmetric_memory(gloo, rank)
    out = open(args.jsonl, "a") if (args.jsonl and rank == 0) else None
    dtype = getattr(torch, args.dtype)

    def barrier():
        dist.barrier(group=gloo)

    for nbytes in grid:
        n = nbytes // dtype.itemsize
        x = torch.zeros(n, device=dev, dtype=dtype)
        calls = {name: (lambda g=g: dist.all_reduce(x, group=g)) for name, g in groups.items()}
        buf = None
        if symm is not None:
            buf = symmetric_buffer(symm, n, dtype, dev, gloo.group_name)
            calls["symm_mem:one_shot"] = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", gloo.group_name)
            calls["symm_mem:two_shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", gloo.group_name)
        for name, fn in calls.items():
            acts = _profiled_replay(fn, args.iters, barrier, rank)
            if rank != 0:
                continue
            s = summarize(acts, args.iters)
            if s is None:
                print(f"world={world} bytes={nbytes} {name}: {len(acts)} activities for {args.iters} calls", flush=True)
                continue
            print(f"world={world} bytes={nbytes} {name}: cycle={s['cycle_us']:.2f}us busy={s['busy_us']:.2f}us "
                  f"gap={s['gap_us']:.2f}us acts={s['acts']} ({', '.join(s['names'])})"
                  + (f" other: {', '.join(s['other'])}" if s["other"] else ""), flush=True)
            if out:
                out.write(json.dumps(dict(world=world, bytes=nbytes, dtype=args.dtype, entry=name, **s)) + "\n")
                out.flush()
        del x, buf
    if out:
        out.close()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main():
    ap = parser(__doc__)
    add_dtype(ap)
    args = ap.parse_args()
    run_worlds(_rank, args, "gpu_kernels")


if __name__ == "__main__":
    main()
