"""send/recv of CUDA tensors between two ranks: GPU to GPU (TILECOMM_CUDA_P2P=direct) against staged.

    python benchmarks/gpu_p2p.py -b 4K -e 256M -f 4 -n 20 --jsonl out.jsonl

Needs a CUDA build of tilecomm and, with both ranks on one GPU, the MPS daemon
(scripts/gpu-run does both). Ranks 0 and 1 bounce a float32 tensor: rank 0
sends and then receives, rank 1 receives and then sends, `iters` round trips
back to back after 3 warm-up ones, between a device synchronize and a Gloo
barrier; the figure is half the round trip (one message's time, as nccl-tests'
sendrecv reports it), in microseconds, of the slower rank, and the bytes per
second it gives (algbw). One group per entry: `direct` and `staged`. A
device-to-device copy of the same size on one rank (`copy`) is the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from tilecomm import launch
from tilecomm.bench import parse_size, sizes
from tilecomm.tune import bounce

ENTRIES = {"direct": {"TILECOMM_CUDA_P2P": "direct"}, "staged": {"TILECOMM_CUDA_P2P": "staged"}}


def _one_way(rank, buf, group, iters, gloo):
    """Seconds per message (half a round trip), the slower rank's."""
    for _ in range(3):
        bounce(rank, buf, group)
    torch.cuda.synchronize()
    dist.barrier(group=gloo)
    t0 = time.perf_counter()
    for _ in range(iters):
        bounce(rank, buf, group)
    torch.cuda.synchronize()
    t = torch.tensor([(time.perf_counter() - t0) / iters / 2], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return float(t[0])


def _copy(buf, iters):
    dst = torch.empty_like(buf)
    dst.copy_(buf)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(buf)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def _rank(rank, world, args):
    import tilecomm  # noqa: F401  (registers the backend)

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    groups = {}
    for name, env in ENTRIES.items():
        os.environ.update(env)  # rank 0's values are read at group creation
        groups[name] = dist.new_group(backend="tilecomm")
        for k in env:
            os.environ.pop(k)
    out = open(args.jsonl, "a") if args.jsonl and rank == 0 else None
    for n in sizes(args.minbytes, args.maxbytes, args.stepfactor):
        buf = torch.ones(max(1, n // 4), device=dev)
        iters = args.iters if n <= (16 << 20) else max(3, args.iters // 4)
        row = {"bytes": buf.nbytes}
        for name, g in groups.items():
            row[name] = _one_way(rank, buf, g, iters, gloo) * 1e6
        row["copy"] = _copy(buf, iters) * 1e6 if rank == 0 else 0.0
        if rank == 0:
            cells = " ".join(f"{k}={row[k]:.1f}us ({buf.nbytes / row[k] / 1e3:.2f} GB/s)" for k in [*ENTRIES, "copy"])
            print(f"bytes={buf.nbytes} {cells}", flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
        del buf
    for g in groups.values():
        dist.destroy_process_group(g)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-b", "--minbytes", type=parse_size, default=4 << 10)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("--jsonl", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_p2p: no CUDA device")
    launch.run(_rank, 2, args)


if __name__ == "__main__":
    main()
