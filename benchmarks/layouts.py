"""all_reduce of CPU tensors that are not dense and contiguous: strided and sparse, against Gloo.

    python benchmarks/layouts.py --worlds 2,4 -n 20

Spawns the ranks itself. Per world size, the time of one all_reduce (median over `-n` calls
after warm-up, the slowest rank's) of:

- `contiguous`: a float32 tensor of `--bytes`;
- `strided`: the same number of elements, every second one of a tensor twice as long (tilecomm
  runs the call on a contiguous copy; Gloo is not timed: it reduces the first elements of the
  memory, strides ignored);
- `sparse`: an embedding-like gradient, a sparse COO tensor of `--rows` rows (of `--dim`
  float32) out of `--vocab`, drawn per rank, so the ranks' rows overlap in part (what DDP
  all_reduces for `nn.Embedding(sparse=True)`); size is one rank's values.

Each result is checked against the closed form (`#wrong`).
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import tilecomm  # noqa: F401  (registers the backend)
from tilecomm import launch


def _case(kind, rank, args):
    """(tensor to all_reduce, its expected sum as a dense tensor, payload bytes)."""
    n = args.bytes // 4
    world = dist.get_world_size()
    if kind == "contiguous":
        return lambda: torch.full((n,), float(rank + 1)), torch.full((n,), world * (world + 1) / 2), n * 4
    if kind == "strided":
        return (lambda: torch.full((2 * n,), float(rank + 1))[::2], torch.full((n,), world * (world + 1) / 2), n * 4)

    def grad(r):
        g = torch.Generator().manual_seed(r)
        rows = torch.randint(0, args.vocab, (args.rows,), generator=g)
        return torch.sparse_coo_tensor(rows[None], torch.ones(args.rows, args.dim), (args.vocab, args.dim),
                                       check_invariants=False)

    expected = sum(grad(r).to_dense() for r in range(world))
    return lambda: grad(rank), expected, args.rows * args.dim * 4


def _rank(rank, world, backend, kinds, args, out):
    dist.init_process_group(backend, rank=rank, world_size=world)
    lines = []
    for kind in kinds:
        make, expected, nbytes = _case(kind, rank, args)
        times, wrong = [], 0
        for i in range(args.warmup + args.iters):
            x = make()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times.append(dt)
            got = x.to_dense() if x.is_sparse else x
            wrong += int(not torch.equal(got, expected))
        t = torch.tensor([statistics.median(times), float(wrong)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        lines.append(f"{kind} {nbytes} {t[0].item()} {int(t[1].item())}")
    if rank == 0:
        with open(out, "w") as f:
            f.write("\n".join(lines))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--bytes", type=int, default=1 << 20, help="dense payload (default 1 MiB)")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=3)
    args = ap.parse_args()
    print(f"# all_reduce (sum), {os.cpu_count()} cores; time: median call, slowest rank")
    header = ("world", 5), ("layout", 10), ("bytes", 9), ("tilecomm (us)", 14), ("gloo (us)", 10), ("ratio", 6)
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'#wrong':>7}")
    for world in [int(w) for w in args.worlds.split(",")]:
        res = {}
        for backend, kinds in (("tilecomm", ["contiguous", "strided", "sparse"]), ("gloo", ["contiguous", "sparse"])):
            for line in launch.run_read(_rank, world, backend, kinds, args).splitlines():
                kind, nbytes, t, wrong = line.split()
                res[backend, kind] = (int(nbytes), float(t), int(wrong))
        for kind in ("contiguous", "strided", "sparse"):
            nbytes, t, wrong = res["tilecomm", kind]
            g = res.get(("gloo", kind))
            gloo = f"{g[1] * 1e6:>10.1f}" if g else f"{'-':>10}"
            ratio = f"{t / g[1]:>6.3f}" if g else f"{'-':>6}"
            wrong += g[2] if g else 0
            print(f"{world:>5} {kind:>10} {nbytes:>9} {t * 1e6:>14.1f} {gloo} {ratio} {wrong:>7}", flush=True)


if __name__ == "__main__":
    main()
