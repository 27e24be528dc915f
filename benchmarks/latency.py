"""Small-message latency in a tight loop: back-to-back calls with no bookkeeping.

    python benchmarks/latency.py --worlds 2,4,8 --bytes 8 -n 2000 --backends tilecomm,gloo

`tilecomm-op` in --backends is tilecomm called through its operators
(torch.ops.tilecomm, Note [Operators]) instead of torch.distributed's functions
(all_reduce and all_gather only).

--cores places the ranks: `any` leaves it to the scheduler; `spread` pins rank r to
the r-th core (mod cores); `one` pins every rank to the first, which is how two ranks behave
while the scheduler keeps them stacked on one core.

Spawns the ranks itself. For each world size and backend: warm-up calls, a
barrier, then `-n` back-to-back calls of one collective on a float32 buffer;
prints the mean time per call (the slowest rank's), the CPU time and the
context switches per call (voluntary + involuntary), both summed over ranks, and the time ratio to the
last backend listed. The result of the last call is checked against the
closed form.
"""

import argparse
import os
import resource
import time

import torch
import torch.distributed as dist

import tilecomm  # noqa: F401  (registers the backend)
from tilecomm import launch


def _rank(rank, world, backend, coll, nbytes, iters, cores, out):
    if cores != "any":
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0] if cores == "one" else cpus[rank % len(cpus)]})
    use_op = backend == "tilecomm-op"
    dist.init_process_group("tilecomm" if use_op else backend, rank=rank, world_size=world)
    name = dist.group.WORLD.group_name
    n = max(nbytes // 4, 1)
    x = torch.full((n,), float(rank + 1))
    outs = torch.empty(n * world)

    def call():
        if coll == "all_reduce":
            x.fill_(float(rank + 1))
            if use_op:
                torch.ops.tilecomm.all_reduce_(x, "sum", name)
            else:
                dist.all_reduce(x)
        elif coll == "all_gather":
            if use_op:
                torch.ops.tilecomm.all_gather_into_tensor_out(x, name, out=outs)
            else:
                dist.all_gather_into_tensor(outs, x)
        elif coll == "broadcast":
            dist.broadcast(x, src=0)
        elif coll == "barrier":
            dist.barrier()

    for _ in range(max(iters // 10, 10)):
        call()
    dist.barrier()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    dt = (time.perf_counter() - t0) / iters
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    switches = (ru1.ru_nvcsw - ru0.ru_nvcsw) + (ru1.ru_nivcsw - ru0.ru_nivcsw)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if coll == "all_reduce":
        ok = bool((x == world * (world + 1) / 2).all())
    elif coll == "all_gather":
        ok = bool((outs.view(world, n) == torch.arange(1, world + 1, dtype=torch.float32)[:, None]).all())
    elif coll == "broadcast":
        ok = bool((x == 1.0).all())
    else:
        ok = True
    t = torch.tensor([dt, switches / iters, cpu / iters, 0.0 if ok else 1.0], dtype=torch.float64)
    res = torch.zeros(4, dtype=torch.float64)
    dist.all_reduce(t[:1], op=dist.ReduceOp.MAX)
    dist.all_reduce(t[1:], op=dist.ReduceOp.SUM)
    if rank == 0:
        res.copy_(t)
        with open(out, "w") as f:
            f.write(" ".join(str(float(v)) for v in res))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--collective", default="all_reduce", choices=["all_reduce", "all_gather", "broadcast", "barrier"])
    ap.add_argument("-n", type=int, default=2000, help="timed calls (Gloo gets a tenth, at least 100)")
    ap.add_argument("--backends", default="tilecomm,gloo")
    ap.add_argument("--cores", default="any", choices=["any", "spread", "one"], help="where the ranks run")
    args = ap.parse_args()
    print(f"# {args.collective}, {args.bytes} B float32, {os.cpu_count()} cores, ranks on cores: {args.cores}")
    print(f"{'world':>5} {'backend':>11} {'us/call':>10} {'cpu us/call':>12} {'switches/call':>14} {'ratio':>7} "
          f"{'ok':>4}")
    for world in [int(w) for w in args.worlds.split(",")]:
        rows = []
        for b in args.backends.split(","):
            if b == "tilecomm-op" and args.collective not in ("all_reduce", "all_gather"):
                continue
            iters = args.n if b.startswith("tilecomm") else max(args.n // 10, 100)
            report = launch.run_read(_rank, world, b, args.collective, args.bytes, iters, args.cores)
            dt, sw, cpu, bad = (float(v) for v in report.split())
            rows.append((b, dt, sw, cpu, bad == 0))
        if not rows:
            continue
        ref = rows[-1][1]
        for b, dt, sw, cpu, ok in rows:
            print(f"{world:>5} {b:>11} {dt * 1e6:>10.1f} {cpu * 1e6:>12.1f} {sw:>14.1f} {dt / ref:>7.3f} "
                  f"{'yes' if ok else 'NO':>4}",
                  flush=True)


if __name__ == "__main__":
    main()
