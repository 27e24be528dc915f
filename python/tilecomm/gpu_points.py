"""Times tilecomm's CUDA all_reduce and all_gather kernels, one group per forced kernel.

Shared by ``python -m tilecomm.tune --device cuda`` (the points the CUDA model is fitted to) and
``benchmarks/gpu_latency.py`` (which adds other libraries alongside). An *entry* is a group made with
its own ``TILECOMM_*`` settings (``GROUPS``): ``ll`` (the LL kernel), ``one_shot`` and ``two_shot``
(that simple kernel), ``auto`` (the CUDA model's pick), each over cuda_ipc (GPU memory) and, as
``hm_<entry>``, over host_mapped (shared host memory, the PCIe path), and ``nvshmem_push`` /
``nvshmem_pull`` (NVSHMEM's all_gather and reduce_scatter kernels forced). A record names, per entry,
the kernel that ran (``kernels``) and its peer memory (``memory``); ``tilecomm.cuda_model.samples``
reads the ``graph`` times of such records, and for NVSHMEM's kernels the ``eager`` ones where a
capture was refused (``cuda_model.kernel_time``).

Each path is timed as a loop of back-to-back calls between two CUDA events: "eager" (the host's cost
per call included) or "graph" (the same loop captured once in a CUDA graph and replayed: the GPU's
cost). The figure is the time per call of the slowest rank, the median of ``reps`` loops; tune's
points keep the fastest loop instead (``pick=min``): a loop that caught a descheduled rank only
adds time, and would otherwise stay in the points the model is fitted to.
"""

from __future__ import annotations

import json
import os
import statistics

import torch
import torch.distributed as dist

from tilecomm import settings
from tilecomm._dist import all_gather_single, reduce_scatter_single
from tilecomm.cuda_model import LL_MAX_BYTES

# entry name -> the group's TILECOMM_* settings; "hm_<name>": the same over host_mapped
_BASE = {
    "ll": {"TILECOMM_PROTO": "ll"},
    "one_shot": {"TILECOMM_PROTO": "simple", "TILECOMM_CUDA_ALLREDUCE": "one_shot"},
    "two_shot": {"TILECOMM_PROTO": "simple", "TILECOMM_CUDA_ALLREDUCE": "two_shot"},
    "auto": {},
}
GROUPS = {**_BASE, **{f"hm_{k}": {**v, "TILECOMM_TRANSPORT": "host_mapped"} for k, v in _BASE.items()},
          # LL with system-scope fences where GPU scope would do (Note [Fence scope]), for comparison
          "ll_system_fence": {"TILECOMM_PROTO": "ll", "TILECOMM_CUDA_FENCE": "system"}}
GATHER = ("ll", "auto", "ll_system_fence")  # entries whose all_gather runs as a kernel (else it is staged)
# What tune fits the CUDA model to: every forced kernel over both memories.
FIT_ENTRIES = ("ll", "one_shot", "two_shot", "hm_ll", "hm_one_shot", "hm_two_shot")
# NVSHMEM's all_gather and reduce_scatter kernels, forced. They are timed eagerly and under graph replay;
# tune fits them to the graph times (cuda_model.kernel_time), and to the eager ones, host included, where
# there are none: put-with-signal, which a group without peer addresses moves data with, cannot be
# captured in a CUDA graph (Note [NVSHMEM capture] in backend/cuda_glue.cpp).
NVSHMEM_GROUPS = {"nvshmem_push": {"TILECOMM_ALGO": "nvshmem_push"}, "nvshmem_pull": {"TILECOMM_ALGO": "nvshmem_pull"}}


def per_call(run, calls, reps, barrier, pick=statistics.median):
    """pick (the median, or min) over reps of (time of run()) / calls, in seconds; run() enqueues
    `calls` calls."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return pick(times)


def eager(fn, calls, reps, barrier, pick=statistics.median):
    for _ in range(3):
        fn()

    def loop():
        for _ in range(calls):
            fn()

    return per_call(loop, calls, reps, barrier, pick)


def graph(fn, calls, reps, barrier, pick=statistics.median):
    fn()  # eager first: sets up transports outside the capture
    torch.cuda.synchronize()
    barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()  # warm-up replay
    t = per_call(g.replay, calls, reps, barrier, pick)
    del g
    return t


def attempt(fn):
    """fn()'s time, or the first line of its error as "failed: ..."."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return f"failed: {str(e).splitlines()[0][:80]}"


def make_groups(names, table=GROUPS):
    """{entry: tilecomm group} for the entries of `table` named (every rank, in the same order)."""
    groups = {}
    for name in names:
        with settings.overriding(table[name]):  # rank 0's values are read at group creation
            groups[name] = dist.new_group(backend="tilecomm")
    return groups


