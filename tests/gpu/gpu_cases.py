"""Cases that run inside the GPU test workers (see gpu_harness.py).

Pool cases: ``case(rank, world, gloo, **kwargs)``; the default group is
tilecomm (CUDA tensors on the rank's GPU), ``gloo`` a Gloo group over every
rank (CPU oracle, and out-of-band checks). Spawn cases: ``case(rank, world,
port, **kwargs)`` set up their own group. Data is small and integer-valued, so
every floating-point result is exact and compared bit for bit with the closed
form; results every rank must share are also checked to be bitwise identical
across ranks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "complex64": torch.complex64,
}
OPS = ["sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor"]
PREMUL = 0.5


def dev():
    return torch.device("cuda", torch.cuda.current_device())


def backend():
    """The tilecomm backend object serving CUDA tensors in the default group."""
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))


def applicable(op, dt):
    if dt.is_complex:  # torch.distributed refuses the others on complex tensors
        return op in ("sum", "avg", "premul_sum")
    if dt == torch.bool:
        return op in ("sum", "product", "min", "max", "band", "bor", "bxor")
    if op in ("band", "bor", "bxor"):
        return not dt.is_floating_point
    if op == "premul_sum":
        return dt.is_floating_point
    return True


def reduce_op(op):
    if op == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL)
    return getattr(ReduceOp, {"sum": "SUM", "avg": "AVG", "product": "PRODUCT", "min": "MIN", "max": "MAX",
                              "band": "BAND", "bor": "BOR", "bxor": "BXOR"}[op])


def data(rank, n, dt, op="sum", salt=0):
    """Rank `rank`'s input: small integers (in {1, 2} for PRODUCT so that 8 ranks stay exact)."""
    i = torch.arange(n, dtype=torch.int64)
    if op == "product":
        v = 1 + ((i * 5 + rank * 3 + salt) % 3 == 0).to(torch.int64)
    else:
        v = (i * 7 + rank * 3 + salt) % 5
        if dt.is_floating_point or dt.is_complex or dt in (torch.int8, torch.int16, torch.int32, torch.int64):
            v = v - 1
    if dt == torch.bool:
        return (v % 2 == 1)
    return v.to(dt)


def closed_form(world, n, dt, op, salt=0):
    xs = [data(r, n, dt, op, salt) for r in range(world)]
    if dt == torch.bool:
        stack = torch.stack(xs)
        if op in ("sum", "max", "bor"):
            return stack.any(0)
        if op in ("product", "min", "band"):
            return stack.all(0)
        return (stack.sum(0) % 2 == 1)  # bxor
    if dt.is_complex or dt.is_floating_point:
        acc = torch.stack([x.to(torch.complex128 if dt.is_complex else torch.float64) for x in xs])
        if op == "premul_sum":
            acc = acc * PREMUL
        r = {"sum": acc.sum(0), "avg": acc.sum(0), "premul_sum": acc.sum(0), "product": acc.prod(0)}.get(op)
        if r is None:
            r = acc.amin(0) if op == "min" else acc.amax(0)
        r = r.to(dt)
        if op == "avg" and dt.is_complex:  # complex tensors reach the backend viewed as real
            return torch.view_as_complex(torch.view_as_real(r) / world)
        return r / world if op == "avg" else r
    acc = torch.stack([x.to(torch.int64) for x in xs])
    if op in ("sum", "avg"):
        r = acc.sum(0)
    elif op == "product":
        r = acc.prod(0)
    elif op == "min":
        r = acc.amin(0)
    elif op == "max":
        r = acc.amax(0)
    else:
        r = xs[0].clone()
        for x in xs[1:]:
            r = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op](r, x)
        return r
    r = r.to(dt)  # wraps like the dtype
    return torch.div(r, world, rounding_mode="trunc") if op == "avg" else r


_FAILURES: list[str] = []


def check(cond, what):
    if not cond:
        _FAILURES.append(what)


def check_equal(got, want, what):
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        diff = ""
        if got.shape == want.shape and got.numel():
            bad = (got != want).nonzero()
            if len(bad):
                i = bad[0][0]
                diff = f" first bad index {bad[0].tolist()}: got {got.flatten()[i].item()} want {want.flatten()[i].item()}"
        _FAILURES.append(f"{what}: mismatch ({got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}){diff}")


