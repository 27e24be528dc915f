"""CUDA all_reduce on one GPU shared by several ranks: tilecomm's paths against PyTorch SymmetricMemory.

    python benchmarks/gpu_compare.py --worlds 2,4 -b 1K -e 256M -f 4 --jsonl out.jsonl

Needs a CUDA build of tilecomm and, with several ranks on one GPU, the MPS
daemon (see scripts/gpu-test). In one run and with one timing method it times
sum all_reduce (float32; --dtype bfloat16 or float16 for the others) through:

- tilecomm with TILECOMM_CUDA_ALLREDUCE = auto, one_shot, two_shot, registered,
  staged (one group each; the cuda_ipc buffers are sized for the largest
  message; the forced paths with TILECOMM_PROTO=simple, auto with the LL kernel
  below TILECOMM_LL_BYTES and on registered tensors from
  TILECOMM_CUDA_REGISTER_BYTES, or, timed as a captured graph, from
  TILECOMM_CUDA_CAPTURE_REGISTER_BYTES);
- `tilecomm:auto_op`: the auto group called through its operator
  (torch.ops.tilecomm.all_reduce_, Note [Operators]) instead of dist.all_reduce;
- with --nvshmem, tilecomm with TILECOMM_CUDA_ALLREDUCE=nvshmem_two_shot on an ordinary tensor
  (`nvshmem_two_shot`: staged through its buffers) and on one made with tilecomm.symmetric_empty
  (`nvshmem_in_place`), and NVSHMEM's own reduction (`nvshmem:reduce`,
  nvshmemx_float_sum_reduce_on_stream from one symmetric tensor into another); the ranks then set
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / ranks, which NVSHMEM needs on a shared GPU (and which
  limits every process, SymmetricMemory's too, to its share of the SMs);
- SymmetricMemory `one_shot_all_reduce` and `two_shot_all_reduce_`
  (TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 lets ranks share the GPU);
- a device-to-device copy of the same size, for the HBM bound.

Timing (--timing barrier, the default): before each timed call, a device
synchronize and a Gloo barrier; the call alone is timed with CUDA events; the
median over iterations of the slowest rank. It includes the ranks' skew after
the barrier (a collective waits for the last rank to arrive). --timing loop is
nccl-tests' method: after one barrier and 3 warm-up calls (the last of which
ends on every rank at once, so the timed calls start in step), `iters` calls
back to back between two CUDA events, the time per call of the slowest rank;
each record also gives, per entry, the host's time per call in that loop
(`host_us`: where it is near the GPU's time, the host is the limit). --timing
graph is nccl-tests' -G: that loop captured once in a CUDA graph, each replay
started in step as the loop is, the fastest of 3 replays; the host's cost per
call is gone, so it times the GPU's work alone (the staging path, which the host
drives, is not captured). "copy" is
the HBM rate of every rank copying its buffer device-to-device at once, started
in step (copy_rate), and "bound" the time that rate gives the least traffic an
all_reduce moves (2 x world x bytes: each input read once, each output written
once); both mean something only from a few MB up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from tilecomm import launch, nvshmem
from tilecomm.bench import parse_size, sizes

PATHS = ["auto", "one_shot", "two_shot", "registered", "staged"]
HOST = {}  # "last": the last loop's host time per call (s)


def _timed(fn, iters, barrier):
    HOST["last"] = None  # (measured by the loop only)
    times = []
    for i in range(iters + 3):
        torch.cuda.synchronize()
        barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= 3:  # warm-up calls
            times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def _timed_loop(fn, iters, barrier, align=None):
    # The warm-up calls come after the barrier: the last one ends on every rank at about the same
    # time (a collective waits for all ranks), so the ranks' streams start the timed calls in step
    # and the host barrier's skew is not paid inside the loop. What waits for no one (a copy)
    # passes `align`, a collective that does that for it.
    torch.cuda.synchronize()
    barrier()
    for _ in range(3):
        fn()
    if align is not None:
        align()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    HOST["last"] = (time.perf_counter() - t0) / iters  # the host's cost per call, when it is behind
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / iters


def _timed_graph(fn, iters, barrier, align=None, replays=3):
    # nccl-tests' -G: the loop's `iters` calls captured once in a CUDA graph and replayed, so the
    # host's cost per call is gone and only the GPU's is timed. Each replay starts in step as the
    # loop does (barrier, then a call that ends on every rank at once); the fastest replay is kept.
    fn()  # eager first: sets up transports outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    HOST["last"] = None
    best = float("inf")
    for _ in range(replays):
        torch.cuda.synchronize()
        barrier()
        (align or fn)()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3 / iters)
    del g
    return best


def timer(args):
    """The timing method --timing names."""
    return {"loop": _timed_loop, "graph": _timed_graph}.get(args.timing, _timed)


def copy_rate(nbytes, world, dev, iters, barrier, align, group):
    """Bytes per second of HBM traffic (read + write) of every rank copying nbytes device-to-device at
    once, `iters` copies back to back, timed as --timing loop times (_timed_loop): after the barrier
    and the warm-up copies, a small collective (`align`) ends on every rank at about the same time, so the copies queued behind it start together and share the GPU
    (under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE one rank alone could not fill it); the slowest rank's
    time per copy moves 2 x world x nbytes. The same value on every rank."""
    src, dst = torch.ones(nbytes // 4, device=dev), torch.empty(nbytes // 4, device=dev)
    t = torch.tensor([_timed_loop(lambda: dst.copy_(src), iters, barrier, align)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    del src, dst
    return 2 * world * nbytes / float(t[0])


def micro(host):
    """Host times per call (s) in microseconds, where the loop timing measured them."""
    return {k: round(v * 1e6, 1) for k, v in host.items() if v is not None}


def slowest(row, group):
    """Replaces each time (s) in `row` by the slowest rank's (failures stay as text)."""
    keys = sorted(k for k, v in row.items() if isinstance(v, float))
    t = torch.tensor([row[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    for k, v in zip(keys, t.tolist()):
        row[k] = v


def emit(out, rank, rec, row, cell=lambda k, v: f"{k}={v * 1e6:.1f}us"):
    """On rank 0: one line (rec's world, bytes, copy rate and bound, then every entry of row through `cell`)
    and, with `out`, one JSON record of rec and row (times in microseconds)."""
    if rank != 0:
        return
    cells = [cell(k, v) if isinstance(v, float) else f"{k}={v}" for k, v in sorted(row.items())]
    print(f"world={rec['world']} bytes={rec['bytes']} copy={rec['copy_gbs']:.0f}GB/s bound={rec['bound_us']:.1f}us "
          + " ".join(cells), flush=True)
    if out:
        rec = dict(rec)
        rec.update({k: (v * 1e6 if isinstance(v, float) else v) for k, v in row.items()})
        out.write(json.dumps(rec) + "\n")
        out.flush()


def parser(doc):
    """The command line the one-GPU comparisons share (worlds, nccl-tests' size flags, iterations, records)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=1 << 10)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--timing", choices=["barrier", "loop", "graph"], default="barrier",
                    help="a barrier before each timed call (default), nccl-tests' back-to-back loop, or that "
                         "loop captured in a CUDA graph and replayed (nccl-tests' -G; the fastest of 3 replays)")
    return ap


def add_dtype(ap):
    """--dtype: the all_reduce's element type."""
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="the all_reduce's element type (default float32)")


def run_worlds(rank_fn, args, name):
    """rank_fn(rank, world, args) on `world` local ranks, for every world of args.worlds."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{name}: no CUDA device")
    for w in (int(x) for x in args.worlds.split(",")):
        launch.run(rank_fn, w, args)


def path_groups(paths):
    """{"tilecomm:PATH": a tilecomm group whose all_reduce takes TILECOMM_CUDA_ALLREDUCE=PATH} (the forced
    paths with TILECOMM_PROTO=simple, so no LL; auto with TILECOMM_PROTO=auto). Every rank calls it."""
    groups = {}
    for path in paths:
        os.environ["TILECOMM_CUDA_ALLREDUCE"] = path  # rank 0's value is read at group creation
        os.environ["TILECOMM_PROTO"] = "auto" if path == "auto" else "simple"  # forced paths: no LL
        groups[f"tilecomm:{path}"] = dist.new_group(backend="tilecomm")
    os.environ.pop("TILECOMM_CUDA_ALLREDUCE")
    os.environ.pop("TILECOMM_PROTO")
    return groups


def symmetric_buffer(symm, n, dtype, device, group_name):
    """A zeroed SymmetricMemory tensor of n elements, rendezvoused over group_name (every rank calls it)."""
    buf = symm.empty(n, dtype=dtype, device=device)
    buf.zero_()
    symm.rendezvous(buf, group_name)
    return buf


def symmetric_memory(gloo, rank):
    """PyTorch's SymmetricMemory module set up for `gloo`'s ranks, or None (said once) where it is unavailable."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(gloo.group_name)
        return symm_mem
    except Exception as e:  # noqa: BLE001
        if rank == 0:
            print(f"# SymmetricMemory unavailable: {type(e).__name__}: {e}", flush=True)
        return None


def _rank(rank, world, args):
    os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    grid = list(sizes(args.minbytes, args.maxbytes, args.stepfactor))
    if args.nvshmem:  # before the GPU is touched
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // world)
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(2 * max(grid) + (1 << 30)))
    import tilecomm  # (registers the backend)

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    os.environ["TILECOMM_CUDA_IPC_BYTES"] = str(max(grid))
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    groups = path_groups(PATHS + (["nvshmem_two_shot"] if args.nvshmem else []))

    symm = symmetric_memory(gloo, rank)
    nvs = groups.get("tilecomm:nvshmem_two_shot")
    heap = tilecomm.symmetric_empty(max(grid) // 4, dtype=torch.float32, group=nvs) if nvs else None
    heap_out = tilecomm.symmetric_empty(max(grid) // 4, dtype=torch.float32, group=nvs) if nvs else None

    def barrier():
        dist.barrier(group=gloo)

    timed = timer(args)

    out = open(args.jsonl, "a") if (args.jsonl and rank == 0) else None
    dtype = getattr(torch, args.dtype)
    for nbytes in grid:
        n = nbytes // dtype.itemsize
        row, host = {}, {}
        x = torch.zeros(n, device=dev, dtype=dtype)  # sums stay finite however often they run
        # the staging fallback takes 0.1-0.3 s per call from 64 MiB: timed up to 16 MiB only
        runs = [(name, g, x) for name, g in groups.items() if name != "tilecomm:staged" or nbytes <= (16 << 20)]
        if args.timing == "graph":
            runs = [r for r in runs if r[0] != "tilecomm:staged"]
        runs.insert(1, ("tilecomm:auto_op", groups["tilecomm:auto"], x))
        if heap is not None:
            runs.append(("tilecomm:nvshmem_in_place", nvs, heap[:n].zero_()))
            runs.append(("nvshmem:reduce", nvs, heap[:n]))
        for name, g, t in runs:
            if name == "nvshmem:reduce":
                call = lambda t=t: nvshmem.sum_reduce(heap_out[: t.numel()], t)  # noqa: E731
            elif name.endswith("_op"):
                call = lambda g=g, t=t: torch.ops.tilecomm.all_reduce_(t, "sum", g.group_name)  # noqa: E731
            else:
                call = lambda g=g, t=t: dist.all_reduce(t, group=g)  # noqa: E731
            try:
                row[name] = timed(call, args.iters, barrier)
                host[name] = HOST.get("last")
            except Exception as e:  # noqa: BLE001
                row[name] = f"failed: {str(e).splitlines()[0][:60]}"
        if symm is not None:
            try:
                buf = symmetric_buffer(symm, n, dtype, dev, gloo.group_name)
                row["symm_mem:one_shot"] = timed(
                    lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", gloo.group_name), args.iters, barrier
                )
                host["symm_mem:one_shot"] = HOST.get("last")
                row["symm_mem:two_shot"] = timed(
                    lambda: torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", gloo.group_name), args.iters, barrier
                )
                host["symm_mem:two_shot"] = HOST.get("last")
                del buf
            except Exception as e:  # noqa: BLE001
                row["symm_mem:one_shot"] = row.get("symm_mem:one_shot", f"failed: {str(e).splitlines()[0][:60]}")
                row.setdefault("symm_mem:two_shot", f"failed: {str(e).splitlines()[0][:60]}")
        del x
        slowest(row, gloo)
        tiny = torch.zeros(1, device=dev)
        rate = copy_rate(nbytes, world, dev, args.iters, barrier, lambda: dist.all_reduce(tiny, group=groups["tilecomm:auto"]), gloo)
        # 2 x world x bytes of HBM traffic: the least an all_reduce can move (each input read once,
        # each output written once).
        emit(out, rank, dict(world=world, bytes=nbytes, dtype=args.dtype, timing=args.timing, copy_gbs=rate / 1e9,
                             bound_us=2 * world * nbytes / rate * 1e6, host_us=micro(host)), row)
    if out:
        out.close()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main():
    ap = parser(__doc__)
    ap.add_argument("--nvshmem", action="store_true", help="also the NVSHMEM two-shot all_reduce")
    add_dtype(ap)
    args = ap.parse_args()
    if args.nvshmem and args.dtype != "float32":
        ap.error("--nvshmem times NVSHMEM's float32 reduction; it takes --dtype float32 only")
    run_worlds(_rank, args, "gpu_compare")


if __name__ == "__main__":
    main()
