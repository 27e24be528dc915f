"""CUDA all_reduce and all_gather latency, LL against simple, eager against CUDA-graph replay.

    python benchmarks/gpu_latency.py --worlds 2,4 -b 8 -e 1M -f 2 --jsonl out.jsonl

Needs a CUDA build of tilecomm and, with several ranks on one GPU, the MPS
daemon (see scripts/gpu-latency). For every size it times, on one GPU shared
by the ranks:

- tilecomm float32 sum all_reduce in one group per entry: `ll` (the LL kernel,
  TILECOMM_PROTO=ll), `one_shot` and `two_shot` (that simple kernel), `auto`
  (what the selector's CUDA model picks), each over the cuda_ipc transport (GPU
  memory) and, as `hm_<entry>`, over host_mapped (shared host memory registered
  with the GPU, the PCIe path), and `ll_system_fence` (LL over cuda_ipc with
  system-scope fences, TILECOMM_CUDA_FENCE=system, where ranks sharing one GPU
  would use GPU scope); and all_gather_into_tensor (bytes are per rank)
  in the entries whose all_gather can run as a kernel (`ll`, `auto`; above the
  LL limit it is staged, which cannot be captured). Each record names, per
  entry, the kernel that ran (`kernels`) and the peer memory (`memory`), which
  `python -m tilecomm.tune --cuda-from` fits the CUDA model to;
- with --ops, every entry also called through tilecomm's operators
  (torch.ops.tilecomm.all_reduce_ / all_gather_into_tensor_out, Note [Operators]) instead of
  torch.distributed's functions, as `<entry>_op`;
- SymmetricMemory `one_shot_all_reduce` (TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1);
- with --fcollect, NVSHMEM's own all_gather (`nvshmemx_fcollectmem_on_stream` on symmetric tensors, as
  `all_gather:fcollect`); the ranks then set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / ranks, which
  NVSHMEM needs on a shared GPU.

Each path twice: "eager", a loop of back-to-back calls between two CUDA events
(the host's cost per call included, as an application sees it), and "graph",
the same loop captured once in a CUDA graph and replayed (the GPU's cost). The
figure is the time per call of the slowest rank, in microseconds, the median of
a few repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

from gpu_compare import symmetric_memory  # noqa: E402  (benchmarks/ is the script's directory)
from tilecomm import launch
from tilecomm.bench import parse_size, sizes
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


def _per_call(run, calls, reps, barrier):
    """Median over reps of (time of run()) / calls, in seconds; run() enqueues `calls` calls."""
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
    return statistics.median(times)


def _eager(fn, calls, reps, barrier):
    for _ in range(3):
        fn()

    def loop():
        for _ in range(calls):
            fn()

    return _per_call(loop, calls, reps, barrier)


def _graph(fn, calls, reps, barrier):
    fn()  # eager first: sets up transports outside the capture
    torch.cuda.synchronize()
    barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()  # warm-up replay
    t = _per_call(g.replay, calls, reps, barrier)
    del g
    return t


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return f"failed: {str(e).splitlines()[0][:80]}"


def _rank(rank, world, args):
    os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    if args.fcollect:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // world)  # before the GPU is touched
    import tilecomm  # noqa: F401  (registers the backend)
    from tilecomm import nvshmem

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    grid = list(sizes(args.minbytes, args.maxbytes, args.stepfactor))
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    groups = {}
    for name, env in GROUPS.items():
        if args.groups and name not in args.groups.split(","):
            continue
        os.environ.update(env)  # rank 0's values are read at group creation
        groups[name] = dist.new_group(backend="tilecomm")
        for k in env:
            os.environ.pop(k)

    symm = symmetric_memory(gloo, rank)
    top = max(1, max(grid) // 4)
    # NVSHMEM's fcollect works on symmetric tensors: made once, of the largest size.
    f32 = torch.float32
    sym = (nvshmem.symmetric_empty(top, dtype=f32), nvshmem.symmetric_empty(world * top, dtype=f32)) if args.fcollect else None

    def barrier():
        dist.barrier(group=gloo)

    calls, reps = args.calls, args.reps
    eager_names = args.eager.split(",") if args.eager else list(GROUPS)

    def eager(name):
        return name in eager_names

    out = open(args.jsonl, "a") if (args.jsonl and rank == 0) else None
    for nbytes in grid:
        n = max(1, nbytes // 4)
        row = {}
        x = torch.zeros(n, device=dev)  # sums stay zero however often they run
        gout = torch.empty(world * n, device=dev)
        kernels, memory = {}, {}
        # (entry, its group's name, group, through the operators)
        entries = [(name, name, g, False) for name, g in groups.items()]
        if args.ops:
            entries += [(name + "_op", name, g, True) for name, g in groups.items()]
        for name, base, g, use_op in entries:
            be = g._get_backend(torch.device("cuda"))
            if use_op:
                ar = lambda g=g: torch.ops.tilecomm.all_reduce_(x, "sum", g.group_name)  # noqa: E731
                ag = lambda g=g: torch.ops.tilecomm.all_gather_into_tensor_out(x, g.group_name, out=gout)  # noqa: E731
            else:
                ar = lambda g=g: dist.all_reduce(x, group=g)  # noqa: E731
                ag = lambda g=g: dist.all_gather_into_tensor(gout, x, group=g)  # noqa: E731
            if eager(base):
                row[f"all_reduce:{name}:eager"] = _try(lambda: _eager(ar, calls, reps, barrier))
            row[f"all_reduce:{name}:graph"] = _try(lambda: _graph(ar, calls, reps, barrier))
            kernels[f"all_reduce:{name}"] = be.cuda_last_kernel() or "staged"
            memory[name] = be.cuda_topology()["transport"]
            if base.removeprefix("hm_") in GATHER:
                if eager(base):
                    row[f"all_gather:{name}:eager"] = _try(lambda: _eager(ag, calls, reps, barrier))
                if nbytes <= LL_MAX_BYTES:  # larger ones are staged, which cannot be captured
                    row[f"all_gather:{name}:graph"] = _try(lambda: _graph(ag, calls, reps, barrier))
                kernels[f"all_gather:{name}"] = be.cuda_last_kernel() or "staged"
        if symm is not None:
            try:
                buf = symm.empty(n, dtype=torch.float32, device=dev)
                buf.zero_()
                symm.rendezvous(buf, gloo.group_name)
                fn = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", gloo.group_name)  # noqa: E731
                row["all_reduce:symm_one_shot:eager"] = _try(lambda: _eager(fn, calls, reps, barrier))
                row["all_reduce:symm_one_shot:graph"] = _try(lambda: _graph(fn, calls, reps, barrier))
                del buf
            except Exception as e:  # noqa: BLE001
                row["all_reduce:symm_one_shot:eager"] = f"failed: {str(e).splitlines()[0][:80]}"
        if sym is not None:
            fc = lambda: nvshmem.fcollect(sym[1][: world * n], sym[0][:n])  # noqa: E731
            row["all_gather:fcollect:eager"] = _try(lambda: _eager(fc, calls, reps, barrier))
            row["all_gather:fcollect:graph"] = _try(lambda: _graph(fc, calls, reps, barrier))
        del x, gout
        # The slowest rank's time per entry (failures stay as text).
        keys = sorted(k for k, v in row.items() if isinstance(v, float))
        t = torch.tensor([row[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        for k, v in zip(keys, t.tolist()):
            row[k] = v
        if rank == 0:
            cells = [f"{k}={v * 1e6:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(row.items())]
            print(f"world={world} bytes={nbytes} " + " ".join(cells), flush=True)
            if out:
                rec = dict(world=world, bytes=nbytes, calls=calls, reps=reps, kernels=kernels, memory=memory)
                rec.update({k: (v * 1e6 if isinstance(v, float) else v) for k, v in row.items()})
                out.write(json.dumps(rec) + "\n")
                out.flush()
    if rank == 0:
        for proto, g in groups.items():
            be = g._get_backend(torch.device("cuda"))
            print(f"# {proto}: {be.cuda_status()}", flush=True)
    if out:
        out.close()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=8)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=1 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=2)
    ap.add_argument("--calls", type=int, default=50, help="calls per timed loop (and per captured graph)")
    ap.add_argument("--reps", type=int, default=5, help="timed loops per entry (median)")
    ap.add_argument("--groups", default="", help="entries to run, comma-separated (default: " + ",".join(GROUPS) + ")")
    ap.add_argument("--eager", default="", help="entries also timed eagerly, comma-separated (default: all)")
    ap.add_argument("--fcollect", action="store_true", help="also NVSHMEM's fcollect (all_gather)")
    ap.add_argument("--ops", action="store_true", help="also every entry through tilecomm's operators")
    ap.add_argument("--jsonl", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_latency: no CUDA device")
    for w in (int(x) for x in args.worlds.split(",")):
        launch.run(_rank, w, args)


if __name__ == "__main__":
    main()