def digest(t):
    t = t.detach().cpu().contiguous()
    return hashlib.sha1(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def identical(gloo, t, what):
    """Checks that every rank holds the same bits."""
    out = [None] * dist.get_world_size(gloo)
    dist.all_gather_object(out, digest(t), group=gloo)
    check(len(set(out)) == 1, f"{what}: results differ across ranks")


def finish():
    global _FAILURES
    failures, _FAILURES = _FAILURES, []
    if failures:
        more = f"\n... and {len(failures) - 20} more" if len(failures) > 20 else ""
        raise AssertionError("\n".join(failures[:20]) + more)


# ---------------------------------------------------------------- all_reduce


def status(rank, world, gloo):
    return backend().cuda_status()


def allreduce_matrix(rank, world, gloo, dtypes, ops, sizes, unaligned=False, expect_direct=None):
    """all_reduce of every (dtype, op, size) on CUDA tensors against the closed form and across ranks."""
    calls = 0
    for name in dtypes:
        dt = DTYPES[name]
        for op in ops:
            if not applicable(op, dt):
                continue
            for n in sizes:
                x = data(rank, n, dt, op)
                if unaligned:  # a view whose data starts 1 element into its storage (not 16-byte aligned)
                    base = torch.zeros(n + 1, dtype=dt, device=dev())
                    t = base[1:]
                    t.copy_(x)
                else:
                    t = x.to(dev())
                dist.all_reduce(t, op=reduce_op(op))
                what = f"all_reduce {name} {op} n={n}{' unaligned' if unaligned else ''}"
                check_equal(t, closed_form(world, n, dt, op), what)
                if unaligned:
                    check(base[0].item() == 0, f"{what}: wrote before the tensor")
                identical(gloo, t, what)
                calls += 1
    torch.cuda.synchronize()
    st = backend().cuda_status()
    if expect_direct is not None:
        check(f"direct={expect_direct}" in st, f"expected direct={expect_direct}, status: {st}")
    finish()
    return calls, st


def _registered_calls():
    st = backend().cuda_status()
    return int(st.split("registered_calls=")[1].split()[0])


def allreduce_registered(rank, world, gloo):
    """Note [Registered tensors]: all_reduce on tensors registered in place, against the closed form:
    the same tensor again (cached mappings), views at odd offsets of one allocation (the elements
    around them untouched), sizes that leave parts empty, a tensor freed and a new one allocated
    (possibly at the same address), and a rank whose tensor cannot be exported (every rank then runs
    the staged kernel). Returns whether that last part ran (it needs cupy)."""
    d = dev()
    calls = _registered_calls()

    def reduce_checked(t, n, what, salt=0, registered=True):
        nonlocal calls
        t.copy_(data(rank, n, torch.float32, "sum", salt))
        dist.all_reduce(t)
        check_equal(t, closed_form(world, n, torch.float32, "sum", salt), what)
        identical(gloo, t, what)
        now = _registered_calls()
        check(now == calls + (1 if registered else 0), f"{what}: registered calls {calls} -> {now}")
        if registered:
            check(backend().cuda_last_kernel() == "allreduce_two_shot_registered",
                  f"{what}: ran {backend().cuda_last_kernel()}")
        calls = now

    for n in (1, 3, 4 * world - 1, 1031, 65543, (1 << 20) + 3):
        t = torch.empty(n, device=d)
        for again in range(3):
            reduce_checked(t, n, f"registered n={n} call {again}", salt=again)
    n = 4097
    big = torch.zeros(3 * n + 5, device=d)
    for at in (0, n + 1, 2 * n + 3):  # 0, 8 and 4 bytes past a 16-byte boundary
        reduce_checked(big[at:at + n], n, f"registered view at {at}", salt=at)
    gaps = torch.cat([big[n:n + 1], big[2 * n + 1:2 * n + 3], big[3 * n + 3:]])
    check(bool((gaps == 0).all().item()), "registered views: elements between the views changed")
    for round_ in range(3):  # new allocations, some at addresses a freed one had
        t = torch.empty(1 << 18, device=d)
        reduce_checked(t, 1 << 18, f"registered after free {round_}", salt=round_)
        del t
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    ran_fallback = False
    try:
        import cupy  # noqa: PLC0415

        ran_fallback = True
    except ImportError:
        pass
    ran = [None] * world
    dist.all_gather_object(ran, ran_fallback, group=gloo)
    if all(ran):
        n = 70001
        arr = None
        if rank == 0:  # stream-ordered pool memory: cudaIpcGetMemHandle refuses it
            with cupy.cuda.Device(d.index):
                arr = cupy.ndarray((n,), dtype=cupy.float32, memptr=cupy.cuda.MemoryAsyncPool().malloc(4 * n))
                cupy.cuda.runtime.deviceSynchronize()
            t = torch.from_dlpack(arr)
        else:
            t = torch.empty(n, device=d)
        before = calls
        t.copy_(data(rank, n, torch.float32, "sum"))
        dist.all_reduce(t)
        check_equal(t, closed_form(world, n, torch.float32, "sum"), "registered fallback")
        deltas = [None] * world
        dist.all_gather_object(deltas, _registered_calls() - before, group=gloo)
        check(len(set(deltas)) == 1, f"registered fallback: ranks disagree on the path: {deltas}")
        torch.cuda.synchronize()
        del t, arr
    torch.cuda.synchronize()
    finish()
    return all(ran)


def allreduce_vs_gloo(rank, world, gloo, n):
    """Random float32 data: tilecomm on CUDA against Gloo on CPU (sums may round differently: allclose)."""
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(n, generator=g)
    t = x.to(dev())
    dist.all_reduce(t)
    ref = x.clone()
    dist.all_reduce(ref, group=gloo)
    check(torch.allclose(t.cpu(), ref, rtol=1e-5, atol=1e-5), f"all_reduce n={n} differs from gloo")
    identical(gloo, t, f"random all_reduce n={n}")
    finish()


# ---------------------------------------------------------------- all_gather (LL)


def allgather_matrix(rank, world, gloo, dtypes, sizes, expect_direct=None):
    """all_gather_into_tensor (aligned, unaligned, in place) and all_gather against the closed form."""
    d = dev()
    for name in dtypes:
        dt = DTYPES[name]
        for n in sizes:
            x = [data(r, n, dt, "sum", salt=n) for r in range(world)]
            want = torch.cat(x)
            what = f"all_gather {name} n={n}"
            big = torch.empty(world * n, dtype=dt, device=d)
            dist.all_gather_into_tensor(big, x[rank].to(d))
            check_equal(big, want, f"{what} into tensor")
            identical(gloo, big, what)
            # input and output views that start 1 element into their storage (not 16-byte aligned)
            src = torch.zeros(n + 1, dtype=dt, device=d)
            src[1:].copy_(x[rank])
            base = torch.zeros(world * n + 2, dtype=dt, device=d)
            dist.all_gather_into_tensor(base[1 : 1 + world * n], src[1:])
            check_equal(base[1 : 1 + world * n], want, f"{what} unaligned")
            check(not base[0].item() and not base[-1].item(), f"{what} unaligned: wrote outside the output")
            # in place: the input is this rank's block of the output
            inplace = torch.zeros(world * n, dtype=dt, device=d)
            inplace[rank * n : (rank + 1) * n].copy_(x[rank])
            dist.all_gather_into_tensor(inplace, inplace[rank * n : (rank + 1) * n])
            check_equal(inplace, want, f"{what} in place")
            outs = [torch.full((n,), 1, dtype=dt, device=d) for _ in range(world)]
            dist.all_gather(outs, x[rank].to(d))
            for r in range(world):
                check_equal(outs[r], x[r], f"{what} list [{r}]")
    torch.cuda.synchronize()
    st = backend().cuda_status()
    if expect_direct is not None:
        check(f"direct={expect_direct}" in st, f"expected direct={expect_direct}, status: {st}")
    finish()
    return st


# ---------------------------------------------------------------- CUDA graphs


def graph_replay(rank, world, gloo, replays, sizes=(1, 7, 1031, 65543)):
    """Several direct collectives (all_to_all with equal and uneven splits among them) captured in one
    CUDA graph and replayed with fresh inputs each time (the kernels take their sequence numbers from
    the device), eager calls in between; then a staged operation (a send) under capture
    is a ValueError and the group stays usable."""
    d = dev()
    n_ag, n_list = 1031, 17
    ar = {n: torch.zeros(n, device=d) for n in sizes}  # float32 sum
    bf = torch.zeros(1031, dtype=torch.bfloat16, device=d)  # max
    iv = torch.zeros(1031, dtype=torch.int32, device=d)  # bxor
    av = torch.zeros(300, device=d)  # avg (a torch op after the kernel, captured too)
    ag_in = torch.zeros(n_ag, dtype=torch.float16, device=d)
    ag_out = torch.empty(world * n_ag, dtype=torch.float16, device=d)
    ls_in = torch.zeros(n_list, dtype=torch.int64, device=d)
    ls_out = [torch.empty(n_list, dtype=torch.int64, device=d) for _ in range(world)]
    a2a_in = torch.zeros(world * 13, dtype=torch.int32, device=d)
    a2a_out = torch.empty(world * 13, dtype=torch.int32, device=d)
    up_ins = [uneven_rows(rank, j, world, 700) for j in range(world)]
    up_outs = [uneven_rows(r, rank, world, 700) for r in range(world)]
    up_in = torch.zeros(sum(up_ins), 3, dtype=torch.float64, device=d)
    up_out = torch.empty(sum(up_outs), 3, dtype=torch.float64, device=d)

    def fill(k):
        for n, t in ar.items():
            t.copy_(data(rank, n, torch.float32, "sum", salt=k))
        bf.copy_(data(rank, bf.numel(), torch.bfloat16, "max", salt=k))
        iv.copy_(data(rank, iv.numel(), torch.int32, "bxor", salt=k))
        av.copy_(data(rank, av.numel(), torch.float32, "avg", salt=k))
        ag_in.copy_(data(rank, n_ag, torch.float16, "sum", salt=k))
        ls_in.copy_(data(rank, n_list, torch.int64, "sum", salt=k))
        a2a_in.copy_(torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [13] * world, torch.int32, salt=k)]))
        up_in.copy_(torch.cat(a2a_blocks(rank, world, up_ins, torch.float64, salt=k, width=3)))

    def body():
        for t in ar.values():
            dist.all_reduce(t)
        dist.all_reduce(bf, op=ReduceOp.MAX)
        dist.all_reduce(iv, op=ReduceOp.BXOR)
        dist.all_reduce(av, op=ReduceOp.AVG)
        dist.all_gather_into_tensor(ag_out, ag_in)
        dist.all_gather(ls_out, ls_in)
        dist.all_to_all_single(a2a_out, a2a_in)
        dist.all_to_all_single(up_out, up_in, up_outs, up_ins)

    def verify(k, what):
        for n, t in ar.items():
            check_equal(t, closed_form(world, n, torch.float32, "sum", salt=k), f"{what}: all_reduce sum n={n}")
        check_equal(bf, closed_form(world, bf.numel(), torch.bfloat16, "max", salt=k), f"{what}: bf16 max")
        check_equal(iv, closed_form(world, iv.numel(), torch.int32, "bxor", salt=k), f"{what}: int32 bxor")
        check_equal(av, closed_form(world, av.numel(), torch.float32, "avg", salt=k), f"{what}: avg")
        want = torch.cat([data(r, n_ag, torch.float16, "sum", salt=k) for r in range(world)])
        check_equal(ag_out, want, f"{what}: all_gather_into_tensor")
        for r in range(world):
            check_equal(ls_out[r], data(r, n_list, torch.int64, "sum", salt=k), f"{what}: all_gather [{r}]")
        want = a2a_received(rank, world, 13, torch.int32, salt=k)
        check_equal(a2a_out, want, f"{what}: all_to_all_single")
        want = a2a_received(rank, world, lambda r: uneven_rows(r, rank, world, 700), torch.float64, salt=k, width=3)
        check_equal(up_out, want, f"{what}: all_to_all_single uneven")
        identical(gloo, torch.cat([t.view(-1).float() for t in (*ar.values(), bf, iv, av, ag_out)]), what)

    fill(0)
    body()  # eager: sets up the transport
    verify(0, "eager")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    eager = torch.zeros(64, device=d)
    for k in range(1, replays + 1):
        fill(k)
        graph.replay()
        verify(k, f"replay {k}")
        if k % 3 == 0:  # an eager direct call between replays takes the next sequence number
            eager.fill_(rank + k)
            dist.all_reduce(eager)
            check_equal(eager, torch.full((64,), float(world * k + world * (world - 1) // 2)), f"eager after {k}")
    torch.cuda.synchronize()

    t = torch.ones(8, device=d)
    staged = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(staged):
            dist.send(torch.ones(8, device=d), (rank + 1) % world)
        check(False, "a staged send was captured without an error")
    except Exception as e:  # noqa: BLE001  (the ValueError, possibly chained by the capture's end)
        text = f"{e} {e.__context__}"
        check("cannot be captured" in text, f"unclear capture error: {type(e).__name__}: {text}")
    torch.cuda.synchronize()
    dist.all_reduce(t)
    check_equal(t, torch.full((8,), float(world)), "all_reduce after a refused capture")
    finish()


def graph_registered(rank, world, gloo, replays=12):
    """Note [Registered tensors] under CUDA graph capture: an all_reduce of a tensor made before the
    capture, one of a tensor made in the graph's pool, an all_gather_into_tensor and an
    all_to_all_single of equal blocks, each registered for the first time inside the capture,
    replayed with fresh inputs; the registration runs at the capture only. Between replays, eager
    registered calls on new tensors (freed, the cache emptied) open and replace other mappings."""
    d = dev()
    warm = torch.ones(1031, device=d)
    dist.all_reduce(warm)  # eager: sets up the transport
    n, n_ag, n_a2a = 65543, 4099, 1031
    x = torch.empty(n, device=d)
    ag_in = torch.empty(n_ag, device=d)
    ag_out = torch.empty(world * n_ag, device=d)
    a2a_in = torch.empty(world * n_a2a, dtype=torch.int32, device=d)
    a2a_out = torch.empty(world * n_a2a, dtype=torch.int32, device=d)

    def fill(k):
        x.copy_(data(rank, n, torch.float32, "sum", salt=k))
        ag_in.copy_(data(rank, n_ag, torch.float32, "sum", salt=k))
        a2a_in.copy_(torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [n_a2a] * world, torch.int32, salt=k)]))

    fill(0)
    torch.cuda.synchronize()
    before = _registered_calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
        y = x * 2  # the graph's pool
        dist.all_reduce(y)
        dist.all_gather_into_tensor(ag_out, ag_in)
        dist.all_to_all_single(a2a_out, a2a_in)
    check(_registered_calls() == before + 4, f"capture: registered calls {before} -> {_registered_calls()}")
    check(backend().cuda_last_kernel() == "alltoall_push_registered", f"captured {backend().cuda_last_kernel()}")
    for k in range(1, replays + 1):
        fill(k)
        graph.replay()
        want = closed_form(world, n, torch.float32, "sum", salt=k)
        check_equal(x, want, f"replay {k}: all_reduce")
        check_equal(y, want * (2 * world), f"replay {k}: all_reduce in the graph's pool")
        want = torch.cat([data(r, n_ag, torch.float32, "sum", salt=k) for r in range(world)])
        check_equal(ag_out, want, f"replay {k}: all_gather_into_tensor")
        check_equal(a2a_out, a2a_received(rank, world, n_a2a, torch.int32, salt=k), f"replay {k}: all_to_all_single")
        identical(gloo, torch.cat([x, y, ag_out]), f"replay {k}")
        if k % 3 == 0:
            t = torch.empty(1 << 18, device=d)
            t.copy_(data(rank, 1 << 18, torch.float32, "sum", salt=k))
            dist.all_reduce(t)
            check_equal(t, closed_form(world, 1 << 18, torch.float32, "sum", salt=k), f"eager after replay {k}")
            del t
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    check(_registered_calls() == before + 4 + replays // 3, "replays registered again")
    del graph
    torch.cuda.synchronize()
    finish()


def graph_capture_registers(rank, world, gloo, replays=9):
    """Note [Registered tensors], with the default settings: an all_reduce of
    TILECOMM_CUDA_CAPTURE_REGISTER_BYTES registers its tensors when captured in a CUDA graph, not when
    run eagerly; one just below it does not register captured either. Float32 SUM of exactly that
    size, bfloat16 MAX of it, float32 AVG of an odd size above it (parts that are not whole) are
    replayed with fresh inputs against the closed form, the same bits on every rank."""
    from tilecomm import settings

    d = dev()
    from_bytes = settings.value("TILECOMM_CUDA_CAPTURE_REGISTER_BYTES", {})
    eager_from = settings.value("TILECOMM_CUDA_REGISTER_BYTES", {})
    check(0 < from_bytes < eager_from, f"defaults: captured from {from_bytes}, eager from {eager_from}")
    n = from_bytes // 4
    cases = [  # (tensor, dtype, op, registers)
        (torch.empty(n, device=d), torch.float32, "sum", True),
        (torch.empty(2 * n, dtype=torch.bfloat16, device=d), torch.bfloat16, "max", True),
        (torch.empty(n + 1031, device=d), torch.float32, "avg", True),
        (torch.empty(n - 4, device=d), torch.float32, "sum", False),
    ]

    def fill(k):
        for t, dt, op, _ in cases:
            t.copy_(data(rank, t.numel(), dt, op, salt=k))

    fill(0)
    before = _registered_calls()
    dist.all_reduce(cases[0][0])  # eager: the staged kernel
    torch.cuda.synchronize()
    check(_registered_calls() == before, f"an eager all_reduce of {from_bytes} B registered")
    check(backend().cuda_last_kernel() != "allreduce_two_shot_registered", "eager: the registered kernel")
    check_equal(cases[0][0], closed_form(world, n, torch.float32, "sum"), "eager all_reduce")
    fill(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t, _, op, _ in cases:
            dist.all_reduce(t, op=reduce_op(op))
    registered = sum(r for *_, r in cases)
    check(_registered_calls() == before + registered, f"capture: registered calls {before} -> {_registered_calls()}")
    check(backend().cuda_last_kernel() != "allreduce_two_shot_registered", "captured below the size: registered")
    for k in range(1, replays + 1):
        fill(k)
        graph.replay()
        for t, dt, op, _ in cases:
            check_equal(t, closed_form(world, t.numel(), dt, op, salt=k), f"replay {k}: {op} {dt} n={t.numel()}")
        identical(gloo, torch.cat([t.float() for t, *_ in cases]), f"replay {k}")
    check(_registered_calls() == before + registered, "replays registered again")
    del graph
    torch.cuda.synchronize()
    finish()


SEQUENCE_SIZES = (0, 1, 1031, 65543, 1 << 20)
SEQUENCE_CALLS = ((torch.float32, "sum"), (torch.bfloat16, "max"), (torch.int32, "bxor"), (torch.float16, "avg"),
                  (torch.int64, "product"))


def _paired_all_reduces(rank, world, gloo, sizes, first, how):
    """For each (dtype, op) of SEQUENCE_CALLS and each size: `first(src, op)` all-reduces a copy of
    this rank's data and returns it; the result must be the closed form, the same bits as a second
    call through dist.all_reduce, and the same on every rank. So every size runs twice in a row, each
    of its kernels (LL, one_shot, two_shot by size) after the previous size's."""
    d = dev()
    for dt, op in SEQUENCE_CALLS:
        for n in sizes:
            what = f"{how} {op} {dt} n={n}"
            src = data(rank, n, dt, op).to(d)
            x = first(src, op)
            check_equal(x, closed_form(world, n, dt, op), what)
            y = src.clone()
            dist.all_reduce(y, op=reduce_op(op))
            check(torch.equal(x, y), f"{what}: differs from dist.all_reduce")
            identical(gloo, x, what)


def allreduce_sequence(rank, world, gloo, sizes=SEQUENCE_SIZES):
    """dist.all_reduce over sizes that take each direct kernel in turn, every size twice."""
    def first(src, op):
        x = src.clone()
        dist.all_reduce(x, op=reduce_op(op))
        return x

    _paired_all_reduces(rank, world, gloo, sizes, first, "all_reduce")
    finish()


def host_stages(rank, world, gloo, calls=30):
    """tilecomm.host_stages on CUDA tensors (Note [Host stages]): a synchronous all_reduce that runs a
    direct kernel, through dist and the operator, gives one sample per stage, the CUDA ones included;
    an all_gather_into_tensor gives the stages every CUDA call passes (its kernel's may differ by
    path); the results stay right."""
    import tilecomm

    stages = ["checked", "begun", "issued", "turn", "guarded", "ready", "launched", "ended", "done", "waited"]
    d = dev()
    name = dist.group.WORLD.group_name
    y = torch.empty(256, device=d)  # 1 KiB: the LL one-shot under auto
    out = torch.empty(world * 256, device=d)
    mine = torch.full((256,), float(rank), device=d)
    want = torch.arange(world, dtype=torch.float32).repeat_interleave(256)
    dist.all_reduce(y)  # the first direct call sets up the peer transport
    dist.all_gather_into_tensor(out, mine)
    with tilecomm.host_stages() as rec:
        for _ in range(calls):
            y.fill_(rank + 1)
            dist.all_reduce(y)
            y.fill_(rank + 1)
            torch.ops.tilecomm.all_reduce_(y, "sum", name)
    check_equal(y.cpu(), torch.full((256,), world * (world + 1) / 2), "all_reduce inside host_stages")
    assert list(rec.samples) == stages, rec.samples.keys()
    for st, xs in rec.samples.items():
        assert len(xs) == 2 * calls and min(xs) >= 0, (st, len(xs), min(xs))
    with tilecomm.host_stages() as rec:
        for _ in range(calls):
            dist.all_gather_into_tensor(out, mine)
    check_equal(out.cpu(), want, "all_gather inside host_stages")
    for st in ("checked", "begun", "issued", "turn", "guarded", "ended", "done", "waited"):
        assert len(rec.samples.get(st, [])) == calls, (st, rec.samples.keys())


def operators(rank, world, gloo, sizes=SEQUENCE_SIZES):
    """torch.ops.tilecomm's collectives on CUDA tensors (Note [Operators]): closed form, the same
    bits as dist.all_reduce / dist.all_gather_into_tensor of the group, ordered after a late write
    on the caller's current stream without a synchronize, complex as its real view, and replayed
    from a CUDA graph; a group without a tilecomm CUDA backend is refused."""
    import tilecomm

    d = dev()
    name = dist.group.WORLD.group_name
    side = torch.cuda.Stream()

    def first(src, op):
        x = torch.full_like(src, 3)  # stale contents, overwritten on `side` only
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the caller's current stream: the op must run after its writes
            torch.cuda._sleep(1_000_000)  # a late writer
            x.copy_(src)
            torch.ops.tilecomm.all_reduce_(x, op, name)
        torch.cuda.current_stream().wait_stream(side)
        return x

    _paired_all_reduces(rank, world, gloo, sizes, first, "op all_reduce_")
    for n in sizes:
        what = f"op all_gather n={n}"
        x = data(rank, n, torch.float16, "sum").to(d)
        out = torch.empty(world * n, dtype=torch.float16, device=d)
        tilecomm.ops.all_gather_into_tensor(out, x)
        check_equal(out, torch.cat([data(r, n, torch.float16, "sum") for r in range(world)]), what)

    # captured: fresh inputs every replay (complex as its real view: a kernel too)
    cx = torch.zeros(1031, dtype=torch.complex64, device=d)
    ar, ag_in = torch.zeros(4099, device=d), torch.zeros(257, device=d)
    ag_out = torch.empty(world * 257, device=d)
    ar.copy_(data(rank, 4099, torch.float32, "sum"))
    tilecomm.ops.all_reduce_(ar)  # eager first: sets up the transport
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.tilecomm.all_reduce_(ar, "sum", name)
        torch.ops.tilecomm.all_gather_into_tensor_out(ag_in, name, out=ag_out)
        torch.ops.tilecomm.all_reduce_(cx, "sum", name)
    for k in range(1, 11):
        ar.copy_(data(rank, 4099, torch.float32, "sum", salt=k))
        ag_in.copy_(data(rank, 257, torch.float32, "sum", salt=k))
        cx.copy_(data(rank, 1031, torch.complex64, "sum", salt=k))
        graph.replay()
        check_equal(cx, closed_form(world, 1031, torch.complex64, "sum", salt=k), f"replay {k}: complex64")
        check_equal(ar, closed_form(world, 4099, torch.float32, "sum", salt=k), f"replay {k}: all_reduce_")
        want = torch.cat([data(r, 257, torch.float32, "sum", salt=k) for r in range(world)])
        check_equal(ag_out, want, f"replay {k}: all_gather")
    torch.cuda.synchronize()
    try:
        tilecomm.ops.all_reduce_(torch.ones(4, device=d), group=gloo)
        check(False, "a Gloo group's CUDA tensor went through tilecomm's operator")
    except ValueError as e:
        check("no tilecomm backend for cuda" in str(e), f"unclear error: {e}")
    finish()


# ---------------------------------------------------------------- every other op


def every_op(rank, world, gloo, dtype, n):
    """Every collective and point-to-point op on CUDA tensors, against the closed form."""
    dt = DTYPES[dtype]
    d = dev()
    x = [data(r, n, dt, "sum", salt=11) for r in range(world)]  # what each rank contributes
    what = f"{dtype} n={n}"

    for root in range(world):
        t = (x[rank] if rank == root else torch.zeros(n, dtype=dt)).to(d)
        dist.broadcast(t, src=root)
        check_equal(t, x[root], f"broadcast root={root} {what}")

    if dt != torch.bool:
        for root in (0, world - 1):
            t = x[rank].to(d)
            dist.reduce(t, dst=root, op=ReduceOp.MAX)
            want = closed_form(world, n, dt, "max", salt=11) if rank == root else x[rank]
            check_equal(t, want, f"reduce max root={root} {what}")

    outs = [torch.empty(n, dtype=dt, device=d) for _ in range(world)]
    dist.all_gather(outs, x[rank].to(d))
    for r in range(world):
        check_equal(outs[r], x[r], f"all_gather [{r}] {what}")
    big = torch.empty(world * n, dtype=dt, device=d)
    dist.all_gather_into_tensor(big, x[rank].to(d))
    check_equal(big, torch.cat(x), f"all_gather_into_tensor {what}")

    if dt != torch.bool:
        # rank r contributes blocks x_r + j for block j; block `rank` of the sum is the output
        blocks = [(x[rank] + j).to(d) for j in range(world)]
        out = torch.empty(n, dtype=dt, device=d)
        dist.reduce_scatter(out, blocks)
        want = torch.stack([(x[r] + rank).to(torch.float64) for r in range(world)]).sum(0).to(dt)
        check_equal(out, want, f"reduce_scatter {what}")
        out2 = torch.empty(n, dtype=dt, device=d)
        dist.reduce_scatter_tensor(out2, torch.cat(blocks))
        check_equal(out2, want, f"reduce_scatter_tensor {what}")
        ref = torch.empty(n, dtype=dt)
        try:  # Gloo as a second oracle where it supports the call
            dist.reduce_scatter_tensor(ref, torch.cat([b.cpu() for b in blocks]), group=gloo)
            check_equal(out2, ref, f"reduce_scatter_tensor vs gloo {what}")
        except (RuntimeError, ValueError, TypeError, NotImplementedError):
            pass

    # all_to_all_single, equal splits: block j of rank r is x_r + j
    src = torch.cat([x[rank] + j if dt != torch.bool else x[rank] for j in range(world)]).to(d)
    dst = torch.empty_like(src)
    dist.all_to_all_single(dst, src)
    want = torch.cat([x[r] + rank if dt != torch.bool else x[r] for r in range(world)])
    check_equal(dst, want, f"all_to_all_single {what}")
    # uneven splits: rank r sends (r + j) % 3 rows to rank j
    in_splits = [(rank + j) % 3 for j in range(world)]
    out_splits = [(r + rank) % 3 for r in range(world)]
    src = torch.cat([torch.full((s,), rank * 10 + j, dtype=torch.int64) for j, s in enumerate(in_splits)]).to(d)
    dst = torch.empty(sum(out_splits), dtype=torch.int64, device=d)
    dist.all_to_all_single(dst, src, out_splits, in_splits)
    want = torch.cat([torch.full((s,), r * 10 + rank, dtype=torch.int64) for r, s in enumerate(out_splits)])
    check_equal(dst, want, "all_to_all_single uneven")
    ins = [x[rank].to(d) for _ in range(world)]
    outs = [torch.empty(n, dtype=dt, device=d) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        check_equal(outs[r], x[r], f"all_to_all [{r}] {what}")

    gather_and_scatter(rank, world, x, what)

    if world > 1:  # ring: send to the right, receive from the left
        right, left = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(n, dtype=dt, device=d)
        if rank % 2 == 0:
            dist.send(x[rank].to(d), right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(x[rank].to(d), right)
        check_equal(got, x[left], f"send/recv {what}")
        got = torch.empty(n, dtype=dt, device=d)
        ops = [dist.P2POp(dist.isend, x[rank].to(d), right), dist.P2POp(dist.irecv, got, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check_equal(got, x[left], f"batch_isend_irecv {what}")
    dist.barrier()
    finish()


def _p2p_counts():
    st = backend().cuda_status()
    return [int(st.split(k + "=")[1].split()[0]) for k in ("p2p_exported", "p2p_copies")]


def p2p_cases(rank, world, gloo, expect):
    """send and recv of CUDA tensors (Note [Direct point-to-point]; `expect`: direct or staged): every
    dtype at sizes 0, 1, odd and 64 KiB + 7 around a ring (batched), 64 MiB blocking, tags received
    out of order, any source, a sender's tensor that cannot be exported, and sizes that disagree
    (both sides raise, and the group goes on). Returns cuda_status()."""
    d = dev()
    right, left = (rank + 1) % world, (rank - 1) % world
    before = _p2p_counts()
    check(backend().cuda_status().split("p2p=")[1].split()[0] == expect, "p2p mode")
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int64,
              torch.bool, torch.complex64]
    for dt in dtypes:
        for n in [0, 1, 7, 1031, 65543]:
            got = torch.zeros(n, dtype=dt, device=d)
            ops = [dist.P2POp(dist.isend, data(rank, n, dt, salt=n).to(d), right, tag=n),
                   dist.P2POp(dist.irecv, got, left, tag=n)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            check_equal(got, data(left, n, dt, salt=n), f"p2p ring {dt} n={n}")
    n = 16 << 20  # 64 MiB of float32, blocking: even ranks send first
    x, got = data(rank, n, torch.float32, salt=3).to(d), torch.empty(n, device=d)
    if rank % 2 == 0:
        dist.send(x, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(x, right)
    check_equal(got, data(left, n, torch.float32, salt=3), "p2p 64 MiB")
    del x, got
    if rank == 0:  # tags out of order: rank 1 takes tag 2 first
        a, b = torch.full((1000,), 1.0, device=d), torch.full((2000,), 2.0, device=d)
        works = [dist.isend(a, 1, tag=1), dist.isend(b, 1, tag=2)]
        for w in works:
            w.wait()
    elif rank == 1:
        a, b = torch.zeros(1000, device=d), torch.zeros(2000, device=d)
        dist.recv(b, 0, tag=2)
        dist.recv(a, 0, tag=1)
        check_equal(a, torch.full((1000,), 1.0), "p2p tag 1 after tag 2")
        check_equal(b, torch.full((2000,), 2.0), "p2p tag 2 before tag 1")
    if rank == 0:  # any source: each sender's tensor names it
        for _ in range(world - 1):
            t = torch.zeros(513, device=d)
            src = dist.recv(t, tag=3)
            check_equal(t, torch.full((513,), float(src)), f"p2p any source (from {src})")
    else:
        dist.send(torch.full((513,), float(rank), device=d), 0, tag=3)
    try:
        import cupy  # noqa: PLC0415
    except ImportError:
        cupy = None
    if cupy is not None:  # stream-ordered pool memory: cudaIpcGetMemHandle refuses it
        n = 70001
        if rank == 0:
            with cupy.cuda.Device(d.index):
                arr = cupy.ndarray((n,), dtype=cupy.float32, memptr=cupy.cuda.MemoryAsyncPool().malloc(4 * n))
                cupy.cuda.runtime.deviceSynchronize()
            t = torch.from_dlpack(arr)
            t.copy_(data(0, n, torch.float32, salt=5))
            dist.send(t, 1)
            torch.cuda.synchronize()
            del t, arr
        elif rank == 1:
            t = torch.zeros(n, device=d)
            dist.recv(t, 0)
            check_equal(t, data(0, n, torch.float32, salt=5), "p2p from a tensor that cannot be exported")
    error = ""  # 100 floats sent, 99 expected
    try:
        if rank == 0:
            dist.send(torch.ones(100, device=d), 1, tag=7)
        elif rank == 1:
            dist.recv(torch.zeros(99, device=d), 0, tag=7)
    except ValueError as e:
        error = str(e)
    # Both sides raise where the sender waits for the receiver's copy; a staged send is done once sent.
    if rank == 1 or (rank == 0 and expect == "direct"):
        check("400 bytes" in error and "receive posted 396 bytes" in error, f"p2p size mismatch: {error!r}")
    got = torch.zeros(5, device=d)  # the group goes on
    ops = [dist.P2POp(dist.isend, torch.full((5,), float(rank), device=d), right, tag=9),
           dist.P2POp(dist.irecv, got, left, tag=9)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check_equal(got, torch.full((5,), float(left)), "p2p after a size mismatch")
    torch.cuda.synchronize()
    after = _p2p_counts()
    moved = [a - b for a, b in zip(after, before)]
    if expect == "direct":
        check(moved[0] > 0 and moved[1] > 0, f"p2p: nothing went GPU to GPU ({moved})")
    else:
        check(moved == [0, 0], f"p2p: staged mode copied GPU to GPU ({moved})")
    dist.barrier()
    finish()
    return backend().cuda_status()


def gather_and_scatter(rank, world, x, what, after=lambda coll: None):
    """gather of x[rank] to the last rank and scatter of x from rank 0, against x; after(collective)
    runs after each call."""
    d = dev()
    n, dt = x[rank].numel(), x[rank].dtype
    root = world - 1
    gl = [torch.empty(n, dtype=dt, device=d) for _ in range(world)] if rank == root else None
    dist.gather(x[rank].to(d), gl, dst=root)
    after("gather")
    if rank == root:
        for r in range(world):
            check_equal(gl[r], x[r], f"gather [{r}] {what}")
    out = torch.empty(n, dtype=dt, device=d)
    dist.scatter(out, [x[r].to(d) for r in range(world)] if rank == 0 else None, src=0)
    check_equal(out, x[rank], f"scatter {what}")
    after("scatter")


def objects(rank, world, gloo):
    out = [None] * world
    dist.all_gather_object(out, {"rank": rank, "v": list(range(rank))})
    check(out == [{"rank": r, "v": list(range(r))} for r in range(world)], f"all_gather_object: {out}")
    objs = [f"from {rank}", rank] if rank == 1 % world else [None, None]
    dist.broadcast_object_list(objs, src=1 % world)
    check(objs == [f"from {1 % world}", 1 % world], f"broadcast_object_list: {objs}")
    finish()


def bad_input(rank, world, gloo):
    """Mixed devices and strided CUDA tensors are ValueErrors at the call; the group stays usable."""
    d = dev()

    def refused(calls, word, what):
        accepted = 0
        for call in calls:
            try:
                call()
                accepted += 1
            except ValueError as e:
                check(word in str(e), f"unclear message: {e}")
        check(not accepted, f"{what} accepted by {accepted} call(s)")

    refused((
        lambda: dist.all_gather([torch.empty(4) for _ in range(world)], torch.ones(4, device=d)),
        lambda: dist.all_gather_into_tensor(torch.empty(4 * world), torch.ones(4, device=d)),
        lambda: dist.reduce_scatter_tensor(torch.empty(4, device=d), torch.ones(4 * world)),
        lambda: dist.all_to_all_single(torch.empty(4 * world, device=d), torch.ones(4 * world)),
    ), "device", "mixed devices")
    strided = torch.ones(4, 4, device=d).t()  # CUDA tensors must be contiguous (CPU ones need not be)
    refused((lambda: dist.all_reduce(strided), lambda: dist.broadcast(strided, src=0)), "not contiguous",
            "a strided CUDA tensor")
    t = torch.ones(3, device=d)
    dist.all_reduce(t)
    check_equal(t, torch.full((3,), float(world)), "all_reduce after bad input")
    finish()


# ---------------------------------------------------------------- all_to_all on the GPU


def a2a_block(sender, receiver, world, rows, dt, salt=0, width=1):
    """The block (`rows` rows of `width`) that `sender` sends `receiver`."""
    return data(sender * world + receiver, rows * width, dt, salt=salt).view(rows, width)


def a2a_received(rank, world, rows, dt, salt=0, width=1):
    """What rank `rank` receives, in sender order: from each sender r, rows(r) rows of `width`
    (an int: the same from every sender); one dimension when width is 1."""
    got = torch.cat([a2a_block(r, rank, world, rows if isinstance(rows, int) else rows(r), dt, salt, width)
                     for r in range(world)])
    return got.view(-1) if width == 1 else got


def a2a_blocks(rank, world, rows, dt, salt=0, width=1):
    """Rank `rank`'s input blocks: block j (rows[j] rows of `width`) is what it sends to rank j."""
    return [a2a_block(rank, j, world, rows[j], dt, salt, width) for j in range(world)]


def uneven_rows(sender, receiver, world, big):
    """Rows that `sender` sends `receiver`: 0-2, plus `big` to its right neighbour (several FIFO slices)."""
    return (sender + receiver) % 3 + (big if receiver == (sender + 1) % world else 0)


def alltoall_cases(rank, world, gloo, register_from):
    """all_to_all_single (equal and uneven splits, empty blocks, odd and unaligned sizes, in place,
    async, and equal splits of 8 MiB per block and more: aligned, unaligned, in place, given) and
    all_to_all (lists) on CUDA tensors, against the closed form and Gloo, and the kernel that ran:
    the FIFO kernel, or the push into registered outputs for equal blocks from `register_from`
    bytes of output (0: never)."""
    d = dev()

    def ran(what, out_bytes=0):
        want = "alltoall_push_registered" if 0 < register_from <= out_bytes else "alltoall_fifo"
        got = backend().cuda_last_kernel()
        check(got == want, f"{what}: ran {got!r}, expected {want!r}")

    for n, off, in_place in ((2_097_152, 0, False), (2_100_001, 1, False), (2_097_153, 0, True)):
        what = f"all_to_all_single large n={n} offset={off} in_place={in_place}"
        want = a2a_received(rank, world, n, torch.float32, salt=1)
        src = torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [n] * world, torch.float32, salt=1)])
        buf = torch.full((world * n + off + 1,), -7.0, device=d)
        if in_place:
            buf[off:off + world * n] = src.to(d)
            dist.all_to_all_single(buf[off:off + world * n], buf[off:off + world * n])
        else:
            dist.all_to_all_single(buf[off:off + world * n], src.to(d))
        ran(what, 4 * world * n)
        check_equal(buf[off:off + world * n], want, what)
        check(bool((buf[:off] == -7).all()) and buf[-1].item() == -7, f"{what}: wrote outside its output")

    for dtype in ("float32", "int8", "bool", "bfloat16", "complex64"):
        dt = DTYPES[dtype]
        for n in (0, 1, 7, 1031, 200_003):
            what = f"all_to_all_single {dtype} n={n}"
            src = torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [n] * world, dt)]).to(d)
            dst = torch.full_like(src, 3 if not dt.is_complex else 3 + 1j) if n else torch.empty_like(src)
            dist.all_to_all_single(dst, src)
            ran(what, dst.nbytes)
            want = a2a_received(rank, world, n, dt)
            check_equal(dst, want, what)
            if n == 1031 and not dt.is_complex:
                ref = torch.empty_like(want)
                dist.all_to_all_single(ref, src.cpu(), group=gloo)
                check_equal(dst, ref, f"{what} vs gloo")

    # equal blocks given as splits: the same kernel as with the splits left out
    n = 2_097_152
    src = torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [n] * world, torch.float32, salt=3)]).to(d)
    dst = torch.empty_like(src)
    dist.all_to_all_single(dst, src, [n] * world, [n] * world)
    ran("equal splits given", dst.nbytes)
    check_equal(dst, a2a_received(rank, world, n, torch.float32, salt=3), "all_to_all_single equal splits given")

    # uneven splits of 2-D int16 rows of 5 (10-byte rows: blocks start unaligned), some empty
    for big in (0, 9000):
        ins = [uneven_rows(rank, j, world, big) for j in range(world)]
        outs = [uneven_rows(r, rank, world, big) for r in range(world)]
        src = torch.cat(a2a_blocks(rank, world, ins, torch.int16, salt=big, width=5)).to(d)
        dst = torch.empty(sum(outs), 5, dtype=torch.int16, device=d)
        dist.all_to_all_single(dst, src, outs, ins)
        ran(f"uneven big={big}")
        want = a2a_received(rank, world, lambda r: uneven_rows(r, rank, world, big), torch.int16, salt=big, width=5)
        check_equal(dst, want, f"all_to_all_single uneven big={big}")
        ref = torch.empty_like(want).view(torch.uint8)  # Gloo moves no int16: rows as bytes
        dist.all_to_all_single(ref, src.cpu().view(torch.uint8), outs, ins, group=gloo)
        check_equal(dst.view(torch.uint8), ref, f"all_to_all_single uneven big={big} vs gloo")

    # unaligned views: int8 blocks of 1031 bytes starting one byte into their buffers
    n = 1031
    src_buf = torch.zeros(world * n + 1, dtype=torch.int8, device=d)
    src_buf[1:] = torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [n] * world, torch.int8, salt=5)]).to(d)
    dst_buf = torch.zeros(world * n + 1, dtype=torch.int8, device=d)
    dist.all_to_all_single(dst_buf[1:], src_buf[1:])
    ran("unaligned", world * n)
    want = a2a_received(rank, world, n, torch.int8, salt=5)
    check_equal(dst_buf[1:], want, "all_to_all_single unaligned")
    check(dst_buf[0].item() == 0, "all_to_all_single unaligned wrote before its output")

    # in place: one tensor as input and output, the same result as out of place
    t = torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [4099] * world, torch.float32, salt=7)]).to(d)
    dist.all_to_all_single(t, t)
    ran("in place", t.nbytes)
    want = a2a_received(rank, world, 4099, torch.float32, salt=7)
    check_equal(t, want, "all_to_all_single in place")

    # async, and the list form
    src = torch.cat([b.view(-1) for b in a2a_blocks(rank, world, [333] * world, torch.int64, salt=9)]).to(d)
    dst = torch.empty_like(src)
    dist.all_to_all_single(dst, src, async_op=True).wait()
    want = a2a_received(rank, world, 333, torch.int64, salt=9)
    check_equal(dst, want, "all_to_all_single async")
    ins = [b.view(-1).to(d) for b in a2a_blocks(rank, world, [70_001] * world, torch.float16, salt=3)]
    outs = [torch.empty(70_001, dtype=torch.float16, device=d) for _ in range(world)]
    dist.all_to_all(outs, ins)
    ran("all_to_all")
    for r in range(world):
        check_equal(outs[r], a2a_block(r, rank, world, 70_001, torch.float16, salt=3).view(-1),
                    f"all_to_all [{r}]")
    torch.cuda.synchronize()
    finish()


