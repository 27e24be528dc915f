"""CUDA all_gather (and reduce_scatter) on one GPU shared by several ranks: tilecomm's NVSHMEM push and pull
against its IPC all-gather (LL), its schedule executor and staged path, and against NVSHMEM's own fcollect.

    python benchmarks/nvshmem_compare.py --worlds 2,4 -b 1K -e 256M -f 4 --jsonl out.jsonl

Needs a CUDA build of tilecomm with its NVSHMEM parts and, with several ranks on one GPU, the MPS daemon
(scripts/gpu-nvshmem starts it; each rank sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / ranks before
touching the GPU, as NVSHMEM needs). Sizes are bytes of each rank's input. In one run and with one timing
method (gpu_compare.py's --timing: by default a Gloo barrier, then the call alone timed with CUDA events,
the median over iterations of the slowest rank) it times float32 all_gather_into_tensor through:

- tilecomm groups with TILECOMM_ALGO forcing ``nvshmem_push``, ``nvshmem_pull`` (input staged),
  ``nvshmem_pull`` with the input on the symmetric heap (``pull_in_place``: read by the peers where it
  lies), ``nvshmem_push`` with the output on the symmetric heap (``push_in_place``: the peers store
  into it), ``nvshmem_push`` with ``TILECOMM_NVSHMEM_DATA=put_signal``, and ``auto``;
- tilecomm's push all_gather over cuda_ipc into registered outputs at every size (``registered``;
  ``auto`` runs it from TILECOMM_CUDA_REGISTER_BYTES of output);
- tilecomm's LL all_gather over cuda_ipc (``ipc_ll``; up to its 1 MiB buffer), the decision table's
  all_gather schedule on the GPU's schedule executor (``executor``), and the staged path (no peer
  transport; up to 16 MiB);
- NVSHMEM's ``fcollect`` (nvshmemx_fcollectmem_on_stream) on symmetric tensors;
- every rank copying its input device-to-device at once, started in step (gpu_compare.copy_rate), for
  the HBM bound: every rank reads its input once and writes world x input once, (1 + world) x world x
  bytes of traffic at the copy's rate.

With --reduce-scatter, float32 sum reduce_scatter_tensor through push, pull and pull_in_place too (bytes:
each rank's output block).

With --timing graph (nccl-tests' -G: the host's cost per call is gone), every entry is captured in a CUDA
graph and replayed but put_signal (its signal values are counted on the host) and staged (driven by the
host), which are left out; NVSHMEM's fcollect is captured too (its on-stream calls can be; where this
library refuses, the entry records why).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_compare import HOST, copy_rate, emit, micro, parser, run_worlds, slowest, timer  # noqa: E402  (one method for the GPU comparisons)
from tilecomm import nvshmem  # noqa: E402
from tilecomm.bench import sizes  # noqa: E402

GROUPS = {
    "push": {"TILECOMM_ALGO": "nvshmem_push"},
    "pull": {"TILECOMM_ALGO": "nvshmem_pull"},
    "put_signal": {"TILECOMM_ALGO": "nvshmem_push", "TILECOMM_NVSHMEM_DATA": "put_signal"},
    "auto": {},
    "registered": {"TILECOMM_CUDA_REGISTER_BYTES": "1", "TILECOMM_PROTO": "simple"},
    "ipc_ll": {"TILECOMM_PROTO": "ll", "TILECOMM_NVSHMEM": "off", "TILECOMM_CUDA_REGISTER_BYTES": "0"},
    "executor": {"TILECOMM_PROTO": "simple", "TILECOMM_NVSHMEM": "off", "TILECOMM_CUDA_REGISTER_BYTES": "0"},
    "staged": {"TILECOMM_CUDA_IPC_BYTES": "0", "TILECOMM_NVSHMEM": "off"},
}
ENV_KEYS = ("TILECOMM_ALGO", "TILECOMM_NVSHMEM_DATA", "TILECOMM_PROTO", "TILECOMM_NVSHMEM", "TILECOMM_CUDA_IPC_BYTES",
            "TILECOMM_CUDA_REGISTER_BYTES")


def _rank(rank, world, args):
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(100 // world)  # before the GPU is touched
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(4 << 30))
    import tilecomm  # noqa: F401  (registers the backend)

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    grid = list(sizes(args.minbytes, args.maxbytes, args.stepfactor))
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    groups = {}
    for name, env in GROUPS.items():
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        os.environ.update(env)  # rank 0's values are read at group creation
        groups[name] = dist.new_group(backend="tilecomm")
    for k in ENV_KEYS:
        os.environ.pop(k, None)
    pull = groups["pull"]
    top = max(grid)
    # Symmetric buffers, made once (never freed before exit): inputs and outputs of the largest size.
    sym_in = nvshmem.symmetric_empty(top // 4, dtype=torch.float32, group=pull)
    sym_out = nvshmem.symmetric_empty(world * top // 4, dtype=torch.float32, group=pull)
    sym_in.fill_(1.0)

    def barrier():
        dist.barrier(group=gloo)

    out_file = open(args.jsonl, "a") if (args.jsonl and rank == 0) else None
    for nbytes in grid:
        n = max(1, nbytes // 4)
        slow = args.iters if nbytes <= (16 << 20) else max(3, args.iters // 4)  # fcollect: 7-55 ms per call
        x = torch.ones(n, device=dev)
        out = torch.empty(world * n, device=dev)
        row, kernels, host = {}, {}, {}

        def timed(key, fn, group=None):
            try:
                row[key] = timer(args)(fn, args.iters if group is not None else slow, barrier)
                host[key] = HOST.get("last")
                if group is not None:
                    kernels[key] = group._get_backend(torch.device("cuda")).cuda_last_kernel()
            except Exception as e:  # noqa: BLE001
                row[key] = f"failed: {str(e).splitlines()[0][:80]}"

        for name, g in groups.items():
            if name == "ipc_ll" and nbytes > (1 << 20) or name == "staged" and nbytes > (16 << 20):
                continue
            if args.timing == "graph" and name in ("put_signal", "staged"):  # not capturable
                continue
            timed(f"all_gather:{name}", lambda g=g: dist.all_gather_into_tensor(out, x, group=g), g)
        xi = sym_in[:n]
        timed("all_gather:pull_in_place", lambda: dist.all_gather_into_tensor(out, xi, group=pull), pull)
        so = sym_out[: world * n]
        push = groups["push"]
        timed("all_gather:push_in_place", lambda: dist.all_gather_into_tensor(so, x, group=push), push)
        timed("all_gather:fcollect", lambda: nvshmem.fcollect(so, xi))
        if args.reduce_scatter:
            big = torch.ones(world * n, device=dev)
            o = torch.empty(n, device=dev)
            for name in ("push", "pull"):
                g = groups[name]
                timed(f"reduce_scatter:{name}", lambda g=g: dist.reduce_scatter_tensor(o, big, group=g), g)
            sbig = sym_out[: world * n]
            sbig.fill_(1.0)
            timed("reduce_scatter:pull_in_place", lambda: dist.reduce_scatter_tensor(o, sbig, group=pull), pull)
            del big, o
        del x, out
        slowest(row, gloo)
        tiny = torch.zeros(1, device=dev)
        rate = copy_rate(nbytes, world, dev, args.iters, barrier, lambda: dist.all_reduce(tiny, group=groups["auto"]), gloo)
        bound = (1 + world) * world * nbytes / rate  # all_gather: read each input once, write each output
        emit(out_file, rank, dict(world=world, bytes=nbytes, timing=args.timing, copy_gbs=rate / 1e9,
                                  bound_us=bound * 1e6, kernels=kernels, host_us=micro(host)), row,
             cell=lambda k, v: f"{k}={v * 1e6:.1f}us({bound / v:.0%})")
    if out_file:
        out_file.close()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main():
    ap = parser(__doc__)
    ap.add_argument("--reduce-scatter", action="store_true")
    args = ap.parse_args()
    run_worlds(_rank, args, "nvshmem_compare")


if __name__ == "__main__":
    main()
