"""The main demo: every collective through tilecomm and through Gloo, checked and timed.

    python -m tilecomm.demo [--np 4]

Starts its own local ranks, runs each collective on both backends, checks that
tilecomm's result equals Gloo's and the closed form on every rank, then prints an
nccl-tests-style table with the tilecomm/Gloo time ratio per size.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

from tilecomm import bench, launch
from tilecomm._dist import all_gather_single, reduce_scatter_single


def _check_all_ops(rank, world, gloo):
    """Every operation once on small odd-sized inputs: tilecomm against Gloo."""
    failures = []

    def same(name, a, b):
        if not torch.equal(a, b):
            failures.append(name)

    x = torch.arange(1001, dtype=torch.float32) + rank
    ops = {
        "all_reduce": lambda g, t: dist.all_reduce(t, group=g),
        "broadcast": lambda g, t: dist.broadcast(t, src=world - 1, group=g),
        "reduce": lambda g, t: dist.reduce(t, dst=0, group=g),
    }
    for name, fn in ops.items():
        a, b = x.clone(), x.clone()
        fn(None, a)
        fn(gloo, b)
        if name != "reduce" or rank == 0:
            same(name, a, b)
    outs = {}
    for g in (None, gloo):
        ag = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(ag, x, group=g)
        agt = torch.empty(world * x.numel())
        all_gather_single(agt, x, group=g)
        a2a = torch.empty(world * 3)
        dist.all_to_all_single(a2a, torch.arange(world * 3, dtype=torch.float32) + 100 * rank, group=g)
        gat = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
        dist.gather(x, gat, dst=0, group=g)
        sc = torch.empty(5)
        dist.scatter(sc, [torch.full((5,), float(r)) for r in range(world)] if rank == 0 else None, src=0, group=g)
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank}, group=g)
        outs[g] = (torch.cat(ag), agt, a2a, torch.cat(gat) if gat else torch.empty(0), sc, objs)
    for i, (a, b) in enumerate(zip(outs[None], outs[gloo])):
        if isinstance(a, torch.Tensor):
            same(f"gather-family #{i}", a, b)
        elif a != b:
            failures.append("all_gather_object")
    rs_in = torch.arange(world * 7, dtype=torch.float32) * (rank + 1)
    rs_out = torch.empty(7)
    reduce_scatter_single(rs_out, rs_in)
    exp = torch.arange(world * 7, dtype=torch.float32)[rank * 7 : (rank + 1) * 7] * (world * (world + 1) // 2)
    same("reduce_scatter", rs_out, exp)
    if world > 1:
        buf = torch.full((9,), float(rank))
        peer = (rank + 1) % world
        reqs = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, buf.clone(), peer), dist.P2POp(dist.irecv, buf, (rank - 1) % world)]
        )
        for r in reqs:
            r.wait()
        same("send/recv", buf, torch.full((9,), float((rank - 1) % world)))
    dist.barrier()
    return failures


def _worker(rank, world, args):
    import tilecomm  # noqa: F401,PLC0415

    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    failures = _check_all_ops(rank, world, gloo)
    flag = torch.tensor([len(failures)])
    dist.all_reduce(flag, group=gloo)
    if rank == 0:
        print(f"tilecomm {tilecomm.__version__}: {world} ranks; every operation checked against Gloo: "
              + ("OK" if int(flag) == 0 else f"MISMATCH {failures}"))
    dist.destroy_process_group()
    if int(flag):
        sys.exit(1)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tilecomm.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=4)
    p.add_argument("-e", "--maxbytes", default="16M")
    args = p.parse_args(argv)
    launch.run(_worker, args.np, args)
    # Timed comparison, results checked (#wrong column), ratio = time / tilecomm's time.
    bench.main(["--np", str(args.np), "-b", "8", "-e", args.maxbytes, "-f", "16", "-n", "20", "-w", "3",
                "-c", "1", "--backend", "tilecomm,gloo"])


if __name__ == "__main__":
    main()