# ---------------------------------------------------------------- streams and async


def streams(rank, world, gloo, n, direct):
    """NCCL's stream contract (Note [CUDA streams] in csrc/backend/cuda_glue.hpp)."""
    d = dev()
    # 1. The op waits for the caller's stream: a slow kernel, then the fill, then the op, no CPU sync.
    t = torch.zeros(n, device=d)
    torch.cuda._sleep(20_000_000)
    t.fill_(rank + 1)
    dist.all_reduce(t)
    check_equal(t, torch.full((n,), float(world * (world + 1) // 2)), "op after a slow fill on the current stream")

    # 2. An async op on a side stream; wait() makes that stream wait; a kernel on it reads the result.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        u = torch.full((n,), float(rank), device=d)
        w = dist.all_reduce(u, async_op=True)
        w.wait()
        v = u * 2
    s.synchronize()
    check_equal(v, torch.full((n,), float(world * (world - 1))), "side stream: kernel after wait()")

    # 3. wait() does not block the CPU on GPU work (direct kernels are enqueued at once).
    if direct:
        x = torch.ones(n, device=d)
        torch.cuda._sleep(200_000_000)  # roughly 0.1 s or more of GPU time
        t0 = time.monotonic()
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        cpu_s = time.monotonic() - t0
        t1 = time.monotonic()
        torch.cuda.current_stream().synchronize()
        gpu_s = time.monotonic() - t1
        check(cpu_s < gpu_s, f"wait() blocked the CPU for {cpu_s:.3f} s (the GPU needed {gpu_s:.3f} s more)")
        check_equal(x, torch.full((n,), float(world)), "direct op after a slow kernel")

    # 4. Several in flight on one group, the same tensor twice (the second sees the first).
    ts = [torch.full((k + 1,) if k % 2 else (n,), float(k + rank), device=d) for k in range(6)]
    same = torch.full((n,), 1.0, device=d)
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    works += [dist.all_reduce(same, async_op=True), dist.all_reduce(same, async_op=True)]
    for w in works:
        w.wait()
    for k, t in enumerate(ts):
        check_equal(t, torch.full(t.shape, float(world * k + world * (world - 1) // 2)), f"in flight [{k}]")
    check_equal(same, torch.full((n,), float(world * world)), "same tensor twice in flight")

    # 5. Outputs stay alive: the only reference is the Work's.
    w = dist.all_reduce(torch.ones(n, device=d), async_op=True)
    junk = [torch.full((n,), 7.0, device=d) for _ in range(4)]
    w.wait()
    check_equal(w.result()[0], torch.full((n,), float(world)), "output kept alive by the Work")
    del junk

    # 6. The Future is device-aware: a callback's tensor ops are ordered after the op.
    y = torch.full((n,), float(rank), device=d)
    fut = dist.all_reduce(y, async_op=True).get_future().then(lambda f: f.value()[0] * 3)
    z = fut.wait()
    check(z.is_cuda, "future value is not on the GPU")
    check_equal(z, torch.full((n,), 3.0 * world * (world - 1) / 2), "future callback")

    # 7. An all_gather issued async, then a CPU op on the same group, then wait.
    outs = [torch.empty(n, device=d) for _ in range(world)]
    w = dist.all_gather(outs, torch.full((n,), float(rank), device=d), async_op=True)
    c = torch.full((2,), float(rank))
    dist.all_reduce(c)
    w.wait()
    for r in range(world):
        check_equal(outs[r], torch.full((n,), float(r)), f"async all_gather [{r}]")
    check_equal(c, torch.full((2,), float(world * (world - 1) // 2)), "cpu all_reduce between")

    # 8. Synchronous calls run on the caller's stream (Note [Synchronous CUDA calls]), asynchronous
    # ones on the internal stream, and the group's kernels still run in issue order (Note [Stream
    # order]): a synchronous call on a side stream held back by a slow kernel, between two
    # asynchronous calls. Out of order, the kernels would take each other's sequence numbers.
    a = torch.full((n,), float(rank), device=d)
    w1 = dist.all_reduce(a, async_op=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        b = torch.full((n,), float(rank + 1), device=d)
        dist.all_reduce(b)
        b2 = b * 2  # on the side stream, after the synchronous call
    w2 = dist.all_reduce(a, async_op=True)
    w1.wait()
    w2.wait()
    side.synchronize()
    total = world * (world - 1) // 2
    check_equal(a, torch.full((n,), float(world * total)), "async, sync on a side stream, async")
    check_equal(b2, torch.full((n,), 2.0 * (total + world)), "sync call on a side stream")

    # 9. The other way round: a synchronous call on the default stream held back by a slow kernel,
    # then a synchronous and an asynchronous call from a side stream, then is_completed() and a
    # wait() from a stream other than the one a synchronous call ran on.
    x = torch.full((n,), float(rank), device=d)
    torch.cuda._sleep(20_000_000)
    dist.all_reduce(x)
    with torch.cuda.stream(side):
        y = torch.full((n,), float(rank + 2), device=d)
        dist.all_reduce(y)
        dist.all_reduce(y, async_op=True).wait()
        y2 = y * 1
    torch.cuda.synchronize()
    check_equal(x, torch.full((n,), float(total)), "sync on the default stream, then a side stream")
    check_equal(y2, torch.full((n,), float(world * (total + 2 * world))), "sync then async on a side stream")
    # The Work of a synchronous call (torch's Python drops it; a C++-level caller keeps it): wait()
    # on another stream orders that stream after the kernel, and is_completed() follows the GPU.
    opts = dist.AllreduceOptions()
    if hasattr(opts, "asyncOp"):  # torch versions whose options carry it
        opts.asyncOp = False
        ones = torch.ones(n, device=d)
        torch.cuda._sleep(20_000_000)
        w4 = dist.group.WORLD.allreduce([ones], opts)
        with torch.cuda.stream(side):
            w4.wait()
            z = ones * 1
        side.synchronize()
        check(w4.is_completed(), "a synchronous call's Work is not completed once its stream passed it")
        check_equal(z, torch.full((n,), float(world)), "a side stream after wait() on a synchronous call")
        # is_completed() of a synchronous call held back by a slow kernel is false at first (a staged call
        # waits for its stream on the host before it returns) and true after a synchronize, whether or not
        # it was asked before.
        torch.cuda._sleep(20_000_000)
        w5 = dist.group.WORLD.allreduce([ones], opts)
        check(not direct or not w5.is_completed(), "a synchronous call's Work is completed before its stream got there")
        w6 = dist.group.WORLD.allreduce([ones], opts)
        torch.cuda.synchronize()
        check(w5.is_completed() and w6.is_completed(), "a synchronous call's Work is not completed after a synchronize")
        check_equal(ones, torch.full((n,), float(world**3)), "two synchronous calls after a slow kernel")
    finish()


def cpu_and_cuda(rank, world, gloo):
    """One group serves CPU and CUDA tensors, interleaved."""
    for k in range(3):
        a = torch.full((5,), float(rank + k))
        b = torch.full((5,), float(rank + k), device=dev())
        dist.all_reduce(a)
        dist.all_reduce(b)
        check_equal(a, b.cpu(), f"cpu vs cuda [{k}]")
    finish()


# ---------------------------------------------------------------- DDP


def ddp_matches_gloo(rank, world, gloo, steps=5, fp16_hook=False):
    """DDP on CUDA through tilecomm trains to the same parameters as DDP on CPU through Gloo; with
    fp16_hook, both with the fp16 compression hook (float16 all_reduces, their device-aware Futures
    chained with then())."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    d = dev()
    a = DDP(model().to(d), device_ids=[d.index], bucket_cap_mb=0.01)  # several buckets
    b = DDP(model(), process_group=gloo)
    if fp16_hook:
        a.register_comm_hook(None, default_hooks.fp16_compress_hook)
        b.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
    rtol, atol = (1e-3, 5e-4) if fp16_hook else (1e-4, 1e-5)  # float16 sums, rounded differently
    oa = torch.optim.SGD(a.parameters(), lr=0.1)
    ob = torch.optim.SGD(b.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        for m, o, dv in ((a, oa, d), (b, ob, torch.device("cpu"))):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(x.to(dv)), y.to(dv)).backward()
            o.step()
    for (name, pa), pb in zip(a.module.named_parameters(), b.module.parameters()):
        check(torch.allclose(pa.detach().cpu(), pb.detach(), rtol=rtol, atol=atol),
              f"DDP parameter {name}: max diff {(pa.detach().cpu() - pb.detach()).abs().max().item()}")
        identical(gloo, pa, f"DDP parameter {name}")
    finish()


def matches_reference(model, ref, gloo, what):
    """A sharded model's parameters (DTensors, gathered whole) against a one-process reference's on
    the CPU, to float tolerance, and bitwise identical across ranks."""
    for k, (p, q) in enumerate(zip(model.parameters(), ref.parameters())):
        full = p.full_tensor().detach()
        check(torch.allclose(full.cpu(), q.detach(), rtol=1e-4, atol=1e-5),
              f"{what} parameter {k}: max diff {(full.cpu() - q.detach()).abs().max().item()}")
        identical(gloo, full, f"{what} parameter {k}")


def fsdp2_on_cuda(rank, world, gloo, steps=4, reshard_after_forward=True):
    """FSDP2 (fully_shard) on CUDA through tilecomm trains to the parameters of a one-process,
    unsharded reference on the CPU. FSDP2 issues its all_gathers and reduce_scatters asynchronously
    from streams of its own and waits on their Works and events: the stream semantics under a real
    client."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def batch(step, r):
        g = torch.Generator().manual_seed(1000 * step + r)
        return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = copy.deepcopy(ref).to(dev())
    mesh = init_device_mesh("cuda", (world,))
    check(dist.get_backend(mesh.get_group()) == "tilecomm", f"the mesh's group is {dist.get_backend(mesh.get_group())}")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x.to(dev())), y.to(dev()))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = sum(torch.nn.functional.mse_loss(ref(batch(step, r)[0]), batch(step, r)[1]) for r in range(world))
        ref_opt.zero_grad()
        (ref_loss / world).backward()
        ref_opt.step()
    matches_reference(model, ref, gloo, "FSDP2")
    torch.cuda.synchronize()
    finish()


def tensor_parallel_on_cuda(rank, world, gloo, steps=3):
    """Tensor parallelism on CUDA through tilecomm: the functional collectives DTensor runs on
    (closed form; each result is waited for through wait_tensor, which orders the caller's stream
    after the collective), and a column- then row-parallel MLP trained against a one-process
    reference on the CPU."""
    import copy

    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    d, group = dev(), dist.group.WORLD
    x = torch.arange(6, dtype=torch.float32, device=d) + rank
    base = torch.arange(6, dtype=torch.float32)
    check_equal(funcol.all_reduce(x, "sum", group), world * base + sum(range(world)), "funcol all_reduce sum")
    check_equal(funcol.all_reduce(x, "max", group), base + world - 1, "funcol all_reduce max")
    check_equal(funcol.all_gather_tensor(x, 0, group), torch.cat([base + r for r in range(world)]),
                "funcol all_gather_tensor")
    blocks = torch.arange(2 * world, dtype=torch.float32, device=d) * (rank + 1)
    check_equal(funcol.reduce_scatter_tensor(blocks, "sum", 0, group),
                torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) * sum(range(1, world + 1)),
                "funcol reduce_scatter_tensor")
    a2a = funcol.all_to_all_single(torch.arange(world, dtype=torch.float32, device=d) + 10 * rank, None, None, group)
    check_equal(a2a, torch.arange(world, dtype=torch.float32) * 10 + rank, "funcol all_to_all_single")
    coalesced = funcol.all_reduce_coalesced([x, 2 * x], "sum", group)
    for i, t in enumerate(coalesced):
        check_equal(t, (i + 1) * (world * base + sum(range(world))), f"funcol all_reduce_coalesced [{i}]")

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(ref).to(d)
    mesh = init_device_mesh("cuda", (world,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step)  # tensor parallel: every rank takes the same batch
        inp, target = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        for m, o, dv in ((model, opt, d), (ref, ref_opt, torch.device("cpu"))):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(inp.to(dv)), target.to(dv)).backward()
            o.step()
    matches_reference(model, ref, gloo, "TP")
    torch.cuda.synchronize()
    finish()


# ---------------------------------------------------------------- timings


def latency(rank, world, gloo, sizes, iters=200):
    """Mean all_reduce latency (float32) per size in microseconds, CUDA events on the current stream,
    and the kernel each size ran ("" where it was staged)."""
    d = dev()
    out, ran = {}, {}
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), device=d)
        for _ in range(20):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(t)
        end.record()
        end.synchronize()
        out[nbytes] = start.elapsed_time(end) * 1000 / iters
        ran[nbytes] = backend().cuda_last_kernel()
    return out, ran


# ---------------------------------------------------------------- spawn cases


def spawn_timeout(rank, world, port, timeout_s=3.0, gather=False):
    """A rank that never arrives: the direct kernel stops waiting after the group timeout (measured on
    the GPU), wait() raises naming the rank, and the group fails fast afterwards."""
    from datetime import timedelta

    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=timeout_s))
    done = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
    try:
        t = torch.ones(16, device=dev())
        dist.all_reduce(t)  # sets up cuda_ipc on every rank
        torch.cuda.synchronize()
        assert t[0].item() == world, t
        if rank != 0:
            return "absent"  # alive until rank 0 is done (the barrier below), but never calls the second all_reduce
        return _absent_rank(t, gather, world)
    finally:
        with contextlib.suppress(Exception):  # the barrier only keeps rank 1 alive: rank 0's result stands
            dist.barrier(group=done)


def _absent_rank(t, gather, world):
    t0 = time.monotonic()
    if gather:
        w = dist.all_gather_into_tensor(torch.empty(16 * world, device=dev()), t, async_op=True)
    else:
        w = dist.all_reduce(t, async_op=True)
    w.wait()  # the kernel is enqueued; the CPU is not blocked on it
    enqueued = time.monotonic() - t0
    torch.cuda.synchronize()  # returns: the kernel gave up waiting
    waited = time.monotonic() - t0
    try:
        w.wait()
        return f"wait() did not raise (waited {waited:.1f} s)"
    except Exception as e:  # noqa: BLE001
        first = str(e)
    try:
        dist.all_reduce(torch.ones(4, device=dev()))
        torch.cuda.synchronize()
        return f"the group kept working after: {first}"
    except Exception as e:  # noqa: BLE001
        second = str(e)
    return {"enqueued": enqueued, "waited": waited, "first": first, "second": second, "pid": os.getpid()}


def spawn_free_after_destroy(rank, world, port):
    """Tensors a group used may outlive it: freeing them after destroy_process_group
    (the caching allocator records events on the streams they were used on) is fine."""
    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    kept = [torch.ones(n, device=dev()) for n in (16, 1 << 22)]  # direct and staged paths
    for t in kept:
        dist.all_reduce(t)
    parts = [torch.empty(16, device=dev()) for _ in range(world)]
    dist.all_gather(parts, kept[0])
    torch.cuda.synchronize()
    ok = all(float(t[0]) == world for t in kept)
    dist.destroy_process_group()
    del kept, parts
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return ok


def spawn_bound_device(rank, world, port):
    """A default group bound to its GPU (init_process_group's device_id), as FSDP2 and TP scripts make
    it: DeviceMesh then splits it (dist.split_group, Note [Splitting]), new_group asks the ranks left
    out to take part in a split (perform_nocolor_split), and dist.split_group works directly; each
    group's all_reduce of CUDA tensors gives the closed form."""
    from torch.distributed.device_mesh import init_device_mesh

    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            device_id=dev())

    def summed(group, members):
        t = torch.full((1031,), float(rank + 1), device=dev())
        dist.all_reduce(t, group=group)
        return bool(t.eq(sum(r + 1 for r in members)).all())

    rows = 2 if world % 2 == 0 else 1
    cols = world // rows
    mesh = init_device_mesh("cuda", (rows, cols), mesh_dim_names=("dp", "tp"))
    r, c = divmod(rank, cols)
    ok = {"tp": summed(mesh.get_group("tp"), [r * cols + j for j in range(cols)]),
          "dp": summed(mesh.get_group("dp"), [i * cols + c for i in range(rows)])}
    first = dist.new_group([0, 1] if world > 1 else [0])  # the others are asked to join a split
    ok["new_group"] = summed(first, [0, 1] if world > 1 else [0]) if rank < 2 else first is dist.GroupMember.NON_GROUP_MEMBER
    evens = list(range(0, world, 2))
    # Note [Splitting]: children set up through the parent's set-up Store, under their ranks
    made = dist.group.WORLD._get_backend(torch.device("cuda")).setup_store
    key = f"tilecomm-split[{','.join(map(str, evens))}]/tilecomm/creations"
    before = made.add(key, 0)
    dist.barrier()  # every rank has read the count before any sets the child up
    # new_group registered its group on ranks 0 and 1 only: from 4 ranks on, torch names this child
    # differently on rank 0 and rank 2, and the DeviceMesh made a child of the same ranks before
    child = dist.split_group(split_ranks=[evens])
    ok["split_group"] = summed(child, evens) if rank % 2 == 0 else child is None
    if child is not None:
        ok["split_backend"] = dist.get_backend(child) == "tilecomm"
        # c10d asks for the child once per device type (CPU and CUDA): it is set up once
        ok["split_once"] = made.add(key, 0) - before == len(evens)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return ok


def spawn_allreduce_sequence(rank, world, port, timeout_s=60.0):
    """allreduce_sequence in fresh processes, e.g. without MPS (the ranks' kernels then time-slice
    the GPU instead of running side by side)."""
    from datetime import timedelta

    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    allreduce_sequence(rank, world, gloo)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return True


def spawn_p2p_then_destroy(rank, world, port, timeout_s=60.0):
    """Rank 1 receives a CUDA tensor and destroys its group at once, while the copy behind its
    receive may still be on the GPU: rank 0's blocking send must still get its reply (Note [Direct
    point-to-point]). Returns (seconds rank 0's send took, whether rank 1 got the bytes)."""
    from datetime import timedelta

    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=timeout_s))
    n = 1 << 24  # 64 MiB: the copy takes a while
    t0 = time.monotonic()
    if rank == 0:
        dist.send(torch.full((n,), 3.0, device=dev()), 1)
        ok = True
    else:
        got = torch.zeros(n, device=dev())
        dist.recv(got, 0)
        dist.destroy_process_group()
        ok = bool((got == 3.0).all())
        return time.monotonic() - t0, ok
    took = time.monotonic() - t0
    dist.destroy_process_group()
    return took, ok


