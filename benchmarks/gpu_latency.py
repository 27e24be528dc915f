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
  in the entries whose all_gather can run as a kernel (`ll`, `auto`), up to the
  LL buffer under graph replay. Each record names, per
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

import torch
import torch.distributed as dist

from gpu_compare import symmetric_buffer, symmetric_memory  # noqa: E402  (benchmarks/ is the script's directory)
from tilecomm import launch
from tilecomm.bench import parse_size, sizes
from tilecomm.gpu_points import GROUPS, attempt, eager, graph, make_groups, record, slowest, time_entries


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
    groups = make_groups([name for name in GROUPS if not args.groups or name in args.groups.split(",")])

    symm = symmetric_memory(gloo, rank)
    top = max(1, max(grid) // 4)
    # NVSHMEM's fcollect works on symmetric tensors: made once, of the largest size.
    f32 = torch.float32
    sym = (nvshmem.symmetric_empty(top, dtype=f32), nvshmem.symmetric_empty(world * top, dtype=f32)) if args.fcollect else None

    def barrier():
        dist.barrier(group=gloo)

    calls, reps = args.calls, args.reps
    eager_names = args.eager.split(",") if args.eager else list(GROUPS)
    out = open(args.jsonl, "a") if (args.jsonl and rank == 0) else None
    for nbytes in grid:
        n = max(1, nbytes // 4)
        x = torch.zeros(n, device=dev)  # sums stay zero however often they run
        gout = torch.empty(world * n, device=dev)
        # (entry, its group's name, group, through the operators)
        entries = [(name, name, g, False) for name, g in groups.items()]
        if args.ops:
            entries += [(name + "_op", name, g, True) for name, g in groups.items()]
        row, kernels, memory = time_entries(entries, x, gout, calls, reps, barrier, lambda name: name in eager_names)
        if symm is not None:
            try:
                buf = symmetric_buffer(symm, n, torch.float32, dev, gloo.group_name)
                fn = lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", gloo.group_name)  # noqa: E731
                row["all_reduce:symm_one_shot:eager"] = attempt(lambda: eager(fn, calls, reps, barrier))
                row["all_reduce:symm_one_shot:graph"] = attempt(lambda: graph(fn, calls, reps, barrier))
                del buf
            except Exception as e:  # noqa: BLE001
                row["all_reduce:symm_one_shot:eager"] = f"failed: {str(e).splitlines()[0][:80]}"
        if sym is not None:
            fc = lambda: nvshmem.fcollect(sym[1][: world * n], sym[0][:n])  # noqa: E731
            row["all_gather:fcollect:eager"] = attempt(lambda: eager(fc, calls, reps, barrier))
            row["all_gather:fcollect:graph"] = attempt(lambda: graph(fc, calls, reps, barrier))
        del x, gout
        row = slowest(row, gloo)
        if rank == 0:
            cells = [f"{k}={v * 1e6:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(row.items())]
            print(f"world={world} bytes={nbytes} " + " ".join(cells), flush=True)
            if out:
                out.write(json.dumps(record(world, nbytes, calls, reps, kernels, memory, row)) + "\n")
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