def time_entries(entries, x, gout, calls, reps, barrier, timed_eagerly, pick=statistics.median):
    """Times all_reduce of x (and all_gather into gout, for GATHER entries) per entry.

    entries: (entry name, its group's name in GROUPS, group, through the operators). Returns (row,
    kernels, memory): row maps "<collective>:<entry>:<eager|graph>" to seconds (or a failure's
    text); kernels maps "<collective>:<entry>" to the kernel that ran; memory maps an entry to its
    group's peer memory. pick: per_call's."""
    row, kernels, memory = {}, {}, {}
    for name, base, g, use_op in entries:
        be = g._get_backend(torch.device("cuda"))
        if use_op:
            ar = lambda g=g: torch.ops.tilecomm.all_reduce_(x, "sum", g.group_name)  # noqa: E731
            ag = lambda g=g: torch.ops.tilecomm.all_gather_into_tensor_out(x, g.group_name, out=gout)  # noqa: E731
        else:
            ar = lambda g=g: dist.all_reduce(x, group=g)  # noqa: E731
            ag = lambda g=g: all_gather_single(gout, x, group=g)  # noqa: E731
        if timed_eagerly(base):
            row[f"all_reduce:{name}:eager"] = attempt(lambda: eager(ar, calls, reps, barrier, pick))
        row[f"all_reduce:{name}:graph"] = attempt(lambda: graph(ar, calls, reps, barrier, pick))
        kernels[f"all_reduce:{name}"] = be.cuda_last_kernel() or "staged"
        memory[name] = be.cuda_topology()["transport"]
        if base.removeprefix("hm_") in GATHER:
            ran = timed_eagerly(base)
            if ran:
                row[f"all_gather:{name}:eager"] = attempt(lambda: eager(ag, calls, reps, barrier, pick))
            if x.numel() * x.element_size() <= LL_MAX_BYTES:  # the LL kernel's range (above it, other kernels)
                ran = True
                row[f"all_gather:{name}:graph"] = attempt(lambda: graph(ag, calls, reps, barrier, pick))
            if ran:  # else the last kernel is all_reduce's
                kernels[f"all_gather:{name}"] = be.cuda_last_kernel() or "staged"
    return row, kernels, memory


def slowest(row, group):
    """row with every time replaced by the slowest rank's (over `group`); failures stay as text."""
    keys = sorted(k for k, v in row.items() if isinstance(v, float))
    t = torch.tensor([row[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return {**row, **dict(zip(keys, t.tolist()))}


def record(world, nbytes, calls, reps, kernels, memory, row) -> dict:
    """One JSON record of a size: times in microseconds."""
    rec = dict(world=world, bytes=nbytes, calls=calls, reps=reps, kernels=kernels, memory=memory)
    rec.update({k: (v * 1e6 if isinstance(v, float) else v) for k, v in row.items()})
    return rec


def time_nvshmem(groups, x, big, calls, reps, barrier, pick=statistics.median):
    """Eager and CUDA-graph times of all_gather (x -> big) and reduce_scatter (big -> x) per NVSHMEM entry
    of `groups` (a capture refused, as put-with-signal's, is recorded as failed); (row, kernels, memory)
    as time_entries'."""
    row, kernels, memory = {}, {}, {}
    for name, g in groups.items():
        be = g._get_backend(torch.device("cuda"))
        for coll, fn in (("all_gather", lambda g=g: all_gather_single(big, x, group=g)),
                         ("reduce_scatter", lambda g=g: reduce_scatter_single(x, big, group=g))):
            row[f"{coll}:{name}:eager"] = t = attempt(lambda fn=fn: eager(fn, calls, reps, barrier, pick))
            if isinstance(t, float):  # else the last kernel is an earlier call's
                kernels[f"{coll}:{name}"] = be.cuda_last_kernel() or "staged"
                row[f"{coll}:{name}:graph"] = attempt(lambda fn=fn: graph(fn, calls, reps, barrier, pick))
        memory[name] = "nvshmem"
    return row, kernels, memory


def fit_points(rank, world, path, grid, calls, reps):
    """tune's worker: CUDA-graph times (the fastest of reps loops) of every FIT_ENTRIES kernel at every
    size of grid (float32 sum), one record per size appended to `path` by rank 0."""
    def measure(groups, x, big, barrier):
        entries = [(name, name, g, False) for name, g in groups.items()]
        return time_entries(entries, x, big, calls, reps, barrier, lambda _: False, min)

    _points(rank, world, path, grid, calls, reps, {k: GROUPS[k] for k in FIT_ENTRIES}, measure)


def nvshmem_fit_points(rank, world, path, grid, calls, reps):
    """tune's worker for NVSHMEM's kernels: eager and graph times (the fastest of reps loops) of all_gather and
    reduce_scatter (float32 sum; each size of grid is the bytes of one rank's block) with each
    NVSHMEM_GROUPS kernel forced, one record per size appended to `path` by rank 0. Ranks that share a
    GPU need MPS and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set before they start (NVSHMEM's collectives
    abort otherwise)."""
    _points(rank, world, path, grid, calls, reps, NVSHMEM_GROUPS,
            lambda groups, x, big, barrier: time_nvshmem(groups, x, big, calls, reps, barrier, min))


def _points(rank, world, path, grid, calls, reps, table, measure):
    """Joins the world, makes the groups of `table` (entry -> settings) and, per size of grid, appends
    to `path` (rank 0) the record of measure(groups, x, big, barrier) -> (row, kernels, memory), with
    the slowest rank's times (x: the size's float32 zeros, big: world times as many)."""
    import tilecomm  # noqa: F401,PLC0415  (registers the backend)

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    groups = make_groups(table, table)

    def barrier():
        dist.barrier(group=gloo)

    dev = torch.device("cuda", torch.cuda.current_device())
    with open(path, "a") if rank == 0 else open(os.devnull, "w") as out:
        for nbytes in grid:
            n = max(1, nbytes // 4)
            x = torch.zeros(n, device=dev)  # sums stay zero however often they run
            big = torch.zeros(world * n, device=dev)
            row, kernels, memory = measure(groups, x, big, barrier)
            row = slowest(row, gloo)
            out.write(json.dumps(record(world, nbytes, calls, reps, kernels, memory, row)) + "\n")
            out.flush()
    torch.cuda.synchronize()
    dist.destroy_process_group()