def spawn_killed_mid_kernel(rank, world, port, port2, n=4096, timeout_s=60.0):
    """Ranks 1 and 2 call an all_reduce whose kernels wait for rank 0, which calls late; rank 2 is
    killed (SIGKILL) meanwhile. The host's watchdog sees the process gone: rank 1's kernel stops
    waiting (Note [GPU watchdog]) and rank 0 launches nothing; both raise an error naming rank 2
    well within the 60 s group timeout, the group fails fast, and after destroy_process_group a new
    group of the survivors (new Store) works."""
    import signal
    from datetime import timedelta

    import tilecomm  # noqa: F401

    victim = world - 1
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=timeout_s))
    t = torch.ones(n, device=dev())
    dist.all_reduce(t)  # sets up the peer transport on every rank
    torch.cuda.synchronize()
    assert t[0].item() == world, t
    dist.barrier()
    if rank == victim:
        dist.all_reduce(t, async_op=True)
        time.sleep(0.5)  # its kernel is running: it waits for rank 0
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        time.sleep(1.5)  # calls once the victim is gone
    t0 = time.monotonic()
    errors = []
    for _ in range(4):
        try:
            w = dist.all_reduce(t, async_op=True)
            w.wait()  # the host part: the kernel is enqueued
            torch.cuda.synchronize()
            w.wait()  # the kernel has ended: a wait that failed on the GPU raises here
        except Exception as e:  # noqa: BLE001
            errors.append(str(e))
            if len(errors) == 2:
                break
    waited = time.monotonic() - t0
    status = backend().cuda_status()
    dist.destroy_process_group()
    # The survivors go on in a new group.
    new_world = world - 1
    try:
        dist.init_process_group("tilecomm", rank=rank, world_size=new_world,
                                init_method=f"tcp://127.0.0.1:{port2}", timeout=timedelta(seconds=timeout_s))
        x = torch.full((n,), float(rank + 1), device=dev())
        dist.all_reduce(x)
        torch.cuda.synchronize()
        recovered = bool((x == new_world * (new_world + 1) / 2).all().item())
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        recovered = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return {"errors": errors, "waited": waited, "status": status, "recovered": recovered}


def gpu_topology(rank, world, gloo):
    """What tilecomm.gpu_topology reports after a direct call (devices, links, transport), and the scope
    of the kernels' fences from the status (Note [Fence scope])."""
    import tilecomm

    t = torch.ones(8, device=dev())
    dist.all_reduce(t)
    torch.cuda.synchronize()
    fence = [w.split("=", 1)[1] for w in backend().cuda_status().split() if w.startswith("fence=")]
    return {**tilecomm.gpu_topology(), "fence": fence}


def auto_kernels(rank, world, gloo):
    """With TILECOMM_PROTO=auto and the shipped CUDA model: all_reduce runs LL up to the model's crossover
    over GPU memory and a simple kernel above it; all_gather runs LL up to the whole LL buffer (its own
    limit, not all_reduce's), except that an output that registers (TILECOMM_CUDA_REGISTER_BYTES) runs the
    push into the registered outputs above the model's crossover with LL. Results against the closed form.
    Returns {case: kernel}."""
    import tilecomm
    from tilecomm import cuda_model, selector, settings

    profile = selector.load_profile(None)
    limit = cuda_model.thresholds(profile, world)["cuda_ipc"]["ll_bytes"]
    sizes = [b for b in sorted({16, limit, 2 * limit}) if 16 <= b <= 1 << 20]
    check(any(b > limit for b in sizes), f"LL limit {limit}: no size above it to check")
    ran = {}
    for nbytes in sizes:
        n = nbytes // 4
        t = torch.full((n,), float(rank + 1), device=dev())
        dist.all_reduce(t)
        check_equal(t, torch.full((n,), world * (world + 1) / 2), f"all_reduce {nbytes} B")
        got = ran[f"all_reduce {nbytes}"] = backend().cuda_last_kernel()
        want = {"allreduce_one_shot_ll"} if nbytes <= limit else {"allreduce_one_shot", "allreduce_two_shot"}
        check(got in want, f"all_reduce of {nbytes} B (LL limit {limit}) ran {got!r}")
    check(tilecomm.gpu_topology()["transport"] == "cuda_ipc", f"transport: {tilecomm.gpu_topology()}")
    register = settings.resolve()["TILECOMM_CUDA_REGISTER_BYTES"]
    at = cuda_model.allgather_register_ll_bytes(profile, world)
    for nbytes in sorted({at, 2 * at, cuda_model.LL_MAX_BYTES}):
        if nbytes > cuda_model.LL_MAX_BYTES:
            continue
        n = nbytes // 4
        out = torch.empty(world * n, device=dev())
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=dev()))
        check_equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(n), f"all_gather of {nbytes} B")
        got = ran[f"all_gather {nbytes}"] = backend().cuda_last_kernel()
        pushed = nbytes > at and nbytes * world >= register
        want = "allgather_push_registered" if pushed else "allgather_direct_ll"
        check(got == want, f"all_gather of {nbytes} B (registered outputs leave LL above {at}) ran {got!r}, not {want}")
    # outputs that are not one range do not register: they keep LL up to the buffer
    n, gap = cuda_model.LL_MAX_BYTES // 4, 64
    buf = torch.empty(world * (n + gap), device=dev())
    parts = [buf[q * (n + gap):q * (n + gap) + n] for q in range(world)]
    dist.all_gather(parts, torch.full((n,), float(rank), device=dev()))
    for q in range(world):
        check_equal(parts[q], torch.full((n,), float(q)), f"all_gather into separate outputs, block {q}")
    got = ran["all_gather list"] = backend().cuda_last_kernel()
    check(got == "allgather_direct_ll", f"all_gather of 1 MiB into separate outputs ran {got!r}")
    finish()
    return ran


# ---------------------------------------------------------------- NVSHMEM (all_gather, reduce_scatter)


def _nvshmem_calls(rank, world, gloo, g, dtypes, ops, sizes, expect, what, in_place, large=()):
    """all_gather (tensor and list) and reduce_scatter (tensor; list for sum and max) of every (dtype, op,
    size) in group g, and of `large` sizes for float32, bfloat16 and int8 only, against the closed form and
    across ranks, and all_reduce too where `expect` names its kernel; `expect` names the kernel each must
    run (None: any). in_place: even ranks pass inputs, all_gather_into_tensor outputs and all_reduce
    tensors on the symmetric heap (peers read such inputs in place when pulling, store into such outputs
    in place when pushing, and do both on such all_reduce tensors)."""
    import tilecomm

    be = g._get_backend(torch.device("cuda"))
    most = max(list(sizes) + list(large)) * world * 8
    cases = [(name, n) for name in dtypes for n in sizes]
    cases += [(name, n) for name in ("bfloat16", "float32", "int8") if name in dtypes for n in large]
    start = time.monotonic()
    heap = tilecomm.symmetric_empty(most, dtype=torch.uint8, group=g) if in_place else None
    heap_out = tilecomm.symmetric_empty(most, dtype=torch.uint8, group=g) if in_place else None

    def source(x, area=heap):
        if area is None or rank % 2:
            return x
        t = area[: x.numel() * x.element_size()].view(x.dtype)
        t.copy_(x)
        return t

    def ran(kind, tag):
        got = be.cuda_last_kernel()
        want = expect.get(kind) if expect else None
        check(want is None or got == want, f"{tag}: ran {got!r}, expected {want!r}")

    calls = 0
    first = None  # when the first call had finished
    for name, n in cases:
        dt = DTYPES[name]
        tag = f"{what} all_gather {name} n={n}"
        x = source(data(rank, n, dt).to(dev()))
        want = torch.cat([data(r, n, dt) for r in range(world)])
        out = source(torch.full((world * n,), 1, dtype=dt, device=dev()), heap_out)
        dist.all_gather_into_tensor(out, x, group=g)
        check_equal(out, want, tag)
        first = first or time.monotonic()
        identical(gloo, out, tag)
        ran("all_gather", tag)
        outs = [torch.zeros(n, dtype=dt, device=dev()) for _ in range(world)]
        dist.all_gather(outs, x, group=g)
        check_equal(torch.cat(outs), want, tag + " (list)")
        ran("all_gather", tag + " (list)")
        calls += 2
        for op in ops:
            if not applicable(op, dt):
                continue
            tag = f"{what} reduce_scatter {name} {op} n={n}"
            blocks = [data(rank, n, dt, op, salt=q) for q in range(world)]
            inp = source(torch.cat(blocks).to(dev()))
            keep = inp.clone()
            o = torch.zeros(n, dtype=dt, device=dev())
            dist.reduce_scatter_tensor(o, inp, op=reduce_op(op), group=g)
            want = closed_form(world, n, dt, op, salt=rank)
            check_equal(o, want, tag)
            check_equal(inp, keep.cpu(), tag + ": input changed")
            if not dt.is_complex:
                ran("reduce_scatter", tag)
            calls += 1
            if op not in ("sum", "max"):
                continue
            o2 = torch.zeros(n, dtype=dt, device=dev())
            dist.reduce_scatter(o2, [b.to(dev()) for b in blocks], op=reduce_op(op), group=g)
            check_equal(o2, want, tag + " (list)")
            calls += 1
        for op in ops if expect and "all_reduce" in expect else ():
            if not applicable(op, dt):
                continue
            tag = f"{what} all_reduce {name} {op} n={n}"
            y = source(data(rank, n, dt, op, salt=1).to(dev()))
            dist.all_reduce(y, op=reduce_op(op), group=g)
            check_equal(y, closed_form(world, n, dt, op, salt=1), tag)
            identical(gloo, y, tag)
            if not dt.is_complex:
                ran("all_reduce", tag)
            calls += 1
    torch.cuda.synchronize()
    done = time.monotonic()
    x = torch.ones(1031, device=dev())
    out = torch.empty(world * 1031, device=dev())
    for _ in range(2):  # the second loop is timed
        alone = time.monotonic()
        for _ in range(20):
            dist.all_gather_into_tensor(out, x, group=g)
        torch.cuda.synchronize()
    if rank == 0:  # where a slow run spends its time: the set-up, the checked calls, or the calls alone
        print(f"{what}: set-up and first call {first - start:.1f} s, {calls} checked calls {done - first:.1f} s, "
              f"an all_gather alone {(time.monotonic() - alone) / 20 * 1e3:.2f} ms", flush=True)
    return calls, be.cuda_status()


def spawn_nvshmem(rank, world, port, configs, dtypes, ops, sizes, large=()):
    """Every config ({name: [TILECOMM_* environment, {collective: kernel expected or None}, in_place, a
    narrower {"dtypes", "ops"} or {}]}) in a new tilecomm group of the same processes (NVSHMEM is
    initialised once, by the first). A config whose
    kernel is "error: <text>" must raise a ValueError containing the text at its first CUDA all_gather (or
    all_reduce, as its key says), and leave the group usable for CPU tensors."""
    from datetime import timedelta

    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    timeout = timedelta(seconds=120)
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timeout)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    report = {}
    start = time.monotonic()
    for name, (env, expect, in_place, narrower) in configs.items():
        for k in [k for k in os.environ if k.startswith("TILECOMM_") and not k.startswith("TILECOMM_TEST_")]:
            del os.environ[k]
        os.environ.update(env)
        g = dist.new_group(backend="tilecomm", timeout=timeout)
        kind, err = next(((k, v) for k, v in (expect or {}).items() if str(v).startswith("error: ")), (None, ""))
        if kind:
            x = torch.ones(8, device=dev())
            try:
                if kind == "all_gather":
                    dist.all_gather_into_tensor(torch.empty(8 * world, device=dev()), x, group=g)
                else:
                    dist.all_reduce(x, group=g)
                check(False, f"{name}: no error")
            except ValueError as e:
                check(err[7:] in str(e), f"{name}: {e}")
            c = torch.ones(3)
            dist.all_reduce(c, group=g)  # the group still serves CPU tensors
            check_equal(c, torch.full((3,), float(world)), f"{name}: CPU all_reduce after the error")
            report[name] = (0, g._get_backend(torch.device("cuda")).cuda_status())
        else:
            report[name] = _nvshmem_calls(rank, world, gloo, g, narrower.get("dtypes", dtypes),
                                          narrower.get("ops", ops), sizes, expect, name, in_place, large)
            if name in ("auto", "push", "pull", "put_signal"):
                _nvshmem_graph(rank, world, g, name)
        if rank == 0:
            print(f"spawn_nvshmem world={world}: {name} done at {time.monotonic() - start:.0f} s, "
                  f"{len(_FAILURES)} failed checks so far", flush=True)
        torch.cuda.synchronize()
        dist.destroy_process_group(g)
    if "push" in configs:
        _nvshmem_baselines(rank, world, timeout)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    finish()
    return report


def spawn_nvshmem4py(rank, world, port, sizes=(1031, 65543)):
    """NVSHMEM initialised by the application through nvshmem4py before tilecomm needs it (Note [NVSHMEM
    lifetime]): tilecomm takes that initialisation, and tensors from ``nvshmem.core.tensor`` are used in
    place by the forced pull and push all_gathers (above 64 KiB per rank, Note [Small calls]), against the
    closed form. Returns {algorithm: the group's cuda_status()}."""
    from datetime import timedelta

    import numpy as np
    import nvshmem.core as nvshmem

    import tilecomm  # noqa: F401

    try:
        from cuda.core import Device
    except ImportError:  # cuda.core before 0.4
        from cuda.core.experimental import Device

    torch.cuda.set_device(rank % torch.cuda.device_count())
    timeout = timedelta(seconds=120)
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timeout)
    # nvshmem4py's unique-id start, its id handed from rank 0 through the group's CPU broadcast
    uid = nvshmem.get_unique_id(empty=rank != 0)
    raw = uid._data.view(np.int8)
    shared = torch.from_numpy(raw.copy())
    dist.broadcast(shared, 0)
    raw[:] = shared.numpy()
    device = Device(torch.cuda.current_device())
    device.set_current()
    nvshmem.init(device=device, uid=uid, rank=rank, nranks=world, initializer_method="uid")
    report = {}
    for algo in ("nvshmem_pull", "nvshmem_push"):
        os.environ["TILECOMM_ALGO"] = f"all_gather:{algo}"
        g = dist.new_group(backend="tilecomm", timeout=timeout)
        be = g._get_backend(torch.device("cuda"))
        for n in sizes:
            x = nvshmem.tensor((n,), dtype=torch.float32)
            out = nvshmem.tensor((world * n,), dtype=torch.float32)
            x.copy_(torch.arange(n, device=dev(), dtype=torch.float32) + 1000 * rank)
            dist.all_gather_into_tensor(out, x, group=g)
            torch.cuda.synchronize()
            want = torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * r for r in range(world)])
            check_equal(out, want, f"nvshmem4py {algo} n={n}")
            check(be.cuda_last_kernel() == f"allgather_{algo}", f"nvshmem4py {algo} n={n}: ran {be.cuda_last_kernel()}")
            nvshmem.free_tensor(x)  # collective, as the allocation
            nvshmem.free_tensor(out)
        report[algo] = be.cuda_status()
        dist.destroy_process_group(g)
    del os.environ["TILECOMM_ALGO"]
    torch.cuda.synchronize()
    dist.destroy_process_group()
    finish()
    return report


def _nvshmem_graph(rank, world, g, name, n=1031, replays=5):
    """Under CUDA graph capture (Note [NVSHMEM capture]): NVSHMEM's kernels that use peer addresses
    ("auto", "push" and "pull", the last two forced by TILECOMM_ALGO) are captured, a reduce_scatter and
    an all_gather in one graph (auto's all_gather of this size runs LL), and every replay with fresh
    inputs gives the closed form; with put-with-signal forced ("put_signal"), the capture is refused,
    saying why, and the group still works."""
    be = g._get_backend(torch.device("cuda"))
    inp, out = torch.empty(world * n, device=dev()), torch.empty(n, device=dev())
    shard, gathered = torch.empty(n, device=dev()), torch.empty(world * n, device=dev())
    dist.reduce_scatter_tensor(out, inp.fill_(1.0), group=g)
    eager = be.cuda_last_kernel()
    check(eager.startswith("reducescatter_nvshmem"), f"{name}: eager reduce_scatter ran {eager!r}")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    if name == "put_signal":
        try:
            with torch.cuda.graph(graph):
                dist.reduce_scatter_tensor(out, inp, group=g)
            check(False, "a reduce_scatter forced onto put-with-signal was captured without an error")
        except Exception as e:  # noqa: BLE001  (the ValueError, possibly chained by the capture's end)
            text = f"{e} {e.__context__}"
            check("cannot be captured" in text and "put-with-signal" in text, f"unclear capture error: {text}")
        torch.cuda.synchronize()
        dist.reduce_scatter_tensor(out, inp.fill_(2.0), group=g)
        check_equal(out, torch.full((n,), 2.0 * world), "put_signal reduce_scatter after a refused capture")
        return
    with torch.cuda.graph(graph):
        dist.reduce_scatter_tensor(out, inp, group=g)
        captured = be.cuda_last_kernel()
        dist.all_gather_into_tensor(gathered, shard, group=g)
        gather = be.cuda_last_kernel()
    check(captured == eager, f"{name}: captured reduce_scatter ran {captured!r}, eagerly {eager!r}")
    if name in ("push", "pull"):
        check(gather == f"allgather_nvshmem_{name}", f"{name}: captured all_gather ran {gather!r}")
    for k in range(replays):
        inp.copy_(torch.arange(world * n, dtype=torch.float32) + rank + k)
        shard.copy_(torch.arange(n, dtype=torch.float32) + rank * n - k)
        graph.replay()
        want = world * (torch.arange(n, dtype=torch.float32) + rank * n + k) + world * (world - 1) // 2
        check_equal(out, want, f"{name}: captured reduce_scatter, replay {k}")
        check_equal(gathered, torch.arange(world * n, dtype=torch.float32) - k,
                    f"{name}: captured all_gather, replay {k}")
    torch.cuda.synchronize()
    del graph


def _nvshmem_baselines(rank, world, timeout, n=1031):
    """NVSHMEM's own fcollect and sum reduction, which the benchmarks compare with, give the closed form."""
    from tilecomm import nvshmem

    g = dist.new_group(backend="tilecomm", timeout=timeout)
    src, red = (nvshmem.symmetric_empty(n, dtype=torch.float32, group=g) for _ in range(2))
    out = nvshmem.symmetric_empty(world * n, dtype=torch.float32, group=g)
    base = torch.arange(n, dtype=torch.float32)
    src.copy_(base + rank * n)
    nvshmem.fcollect(out, src)
    nvshmem.sum_reduce(red, src)
    check_equal(out, torch.arange(world * n, dtype=torch.float32), "NVSHMEM fcollect")
    check_equal(red, world * base + n * world * (world - 1) // 2, "NVSHMEM sum reduction")
    try:
        nvshmem.sum_reduce(red, out)
        check(False, "NVSHMEM sum reduction of tensors of two sizes: no error")
    except ValueError as e:
        check("float32 symmetric tensors of one size" in str(e), f"NVSHMEM sum reduction of two sizes: {e}")
    torch.cuda.synchronize()
    dist.destroy_process_group(g)


# ---------------------------------------------------------------- the schedule executor


def _ran_schedule(what, want):
    """The last CUDA call ran on the schedule executor, as algorithm `want` (None: any)."""
    got = backend().cuda_last_kernel()
    ok = got == f"schedule:{want}" if want else got.startswith("schedule:")
    check(ok, f"{what}: ran {got!r}, expected schedule:{want or '...'}")


def schedule_matrix(rank, world, gloo, dtypes, ops, sizes, algos):
    """Every collective whose schedule the GPU's executor walks (Note [Schedule executor] in
    csrc/cuda/schedule_executor.h), against the closed form, bitwise identical across ranks, and
    run by the expected algorithm (algos: collective -> algorithm id; a missing one: any)."""
    d = dev()
    for name in dtypes:
        dt = DTYPES[name]
        for n in sizes:
            x = [data(r, n, dt, "sum", salt=n % 7) for r in range(world)]
            what = f"{name} n={n}"
            for root in sorted({0, world - 1}):
                t = (x[rank] if rank == root else torch.zeros(n, dtype=dt)).to(d)
                dist.broadcast(t, src=root)
                check_equal(t, x[root], f"broadcast root={root} {what}")
                _ran_schedule(f"broadcast {what}", algos.get("broadcast"))
            big = torch.empty(world * n, dtype=dt, device=d)
            dist.all_gather_into_tensor(big, x[rank].to(d))
            check_equal(big, torch.cat(x), f"all_gather_into_tensor {what}")
            _ran_schedule(f"all_gather {what}", algos.get("all_gather"))
            outs = [torch.full((n,), 1, dtype=dt, device=d) for _ in range(world)]
            dist.all_gather(outs, x[rank].to(d))
            for r in range(world):
                check_equal(outs[r], x[r], f"all_gather [{r}] {what}")
            gather_and_scatter(rank, world, x, what,
                               after=lambda coll: _ran_schedule(f"{coll} {what}", algos.get(coll)))
            for op in ops:
                if not applicable(op, dt):
                    continue
                xs = [data(r, n, dt, op) for r in range(world)]
                want = closed_form(world, n, dt, op)
                ow = f"{op} {what}"
                t = xs[rank].to(d)
                dist.all_reduce(t, op=reduce_op(op))
                check_equal(t, want, f"all_reduce {ow}")
                identical(gloo, t, f"all_reduce {ow}")
                _ran_schedule(f"all_reduce {ow}", algos.get("all_reduce"))
                for root in sorted({0, world - 1}):
                    t = xs[rank].to(d)
                    dist.reduce(t, dst=root, op=reduce_op(op))
                    check_equal(t, want if rank == root else xs[rank], f"reduce root={root} {ow}")
                    _ran_schedule(f"reduce {ow}", algos.get("reduce"))
                # rank r's block j is data(r, salt=j): block `rank` of the reduction is the output
                blocks = torch.cat([data(rank, n, dt, op, salt=j) for j in range(world)]).to(d)
                o = torch.full((n,), 1, dtype=dt, device=d)
                dist.reduce_scatter_tensor(o, blocks, op=reduce_op(op))
                check_equal(o, closed_form(world, n, dt, op, salt=rank), f"reduce_scatter_tensor {ow}")
                _ran_schedule(f"reduce_scatter {ow}", algos.get("reduce_scatter"))
                check_equal(blocks.cpu(), torch.cat([data(rank, n, dt, op, salt=j) for j in range(world)]),
                            f"reduce_scatter_tensor {ow}: input unchanged")
    if "float32" in dtypes and sizes:  # all_reduce_coalesced: one schedule over the tensors' concatenation
        n = max(sizes)
        ts = [data(rank, n, torch.float32, "sum").to(d), data(rank, 3, torch.float32, "sum", salt=1).to(d)]
        dist.all_reduce_coalesced(ts)
        check_equal(ts[0], closed_form(world, n, torch.float32, "sum"), "all_reduce_coalesced [0]")
        check_equal(ts[1], closed_form(world, 3, torch.float32, "sum", salt=1), "all_reduce_coalesced [1]")
    torch.cuda.synchronize()
    st = backend().cuda_status()
    check("direct=on" in st and "programs=0" not in st, f"executor not set up: {st}")
    finish()
    return st


def schedule_graph(rank, world, gloo, replays):
    """Collectives run by the schedule executor captured in one CUDA graph and replayed with fresh
    inputs (the executor takes nothing per call from the host), eager calls between replays."""
    d = dev()
    n = 1031
    ar = torch.zeros(n, device=d)
    bc = torch.zeros(n, dtype=torch.int32, device=d)
    rd = torch.zeros(n, dtype=torch.bfloat16, device=d)
    ag_in = torch.zeros(n, dtype=torch.float16, device=d)
    ag_out = torch.empty(world * n, dtype=torch.float16, device=d)
    rs_in = torch.zeros(world * n, device=d)
    rs_out = torch.empty(n, device=d)
    root = world - 1

    def fill(k):
        ar.copy_(data(rank, n, torch.float32, "sum", salt=k))
        bc.copy_(data(rank, n, torch.int32, "sum", salt=k))
        rd.copy_(data(rank, n, torch.bfloat16, "max", salt=k))
        ag_in.copy_(data(rank, n, torch.float16, "sum", salt=k))
        rs_in.copy_(torch.cat([data(rank, n, torch.float32, "sum", salt=k + j) for j in range(world)]))

    def body():
        dist.all_reduce(ar)
        dist.broadcast(bc, src=root)
        dist.reduce(rd, dst=0, op=ReduceOp.MAX)
        dist.all_gather_into_tensor(ag_out, ag_in)
        dist.reduce_scatter_tensor(rs_out, rs_in)

    def verify(k, what):
        check_equal(ar, closed_form(world, n, torch.float32, "sum", salt=k), f"{what}: all_reduce")
        check_equal(bc, data(root, n, torch.int32, "sum", salt=k), f"{what}: broadcast")
        want = closed_form(world, n, torch.bfloat16, "max", salt=k) if rank == 0 else data(rank, n, torch.bfloat16,
                                                                                               "max", salt=k)
        check_equal(rd, want, f"{what}: reduce")
        check_equal(ag_out, torch.cat([data(r, n, torch.float16, "sum", salt=k) for r in range(world)]),
                    f"{what}: all_gather")
        check_equal(rs_out, closed_form(world, n, torch.float32, "sum", salt=k + rank), f"{what}: reduce_scatter")

    fill(0)
    body()  # eager: sets up the transport and the executor's programs
    verify(0, "eager")
    _ran_schedule("eager", None)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    eager = torch.zeros(64, dtype=torch.int64, device=d)
    for k in range(1, replays + 1):
        fill(k)
        graph.replay()
        verify(k, f"replay {k}")
        if k % 3 == 0:  # eager executor calls between replays
            eager.fill_(rank + k)
            dist.broadcast(eager, src=k % world)
            check_equal(eager, torch.full((64,), k % world + k, dtype=torch.int64), f"eager after {k}")
    torch.cuda.synchronize()
    finish()


def spawn_alltoall_mismatch(rank, world, port, timeout_s=20.0, mode="sizes"):
    """Two ranks whose all_to_all splits disagree, well before the timeout, and the group then fails
    fast. `sizes`: rank 0 sends rank 1 two rows where rank 1 expects three, rank 1 sends one where
    rank 0 expects two (each names the other); `empty`: rank 0 sends rank 1 nothing where rank 1
    expects one row (only channel 0's empty slice tells rank 1); `registered`: equal splits whose
    sizes differ, above the size that registers outputs (each names the other)."""
    from datetime import timedelta

    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=timeout_s))
    t = torch.arange(4, device=dev(), dtype=torch.float32)
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t)  # sets up the transport on every rank
    torch.cuda.synchronize()
    ran = backend().cuda_last_kernel()
    if mode == "empty":
        ins, outs = ([2, 0], [2, 2]) if rank == 0 else ([2, 2], [1, 2])
    else:
        ins, outs = ([2, 2], [2, 2]) if rank == 0 else ([1, 3], [3, 3])
    t0 = time.monotonic()
    first = ""
    try:
        if mode == "registered":
            n = (1 << 22) + 2 * rank
            dist.all_to_all_single(torch.empty(n, device=dev()), torch.ones(n, device=dev()))
        else:
            dist.all_to_all_single(torch.empty(sum(outs), device=dev()), torch.ones(sum(ins), device=dev()), outs,
                                   ins)
        torch.cuda.synchronize()
        dist.barrier()
    except Exception as e:  # noqa: BLE001
        first = str(e)
    waited = time.monotonic() - t0
    try:
        dist.all_to_all_single(out, t)
        torch.cuda.synchronize()
        second = "the group kept working"
    except Exception as e:  # noqa: BLE001
        second = str(e)
    return {"ran": ran, "first": first, "second": second, "waited": waited}


def spawn_capture_mismatch(rank, world, port, timeout_s=20.0):
    """Note [Registered tensors]: rank 0 captures an all_reduce of the captured registration size in a
    CUDA graph (it registers), rank 1 runs the same call eagerly (staged) and then captures another
    (it registers): the second exchange pairs with rank 0's first, with equal extents. Each rank's
    count of issued collectives differs there, so both raise a collective mismatch instead of running
    kernels of different calls against each other."""
    from datetime import timedelta

    import tilecomm  # noqa: F401
    from tilecomm import settings

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=timeout_s))
    warm = torch.ones(1031, device=dev())
    dist.all_reduce(warm)  # sets up the transport on every rank
    torch.cuda.synchronize()
    x = torch.ones(settings.value("TILECOMM_CUDA_CAPTURE_REGISTER_BYTES", {}) // 4, device=dev())
    torch.cuda.synchronize()
    before = _registered_calls()
    first = ""
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    try:
        if rank == 1:
            dist.all_reduce(x)  # eager: the staged kernel, waiting for rank 0's part of it
        # Not torch.cuda.graph, which first synchronizes the device (rank 1's kernel waits for rank 0).
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="relaxed")
            try:
                dist.all_reduce(x)
            finally:
                graph.capture_end()
    except Exception as e:  # noqa: BLE001
        first = f"{e} {e.__context__}"
    return {"first": first, "registered": _registered_calls() - before}


def spawn_schedule_mismatch(rank, world, port, timeout_s=20.0):
    """Ranks that call broadcasts of different sizes on the executor: an error that says so, well
    before the timeout, on the receiving rank; every rank's next call fails fast."""
    from datetime import timedelta

    import tilecomm  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=timeout_s))
    t = torch.full((16,), rank, device=dev())
    dist.broadcast(t, src=0)  # sets up the transport and the executor on every rank
    torch.cuda.synchronize()
    assert t[0].item() == 0, t
    t0 = time.monotonic()
    first = ""
    try:
        dist.broadcast(torch.ones(1000 * (rank + 1), device=dev()), src=0)
        torch.cuda.synchronize()
        dist.barrier()  # the failure reaches every rank through the group
    except Exception as e:  # noqa: BLE001
        first = str(e)
    waited = time.monotonic() - t0
    try:
        dist.broadcast(torch.ones(4, device=dev()), src=0)
        torch.cuda.synchronize()
        second = "the group kept working"
    except Exception as e:  # noqa: BLE001
        second = str(e)
    return {"first": first, "second": second, "waited": waited}
