"""Test cases that run inside the worker processes (see harness.py).

Pool cases have the signature ``case(rank, world, gloo, **kwargs)``: the
default process group is tilecomm, ``gloo`` is a Gloo group over every rank
used as the oracle and for out-of-band checks. They assert inside the worker
and return something small and picklable.

Spawn cases (``spawn_*``) have the signature ``case(rank, world, port,
**kwargs)`` and set up their own process group; they are for tests that break
groups (failures, bad settings) and run in processes of their own.

Data is integer-valued and small so that every floating-point result is exact
and can be compared bit for bit with a closed form. Every result is checked
(1) against the closed form, (2) against Gloo where Gloo supports the
operation, and (3) for being bitwise identical across ranks where every rank
must hold the same result.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import os
import time
from datetime import timedelta

import torch
import torch._C._distributed_c10d as _c10d
import torch.distributed as dist
from torch.distributed import ReduceOp

# ---------------------------------------------------------------- vocabulary

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum", "premul_sum_tensor"]
BITWISE = {"band", "bor", "bxor"}
PREMUL_FACTOR = 0.5  # float factor; the tensor-factor variant uses 2.0
PREMUL_TENSOR_FACTOR = 2.0


def is_float(dt):
    return dt.is_floating_point


def is_complex(dt):
    return dt.is_complex


def reduce_op(name):
    if name == "premul_sum":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    if name == "premul_sum_tensor":
        return dist._make_nccl_premul_sum(torch.tensor([PREMUL_TENSOR_FACTOR], dtype=torch.float64))
    return {
        "sum": ReduceOp.SUM,
        "avg": ReduceOp.AVG,
        "product": ReduceOp.PRODUCT,
        "min": ReduceOp.MIN,
        "max": ReduceOp.MAX,
        "band": ReduceOp.BAND,
        "bor": ReduceOp.BOR,
        "bxor": ReduceOp.BXOR,
    }[name]


def backend_invalid(op, dt):
    """Exception type tilecomm itself must raise for (op, dtype), or None when valid."""
    if op in BITWISE and (is_float(dt) or is_complex(dt)):
        return TypeError
    if op == "avg" and dt == torch.bool:
        return TypeError
    if op.startswith("premul") and not (is_float(dt) or is_complex(dt)):
        return TypeError
    if is_complex(dt) and op not in ("sum", "avg", "product", "premul_sum", "premul_sum_tensor"):
        return TypeError
    return None


def torch_api_blocks_complex(op, dt):
    """torch.distributed.all_reduce views complex as real and rejects ops it cannot express that way."""
    return is_complex(dt) and op in ("product", "min", "max", "band", "bor", "bxor")


def kind_of(op):
    if op in ("sum", "avg", "premul_sum", "premul_sum_tensor"):
        return "sum"
    if op == "product":
        return "prod"
    if op in ("min", "max"):
        return "minmax"
    return "bits"


# ---------------------------------------------------------------- data


def _ints(kind, n, rank, signed, salt=0):
    i = torch.arange(n, dtype=torch.int64) + salt
    r = rank
    if kind == "sum":  # |sum over 8 ranks| <= 48: fits int8; exact in every float type
        v = (i * 3 + r * 5) % 13
        return v - 6 if signed else v
    if kind == "prod":  # values 1, 2 (and -1): |product over 8 ranks| <= 4
        v = torch.ones(n, dtype=torch.int64)
        v[(i + r) % 5 == 0] = 2
        if signed:
            v[((i + 2 * r) % 3 == 0) & (v == 1)] = -1
        return v
    if kind == "minmax":
        v = (i * 7 + r * 11) % 23
        return v - 11 if signed else v
    if kind == "bits":
        v = (i * 37 + r * 11) % 128
        return v - 64 if signed else v + (i % 2) * 128  # uint8 uses the top bit too
    if kind == "any":  # data movement: distinct-ish values, exact in every dtype
        return (i * 7 + r * 31) % 97 - (48 if signed else 0)
    raise ValueError(kind)


def pattern(kind, dt, n, rank, salt=0):
    """Rank ``rank``'s input of ``n`` elements for reductions of ``kind``."""
    if dt == torch.bool:
        i = torch.arange(n, dtype=torch.int64) + salt
        if kind == "sum":
            return (i + rank) % 3 == 0
        if kind == "prod":
            return (i + rank) % 4 != 0
        if kind == "minmax":
            return (i * 7 + rank) % 3 == 0
        return (i + 2 * rank) % 3 == 0
    if is_complex(dt):
        if kind == "prod":
            i = torch.arange(n, dtype=torch.int64) + salt
            units = torch.tensor([1, 1j, -1, -1j], dtype=torch.complex128)
            v = units[(i + rank) % 4]
            v = torch.where((i + 2 * rank) % 9 == 0, v * (1 + 1j), v)
            return v.to(dt)
        re = _ints(kind, n, rank, True, salt).to(torch.float64)
        im = _ints(kind, n, rank + 3, True, salt + 1).to(torch.float64)
        return torch.complex(re, im).to(dt)
    signed = dt != torch.uint8
    v = _ints(kind, n, rank, signed, salt)
    if is_float(dt):
        v = v.to(torch.float64)
        if kind == "prod":
            i = torch.arange(n, dtype=torch.int64) + salt
            v[((i + 3 * rank) % 7 == 1) & (v == 1)] = 0.5
    return v.to(dt)


def closed_form(op, dt, n, ranks, world=None, salt=0):
    """The reduction over ``ranks`` of pattern(kind_of(op), ...), as tilecomm must produce it."""
    world = world if world is not None else len(ranks)
    xs = [pattern(kind_of(op), dt, n, r, salt) for r in ranks]
    s = torch.stack(xs) if xs else torch.empty(0, n, dtype=dt)
    if dt == torch.bool:
        if op in ("sum", "max", "bor"):
            return s.any(0)
        if op in ("product", "min", "band"):
            return s.all(0)
        if op == "bxor":
            return s.to(torch.int64).sum(0) % 2 == 1
        raise ValueError(op)
    if is_float(dt) or is_complex(dt):
        wide = s.to(torch.complex128 if is_complex(dt) else torch.float64)
        if op == "sum":
            return wide.sum(0).to(dt)
        if op == "avg":
            total = wide.sum(0).to(dt)
            if is_complex(dt):  # torch.distributed reduces complex tensors viewed as real
                return torch.view_as_complex(torch.view_as_real(total).div(world).contiguous())
            return total.div(world)  # torch's own division in dt, as the backend does
        if op == "premul_sum":
            return (wide * PREMUL_FACTOR).sum(0).to(dt)
        if op == "premul_sum_tensor":
            return (wide * PREMUL_TENSOR_FACTOR).sum(0).to(dt)
        if op == "product":
            return wide.prod(0).to(dt)
        if op == "min":
            return wide.amin(0).to(dt)
        if op == "max":
            return wide.amax(0).to(dt)
        raise ValueError(op)
    wide = s.to(torch.int64)
    if op == "sum":
        return wide.sum(0).to(dt)
    if op == "avg":
        return torch.div(wide.sum(0), world, rounding_mode="trunc").to(dt)
    if op == "product":
        return wide.prod(0).to(dt)
    if op == "min":
        return wide.amin(0).to(dt)
    if op == "max":
        return wide.amax(0).to(dt)
    fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
    return functools.reduce(fn, list(wide)).to(dt)


def data(dt, n, rank, salt=0):
    """Data to move (not reduce)."""
    return pattern("any", dt, n, rank, salt) if dt != torch.bool else pattern("bits", dt, n, rank, salt)


def numel(shape):
    out = 1
    for s in shape:
        out *= s
    return out


# ---------------------------------------------------------------- checks


def raw_bytes(t):
    t = t.detach().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes()


def digest(t):
    return hashlib.sha1(raw_bytes(t)).hexdigest() + f"/{tuple(t.shape)}/{t.dtype}"


# Value checks are "soft": a mismatch is recorded and the case carries on, so
# that every rank stays in step with the others (a rank that stopped early
# would leave its peers waiting in a collective). The harness fails the case
# if anything was recorded (see take_failures).
_FAILURES: list[str] = []


def fail_soft(msg):
    _FAILURES.append(msg)


def take_failures():
    out = list(_FAILURES)
    _FAILURES.clear()
    return out


def assert_equal(actual, expected, what):
    """Exact equality (dtype, shape, values); a mismatch is recorded (see fail_soft). Returns True if equal."""
    if actual.dtype != expected.dtype:
        fail_soft(f"{what}: dtype {actual.dtype} != {expected.dtype}")
        return False
    if tuple(actual.shape) != tuple(expected.shape):
        fail_soft(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
        return False
    if torch.equal(actual, expected):
        return True
    a, e = actual.reshape(-1), expected.reshape(-1)
    bad = (a != e).nonzero().reshape(-1)
    i = int(bad[0]) if bad.numel() else -1
    fail_soft(
        f"{what}: {bad.numel()} of {a.numel()} elements differ; first at flat index {i}: "
        f"got {a[i].item() if i >= 0 else None}, expected {e[i].item() if i >= 0 else None}"
    )
    return False


_IDENTICAL: list = []  # (what, digest) noted during a case, compared across ranks at its end


def assert_identical_across_ranks(t, gloo, what):
    """Every rank must hold the same bytes. Deferred: compared at the end of the case (flush_identical)."""
    _IDENTICAL.append((what, digest(t)))


def flush_identical(gloo):
    """Compares, through Gloo, every digest noted during the case (one exchange per case)."""
    mine = list(_IDENTICAL)
    _IDENTICAL.clear()
    world = dist.get_world_size(gloo)
    if world == 1:
        return
    got = [None] * world
    dist.all_gather_object(got, mine, group=gloo)
    if any(len(g) != len(mine) for g in got):
        fail_soft(f"ranks noted different numbers of results to compare: {[len(g) for g in got]}")
        return
    for k, (what, d) in enumerate(mine):
        ds = [g[k][1] for g in got]
        if any(x != ds[0] for x in ds):
            fail_soft(f"{what}: results differ across ranks: {ds}")


def gloo_agrees(fn, gloo_result_getter, actual, what):
    """Runs ``fn`` on the Gloo group; if Gloo supports it, its result must equal ``actual``."""
    try:
        fn()
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return False
    expected = gloo_result_getter()
    if actual.dtype == torch.bool:
        expected = expected.to(torch.bool)
    assert_equal(actual, expected, what + " (vs gloo)")
    return True


def gloo_is_exact(op, dt):
    """Whether Gloo's result can serve as an exact oracle for (op, dtype) when handed the tensor as is.

    Gloo averages a complex tensor with a complex division (``t / size``), which
    is not correctly rounded per component (1 ulp off for, e.g., -7/3): the
    closed form is the reference there, Gloo is not. (all_reduce is unaffected:
    torch.distributed hands complex tensors to the backends viewed as real.)
    """
    return not (op == "avg" and is_complex(dt))


def expect_error(exc_types, fn, what, match=None):
    try:
        fn()
    except exc_types as e:
        if match is not None:
            assert any(m in str(e) for m in ([match] if isinstance(match, str) else match)), (
                f"{what}: error message {str(e)!r} does not mention {match!r}"
            )
        return type(e).__name__ + ": " + str(e).split("\n")[0]
    except Exception as e:  # wrong type
        raise AssertionError(f"{what}: expected {exc_types}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{what}: expected {exc_types}, nothing was raised")


def backend(group=None):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg._get_backend(torch.device("cpu"))


def check_group_healthy(gloo, group=None):
    """An all_reduce still works on the (tilecomm) group."""
    t = torch.ones(3)
    dist.all_reduce(t, group=group)
    size = dist.get_world_size(group)
    assert t.tolist() == [float(size)] * 3, f"group unhealthy after errors: {t}"


# ---------------------------------------------------------------- all_reduce


def all_reduce(rank, world, gloo, dtype, op, shapes, via_backend_for_complex=True):
    """all_reduce of every shape in ``shapes`` with ``op`` on ``dtype``; or the right error."""
    dt = DTYPES[dtype]
    report = {"gloo": 0, "checked": 0, "errors": []}
    ins, outs = [], []
    for shape in shapes:
        shape = tuple(shape)
        n = numel(shape)
        what = f"all_reduce({op}, {dtype}, shape={shape}, world={world})"
        x = pattern(kind_of(op), dt, n, rank).reshape(shape)
        if torch_api_blocks_complex(op, dt):
            y = x.clone()
            report["errors"].append(expect_error(ValueError, lambda: dist.all_reduce(y, op=reduce_op(op)), what))
            if not via_backend_for_complex:
                continue
            # The backend itself: complex PRODUCT is defined, the rest must raise TypeError.
            opts = dist.AllreduceOptions()
            opts.reduceOp = reduce_op(op)
            if backend_invalid(op, dt):
                report["errors"].append(
                    expect_error(TypeError, lambda: backend().allreduce([y], opts).wait(), what + " [backend]")
                )
                assert_equal(y, x, what + " input left alone after the error")
                continue
            backend().allreduce([y], opts).wait()
        else:
            inv = backend_invalid(op, dt)
            if inv is not None:
                y = x.clone()
                report["errors"].append(expect_error(inv, lambda: dist.all_reduce(y, op=reduce_op(op)), what))
                assert_equal(y, x, what + " input left alone after the error")
                continue
            y = x.clone()
            dist.all_reduce(y, op=reduce_op(op))
            ins.append(x.reshape(-1))
            outs.append(y.reshape(-1))
        expected = closed_form(op, dt, n, range(world)).reshape(shape)
        assert_equal(y, expected, what)
        assert_identical_across_ranks(y, gloo, what)
        report["checked"] += 1
    if ins:
        # One Gloo call over every shape at once (element-wise: same result as one call per shape).
        z = torch.cat(ins)
        report["gloo"] = gloo_agrees(lambda: dist.all_reduce(z, op=reduce_op(op), group=gloo), lambda: z,
                                     torch.cat(outs), f"all_reduce({op}, {dtype}, world={world})")
    return report


def all_reduce_matrix(rank, world, gloo, shapes, dtypes=None, ops=None):
    """Every op x dtype combination in one case (for world sizes where one test per combination is too many)."""
    out = {}
    for dtype in dtypes or list(DTYPES):
        for op in ops or OPS:
            out[f"{dtype}-{op}"] = all_reduce(rank, world, gloo, dtype, op, shapes)
    return out


def all_reduce_large(rank, world, gloo, n, dtype="float32", op="sum", repeat=1):
    dt = DTYPES[dtype]
    x = pattern(kind_of(op), dt, n, rank)
    expected = closed_form(op, dt, n, range(world))
    t0 = time.perf_counter()
    for _ in range(repeat):
        y = x.clone()
        dist.all_reduce(y, op=reduce_op(op))
    secs = (time.perf_counter() - t0) / repeat
    what = f"all_reduce({op}, {dtype}, n={n})"
    assert_equal(y, expected, what)
    assert_identical_across_ranks(y, gloo, what)
    z = x.clone()
    gl = gloo_agrees(lambda: dist.all_reduce(z, op=reduce_op(op), group=gloo), lambda: z, y, what)
    return {"seconds": secs, "gloo": gl}


def all_reduce_special(rank, world, gloo):
    """Views with offsets, 0-dim tensors, dtypes the engine cannot reduce, tensor PREMUL factors."""
    # A contiguous slice of a bigger tensor: only the slice changes.
    big = torch.full((100,), -7.0)
    view = big[10:40]
    view.copy_(pattern("sum", torch.float32, 30, rank))
    dist.all_reduce(view)
    assert_equal(view, closed_form("sum", torch.float32, 30, range(world)), "all_reduce of a slice")
    assert (big[:10] == -7).all() and (big[40:] == -7).all(), "all_reduce wrote outside the slice"
    # 0-dim
    s = torch.tensor(float(rank + 1))
    dist.all_reduce(s, op=ReduceOp.MAX)
    assert s.item() == world and s.dim() == 0
    s = torch.tensor(rank + 1, dtype=torch.int64)
    dist.all_reduce(s)
    assert s.item() == world * (world + 1) // 2
    # AVG on integers truncates toward zero (negative sums included)
    t = torch.tensor([-(rank + 1), rank + 1, -1, 1, 7], dtype=torch.int32)
    dist.all_reduce(t, op=ReduceOp.AVG)
    tot = world * (world + 1) // 2
    exp = [int(-tot / world), int(tot / world), int(-world / world), int(world / world), 7]
    assert t.tolist() == exp, f"integer AVG: got {t.tolist()}, expected {exp} (truncation toward zero)"
    # PREMUL_SUM with a 1-element tensor factor on a lower-precision tensor
    h = torch.full((5,), float(rank + 1), dtype=torch.bfloat16)
    dist.all_reduce(h, op=dist._make_nccl_premul_sum(torch.tensor([0.25], dtype=torch.float32)))
    assert h.tolist() == [tot * 0.25] * 5, h.tolist()
    # dtypes the engine cannot reduce: a clear TypeError
    for dt in [torch.uint16, torch.uint32, torch.uint64]:
        u = torch.zeros(3, dtype=dt)
        expect_error(TypeError, lambda: dist.all_reduce(u), f"all_reduce on {dt}", match="tilecomm")
    check_group_healthy(gloo)
    return True


def _strided(values, step=2):
    """A non-contiguous tensor holding `values` (every `step`-th element of a bigger one, or, for 2-D
    values, the transpose of a contiguous tensor), around elements that must not change."""
    if values.dim() == 2:
        return values.t().contiguous().t()
    big = torch.full((values.numel() * step,), -7, dtype=torch.int64).to(values.dtype)
    view = big[::step]
    view.copy_(values)
    return view


def _gaps(t):
    """The elements between a _strided tensor's (1-D, step 2) elements: must stay -7."""
    return torch.as_strided(t, (t.numel(),), (2,), t.storage_offset() + 1) if t.numel() else t


def strided_tensors(rank, world, gloo):
    """Collectives on CPU tensors that are not contiguous: the closed form, with the elements between
    the strided ones untouched; an async call that reads a strided tensor the call before it writes
    sees that write; point-to-point refuses them. (Not compared with Gloo: Gloo takes such tensors
    but reduces the first numel elements of their memory, strides ignored.)"""
    n = 5
    for dtype in (torch.float32, torch.int64):
        def block(r, salt=0):
            return (torch.arange(n) * (r + 2) + salt).to(dtype)

        what = f"strided {dtype}"
        # all_reduce: 1-D with a step, and 2-D transposed
        t = _strided(block(rank))
        dist.all_reduce(t)
        assert_equal(t, sum(block(r) for r in range(world)), what + " all_reduce")
        assert _gaps(t).eq(-7).all(), what + ": all_reduce wrote between the elements"
        m = _strided(torch.stack([block(rank), block(rank, 1)]))
        assert not m.is_contiguous()
        dist.all_reduce(m, op=ReduceOp.MAX)
        assert_equal(m, torch.stack([block(world - 1), block(world - 1, 1)]), what + " all_reduce 2-D max")
        # broadcast and reduce
        t = _strided(block(rank))
        dist.broadcast(t, src=world - 1)
        assert_equal(t, block(world - 1), what + " broadcast")
        t = _strided(block(rank))
        dist.reduce(t, dst=0)
        assert_equal(t, sum(block(r) for r in range(world)) if rank == 0 else block(rank), what + " reduce")
        # all_gather: strided input and outputs; into a strided tensor
        outs = [_strided(torch.zeros(n, dtype=dtype)) for _ in range(world)]
        dist.all_gather(outs, _strided(block(rank)))
        for r in range(world):
            assert_equal(outs[r], block(r), what + f" all_gather block {r}")
        out = _strided(torch.zeros(n * world, dtype=dtype))
        dist.all_gather_into_tensor(out, _strided(block(rank)))
        assert_equal(out, torch.cat([block(r) for r in range(world)]), what + " all_gather_into_tensor")
        assert _gaps(out).eq(-7).all(), what + ": all_gather_into_tensor wrote between the elements"
        # reduce_scatter: tensor and list forms
        full = [torch.cat([block(r, q) for q in range(world)]) for r in range(world)]
        out = _strided(torch.zeros(n, dtype=dtype))
        dist.reduce_scatter_tensor(out, _strided(full[rank]))
        assert_equal(out, sum(block(r, rank) for r in range(world)), what + " reduce_scatter_tensor")
        out = _strided(torch.zeros(n, dtype=dtype))
        dist.reduce_scatter(out, [_strided(block(rank, q)) for q in range(world)])
        assert_equal(out, sum(block(r, rank) for r in range(world)), what + " reduce_scatter")
        # all_to_all: single and list forms
        out = _strided(torch.zeros(n * world, dtype=dtype))
        dist.all_to_all_single(out, _strided(torch.cat([block(rank, q) for q in range(world)])))
        assert_equal(out, torch.cat([block(r, rank) for r in range(world)]), what + " all_to_all_single")
        outs = [_strided(torch.zeros(n, dtype=dtype)) for _ in range(world)]
        dist.all_to_all(outs, [_strided(block(rank, q)) for q in range(world)])
        for r in range(world):
            assert_equal(outs[r], block(r, rank), what + f" all_to_all block {r}")
        # gather and scatter
        outs = [_strided(torch.zeros(n, dtype=dtype)) for _ in range(world)] if rank == 0 else None
        dist.gather(_strided(block(rank)), outs, dst=0)
        for r in range(world if rank == 0 else 0):
            assert_equal(outs[r], block(r), what + f" gather block {r}")
        out = _strided(torch.zeros(n, dtype=dtype))
        dist.scatter(out, [_strided(block(q, 3)) for q in range(world)] if rank == world - 1 else None, src=world - 1)
        assert_equal(out, block(rank, 3), what + " scatter")
    # async, back to back: the second call reads what the first writes
    t = _strided(torch.full((n,), float(rank)))
    w1 = dist.all_reduce(t, async_op=True)
    w2 = dist.all_reduce(t, async_op=True)
    w1.wait()
    w2.wait()
    assert_equal(t, torch.full((n,), float(world * sum(range(world)))), "strided async all_reduce twice")
    # tensors that require grad (a channels_last parameter): the copy back is not autograd's
    p = torch.nn.Parameter(torch.full((2, 3, 2, 2), float(rank)).to(memory_format=torch.channels_last))
    assert not p.is_contiguous()
    with torch.no_grad():
        dist.broadcast(p, src=world - 1, async_op=True).wait()
        dist.all_reduce(p, op=ReduceOp.AVG, async_op=True).wait()
    assert_equal(p.detach(), torch.full((2, 3, 2, 2), float(world - 1)), "strided parameter, broadcast then AVG")
    be = backend()
    expect_error(ValueError, lambda: be.send([_strided(torch.ones(n))], (rank + 1) % world, 0), "strided send",
                 match="contiguous")
    expanded = torch.zeros(1).expand(n)  # its elements share one float: nothing can be written into it
    expect_error(ValueError, lambda: dist.all_reduce(expanded), "all_reduce into an expanded tensor",
                 match="share memory")
    src = torch.ones(n)
    dist.broadcast(torch.ones(1).expand(n) if rank == 0 else src, src=0)  # read only: the root's may be expanded
    assert_equal(src, torch.ones(n), "broadcast from an expanded tensor")
    check_group_healthy(gloo)
    return True


def _sparse(rank, world, dtype, hybrid, salt=0):
    """An uncoalesced sparse COO tensor of shape (7, 5[, 3]) whose indices overlap other ranks' and its
    own (rank 1 has none); values are small integers, so every sum is exact."""
    nnz = 0 if rank == 1 else 3 + (rank + salt) % 4
    g = torch.Generator().manual_seed(100 * rank + salt)
    rows = torch.randint(0, 7, (nnz,), generator=g)
    cols = torch.randint(0, 5, (nnz,), generator=g)
    if hybrid:  # two sparse dimensions, one dense
        vals = torch.randint(-4, 5, (nnz, 3), generator=g).to(dtype)
        return torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (7, 5, 3))
    vals = torch.randint(-4, 5, (nnz,), generator=g).to(dtype)
    return torch.sparse_coo_tensor(rows[None] * 5 + cols[None], vals, (35,))


def sparse_all_reduce(rank, world, gloo):
    """all_reduce of sparse COO tensors (SUM): the dense closed form, Gloo's coalesced result bit for
    bit, async with the Work's result; other ReduceOps and shapes that differ between ranks refused."""
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
        for hybrid in (False, True):
            what = f"sparse all_reduce({dtype}, hybrid={hybrid})"
            expected = sum(_sparse(r, world, dtype, hybrid).to_dense() for r in range(world))
            t = _sparse(rank, world, dtype, hybrid)
            dist.all_reduce(t)
            assert t.is_sparse and t.is_coalesced(), what
            assert_equal(t.to_dense(), expected.to(dtype), what)
            g = _sparse(rank, world, dtype, hybrid)
            dist.all_reduce(g, group=gloo)
            assert_equal(t._indices(), g._indices(), what + " indices against Gloo")
            assert_equal(t._values(), g._values(), what + " values against Gloo")
            assert_identical_across_ranks(t._values(), gloo, what)
    t = _sparse(rank, world, torch.float32, True, salt=1)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    value = work.get_future().value()[0]
    expected = sum(_sparse(r, world, torch.float32, True, salt=1).to_dense() for r in range(world))
    assert_equal(value.to_dense(), expected, "async sparse all_reduce, the future's value")
    for op in (ReduceOp.MAX, ReduceOp.AVG, ReduceOp.PRODUCT):
        expect_error(ValueError, lambda: dist.all_reduce(_sparse(rank, world, torch.float32, False), op=op),
                     f"sparse all_reduce({op})", match="only ReduceOp.SUM")
    # no rank has an entry
    t = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0, 3), (7, 5, 3))
    dist.all_reduce(t)
    assert t._nnz() == 0 and t.shape == (7, 5, 3), t
    if world > 1:
        last = rank == world - 1
        # the last rank's tensor differs: every rank raises, naming it (or, on the last rank, rank 0)
        for what, odd, about in (
            ("sizes", torch.sparse_coo_tensor([[0]], [1.0], (35 + last,)), "shape"),
            ("dims", torch.sparse_coo_tensor([[0], [0]] if last else [[0]], [1.0], (35, 1) if last else (35,)),
             "shape"),
            ("dtype", torch.sparse_coo_tensor([[0]], torch.ones(1, dtype=torch.float64 if last else torch.float32),
                                              (35,)), "dtype"),
        ):
            named = [f"rank {world - 1}'s tensor has another {about}", f"rank 0's tensor has another {about}"]
            expect_error(ValueError, lambda: dist.all_reduce(odd), f"sparse all_reduce, {what} differ", match=named)
            check_group_healthy(gloo)
    return True


def _join_run(pg, rank, steps):
    """DDP under Join, rank r taking steps + r batches (uneven inputs); the final parameters."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(seed=0), process_group=pg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Join([model]):
        for step in range(steps + rank):
            x, y = _batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return [p.detach().clone() for p in model.module.parameters()]


def _zero_run(pg, rank, steps):
    """DDP with ZeroRedundancyOptimizer (each rank steps its shard and broadcasts it); the final
    parameters, and the consolidated optimizer state's size on rank 0."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_mlp(seed=0), process_group=pg)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2, process_group=pg)
    for step in range(steps):
        x, y = _batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.consolidate_state_dict(to=0)
    states = len(opt.state_dict()["state"]) if rank == 0 else None
    return [p.detach().clone() for p in model.module.parameters()], states


def ddp_join_and_zero(rank, world, gloo, steps=3):
    """More of DDP's clients over tilecomm and over Gloo, same parameters: Join with uneven inputs
    (ranks that ran out shadow the others' all_reduces), ZeroRedundancyOptimizer; and the autograd
    collectives of torch.distributed.nn.functional against the closed form."""
    import torch.distributed.nn.functional as dnf

    for what, run in (("Join", lambda pg: _join_run(pg, rank, steps)), ("ZeRO", lambda pg: _zero_run(pg, rank, steps))):
        ours, theirs = run(None), run(gloo)
        if what == "ZeRO":
            (ours, states), (theirs, _) = ours, theirs
            assert rank != 0 or states == len(ours), f"ZeRO consolidated {states} states for {len(ours)} params"
        for k, (a, b) in enumerate(zip(ours, theirs)):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"{what} param {k}: max diff {(a - b).abs().max()}"
            assert_identical_across_ranks(a, gloo, f"{what} param {k}")
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    y = dnf.all_reduce(x * 2)
    y.sum().backward()  # the gradient of an all_reduce (sum) is the all_reduce of the gradients
    assert y.tolist() == [float(world * (world + 1))] * 3, y
    assert x.grad.tolist() == [2.0 * world] * 3, x.grad
    g = torch.ones(2, requires_grad=True)
    torch.stack(dnf.all_gather(g * (rank + 1))).sum().backward()  # every rank's sum depends on this rank's block
    assert g.grad.tolist() == [float(world * (rank + 1))] * 2, g.grad
    return True


class _SparseEmbeddingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 6, sparse=True)  # its gradient is a sparse COO tensor
        self.out = torch.nn.Linear(6, 1)

    def forward(self, ids):
        return self.out(self.emb(ids))


def ddp_sparse_embedding(rank, world, gloo, steps=4):
    """DDP of a model with a sparse embedding (sparse gradients, all_reduced as such) over tilecomm
    and over Gloo, from the same weights and per-rank batches: the same parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    final = {}
    for name, pg in [("tilecomm", None), ("gloo", gloo)]:
        torch.manual_seed(0)
        model = DDP(_SparseEmbeddingModel(), process_group=pg)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            g = torch.Generator().manual_seed(10 * step + rank)
            ids, y = torch.randint(0, 50, (8,), generator=g), torch.randn(8, 1, generator=g)
            loss = torch.nn.functional.mse_loss(model(ids), y)
            opt.zero_grad()
            loss.backward()
            assert model.module.emb.weight.grad.is_sparse
            opt.step()
        final[name] = [p.detach().clone() for p in model.module.parameters()]
    for k, (a, b) in enumerate(zip(final["tilecomm"], final["gloo"])):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"param {k}: tilecomm vs gloo max diff {(a - b).abs().max()}"
        assert_identical_across_ranks(a, gloo, f"DDP sparse embedding param {k}")
    torch.manual_seed(0)
    assert not torch.equal(final["tilecomm"][0], _SparseEmbeddingModel().emb.weight), "the embedding never moved"
    return True


def all_reduce_coalesced(rank, world, gloo, dtype="float32", ops=("sum", "avg", "max", "product")):
    dt = DTYPES[dtype]
    shapes = [(3,), (0,), (4, 5), (1001,), ()]
    for op in ops:
        if backend_invalid(op, dt) or torch_api_blocks_complex(op, dt):
            continue
        xs = [pattern(kind_of(op), dt, numel(s), rank, salt=k).reshape(s) for k, s in enumerate(shapes)]
        exps = [closed_form(op, dt, numel(s), range(world), salt=k).reshape(s) for k, s in enumerate(shapes)]
        # deprecated public API
        ys = [x.clone() for x in xs]
        if hasattr(dist, "all_reduce_coalesced"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dist.all_reduce_coalesced(ys, op=reduce_op(op))
            for y, e, s in zip(ys, exps, shapes):
                assert_equal(y, e, f"all_reduce_coalesced({op}, {dtype}, {s})")
        # through the coalescing manager (what DDP/FSDP-style code uses)
        ys = [x.clone() for x in xs]
        with dist._coalescing_manager(async_ops=True) as cm:
            for y in ys:
                dist.all_reduce(y, op=reduce_op(op))
        cm.wait()
        for y, e, s in zip(ys, exps, shapes):
            assert_equal(y, e, f"coalesced all_reduce({op}, {dtype}, {s})")
            assert_identical_across_ranks(y, gloo, f"coalesced all_reduce({op}, {dtype}, {s})")
        # coalescing manager, synchronous
        ys = [x.clone() for x in xs]
        with dist._coalescing_manager():
            for y in ys:
                dist.all_reduce(y, op=reduce_op(op))
        for y, e, s in zip(ys, exps, shapes):
            assert_equal(y, e, f"sync coalesced all_reduce({op}, {dtype}, {s})")
        # backend-level call, async
        ys = [x.clone() for x in xs]
        opts = dist.AllreduceCoalescedOptions()
        opts.reduceOp = reduce_op(op)
        backend().allreduce_coalesced(ys, opts).wait()
        for y, e, s in zip(ys, exps, shapes):
            assert_equal(y, e, f"backend allreduce_coalesced({op}, {dtype}, {s})")
    return True


# ---------------------------------------------------------------- reduce / broadcast


def reduce(rank, world, gloo, dtype, op, shapes, roots=None):
    dt = DTYPES[dtype]
    gloo_used = 0
    for root in roots if roots is not None else range(world):
        ins, outs = [], []
        for shape in shapes:
            shape = tuple(shape)
            n = numel(shape)
            what = f"reduce({op}, {dtype}, shape={shape}, root={root}, world={world})"
            x = pattern(kind_of(op), dt, n, rank).reshape(shape)
            y = x.clone()
            inv = backend_invalid(op, dt)
            if inv is not None:
                expect_error(inv, lambda: dist.reduce(y, dst=root, op=reduce_op(op)), what)
                continue
            dist.reduce(y, dst=root, op=reduce_op(op))
            if rank == root:
                assert_equal(y, closed_form(op, dt, n, range(world)).reshape(shape), what)
            else:
                assert_equal(y, x, what + ": a non-root rank's tensor changed")
            ins.append(x.reshape(-1))
            outs.append(y.reshape(-1))
        if not ins or not gloo_is_exact(op, dt):
            continue
        z = torch.cat(ins)
        try:
            dist.reduce(z, dst=root, op=reduce_op(op), group=gloo)
        except (RuntimeError, ValueError, TypeError):
            continue
        gloo_used += 1
        if rank == root:
            assert_equal(torch.cat(outs), z.to(dt), f"reduce({op}, {dtype}, root={root}) (vs gloo)")
    return {"gloo": gloo_used}


def broadcast(rank, world, gloo, dtype, shapes, roots=None, async_op=False):
    dt = getattr(torch, dtype)
    for root in roots if roots is not None else range(world):
        results = []
        for shape in shapes:
            shape = tuple(shape)
            n = numel(shape)
            what = f"broadcast({dtype}, shape={shape}, root={root}, world={world})"
            src = _movable(dt, n, root).reshape(shape)
            t = src.clone() if rank == root else _garbage(dt, shape)
            w = dist.broadcast(t, src=root, async_op=async_op)
            if async_op:
                w.wait()
            assert_equal(t, src, what)
            assert_identical_across_ranks(t, gloo, what)
            results.append(t.reshape(-1))
        # Gloo, once per root over every shape
        src_all = torch.cat([_movable(dt, numel(tuple(s)), root).reshape(-1) for s in shapes])
        z = src_all.clone() if rank == root else _garbage(dt, tuple(src_all.shape))
        gloo_agrees(lambda: dist.broadcast(z, src=root, group=gloo), lambda: z, torch.cat(results),
                    f"broadcast({dtype}, root={root}, world={world})")
    return True


def _movable(dt, n, rank, salt=0):
    """Data for any dtype, including ones the engine only moves as bytes (uint16 ...)."""
    if dt in DTYPES.values():
        return data(dt, n, rank, salt)
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 31 + salt) % 97).to(dt)


def _garbage(dt, shape):
    if dt == torch.bool:
        return torch.zeros(shape, dtype=dt)
    return torch.full(shape, 99, dtype=torch.int64).to(dt) if not (dt.is_floating_point or dt.is_complex) else torch.full(
        shape, -99.0
    ).to(dt)


# ---------------------------------------------------------------- all_gather


def all_gather(rank, world, gloo, dtype, shapes):
    dt = getattr(torch, dtype)
    ins_all, outs_all = [], []
    for shape in shapes:
        shape = tuple(shape)
        n = numel(shape)
        what = f"all_gather({dtype}, shape={shape}, world={world})"
        mine = _movable(dt, n, rank).reshape(shape)
        expected = [_movable(dt, n, r).reshape(shape) for r in range(world)]
        # list version
        outs = [_garbage(dt, shape) for _ in range(world)]
        dist.all_gather(outs, mine)
        for r in range(world):
            assert_equal(outs[r], expected[r], what + f" [list, block {r}]")
        # into one tensor (dim-0 concatenation)
        flat_shape = (world * shape[0],) + shape[1:] if len(shape) else (world,)
        out = _garbage(dt, flat_shape)
        dist.all_gather_into_tensor(out, mine)
        cat = torch.cat([e.reshape((-1,) + shape[1:]) if len(shape) else e.reshape(1) for e in expected])
        assert_equal(out, cat.reshape(flat_shape), what + " [into_tensor]")
        assert_identical_across_ranks(out, gloo, what)
        if hasattr(dist, "all_gather_single"):  # torch 2.13's name for it
            single = _garbage(dt, flat_shape)
            dist.all_gather_single(single, mine)
            assert_equal(single, out, what + " [all_gather_single]")
        # into one tensor, stacked form [world, *shape]
        stacked = _garbage(dt, (world,) + shape)
        dist.all_gather_into_tensor(stacked, mine)
        assert_equal(stacked, torch.stack(expected), what + " [into_tensor, stacked]")
        ins_all.append(mine.reshape(-1))
        outs_all.append(torch.stack([o.reshape(-1) for o in outs]))  # [world, n]
    # vs gloo, once over every shape: block r of the gathered concatenation is rank r's inputs
    cat_in = torch.cat(ins_all)
    gouts = [_garbage(dt, tuple(cat_in.shape)) for _ in range(world)]
    gloo_agrees(lambda: dist.all_gather(gouts, cat_in, group=gloo), lambda: torch.stack(gouts),
                torch.cat(outs_all, dim=1), f"all_gather({dtype}, world={world})")
    return True


def in_place_variants(rank, world, gloo, n=1001):
    """Aliased buffers as ZeRO/FSDP use them: the input is this rank's slice of the output (or vice versa)."""
    # all_gather_into_tensor with input = own slice of the output
    out = torch.full((world * n,), -1.0)
    out[rank * n:(rank + 1) * n] = data(torch.float32, n, rank)
    dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
    assert_equal(out, torch.cat([data(torch.float32, n, r) for r in range(world)]), "in-place all_gather_into_tensor")
    # reduce_scatter_tensor with output = own slice of the input
    buf = pattern("sum", torch.float32, world * n, rank)
    dist.reduce_scatter_tensor(buf[rank * n:(rank + 1) * n], buf)
    exp = closed_form("sum", torch.float32, world * n, range(world))[rank * n:(rank + 1) * n]
    assert_equal(buf[rank * n:(rank + 1) * n], exp, "in-place reduce_scatter_tensor")
    # all_gather list with this rank's output being the input tensor itself
    mine = data(torch.int32, n, rank)
    outs = [torch.zeros(n, dtype=torch.int32) for _ in range(world)]
    outs[rank] = mine
    dist.all_gather(outs, mine)
    for r in range(world):
        assert_equal(outs[r], data(torch.int32, n, r), f"all_gather with aliased own output, block {r}")
    # scatter/gather where the root's own block aliases its output/input
    for root in range(world):
        blocks = [data(torch.float64, n, r, salt=root) for r in range(world)]
        out = blocks[rank].clone() if rank == root else torch.zeros(n, dtype=torch.float64)
        if rank == root:
            blocks[rank] = out
        dist.scatter(out, blocks if rank == root else None, src=root)
        assert_equal(out, data(torch.float64, n, rank, salt=root), f"scatter with aliased root block, root {root}")
    return True


def all_gather_coalesced(rank, world, gloo, dtype="float32"):
    dt = getattr(torch, dtype)
    shapes = [(3,), (0,), (2, 5), (1001,)]
    ins = [_movable(dt, numel(s), rank, salt=k).reshape(s) for k, s in enumerate(shapes)]
    exp = [[_movable(dt, numel(s), r, salt=k).reshape(s) for r in range(world)] for k, s in enumerate(shapes)]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = [[_garbage(dt, s) for _ in range(world)] for s in shapes]
        dist.all_gather_coalesced(outs, ins)
        for k in range(len(shapes)):
            for r in range(world):
                assert_equal(outs[k][r], exp[k][r], f"all_gather_coalesced tensor {k} block {r}")
        # async
        outs = [[_garbage(dt, s) for _ in range(world)] for s in shapes]
        w = dist.all_gather_coalesced(outs, ins, async_op=True)
        w.wait()
        for k in range(len(shapes)):
            for r in range(world):
                assert_equal(outs[k][r], exp[k][r], f"async all_gather_coalesced tensor {k} block {r}")
    # all_gather_into_tensor through the coalescing manager
    flat_ins = [i.reshape(-1) for i in ins]
    flat_outs = [_garbage(dt, (world * i.numel(),)) for i in flat_ins]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(flat_outs, flat_ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k in range(len(shapes)):
        assert_equal(flat_outs[k], torch.cat([e.reshape(-1) for e in exp[k]]), f"coalesced all_gather_into_tensor {k}")
    return True


# ---------------------------------------------------------------- reduce_scatter


def reduce_scatter(rank, world, gloo, dtype, op, blocks):
    """reduce_scatter (list) and reduce_scatter_tensor with per-rank blocks of ``blocks`` elements."""
    dt = DTYPES[dtype]
    gloo_used = 0
    for m in blocks:
        what = f"reduce_scatter({op}, {dtype}, block={m}, world={world})"
        full = pattern(kind_of(op), dt, m * world, rank)
        inv = backend_invalid(op, dt)  # reduce_scatter hands complex tensors to the backend as they are
        if inv is not None:
            out = torch.zeros(m, dtype=dt)
            parts = [full[r * m:(r + 1) * m].clone() for r in range(world)]
            expect_error(inv, lambda: dist.reduce_scatter_tensor(out, full.clone(), op=reduce_op(op)), what)
            expect_error(inv, lambda: dist.reduce_scatter(out, parts, op=reduce_op(op)), what)
            continue
        expected = closed_form(op, dt, m * world, range(world))[rank * m:(rank + 1) * m]
        out = _garbage(dt, (m,))
        dist.reduce_scatter_tensor(out, full.clone(), op=reduce_op(op))
        assert_equal(out, expected, what + " [tensor]")
        if hasattr(dist, "reduce_scatter_single"):  # torch 2.13's name for it
            single = _garbage(dt, (m,))
            dist.reduce_scatter_single(single, full.clone(), op=reduce_op(op))
            assert_equal(single, expected, what + " [reduce_scatter_single]")
        out2 = _garbage(dt, (m,))
        parts = [full[r * m:(r + 1) * m].clone() for r in range(world)]
        dist.reduce_scatter(out2, parts, op=reduce_op(op))
        assert_equal(out2, expected, what + " [list]")
        # stacked input [world, m]
        out4 = _garbage(dt, (m,))
        dist.reduce_scatter_tensor(out4, full.clone().reshape(world, m), op=reduce_op(op))
        assert_equal(out4, expected, what + " [stacked input]")
        # 2-D input: rows are scattered
        if m % 2 == 0 and m > 0:
            out3 = _garbage(dt, (2, m // 2))
            dist.reduce_scatter_tensor(out3, full.clone().reshape(2 * world, m // 2), op=reduce_op(op))
            assert_equal(out3.reshape(-1), expected, what + " [2-D]")
        if not gloo_is_exact(op, dt):
            continue
        z = _garbage(dt, (m,))
        gloo_used += gloo_agrees(
            lambda: dist.reduce_scatter_tensor(z, full.clone(), op=reduce_op(op), group=gloo), lambda: z, out, what
        )
    return {"gloo": gloo_used}


def reduce_scatter_tensor_coalesced(rank, world, gloo, dtype, op):
    """reduce_scatter_tensor calls coalesced, as FSDP-style code issues them (the coalescing manager,
    async and not, which hands them to the backend's reduce_scatter_tensor_coalesced), and that
    method itself: each output gets its own call's reduced block, with blocks of 0, 1, 10 and 1001
    elements in one call. Different counts of outputs and inputs are refused."""
    dt = DTYPES[dtype]
    blocks = [3, 0, 10, 1001, 1]
    fulls = [pattern(kind_of(op), dt, m * world, rank, salt=k) for k, m in enumerate(blocks)]
    expected = [closed_form(op, dt, m * world, range(world), salt=k)[rank * m:(rank + 1) * m]
                for k, m in enumerate(blocks)]
    what = f"reduce_scatter_tensor_coalesced({op}, {dtype}, world={world})"
    for async_ops in (True, False):
        outs = [_garbage(dt, (m,)) for m in blocks]
        with dist._coalescing_manager(async_ops=async_ops) as cm:
            for o, f in zip(outs, fulls):
                dist.reduce_scatter_tensor(o, f.clone(), op=reduce_op(op))
        if async_ops:
            cm.wait()
        for k, (o, e) in enumerate(zip(outs, expected)):
            assert_equal(o, e, f"{what} through the coalescing manager (async {async_ops}), tensor {k}")
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = reduce_op(op)
    pg = dist.distributed_c10d._get_default_group()
    outs = [_garbage(dt, (m,)) for m in blocks]
    pg.reduce_scatter_tensor_coalesced(outs, [f.clone() for f in fulls], opts).wait()
    for k, (o, e) in enumerate(zip(outs, expected)):
        assert_equal(o, e, f"{what} called on the group, tensor {k}")
    expect_error(ValueError, lambda: pg.reduce_scatter_tensor_coalesced(outs[:1], fulls[:2], opts), what,
                 match="2 inputs but 1 outputs")
    check_group_healthy(gloo)
    return True


# ---------------------------------------------------------------- all_to_all


def _a2a_block(src, dst, rows, row_shape, dt):
    n = rows * numel(row_shape)
    j = torch.arange(n, dtype=torch.int64)
    return ((src * 37 + dst * 11 + j) % 101).to(dt).reshape((rows,) + tuple(row_shape))


def all_to_all_single(rank, world, gloo, dtype, split_kind, base_rows, row_shape=()):
    """all_to_all_single with equal splits (``split_kind='equal'``) or uneven ones, zeros included."""
    dt = getattr(torch, dtype)
    row_shape = tuple(row_shape)

    def rows(s, d):  # rows src s sends to dst d
        if split_kind == "equal":
            return base_rows
        return ((s + 2 * d) % 3) * base_rows + (s == d)  # some pairs send nothing

    send_rows = [rows(rank, d) for d in range(world)]
    recv_rows = [rows(s, rank) for s in range(world)]
    inp = torch.cat([_a2a_block(rank, d, send_rows[d], row_shape, dt) for d in range(world)])
    expected = torch.cat([_a2a_block(s, rank, recv_rows[s], row_shape, dt) for s in range(world)])
    out = _garbage(dt, tuple(expected.shape))
    what = f"all_to_all_single({dtype}, {split_kind}, rows={base_rows}, row_shape={row_shape}, world={world})"
    if split_kind == "equal":
        dist.all_to_all_single(out, inp)
    else:
        dist.all_to_all_single(out, inp, output_split_sizes=recv_rows, input_split_sizes=send_rows)
    assert_equal(out, expected, what)
    gout = _garbage(dt, tuple(expected.shape))
    if split_kind == "equal":
        gloo_agrees(lambda: dist.all_to_all_single(gout, inp, group=gloo), lambda: gout, out, what)
    else:
        gloo_agrees(
            lambda: dist.all_to_all_single(gout, inp, recv_rows, send_rows, group=gloo), lambda: gout, out, what
        )
    return True


def all_to_all_list(rank, world, gloo, dtype, uneven):
    dt = getattr(torch, dtype)

    def n(s, d):
        return ((s * 3 + d) % 4) + 1 if uneven else 5

    ins = [_a2a_block(rank, d, n(rank, d), (), dt) for d in range(world)]
    outs = [_garbage(dt, (n(s, rank),)) for s in range(world)]
    dist.all_to_all(outs, ins)
    for s in range(world):
        assert_equal(outs[s], _a2a_block(s, rank, n(s, rank), (), dt), f"all_to_all({dtype}, uneven={uneven}) from {s}")
    return True


# ---------------------------------------------------------------- gather / scatter


def gather(rank, world, gloo, dtype, shapes, roots=None):
    dt = getattr(torch, dtype)
    for root in roots if roots is not None else range(world):
        got = []
        for shape in shapes:
            shape = tuple(shape)
            n = numel(shape)
            what = f"gather({dtype}, shape={shape}, root={root}, world={world})"
            mine = _movable(dt, n, rank).reshape(shape)
            outs = [_garbage(dt, shape) for _ in range(world)] if rank == root else None
            dist.gather(mine, outs, dst=root)
            if rank == root:
                for r in range(world):
                    assert_equal(outs[r], _movable(dt, n, r).reshape(shape), what + f" [block {r}]")
                got.append(torch.stack([o.reshape(-1) for o in outs]))
        # vs gloo, once per root over every shape
        cat_in = torch.cat([_movable(dt, numel(tuple(s)), rank).reshape(-1) for s in shapes])
        gouts = [_garbage(dt, tuple(cat_in.shape)) for _ in range(world)] if rank == root else None
        try:
            dist.gather(cat_in, gouts, dst=root, group=gloo)
        except (RuntimeError, ValueError, TypeError):
            continue
        if rank == root:
            assert_equal(torch.cat(got, dim=1), torch.stack(gouts), f"gather({dtype}, root={root}) (vs gloo)")
    return True


def scatter(rank, world, gloo, dtype, shapes, roots=None):
    dt = getattr(torch, dtype)
    for root in roots if roots is not None else range(world):
        got = []
        for shape in shapes:
            shape = tuple(shape)
            n = numel(shape)
            what = f"scatter({dtype}, shape={shape}, root={root}, world={world})"
            ins = [_movable(dt, n, r, salt=root).reshape(shape) for r in range(world)] if rank == root else None
            out = _garbage(dt, shape)
            dist.scatter(out, ins, src=root)
            assert_equal(out, _movable(dt, n, rank, salt=root).reshape(shape), what)
            got.append(out.reshape(-1))
        # vs gloo, once per root over every shape
        cat_ins = (
            [torch.cat([_movable(dt, numel(tuple(s)), r, salt=root).reshape(-1) for s in shapes]) for r in range(world)]
            if rank == root else None
        )
        mine = torch.cat(got)
        gout = _garbage(dt, tuple(mine.shape))
        gloo_agrees(lambda: dist.scatter(gout, cat_ins, src=root, group=gloo), lambda: gout, mine,
                    f"scatter({dtype}, root={root}, world={world})")
    return True


# ---------------------------------------------------------------- one of everything


def battery(rank, world, gloo, n=1001, big=30_001):
    """Every collective, a few dtypes and ops, small and medium sizes, in one case.

    For extra world sizes (5, 6, 7: the non-power-of-two folds of the
    halving/doubling algorithms) under every forced algorithm set.
    """
    shapes = [(0,), (1,), (n,), (big,)]
    for dtype, ops in [("float32", ["sum", "avg", "max", "premul_sum"]), ("bfloat16", ["sum", "min"]),
                       ("int32", ["sum", "product", "bxor", "avg"]), ("bool", ["sum", "band"]),
                       ("complex64", ["sum"])]:
        for op in ops:
            all_reduce(rank, world, gloo, dtype, op, shapes)
            reduce(rank, world, gloo, dtype, op, [(n,), (big,)], roots=sorted({0, world // 2, world - 1}))
            reduce_scatter(rank, world, gloo, dtype, op, [1, n, big // world])
    for dtype in ["float32", "int8", "bool"]:
        broadcast(rank, world, gloo, dtype, shapes, roots=sorted({0, world // 2, world - 1}))
        all_gather(rank, world, gloo, dtype, [(0,), (1,), (n,), (big // world,)])
        gather(rank, world, gloo, dtype, [(1,), (n,), (big // world,)], roots=sorted({0, world - 1}))
        scatter(rank, world, gloo, dtype, [(1,), (n,), (big // world,)], roots=sorted({0, world - 1}))
        all_to_all_single(rank, world, gloo, dtype, "uneven", 5)
    all_gather_coalesced(rank, world, gloo)
    async_ops(rank, world, gloo)
    barrier(rank, world, gloo, rounds=1)
    return True


# ---------------------------------------------------------------- barrier


def barrier(rank, world, gloo, rounds=3):
    for k in range(rounds):
        time.sleep(0.05 * ((rank + k) % world))
        before = time.time()
        dist.barrier()
        after = time.time()
        times = [None] * world
        dist.all_gather_object(times, (before, after), group=gloo)
        last_arrival = max(b for b, _ in times)
        for r, (_, a) in enumerate(times):
            assert a >= last_arrival - 1e-3, f"rank {r} left barrier {k} before rank arrived ({a} < {last_arrival})"
    w = dist.barrier(async_op=True)
    w.wait()
    assert w.is_completed()
    return True


# ---------------------------------------------------------------- point-to-point


def p2p_send_recv_tags(rank, world, gloo, n=1001):
    """Blocking send/recv with tags between ring neighbours, even and odd ranks taking turns."""
    if world == 1:
        return "skipped"
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    a = torch.full((n,), float(rank * 10 + 1))
    b = torch.full((n,), float(rank * 10 + 2))
    ra, rb = torch.zeros(n), torch.zeros(n)

    def sends():
        dist.send(a, dst=nxt, tag=11)
        dist.send(b, dst=nxt, tag=22)

    def recvs():
        dist.recv(ra, src=prv, tag=11)
        dist.recv(rb, src=prv, tag=22)

    if rank % 2 == 0:
        sends()
        recvs()
    else:
        recvs()
        sends()
    assert ra.eq(prv * 10 + 1).all() and rb.eq(prv * 10 + 2).all(), (ra[:3], rb[:3])
    return True


def p2p_isend_irecv(rank, world, gloo, n=1001, dtypes=("float32", "int64", "bfloat16", "bool", "complex64", "uint8")):
    if world == 1:
        return "skipped"
    works, bufs = [], []
    for k, dtype in enumerate(dtypes):
        dt = getattr(torch, dtype)
        for peer in range(world):
            if peer == rank:
                continue
            works.append(dist.isend(_movable(dt, n, rank * 100 + peer, salt=k), dst=peer, tag=k))
            buf = _garbage(dt, (n,))
            works.append(dist.irecv(buf, src=peer, tag=k))
            bufs.append((buf, _movable(dt, n, peer * 100 + rank, salt=k), f"{dtype} from {peer}"))
    for w in works:
        w.wait()
    for buf, exp, what in bufs:
        assert_equal(buf, exp, "irecv " + what)
    return True


def p2p_any_source(rank, world, gloo, n=17, rounds=2):
    """Rank 0 receives from any source; recv returns the sender."""
    if world == 1:
        return "skipped"
    if rank == 0:
        seen = []
        for _ in range(rounds * (world - 1)):
            t = torch.zeros(n)
            sender = dist.recv(t)
            assert sender is not None and 1 <= sender < world, f"bad sender {sender}"
            seen.append(sender)
            assert t.eq(sender).all(), f"payload {t[:3]} does not match sender {sender}"
        assert sorted(seen) == sorted(list(range(1, world)) * rounds), seen
        dist.barrier(group=gloo)
        # irecv from any source: the work names the source
        t = torch.zeros(n)
        w = dist.irecv(t)
        w.wait()
        assert w._source_rank() == world - 1 and t.eq(world - 1).all(), (w._source_rank(), t[:3])
        return sorted(seen)
    for _ in range(rounds):
        dist.send(torch.full((n,), float(rank)), dst=0)
    dist.barrier(group=gloo)
    if rank == world - 1:
        dist.send(torch.full((n,), float(rank)), dst=0)
    return True


def p2p_any_source_mixed(rank, world, gloo):
    """Specific and any-source receives posted together: matching keeps per-sender order."""
    if world < 3:
        return "skipped"
    if rank == 0:
        ra, rb, rc = torch.zeros(2), torch.zeros(2), torch.zeros(2)
        wa = dist.irecv(ra, src=1)
        wb = dist.irecv(rb)
        wc = dist.irecv(rc)
        dist.barrier(group=gloo)
        for w in (wa, wb, wc):
            w.wait()
        assert ra.eq(10).all(), f"the receive posted first for rank 1 must get its first message: {ra}"
        got = sorted([(wb._source_rank(), rb[0].item()), (wc._source_rank(), rc[0].item())])
        assert got == [(1, 11.0), (2, 20.0)], got
    else:
        dist.barrier(group=gloo)
        if rank == 1:
            dist.send(torch.full((2,), 10.0), dst=0)
            dist.send(torch.full((2,), 11.0), dst=0)
        elif rank == 2:
            dist.send(torch.full((2,), 20.0), dst=0)
    return True


def p2p_batch_ring(rank, world, gloo, n=1_000_000):
    """batch_isend_irecv: large messages both ways around the ring at once (must not deadlock)."""
    if world == 1:
        return "skipped"
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    to_next = torch.arange(n, dtype=torch.float32) + rank * 1e6
    to_prev = -torch.arange(n, dtype=torch.float32) - rank * 1e6
    from_prev, from_next = torch.zeros(n), torch.zeros(n)
    ops = [
        dist.P2POp(dist.isend, to_next, nxt),
        dist.P2POp(dist.isend, to_prev, prv),
        dist.P2POp(dist.irecv, from_prev, prv),
        dist.P2POp(dist.irecv, from_next, nxt),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(from_prev, torch.arange(n, dtype=torch.float32) + prv * 1e6), "from prev"
    assert torch.equal(from_next, -torch.arange(n, dtype=torch.float32) - nxt * 1e6), "from next"
    return True


def p2p_tag_order(rank, world, gloo, n=10, blocking=True):
    """Rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first, then tag 1."""
    if world == 1:
        return "skipped"
    if rank == 0:
        a, b = torch.full((n,), 1.0), torch.full((n,), 2.0)
        if blocking:
            dist.send(a, dst=1, tag=1)
            dist.send(b, dst=1, tag=2)
        else:
            ws = [dist.isend(a, dst=1, tag=1), dist.isend(b, dst=1, tag=2)]
            for w in ws:
                w.wait()
    elif rank == 1:
        a, b = torch.zeros(n), torch.zeros(n)
        dist.recv(b, src=0, tag=2)
        dist.recv(a, src=0, tag=1)
        assert a.eq(1).all() and b.eq(2).all(), (a[:3], b[:3])
    return True


def p2p_edge_cases(rank, world, gloo):
    """Zero-size messages, many small messages in order, 0-dim tensors, p2p between collectives."""
    if world == 1:
        return "skipped"
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # zero-size and 0-dim
    ws = [dist.isend(torch.zeros(0), dst=nxt), dist.isend(torch.tensor(float(rank)), dst=nxt, tag=3)]
    z, s = torch.zeros(0), torch.tensor(-1.0)
    dist.recv(z, src=prv)
    dist.recv(s, src=prv, tag=3)
    for w in ws:
        w.wait()
    assert s.item() == prv
    # 200 small messages, same tag: must arrive in order
    ws = [dist.isend(torch.tensor([float(k)]), dst=nxt, tag=9) for k in range(200)]
    got = []
    for _ in range(200):
        t = torch.zeros(1)
        dist.recv(t, src=prv, tag=9)
        got.append(int(t.item()))
    for w in ws:
        w.wait()
    assert got == list(range(200)), got[:20]
    # an isend posted before a collective must not block it; receive after the collective
    big = torch.arange(300_000, dtype=torch.float32) + rank
    w = dist.isend(big, dst=nxt, tag=4)
    t = torch.ones(5)
    dist.all_reduce(t)
    assert t.eq(world).all()
    r = torch.zeros(300_000)
    dist.recv(r, src=prv, tag=4)
    w.wait()
    assert torch.equal(r, torch.arange(300_000, dtype=torch.float32) + prv)
    return True


# ---------------------------------------------------------------- async


def async_ops(rank, world, gloo, n=1001):
    """Several operations in flight, then wait for all; is_completed; futures."""
    a = pattern("sum", torch.float32, n, rank)
    b = data(torch.int64, n, 0) if rank == 0 else torch.zeros(n, dtype=torch.int64)
    c_outs = [torch.zeros(n) for _ in range(world)]
    c_in = data(torch.float32, n, rank)
    d_in = pattern("sum", torch.float64, n * world, rank)
    d_out = torch.zeros(n, dtype=torch.float64)
    e = pattern("minmax", torch.int32, n, rank)
    works = [
        dist.all_reduce(a, async_op=True),
        dist.broadcast(b, src=0, async_op=True),
        dist.all_gather(c_outs, c_in, async_op=True),
        dist.reduce_scatter_tensor(d_out, d_in, async_op=True),
        dist.barrier(async_op=True),
        dist.all_reduce(e, op=ReduceOp.MAX, async_op=True),
    ]
    # a synchronous collective issued behind them
    f = torch.full((3,), float(rank))
    dist.all_reduce(f)
    assert f.eq(sum(range(world))).all()
    for w in works:
        w.wait()
        assert w.is_completed()
    assert_equal(a, closed_form("sum", torch.float32, n, range(world)), "async all_reduce")
    assert_equal(b, data(torch.int64, n, 0), "async broadcast")
    for r in range(world):
        assert_equal(c_outs[r], data(torch.float32, n, r), f"async all_gather block {r}")
    assert_equal(d_out, closed_form("sum", torch.float64, n * world, range(world))[rank * n:(rank + 1) * n],
                 "async reduce_scatter_tensor")
    assert_equal(e, closed_form("max", torch.int32, n, range(world)), "async all_reduce max")
    # futures: value, and a callback chained on it
    g = pattern("sum", torch.float32, n, rank)
    w = dist.all_reduce(g, async_op=True)
    fut = w.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    val = fut.wait()
    assert isinstance(val, list) and len(val) == 1, type(val)
    exp = closed_form("sum", torch.float32, n, range(world))
    assert_equal(val[0], exp, "future value")
    assert_equal(doubled.wait(), exp * 2, "chained future")
    w.wait()
    assert w.is_completed()
    # the Future asked for only once the op is done (it is made on demand): completed, with the
    # value, and callbacks chained on it run at once
    g2 = pattern("sum", torch.float32, n, rank)
    w2 = dist.all_reduce(g2, async_op=True)
    w2.wait()
    late = w2.get_future()
    assert late.done() and w2.get_future().done()
    assert_equal(late.wait()[0], exp, "future made after completion")
    assert_equal(late.then(lambda f: f.value()[0] + 1).wait(), exp + 1, "callback on a completed future")
    # many in flight at once
    ts = [torch.full((k + 1,), float(rank + k)) for k in range(32)]
    ws = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(ws):
        w.wait()
    for k, t in enumerate(ts):
        assert t.eq(sum(r + k for r in range(world))).all(), (k, t)
    # async p2p and async collectives interleaved
    if world > 1:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        s = torch.full((n,), float(rank))
        r = torch.zeros(n)
        ws = [dist.isend(s, dst=nxt), dist.all_reduce(torch.ones(4), async_op=True), dist.irecv(r, src=prv)]
        for w in ws:
            w.wait()
        assert r.eq(prv).all()
    return True


# ---------------------------------------------------------------- subgroups


def subgroups(rank, world, gloo, n=1001, churn=3):
    """Collectives on subgroups while the other ranks do something else."""
    evens = list(range(0, world, 2))
    odds = list(range(1, world, 2))
    g_even = dist.new_group(evens)
    g_odd = dist.new_group(odds) if odds else None
    g_last = dist.new_group([world - 1])  # a group of one
    g_explicit = dist.new_group(list(range(world))[::-1], backend="tilecomm")  # explicit backend; torch sorts ranks
    mine = evens if rank % 2 == 0 else odds
    g = g_even if rank % 2 == 0 else g_odd
    x = pattern("sum", torch.float32, n, rank)
    y = x.clone()
    if rank % 2 == 0:
        dist.all_reduce(y, group=g)
        # broadcast from the group's last member, using group-relative ranks
        b = data(torch.int32, n, 7) if rank == evens[-1] else torch.zeros(n, dtype=torch.int32)
        dist.broadcast(b, group=g, group_src=len(evens) - 1)
        assert_equal(b, data(torch.int32, n, 7), "subgroup broadcast")
        outs = [torch.zeros(n) for _ in evens]
        dist.all_gather(outs, x, group=g)
        for k, r in enumerate(evens):
            assert_equal(outs[k], pattern("sum", torch.float32, n, r), f"subgroup all_gather block {k}")
    else:
        # the odd ranks: point-to-point among themselves first, then their own collective
        if len(odds) > 1:
            k = odds.index(rank)
            nxt, prv = odds[(k + 1) % len(odds)], odds[(k - 1) % len(odds)]
            w = dist.isend(torch.full((7,), float(rank)), dst=nxt)
            r = torch.zeros(7)
            dist.recv(r, src=prv)
            w.wait()
            assert r.eq(prv).all()
        time.sleep(0.05)
        dist.all_reduce(y, group=g)
    assert_equal(y, closed_form("sum", torch.float32, n, mine), "subgroup all_reduce")
    # group of one
    if rank == world - 1:
        t = torch.full((3,), 5.0)
        dist.all_reduce(t, group=g_last)
        assert t.eq(5).all()
    # explicit-backend group over every rank
    assert dist.get_backend(g_explicit) == "tilecomm"
    assert dist.get_group_rank(g_explicit, rank) == sorted(range(world)).index(rank)
    outs = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), float(rank)), group=g_explicit)
    assert [o[0].item() for o in outs] == [float(k) for k in range(world)]
    # the default group still works, interleaved with subgroup work
    z = torch.ones(2)
    dist.all_reduce(z)
    assert z.eq(world).all()
    for grp in [g_even, g_odd, g_last, g_explicit]:
        if grp is not None and grp != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(grp)
    # create / use / destroy repeatedly (no leaked segments or threads)
    for k in range(churn):
        sub = dist.new_group(list(range(world)))
        t = torch.full((5,), float(rank + k))
        dist.all_reduce(t, group=sub)
        assert t.eq(sum(range(world)) + world * k).all()
        dist.destroy_process_group(sub)
    import harness

    leftover = harness.shm_segments([os.getpid()])
    assert not leftover, f"shared-memory segments left after destroying subgroups: {leftover}"
    return True


def concurrent_groups(rank, world, gloo, iters=40, ngroups=6, n=5001):
    """Several tilecomm groups over the same ranks, driven at once from one thread each.

    Each group has its own engine and progress threads, so this must neither
    deadlock nor mix data between groups (FSDP-style separate groups for
    all-gather and reduce-scatter).
    """
    import threading

    groups = [dist.new_group(list(range(world))) for _ in range(ngroups)]
    local = [dist.new_group([r], use_local_synchronization=True) for r in [rank]]  # only this rank calls it
    errors, results = [], {}

    base = sum(range(world))

    def drive(k, g):
        try:
            bad = 0
            ramp = torch.arange(n, dtype=torch.float32) % 7
            for i in range(iters):
                t = ramp + float(rank + k * 100 + i)
                if i % 3 == 2:
                    dist.all_reduce(t, group=g, async_op=True).wait()
                else:
                    dist.all_reduce(t, group=g)
                bad += not torch.equal(t, ramp * world + float(base + world * (k * 100 + i)))
            results[k] = bad
        except Exception as e:  # reported below
            errors.append(f"group {k}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=drive, args=(k, g)) for k, g in enumerate(groups)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "a group's thread is stuck"
    assert not errors, errors
    for k in range(ngroups):
        assert results.get(k) == 0, f"group {k}: {results.get(k)} of {iters} results wrong"
    t = torch.full((3,), 2.0)
    dist.all_reduce(t, group=local[0])  # a group of one made with use_local_synchronization
    assert t.eq(2).all()
    for g in groups + local:
        dist.destroy_process_group(g)
    return True


def device_mesh_2d(rank, world, gloo):
    """A 2-D DeviceMesh over tilecomm: collectives along each dimension use the right sub-groups."""
    from torch.distributed.device_mesh import init_device_mesh

    rows = 2
    cols = world // rows
    mesh = init_device_mesh("cpu", (rows, cols), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    assert dist.get_backend(dp) == "tilecomm" and dist.get_backend(tp) == "tilecomm"
    r, c = divmod(rank, cols)
    t = torch.full((4,), float(rank))
    dist.all_reduce(t, group=tp)  # same row
    assert t.eq(sum(r * cols + j for j in range(cols))).all(), t
    t = torch.full((4,), float(rank))
    dist.all_reduce(t, group=dp)  # same column
    assert t.eq(sum(i * cols + c for i in range(rows))).all(), t
    return True


def split_groups(rank, world, gloo):
    """ProcessGroup.split_group, which dist.split_group and DeviceMesh call where the default group is
    bound to an accelerator (CPU-only torch refuses that binding, so the split is called directly):
    each rank names its child (even ranks; odd ranks but the last; the last alone), gets a tilecomm
    group of those ranks, and a rank that names a child it is not in gets None."""
    import copy
    from datetime import timedelta

    parent = dist.group.WORLD
    backend = parent._get_backend(torch.device("cpu"))
    assert backend.supports_splitting
    opts = copy.deepcopy(backend.options)  # as dist.split_group copies the parent's options
    assert opts.backend == "tilecomm" and opts._timeout == backend.options._timeout, opts._timeout
    evens = list(range(0, world, 2))
    odds = [r for r in range(1, world, 2) if r != world - 1]
    splits = [s for s in (evens, odds, [world - 1] if world > 1 and (world - 1) % 2 else []) if s]
    mine = next(s for s in splits if rank in s)
    # children set up through the parent's set-up Store, under their ranks (Note [Splitting])
    made = backend.setup_store
    key = f"tilecomm-split[{','.join(map(str, mine))}]/tilecomm/creations"
    base = made.add(key, 0)
    dist.barrier(group=gloo)  # every rank has counted before any makes a child
    # every child of one split has the same name, as some torch versions' dist.split_group names them
    child = parent.split_group(mine, timeout=timedelta(seconds=90), opts=opts, group_name="split")
    assert child.rank() == mine.index(rank) and child.size() == len(mine), (child.rank(), child.size())
    assert child.group_name == "split"
    child_backend = child._get_backend(torch.device("cpu"))
    assert child_backend.options._timeout == timedelta(seconds=90)
    for n in (1, 1031):
        t = torch.full((n,), float(rank + 1))
        child.allreduce([t]).wait()
        assert t.eq(sum(r + 1 for r in mine)).all(), (mine, t[:4])
    out = [torch.empty(3) for _ in mine]
    child.allgather([out], [torch.full((3,), float(rank))]).wait()
    assert [o[0].item() for o in out] == [float(r) for r in mine], out
    assert made.add(key, 0) - base == len(mine)  # set up once per rank
    dist.barrier(group=gloo)  # every rank has counted before any makes the second child
    # a second child of the same ranks, whose members are given different names: torch's
    # dist.split_group hashes the ranks with the count of groups each process registered, which
    # differs once a new_group has registered on some ranks only
    again = parent.split_group(mine, timeout=timedelta(seconds=90), opts=copy.deepcopy(opts),
                               group_name=f"again-{rank}")
    t = torch.full((1031,), float(rank + 1))
    again.allreduce([t]).wait()
    assert t.eq(sum(r + 1 for r in mine)).all(), (mine, t[:4])
    assert made.add(key, 0) - base == 2 * len(mine)
    # a rank outside the split it names gets no group (and the others do not wait for it)
    if world > 1:
        other = next(s for s in splits if rank not in s) if len(splits) > 1 else None
        if other is not None:
            assert parent.split_group(other, opts=copy.deepcopy(opts), group_name=f"none-{rank}") is None
    dist.barrier(group=gloo)
    return True


# ---------------------------------------------------------------- objects


def object_collectives(rank, world, gloo):
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "data": list(range(rank + 1)), "s": "x" * (rank * 1000)})
    for r, o in enumerate(objs):
        assert o == {"rank": r, "data": list(range(r + 1)), "s": "x" * (r * 1000)}, (r, o)
    for root in range(world):
        lst = [("root", root, {"k": [1, 2, 3]}), root * 1.5, None] if rank == root else [None, None, None]
        dist.broadcast_object_list(lst, src=root)
        assert lst == [("root", root, {"k": [1, 2, 3]}), root * 1.5, None], lst
    dst = world - 1
    gathered = [None] * world if rank == dst else None
    dist.gather_object(("g", rank, "y" * rank), gathered, dst=dst)
    if rank == dst:
        assert gathered == [("g", r, "y" * r) for r in range(world)], gathered
    out = [None]
    dist.scatter_object_list(out, [{"to": r, "v": [r] * r} for r in range(world)] if rank == 0 else None, src=0)
    assert out[0] == {"to": rank, "v": [rank] * rank}, out
    if world > 1:
        if rank == 0:
            dist.send_object_list([{"hello": 1}, "two"], dst=1)
        elif rank == 1:
            got = [None, None]
            dist.recv_object_list(got, src=0)
            assert got == [{"hello": 1}, "two"], got
    return True


# ---------------------------------------------------------------- bad inputs (group stays usable)


def operators(rank, world, gloo, shapes=((0,), (1,), (1001,), (3, 5, 7))):
    """torch.ops.tilecomm's collectives (Note [Operators]) against the closed form and, bit for bit,
    against dist.all_reduce / dist.all_gather_into_tensor of the same group, for every dtype and
    named ReduceOp; the errors of the backend for invalid pairs; clear errors for what the
    operators refuse. Returns how many results were checked."""
    import tilecomm

    name = dist.group.WORLD.group_name
    checked = 0
    for dtype, dt in DTYPES.items():
        for op in [o for o in OPS if not o.startswith("premul")]:
            for shape in shapes:
                n = numel(shape)
                what = f"op all_reduce_({op}, {dtype}, shape={shape}, world={world})"
                x = pattern(kind_of(op), dt, n, rank).reshape(shape)
                y = x.clone()
                # as dist.all_reduce: complex goes as its real view, for SUM and AVG only (ValueError)
                inv = ValueError if torch_api_blocks_complex(op, dt) else backend_invalid(op, dt)
                if inv is not None:
                    expect_error(inv, lambda: torch.ops.tilecomm.all_reduce_(y, op, name), what)
                    assert_equal(y, x, what + " input left alone after the error")
                    continue
                assert torch.ops.tilecomm.all_reduce_(y, op, name) is None, f"{what}: returns something"
                assert_equal(y, closed_form(op, dt, n, range(world)).reshape(shape), what)
                z = x.clone()
                dist.all_reduce(z, op=reduce_op(op))
                assert raw_bytes(y) == raw_bytes(z), f"{what}: differs from dist.all_reduce"
                checked += 1
    for dtype in ("float32", "bfloat16", "int64", "bool", "complex128"):
        dt = DTYPES[dtype]
        for shape in shapes:
            n = numel(shape)
            mine = _movable(dt, n, rank).reshape(shape)
            out = _garbage(dt, (world * shape[0],) + shape[1:])
            torch.ops.tilecomm.all_gather_into_tensor_out(mine, name, out=out)
            want = torch.cat([_movable(dt, n, r).reshape(shape) for r in range(world)])
            assert_equal(out, want, f"op all_gather({dtype}, shape={shape}, world={world})")
            checked += 1
    # the Python helpers: default group, another tilecomm group, a ReduceOp member
    sub = dist.new_group(backend="tilecomm")
    t = torch.full((5,), float(rank + 1))
    assert tilecomm.ops.all_reduce_(t, dist.ReduceOp.MAX, group=sub) is t
    assert t.tolist() == [float(world)] * 5, t
    tilecomm.ops.all_reduce_(t)
    assert t.tolist() == [float(world * world)] * 5, t
    out = torch.empty(2 * world)
    tilecomm.ops.all_gather_into_tensor(out, torch.full((2,), float(rank)), group=sub)
    assert out.tolist() == [float(r) for r in range(world) for _ in range(2)], out
    # meta tensors: nothing happens
    torch.ops.tilecomm.all_reduce_(torch.empty(3, device="meta"), "sum", name)
    # autograd: a tensor that requires grad is refused (no silent identity gradient); without grad mode it runs
    h = torch.ones(3, requires_grad=True) * 2
    expect_error(ValueError, lambda: torch.ops.tilecomm.all_reduce_(h, "sum", name), "requires grad", "no_grad")
    assert h.tolist() == [2.0] * 3, h
    with torch.no_grad():
        g = torch.ones(3)
        tilecomm.ops.all_reduce_(g)
    assert g.tolist() == [float(world)] * 3, g
    if world <= 2:  # torch.compile traces and functionalizes them (aot_eager: no C++ compiler needed)
        def fn(a, out):
            a = a * 2
            torch.ops.tilecomm.all_reduce_(a, "sum", name)
            torch.ops.tilecomm.all_gather_into_tensor_out(a, name, out=out)
            return a + 1

        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        out = torch.empty(3 * world)
        got = compiled(torch.full((3,), float(rank + 1)), out)
        s = 2.0 * world * (world + 1) / 2
        assert got.tolist() == [s + 1] * 3 and out.tolist() == [s] * (3 * world), (got, out)
    # refused, each naming the problem
    x = torch.ones(4)
    msgs = [
        expect_error(ValueError, lambda: torch.ops.tilecomm.all_reduce_(x, "median", name), "op name", "median"),
        expect_error(ValueError, lambda: torch.ops.tilecomm.all_reduce_(x, "premul_sum", name), "premul", "PREMUL_SUM"),
        expect_error(ValueError, lambda: tilecomm.ops.all_reduce_(x, group=gloo), "gloo group", "its backend is gloo"),
        expect_error(ValueError, lambda: tilecomm.ops.all_reduce_(x, op=3), "op type", "op must be"),
        expect_error(RuntimeError, lambda: torch.ops.tilecomm.all_reduce_(x, "sum", "no-such-group"), "group name",
                     "no-such-group"),
        expect_error(ValueError, lambda: tilecomm.ops.all_gather_into_tensor(torch.empty(world * 4 + 1), x),
                     "all_gather size", "expected world size"),
        expect_error(ValueError, lambda: tilecomm.ops.all_gather_into_tensor(torch.empty(world * 4, device="meta"), x),
                     "meta and cpu", "meta"),
    ]
    assert x.tolist() == [1.0] * 4, x
    dist.destroy_process_group(sub)
    if world > 1:  # a rank outside a group: nothing happens, with a warning, as with dist's functions
        pair = dist.new_group([0, 1], backend="tilecomm")
        t = torch.full((3,), float(rank))
        tilecomm.ops.all_reduce_(t, group=pair)
        assert t.tolist() == ([1.0] * 3 if rank < 2 else [float(rank)] * 3), t
        dist.destroy_process_group(pair)
    check_group_healthy(gloo)
    return {"checked": checked, "errors": msgs}


def host_stages(rank, world, gloo, calls=40):
    """tilecomm.host_stages (Note [Host stages]): every synchronous all_reduce and all_gather_into_tensor
    of the block, through dist and the operators, gives one sample per CPU stage and none of the CUDA
    stages; asynchronous calls, other collectives, a refused call and calls outside the block give
    none; the results stay right; blocks do not nest."""
    import math

    import tilecomm

    name = dist.group.WORLD.group_name
    cpu_stages = ["checked", "issued", "turn", "done", "waited"]  # in order
    y, out = torch.ones(7), torch.empty(7 * world)
    with tilecomm.host_stages() as rec:
        for _ in range(calls):
            y.fill_(rank + 1)
            dist.all_reduce(y)
            assert y.tolist() == [world * (world + 1) / 2] * 7, y
            y.fill_(rank + 1)
            torch.ops.tilecomm.all_reduce_(y, "max", name)
            assert y.tolist() == [float(world)] * 7, y
            dist.all_gather_into_tensor(out, torch.full((7,), float(rank)))
            assert out.tolist() == [float(r) for r in range(world) for _ in range(7)], out
        dist.all_reduce(y, async_op=True).wait()
        dist.all_gather_into_tensor(out, y, async_op=True).wait()
        dist.broadcast(y, 0)  # another collective: not recorded
        expect_error(TypeError, lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG),
                     "refused call inside the block", "AVG")
        expect_error(RuntimeError, lambda: tilecomm.host_stages().__enter__(), "nested block", "already recording")
    dist.all_reduce(y)  # after the block: not recorded
    assert sorted(rec.samples) == sorted(cpu_stages), rec.samples.keys()
    for st, xs in rec.samples.items():
        assert len(xs) == 3 * calls, (st, len(xs))
        assert all(math.isfinite(x) and x >= 0 for x in xs), (st, min(xs))
    assert list(rec.medians()) == cpu_stages, rec.medians()
    assert "| sum of medians |" in rec.table(), rec.table()
    with tilecomm.host_stages() as again:
        pass
    assert again.samples == {}, again.samples
    return {"checked": 3 * calls}


def bad_inputs(rank, world, gloo):
    msgs = {}
    be = backend()
    nc = torch.arange(20.0).reshape(4, 5).t()  # non-contiguous: collectives take it (strided_tensors), p2p not
    assert not nc.is_contiguous()
    # dtype mismatch in an output list: torch's own check, and the backend's TypeError
    inp = torch.zeros(4)
    outs = [torch.zeros(4) for _ in range(world)]
    outs[-1] = torch.zeros(4, dtype=torch.float64)
    msgs["all_gather dtype mismatch"] = expect_error((TypeError, ValueError), lambda: dist.all_gather(outs, inp),
                                                     "dtype mismatch")
    msgs["backend allgather dtype mismatch"] = expect_error(
        TypeError, lambda: be.allgather([outs], [inp], _c10d.AllgatherOptions()), "backend dtype mismatch", match="dtype"
    )
    # wrong output-list length
    short = [torch.zeros(4) for _ in range(world + 1)]
    msgs["all_gather list length"] = expect_error(ValueError, lambda: be.allgather([short], [inp],
                                                                                    _c10d.AllgatherOptions()),
                                                  "list length", match="world size")
    msgs["reduce_scatter list length"] = expect_error(
        ValueError, lambda: dist.reduce_scatter(torch.zeros(4), [torch.zeros(4)] * (world + 1)), "rs list length"
    )
    msgs["all_gather_into_tensor size"] = expect_error(
        ValueError, lambda: dist.all_gather_into_tensor(torch.zeros(4 * world + 1), inp), "agit size"
    )
    msgs["reduce_scatter_tensor size"] = expect_error(
        ValueError, lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.zeros(4 * world + 1)), "rst size"
    )
    # invalid roots
    bo = dist.BroadcastOptions()
    bo.rootRank = world
    msgs["backend broadcast root"] = expect_error(ValueError, lambda: be.broadcast([inp], bo), "root", match="root")
    bo.rootRank = -1
    msgs["backend broadcast root -1"] = expect_error(ValueError, lambda: be.broadcast([inp], bo), "root -1")
    ro = dist.ReduceOptions()
    ro.rootRank = world + 3
    msgs["backend reduce root"] = expect_error(ValueError, lambda: be.reduce([inp], ro), "reduce root")
    msgs["broadcast src out of range"] = expect_error((ValueError, RuntimeError),
                                                      lambda: dist.broadcast(inp, src=world), "src")
    go = dist.GatherOptions()
    go.rootRank = world
    msgs["backend gather root"] = expect_error(ValueError, lambda: be.gather([outs[:world]], [inp], go), "gather root")
    # all_to_all splits that do not add up
    a2a_in, a2a_out = torch.zeros(world * 2), torch.zeros(world * 2)
    bad = [2] * world
    bad[0] = 3
    msgs["all_to_all_single splits"] = expect_error(
        ValueError, lambda: dist.all_to_all_single(a2a_out, a2a_in, [2] * world, bad), "splits", match="split"
    )
    msgs["all_to_all_single split count"] = expect_error(
        ValueError, lambda: dist.all_to_all_single(a2a_out, a2a_in, [2] * (world + 1), [2] * (world + 1)),
        "split count"
    )
    # the own block: sent to itself 3 rows, expected from itself 2 (the totals add up)
    own_in = [2] * world
    own_in[rank] = 3
    msgs["all_to_all_single own block"] = expect_error(
        ValueError, lambda: dist.all_to_all_single(a2a_out, torch.zeros(world * 2 + 1), [2] * world, own_in),
        "own block", match="sends itself"
    )
    own_out = [torch.zeros(2) for _ in range(world)]
    own_out[rank] = torch.zeros(3)
    msgs["all_to_all own block"] = expect_error(
        ValueError, lambda: dist.all_to_all(own_out, [torch.zeros(2) for _ in range(world)]), "own block (list)",
        match="sends itself"
    )
    if world > 1:
        msgs["all_to_all_single indivisible"] = expect_error(
            ValueError, lambda: dist.all_to_all_single(torch.zeros(world + 1), torch.zeros(world + 1)), "indivisible"
        )
    # reductions the engine does not define
    msgs["bitwise on float"] = expect_error(TypeError, lambda: dist.all_reduce(torch.zeros(3), op=ReduceOp.BXOR),
                                            "bxor float")
    msgs["avg on bool"] = expect_error(TypeError, lambda: dist.all_reduce(torch.zeros(3, dtype=torch.bool),
                                                                          op=ReduceOp.AVG), "avg bool")
    msgs["premul on int"] = expect_error(
        TypeError, lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)),
        "premul int"
    )
    # point-to-point to oneself
    msgs["send to self"] = expect_error(ValueError, lambda: be.send([inp], rank, 0), "send self")
    if world > 1:
        msgs["send non-contiguous"] = expect_error(ValueError, lambda: be.send([nc], (rank + 1) % world, 0),
                                                   "send nc", match="contiguous")
        msgs["recv non-contiguous"] = expect_error(ValueError, lambda: be.recv([nc], (rank + 1) % world, 0),
                                                   "recv nc", match="contiguous")
    msgs["recv from out of range"] = expect_error(ValueError, lambda: be.recv([inp], world, 0), "recv range")
    # a receive whose size does not match the message: the receiver gets ValueError, the group stays usable
    if world > 1:
        if rank == 0:
            dist.send(torch.ones(4), dst=1, tag=77)
        elif rank == 1:
            msgs["recv size mismatch"] = expect_error(
                (ValueError, RuntimeError), lambda: dist.recv(torch.zeros(8), src=0, tag=77), "recv size"
            )
        dist.barrier(group=gloo)
    check_group_healthy(gloo)
    return msgs


# ---------------------------------------------------------------- clients: DDP and FSDP2


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(step, rank, rows=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(rows, 8, generator=g), torch.randn(rows, 4, generator=g)


def ddp_train(rank, world, gloo, steps=5, bucket_cap_mb=None):
    """DDP with tilecomm vs DDP with Gloo from the same (per-rank different) initial weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    final = {}
    for name, pg in [("tilecomm", None), ("gloo", gloo)]:
        kw = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        model = DDP(_mlp(seed=rank), process_group=pg, **kw)  # DDP broadcasts rank 0's weights
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(steps):
            x, y = _batch(step, rank)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        final[name] = [p.detach().clone() for p in model.module.parameters()]
    # reference without any communication: rank 0's weights, gradients averaged over every rank's batch
    ref = _mlp(seed=0)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        loss = sum(torch.nn.functional.mse_loss(ref(_batch(step, r)[0]), _batch(step, r)[1]) for r in range(world))
        opt.zero_grad()
        (loss / world).backward()
        opt.step()
    for k, (a, b, c) in enumerate(zip(final["tilecomm"], final["gloo"], ref.parameters())):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"param {k}: tilecomm vs gloo max diff {(a - b).abs().max()}"
        assert torch.allclose(a, c.detach(), rtol=1e-5, atol=1e-6), f"param {k}: tilecomm vs reference"
        assert_identical_across_ranks(a, gloo, f"DDP param {k}")
    return True


def _ddp_hook_run(pg, hook, steps):
    """Trains a DDP model with a communication hook on ``pg``; returns the final parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    model = DDP(_mlp(seed=rank), process_group=pg)
    if hook == "powersgd":
        state = psgd.PowerSGDState(process_group=pg, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   min_compression_rate=0.5, use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    elif hook == "fp16":
        model.register_comm_hook(pg, default_hooks.fp16_compress_hook)
    else:
        raise ValueError(hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.module.parameters()]


def ddp_comm_hook(rank, world, gloo, hook="fp16", steps=4):
    """DDP with a communication hook, over tilecomm and over Gloo: same parameters."""
    final = {"tilecomm": _ddp_hook_run(None, hook, steps), "gloo": _ddp_hook_run(gloo, hook, steps)}
    for k, (a, b) in enumerate(zip(final["tilecomm"], final["gloo"])):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), f"param {k}: tilecomm vs gloo max diff {(a - b).abs().max()}"
        assert_identical_across_ranks(a, gloo, f"DDP+{hook} param {k}")
    return True


def fsdp2_train(rank, world, gloo, steps=4, reshard_after_forward=True):
    """FSDP2 (fully_shard) on CPU over tilecomm vs a single-process, non-sharded reference."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    be_name = dist.get_backend(mesh.get_group())
    model = _mlp(seed=0)
    ref = copy.deepcopy(model)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = sum(
            torch.nn.functional.mse_loss(ref(_batch(step, r)[0]), _batch(step, r)[1]) for r in range(world)
        ) / world
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
    for k, (p, q) in enumerate(zip(model.parameters(), ref.parameters())):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        assert torch.allclose(full.detach(), q.detach(), rtol=1e-4, atol=1e-5), (
            f"FSDP2 param {k}: max diff {(full.detach() - q.detach()).abs().max()}"
        )
        assert_identical_across_ranks(full.detach(), gloo, f"FSDP2 param {k}")
    return {"mesh_backend": str(be_name)}


def tensor_parallel(rank, world, gloo, steps=3):
    """Tensor parallelism on CPU over tilecomm: the functional collectives DTensor runs on (closed
    form), a column- then row-parallel MLP trained against a one-process reference, and its sharded
    state dict saved and loaded with torch.distributed.checkpoint."""
    import shutil
    import tempfile

    import torch.distributed._functional_collectives as funcol
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world_group = dist.group.WORLD
    x = torch.arange(6, dtype=torch.float32) + rank
    base = torch.arange(6, dtype=torch.float32)
    assert torch.equal(funcol.all_reduce(x, "sum", world_group), world * base + sum(range(world)))
    assert torch.equal(funcol.all_reduce(x, "max", world_group), base + world - 1)
    gathered = funcol.all_gather_single(x, 0, world_group)
    assert torch.equal(gathered, torch.cat([base + r for r in range(world)]))
    blocks = torch.arange(2 * world, dtype=torch.float32) * (rank + 1)
    scattered = funcol.reduce_scatter_single(blocks, "sum", 0, world_group)
    assert torch.equal(scattered, torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) * sum(range(1, world + 1)))
    a2a = funcol.all_to_all_single(torch.arange(world, dtype=torch.float32) + 10 * rank, None, None, world_group)
    assert torch.equal(a2a, torch.arange(world, dtype=torch.float32) * 10 + rank)
    coalesced = funcol.all_reduce_coalesced([x, 2 * x], "sum", world_group)
    assert torch.equal(coalesced[1], 2 * (world * base + sum(range(world))))

    mesh = init_device_mesh("cpu", (world,))
    assert dist.get_backend(mesh.get_group()) == "tilecomm"
    model = _mlp(seed=0)
    ref = copy.deepcopy(model)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(steps):
        inp, target = _batch(step, 0)  # tensor parallel: every rank takes the same batch
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.mse_loss(m(inp), target).backward()
            o.step()
    for k, (p, q) in enumerate(zip(model.parameters(), ref.parameters())):
        full = p.full_tensor().detach()
        diff = (full - q).abs().max()
        assert torch.allclose(full, q.detach(), rtol=1e-5, atol=1e-6), f"TP param {k}: max diff {diff}"
        assert_identical_across_ranks(full, gloo, f"TP param {k}")

    where = [tempfile.mkdtemp(prefix="tilecomm-dcp-") if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    try:
        dcp.save(model.state_dict(), checkpoint_id=where[0])
        other = _mlp(seed=1)
        parallelize_module(other, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        state = other.state_dict()
        dcp.load(state, checkpoint_id=where[0])
        other.load_state_dict(state)
        for k, (p, q) in enumerate(zip(other.parameters(), model.parameters())):
            assert torch.equal(p.to_local(), q.to_local()), f"checkpointed TP param {k} differs after load"
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(where[0], ignore_errors=True)
    return True


# ---------------------------------------------------------------- harness self-tests


def hang(rank, world, gloo, seconds=600):
    """Never returns in time (the harness must kill the pool and fail, not hang)."""
    time.sleep(seconds)


def one_rank_raises(rank, world, gloo):
    """Rank 0 raises at once; the others wait in a collective rank 0 never joins."""
    if rank == 0:
        raise RuntimeError("deliberate failure on rank 0")
    dist.all_reduce(torch.ones(3))


# ================================================================ spawn cases
# Signature: (rank, world, port, **kwargs). They set up their own group.


def _init(rank, world, port, timeout_s, backend_name="tilecomm"):
    import tilecomm  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group(
        backend_name, rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
        timeout=timedelta(seconds=timeout_s),
    )


def _err(e):
    return {"type": type(e).__name__, "message": str(e), "is_dist_backend_error": isinstance(e, dist.DistBackendError)}


def _store_barrier(tag, world):
    """Waits until every rank got here, through the default group's store (no collective).

    The last to arrive sets a key that the others wait on: the store answers
    every waiter when it is set, so a rank that moves on (and may exit, taking
    the store with it) never leaves another one asking.
    """
    store = dist.distributed_c10d._get_default_store()
    key = f"store_barrier/{tag}"
    if store.add(key, 1) == world:
        store.set(key + "/all", "1")
    store.wait([key + "/all"], timedelta(seconds=60))


def _attempt(fn, *args, **kwargs):
    """(the error as _err gives it, or None; seconds) of one call of fn."""
    t0 = time.monotonic()
    try:
        fn(*args, **kwargs)
        err = None
    except Exception as e:
        err = _err(e)
    return err, time.monotonic() - t0


def spawn_desync(rank, world, port, kind="all_reduce_vs_broadcast", timeout_s=30):
    """Mismatched collectives: every rank must raise DistBackendError quickly; later ops fail too."""
    _init(rank, world, port, timeout_s)
    warm = torch.ones(4)
    dist.all_reduce(warm)  # everyone connected
    _store_barrier("desync", world)  # in step: nobody is still inside the warm-up when rank 0 fails the group
    t = torch.ones(4)
    t0 = time.monotonic()
    try:
        if kind == "all_reduce_vs_broadcast":
            if rank == 0:
                dist.all_reduce(t)
            else:
                dist.broadcast(t, src=0)
        elif kind == "count":
            dist.all_reduce(torch.ones(4 if rank == 0 else 8))
        elif kind == "dtype":
            dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64))
        elif kind == "op":
            dist.all_reduce(t, op=ReduceOp.SUM if rank == 0 else ReduceOp.MAX)
        elif kind == "root":
            dist.broadcast(t, src=0 if rank == 0 else 1)
        elif kind == "all_gather_vs_all_reduce":
            if rank == 0:
                dist.all_gather([torch.zeros(4) for _ in range(world)], t)
            else:
                dist.all_reduce(torch.ones(4 * world))
        else:
            raise ValueError(kind)
        first = None
    except Exception as e:
        first = _err(e)
    elapsed = time.monotonic() - t0
    try:
        dist.all_reduce(torch.ones(2))
        later = None
    except Exception as e:
        later = _err(e)
    return {"first": first, "elapsed": elapsed, "later": later, "pid": os.getpid()}


def spawn_dead_rank(rank, world, port, victim=1, n=4, timeout_s=10, during=False):
    """``victim`` exits abruptly; the others must raise DistBackendError naming it, well within the timeout.

    during=False: the victim exits before the collective. during=True (world >= 3):
    the victim starts the all_reduce and exits 0.3 s later while the last rank
    joins only after 0.6 s, so the victim dies with the collective half done.
    """
    _init(rank, world, port, timeout_s)
    t = torch.ones(n)
    dist.all_reduce(t)
    dist.barrier()
    if rank == victim:
        if during:
            dist.all_reduce(torch.ones(n), async_op=True)
            time.sleep(0.3)
        else:
            time.sleep(0.2)
        os._exit(1)
    if during and rank == world - 1:
        time.sleep(0.6)
    err, elapsed = _attempt(dist.all_reduce, torch.ones(n))
    try:
        dist.all_reduce(torch.ones(2))
        later = None
    except Exception as e:
        later = _err(e)
    # an asynchronous op of the failed group: its Future, made only once the op is done, carries the error
    w = dist.all_reduce(torch.ones(2), async_op=True)
    try:
        w.wait()
    except Exception:  # noqa: BLE001  (the error itself is checked through the Future)
        pass
    try:
        w.get_future().wait()
        late_future = None
    except Exception as e:
        late_future = _err(e)
    return {"error": err, "elapsed": elapsed, "later": later, "late_future": late_future, "pid": os.getpid()}


def spawn_p2p_dead_peer(rank, world, port, any_source=False, timeout_s=10):
    """Rank 1 exits; rank 0's pending receive must fail naming it, well within the timeout."""
    _init(rank, world, port, timeout_s)
    dist.barrier()
    if rank == 1:
        time.sleep(0.3)
        os._exit(1)
    t0 = time.monotonic()
    try:
        if any_source:
            dist.recv(torch.zeros(4))
        else:
            dist.recv(torch.zeros(4), src=1)
        err = None
    except Exception as e:
        err = _err(e)
    return {"error": err, "elapsed": time.monotonic() - t0, "pid": os.getpid()}


def spawn_destroy_pending(rank, world, port, flag_path, kind="p2p", timeout_s=20):
    """destroy_process_group with an operation still pending must return promptly (not wait out the timeout).

    Rank 0 leaves an operation pending that rank 1 never matches (rank 1 stays
    alive, waiting for rank 0 to finish, so no failure is detected).
    """
    _init(rank, world, port, timeout_s)
    dist.barrier()
    if rank == 1:
        t0 = time.monotonic()
        while not os.path.exists(flag_path) and time.monotonic() - t0 < timeout_s + 10:
            time.sleep(0.05)
        return {}
    if kind == "p2p":
        w = dist.irecv(torch.zeros(4), src=1, tag=5)
    else:
        w = dist.all_reduce(torch.ones(4), async_op=True)
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        dist.destroy_process_group()
        destroy_err = None
    except Exception as e:
        destroy_err = _err(e)
    destroy_s = time.monotonic() - t0
    try:
        w.wait()
        wait_err = None
    except Exception as e:
        wait_err = _err(e)
    with open(flag_path, "w") as f:
        f.write("done")
    return {"destroy_s": destroy_s, "destroy_err": destroy_err, "wait_err": wait_err}


def spawn_late_rank(rank, world, port, late=1, timeout_s=3, sleep_s=8, n=4):
    """``late`` arrives long after the group timeout; the others time out naming it."""
    _init(rank, world, port, timeout_s)
    t = torch.ones(n)
    dist.all_reduce(t)
    if rank == late:
        time.sleep(sleep_s)
    err, elapsed = _attempt(dist.all_reduce, torch.ones(n))
    return {"error": err, "elapsed": elapsed, "pid": os.getpid()}


def spawn_init_error(rank, world, port, timeout_s=20, store_port=None):
    """init_process_group under a bad TILECOMM_* setting (set through the environment) must raise.

    With ``store_port`` the ranks join a TCP store hosted by the test process
    (as under torchrun) instead of rank 0's: when rank 0's init fails, the store
    it hosts goes away with it, and a slower rank then sees a connection reset
    instead of the error rank 0 left in the store for it.
    """
    import tilecomm  # noqa: F401

    t0 = time.monotonic()
    try:
        if store_port is None:
            _init(rank, world, port, timeout_s)
        else:
            store = dist.TCPStore("127.0.0.1", store_port, world, is_master=False,
                                  timeout=timedelta(seconds=timeout_s))
            dist.init_process_group("tilecomm", store=store, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=timeout_s))
        err = None
        dist.destroy_process_group()
    except Exception as e:
        err = _err(e)
    return {"error": err, "elapsed": time.monotonic() - t0}


def spawn_lifecycle(rank, world, port, timeout_s=30):
    """Create groups, use them, destroy everything: no /dev/shm segments may remain."""
    import harness

    _init(rank, world, port, timeout_s)
    sub = dist.new_group(list(range(world)))
    t = torch.ones(1000)
    dist.all_reduce(t)
    dist.all_reduce(t, group=sub)
    if world > 1:
        w = dist.isend(torch.ones(10), dst=(rank + 1) % world)
        r = torch.zeros(10)
        dist.recv(r, src=(rank - 1) % world)
        w.wait()
    during = harness.shm_segments([os.getpid()])
    dist.destroy_process_group()
    after = harness.shm_segments([os.getpid()])
    return {"during": during, "after": after, "pid": os.getpid()}


def spawn_reinit(rank, world, port, port2, timeout_s=30):
    """destroy_process_group, then init_process_group again in the same processes."""
    _init(rank, world, port, timeout_s)
    t = torch.ones(5)
    dist.all_reduce(t)
    dist.destroy_process_group()
    _init(rank, world, port2, timeout_s)
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    outs = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    dist.destroy_process_group()
    return {"sum": t.tolist(), "gathered": [o.tolist() for o in outs]}


def _bounded(fn, seconds):
    """Runs fn in a daemon thread; (finished, result or error text). A deadlock costs ``seconds``, not a hang."""
    import threading

    box = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as e:
            box["error"] = f"{type(e).__name__}: {e}"

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    if th.is_alive():
        return False, None
    return True, box.get("error", box.get("result"))


def spawn_future_callback_collective(rank, world, port, timeout_s=30, wait_s=15, backend_name="tilecomm"):
    """A then() callback on an async collective's future issues another collective and waits for it.

    torch's PowerSGD DDP hook does exactly this. The chained future must
    complete (Gloo: yes). Bounded: a deadlock is reported, not waited out.
    """
    _init(rank, world, port, timeout_s, backend_name)
    dist.barrier()

    def cb(fut):
        x = torch.full((3,), float(rank))
        dist.all_reduce(x, async_op=True).get_future().wait()
        y = torch.full((3,), 1.0)
        dist.all_reduce(y)  # and a synchronous one
        return x + y

    def chain():
        t = torch.ones(1 << 20)  # large: the callback is registered before the all_reduce completes
        return dist.all_reduce(t, async_op=True).get_future().then(cb).wait().tolist()

    finished, value = _bounded(chain, wait_s)
    return {"finished": finished, "value": value}


def spawn_future_callbacks_queued(rank, world, port, timeout_s=30, wait_s=15, backend_name="tilecomm"):
    """Two async collectives queued, each with a then() callback that runs a synchronous one.

    The first callback runs on the progress thread while the second collective
    is still queued; running that one must not leave its own callback waiting
    for the first callback's turn. Bounded: a deadlock is reported, not waited out.
    """
    _init(rank, world, port, timeout_s, backend_name)
    dist.barrier()

    def cb(fut):
        y = fut.value()[0].clone()
        dist.all_reduce(y)
        return y

    def chain():
        a = torch.ones(1 << 20)  # large: the callbacks are registered before the all_reduces complete
        b = torch.full((1 << 20,), 2.0)
        fa = dist.all_reduce(a, async_op=True).get_future().then(cb)
        fb = dist.all_reduce(b, async_op=True).get_future().then(cb)
        return [float(fa.wait()[0]), float(fb.wait()[0])]

    finished, value = _bounded(chain, wait_s)
    return {"finished": finished, "value": value}


def spawn_ddp_powersgd(rank, world, port, timeout_s=30, wait_s=30, steps=4, backend_name="tilecomm"):
    """DDP + PowerSGD hook over tilecomm (bounded: a deadlock is reported, not waited out)."""
    _init(rank, world, port, timeout_s, backend_name)
    dist.barrier()
    # plain floats back: tensors sent through a pipe are shared through this process, which exits right after
    finished, value = _bounded(lambda: [float(p.sum()) for p in _ddp_hook_run(None, "powersgd", steps)], wait_s)
    return {"finished": finished, "value": value}


def spawn_debug_detail(rank, world, port, timeout_s=30):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: c10d wraps the backend in its ProcessGroupWrapper, which checks
    each collective's fingerprint and sequence number across ranks (through a Gloo helper) before
    running it. Collectives, a DDP step and a subgroup work under it; the sequence numbers agree;
    a mismatch is reported by the wrapper."""
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    _init(rank, world, port, timeout_s)
    pg = dist.distributed_c10d._get_default_group()
    out = {"wrapper": type(pg._get_backend(torch.device("cpu"))).__name__}
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    out["all_reduce"] = t.tolist()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    sub = dist.new_group([0, 1])
    if rank < 2:
        s = torch.ones(2)
        dist.all_reduce(s, group=sub)
        out["subgroup"] = s.tolist()
    out["seq"] = pg._get_backend(torch.device("cpu"))._get_sequence_number_for_group()  # the wrapper asks tilecomm
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(3))
        else:
            dist.broadcast(torch.ones(3), src=0)
        out["mismatch"] = None
    except Exception as e:  # noqa: BLE001
        out["mismatch"] = str(e)
    return out


def spawn_p2p_timeout_per_op(rank, world, port, timeout_s=4):
    """Each point-to-point operation has its own timeout.

    Rank 0 posts irecv A at t=0 and irecv B at t=2; rank 1 sends A at t=3 and B at
    t=5.5. B waited 3.5 s (< 4 s timeout) and A 3 s: both must succeed.
    """
    _init(rank, world, port, timeout_s)
    dist.barrier()
    t0 = time.monotonic()
    if rank == 0:
        a, b = torch.zeros(4), torch.zeros(4)
        wa = dist.irecv(a, src=1, tag=1)
        time.sleep(2.0)
        wb = dist.irecv(b, src=1, tag=2)
        out = {}
        for name, w in [("a", wa), ("b", wb)]:
            try:
                w.wait()
                out[name] = None
            except Exception as e:
                out[name] = _err(e) | {"at": time.monotonic() - t0}
        out["values"] = (a.tolist(), b.tolist())
        return out
    if rank == 1:
        time.sleep(3.0)
        try:
            dist.send(torch.full((4,), 1.0), dst=0, tag=1)
            time.sleep(2.5)
            dist.send(torch.full((4,), 2.0), dst=0, tag=2)
            return {"sent": True}
        except Exception as e:
            return {"sent": False, "error": _err(e)}
    return {}


def _resources():
    """(RSS in bytes, open file descriptors, this process's shared-memory segments)."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    fds = len(os.listdir("/proc/self/fd"))
    segs = len([n for n in os.listdir("/dev/shm") if n.startswith(f"tilecomm-{os.getpid()}-")])
    return rss, fds, segs


def _soak_blocks(world, n, dt):
    """What all_gather and all_to_all deliver in the soak: n copies of rank r's value, per rank."""
    return torch.tensor([r % 3 + 1 for r in range(world)], dtype=dt).repeat_interleave(n)


def spawn_soak(rank, world, port, n_ops=10000, max_bytes=4 << 20, seed=0, timeout_s=120):
    """Random collectives, sizes (0 B .. max_bytes, log-uniform), dtypes, algorithms (groups
    with forced algorithms) and small random delays, every result checked against the closed
    form; returns resource use after the warm-up and at the end, and the number of checks."""
    import random

    _init(rank, world, port, timeout_s)
    groups = {"auto": dist.group.WORLD}
    for spec in ("ring", "recursive_doubling", "all_reduce:one_shot;reduce_scatter:direct;all_to_all:pairwise"):
        os.environ["TILECOMM_ALGO"] = spec  # rank 0's value is read at group creation
        groups[spec] = dist.new_group(backend="tilecomm")
    os.environ.pop("TILECOMM_ALGO")
    rng = random.Random(seed)  # the same sequence on every rank
    delay = random.Random(seed * 1000 + rank)  # delays differ per rank
    dtypes = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.int8]
    colls = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"]
    total = sum(r % 3 + 1 for r in range(world))  # every reduction's value
    start = None
    checks = 0
    for i in range(n_ops):
        if i == 50:
            start = _resources()
        coll = rng.choice(colls)
        dt = rng.choice(dtypes)
        g = groups[rng.choice(sorted(groups))]
        esize = torch.empty((), dtype=dt).element_size()
        nbytes = int(2 ** rng.uniform(0, math.log2(max_bytes))) if rng.random() > 0.05 else 0
        n = nbytes // esize // world  # elements per block
        root = rng.randrange(world)
        if delay.random() < 0.02:
            time.sleep(delay.random() * 2e-3)
        # Values stay exact in every dtype: small per-rank integers.
        mine = torch.full((n * world,), rank % 3 + 1, dtype=dt)
        if coll == "all_reduce":
            dist.all_reduce(mine, group=g)
            ok = bool((mine == total).all())
        elif coll == "broadcast":
            dist.broadcast(mine, src=root, group=g)
            ok = bool((mine == root % 3 + 1).all())
        elif coll == "reduce":
            dist.reduce(mine, dst=root, group=g)
            ok = rank != root or bool((mine == total).all())
        elif coll == "all_gather":
            out = torch.empty(n * world, dtype=dt)
            dist.all_gather_into_tensor(out, mine[:n], group=g)
            ok = torch.equal(out, _soak_blocks(world, n, dt))
        elif coll == "reduce_scatter":
            out = torch.empty(n, dtype=dt)
            dist.reduce_scatter_tensor(out, mine, group=g)
            ok = bool((out == total).all())
        elif coll == "all_to_all":
            out = torch.empty(n * world, dtype=dt)
            dist.all_to_all_single(out, mine, group=g)
            ok = torch.equal(out, _soak_blocks(world, n, dt))
        else:
            dist.barrier(group=g)
            ok = True
        if not ok:
            raise AssertionError(f"soak op {i}: {coll} of {n} x {dt} (root {root}) gave a wrong result")
        checks += 1
    end = _resources()
    dist.destroy_process_group()
    return {"start": start, "end": end, "checks": checks, "pid": os.getpid()}


def _pids(world):
    """Every rank's pid, exchanged through the default group's Store."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"test_pid_{dist.get_rank()}", str(os.getpid()))
    return [int(store.get(f"test_pid_{r}")) for r in range(world)]


def spawn_stopped_rank(rank, world, port, victim=1, n=4, timeout_s=2, stop_s=0.2):
    """``victim`` is stopped (SIGSTOP) inside an all_reduce; the others must time out naming it.

    The victim enters first and stops ``stop_s`` later, mid-transfer when ``n`` is
    large (its sends fill the slots no peer has read yet); the others enter after
    that, rank r 0.2 r s after rank 0 (so rank 0 times out first, whatever it
    waits for). Rank 0 then resumes the victim (SIGCONT): its all_reduce must
    fail as well, since its peers failed the group while it was stopped.
    """
    import signal
    import threading

    _init(rank, world, port, timeout_s)
    pids = _pids(world)
    dist.all_reduce(torch.ones(n))
    dist.barrier()
    if rank == victim:
        threading.Timer(stop_s, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    else:
        time.sleep(2 * stop_s + 0.2 * rank)
    err, elapsed = _attempt(dist.all_reduce, torch.ones(n))
    if rank == 0:
        os.kill(pids[victim], signal.SIGCONT)
    return {"error": err, "elapsed": elapsed, "pid": os.getpid()}


def spawn_recover_after_kill(rank, world, port, port2, victim=1, n=4, timeout_s=10):
    """``victim`` is killed (SIGKILL) inside an all_reduce; the survivors get their error,
    destroy the group and form a new one of world - 1 ranks (new Store, new port),
    whose collectives must be right."""
    import signal

    import harness

    _init(rank, world, port, timeout_s)
    dist.all_reduce(torch.ones(n))
    dist.barrier()
    if rank == victim:
        dist.all_reduce(torch.ones(n), async_op=True)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == world - 1:
        time.sleep(0.6)  # the victim dies with the collective under way
    try:
        dist.all_reduce(torch.ones(n))
        err = None
    except Exception as e:
        err = _err(e)
    t0 = time.monotonic()
    dist.destroy_process_group()
    destroy_s = time.monotonic() - t0
    segments = harness.shm_segments([os.getpid()])
    new_rank, new_world = rank - (rank > victim), world - 1
    _init(new_rank, new_world, port2, timeout_s)
    t = pattern("sum", torch.float32, n, new_rank)
    dist.all_reduce(t)
    sum_ok = torch.equal(t, closed_form("sum", torch.float32, n, range(new_world)))
    outs = [torch.zeros(3, dtype=torch.int64) for _ in range(new_world)]
    dist.all_gather(outs, torch.full((3,), new_rank, dtype=torch.int64))
    dist.destroy_process_group()
    return {"error": err, "destroy_s": destroy_s, "segments": segments, "sum_ok": sum_ok,
            "gathered": [o.tolist() for o in outs], "pid": os.getpid()}


def _call(coll, g, n=5, dtype="float32", op="sum", root=0):
    """One ``coll`` over ``g`` (every rank in it) with blocks of ``n`` elements of ``dtype``."""
    world, rank = dist.get_world_size(g), dist.get_rank(g)
    dtype, op = DTYPES[dtype], reduce_op(op)
    x = torch.ones(n, dtype=dtype)
    if coll == "all_reduce":
        dist.all_reduce(x, op=op, group=g)
    elif coll == "broadcast":
        dist.broadcast(x, src=root, group=g)
    elif coll == "reduce":
        dist.reduce(x, dst=root, op=op, group=g)
    elif coll == "all_gather":
        dist.all_gather_into_tensor(torch.empty(n * world, dtype=dtype), x, group=g)
    elif coll == "reduce_scatter":
        dist.reduce_scatter_tensor(x, torch.ones(n * world, dtype=dtype), op=op, group=g)
    elif coll == "gather":
        dist.gather(x, [torch.empty_like(x) for _ in range(world)] if rank == root else None, dst=root, group=g)
    elif coll == "scatter":
        dist.scatter(x, [torch.ones_like(x) for _ in range(world)] if rank == root else None, src=root, group=g)
    elif coll == "all_to_all":
        dist.all_to_all_single(torch.empty(n * world, dtype=dtype), torch.ones(n * world, dtype=dtype), group=g)
    elif coll == "barrier":
        dist.barrier(group=g)
    else:
        raise ValueError(coll)


def spawn_desync_matrix(rank, world, port, items, timeout_s=10):
    """Mismatched calls, each on a fresh tilecomm group with its algorithms forced.

    ``items`` are (TILECOMM_ALGO value, call kwargs of rank 0, call kwargs of the
    other ranks) (see _call). The default group is Gloo, so that a failed
    tilecomm group costs nothing but itself. Per item: the first error (or
    None), how long it took, and the error of the next collective on the group.
    """
    _init(rank, world, port, timeout_s, backend_name="gloo")
    out = []
    for spec, mine, theirs in items:
        os.environ["TILECOMM_ALGO"] = spec  # rank 0's value is read at group creation
        g = dist.new_group(backend="tilecomm", timeout=timedelta(seconds=timeout_s))
        _call("all_reduce", g)  # everyone connected
        # NOTE: a rank still inside that all_reduce when rank 0 fails the group at
        # the next call may get the failure there (the group fails fast); the Gloo
        # barrier keeps every rank in step, so the mismatched call is where it fails.
        dist.barrier()
        first, elapsed = _attempt(_call, g=g, **(mine if rank == 0 else theirs))
        try:
            _call("all_reduce", g)
            later = None
        except Exception as e:
            later = _err(e)
        dist.destroy_process_group(g)
        out.append({"first": first, "elapsed": elapsed, "later": later})
    os.environ.pop("TILECOMM_ALGO", None)
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------- one drawn call (test_properties.py)


def _run_both(fn_tilecomm, fn_gloo):
    """Runs a call on tilecomm, then on Gloo (unless None); returns each one's error text or None.

    A tilecomm error that fails the group (DistBackendError) is raised: the
    pool must not serve more calls from a failed group.
    """
    errors = []
    for fn in (fn_tilecomm, fn_gloo):
        if fn is None:
            errors.append("not run")
            continue
        try:
            fn()
            errors.append(None)
        except dist.DistBackendError:
            if fn is fn_tilecomm:
                raise
            errors.append("DistBackendError")
        except Exception as e:
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return errors


def _same(actual, expected, what, problems):
    if expected.dtype != actual.dtype:
        expected = expected.to(actual.dtype)
    if actual.shape != expected.shape or not torch.equal(actual, expected):
        problems.append(f"{what}: got {actual.reshape(-1)[:8].tolist()}, expected {expected.reshape(-1)[:8].tolist()} "
                        f"(shapes {tuple(actual.shape)}, {tuple(expected.shape)})")


def _spaced(x):
    """x's values in a view of every second element of a bigger tensor (not contiguous where x has
    two or more elements)."""
    view = torch.zeros((*x.shape, 2), dtype=x.dtype)[..., 0]
    view.copy_(x)
    return view


def property_call(rank, world, gloo, coll, shape, dtype, op, root, splits, salt, strided=False):
    """One call of the Python API, on tilecomm and on Gloo, with the same inputs.

    Returns what each raised (or None) and the problems found: a tilecomm result
    that differs from the closed form or, where Gloo ran and is exact, from
    Gloo's, bit for bit; an error tilecomm should have raised and did not, or
    one it raised on a valid call (an invalid reduction must be a TypeError,
    or a ValueError from torch itself). With `strided`, tilecomm's tensors are
    not contiguous (Gloo's stay contiguous: it ignores strides).
    """
    dt = DTYPES[dtype]
    sp = _spaced if strided else (lambda t: t)
    shape = tuple(shape)
    n = numel(shape)
    first = shape[0] if shape else 1
    flat = (world * first,) + shape[1:]  # all_gather output, reduce_scatter input
    expected_error = None
    if coll in ("all_reduce", "reduce", "reduce_scatter_tensor"):
        expected_error = backend_invalid(op, dt)
        if coll == "all_reduce" and torch_api_blocks_complex(op, dt):
            expected_error = ValueError
    tc, gl = None, None  # tilecomm's and Gloo's result on this rank, where it has one

    def reduced(m):  # the closed form, where the reduction is defined
        return closed_form(op, dt, m, range(world), salt=salt) if expected_error is None else torch.empty(m, dtype=dt)

    if coll == "all_reduce":
        x = pattern(kind_of(op), dt, n, rank, salt).reshape(shape)
        tc, gl = sp(x.clone()), x.clone()
        errs = _run_both(lambda: dist.all_reduce(tc, op=reduce_op(op)),
                         lambda: dist.all_reduce(gl, op=reduce_op(op), group=gloo))
        expected = reduced(n).reshape(shape)
    elif coll == "reduce":
        x = pattern(kind_of(op), dt, n, rank, salt).reshape(shape)
        tc, gl = sp(x.clone()), x.clone()
        errs = _run_both(lambda: dist.reduce(tc, dst=root, op=reduce_op(op)),
                         lambda: dist.reduce(gl, dst=root, op=reduce_op(op), group=gloo))
        expected = reduced(n).reshape(shape) if rank == root else x
    elif coll == "reduce_scatter_tensor":
        x = pattern(kind_of(op), dt, world * n, rank, salt).reshape(flat)
        tc, gl = sp(_garbage(dt, shape)), _garbage(dt, shape)
        errs = _run_both(lambda: dist.reduce_scatter_tensor(tc, sp(x.clone()), op=reduce_op(op)),
                         # Gloo (torch 2.13) crashes (SIGSEGV) on a 0-dim output
                         (lambda: dist.reduce_scatter_tensor(gl, x.clone(), op=reduce_op(op), group=gloo))
                         if shape else None)
        expected = reduced(world * n)[rank * n:(rank + 1) * n].reshape(shape)
    elif coll == "broadcast":
        src = _movable(dt, n, root, salt).reshape(shape)
        tc = sp(src.clone() if rank == root else _garbage(dt, shape))
        gl = src.clone() if rank == root else _garbage(dt, shape)
        errs = _run_both(lambda: dist.broadcast(tc, src=root), lambda: dist.broadcast(gl, src=root, group=gloo))
        expected = src
    elif coll == "all_gather_into_tensor":
        mine = _movable(dt, n, rank, salt).reshape(shape)
        tc, gl = sp(_garbage(dt, flat)), _garbage(dt, flat)
        errs = _run_both(lambda: dist.all_gather_into_tensor(tc, sp(mine)),
                         lambda: dist.all_gather_into_tensor(gl, mine, group=gloo))
        expected = torch.cat([_movable(dt, n, r, salt) for r in range(world)]).reshape(flat)
    elif coll == "all_to_all_single":
        rows = shape[1:]
        send = [splits[rank][d] for d in range(world)]
        recv = [splits[s][rank] for s in range(world)]
        inp = torch.cat([_a2a_block(rank + salt, d, send[d], rows, dt) for d in range(world)])
        expected = torch.cat([_a2a_block(s + salt, rank, recv[s], rows, dt) for s in range(world)])
        tc, gl = sp(_garbage(dt, tuple(expected.shape))), _garbage(dt, tuple(expected.shape))
        errs = _run_both(lambda: dist.all_to_all_single(tc, sp(inp), recv, send),
                         lambda: dist.all_to_all_single(gl, inp, recv, send, group=gloo))
    elif coll == "gather":
        mine = _movable(dt, n, rank, salt).reshape(shape)
        outs_tc = [sp(_garbage(dt, shape)) for _ in range(world)] if rank == root else None
        outs_gl = [_garbage(dt, shape) for _ in range(world)] if rank == root else None
        errs = _run_both(lambda: dist.gather(sp(mine), outs_tc, dst=root),
                         lambda: dist.gather(mine, outs_gl, dst=root, group=gloo))
        if rank == root:
            tc, gl = torch.stack(outs_tc), torch.stack(outs_gl)
            expected = torch.stack([_movable(dt, n, r, salt).reshape(shape) for r in range(world)])
    elif coll == "scatter":
        ins = [_movable(dt, n, r, salt).reshape(shape) for r in range(world)] if rank == root else None
        tc, gl = sp(_garbage(dt, shape)), _garbage(dt, shape)
        ins_tc = [sp(t) for t in ins] if ins is not None else None
        errs = _run_both(lambda: dist.scatter(tc, ins_tc, src=root),
                         lambda: dist.scatter(gl, ins, src=root, group=gloo))
        expected = _movable(dt, n, rank, salt).reshape(shape)
    else:
        raise ValueError(coll)
    problems = []
    what = f"{coll}({dtype}, shape={shape}, op={op}, root={root}, splits={splits}, strided={strided})"
    what += f" on rank {rank}"
    if errs[0] is not None:
        if expected_error is None or not errs[0].startswith(expected_error.__name__ + ":"):
            problems.append(f"{what}: tilecomm raised {errs[0]} (expected {expected_error})")
    elif expected_error is not None:
        problems.append(f"{what}: tilecomm did not raise {expected_error.__name__}")
    elif tc is not None:
        _same(tc, expected, what + " vs closed form", problems)
        gloo_defined = not (coll == "reduce" and rank != root)  # Gloo uses non-root buffers as scratch
        if errs[1] is None and gloo_is_exact(op, dt) and gloo_defined:
            _same(tc, gl, what + " vs gloo", problems)
    return {"tilecomm": errs[0], "gloo": errs[1], "problems": problems}


# ---------------------------------------------------------------- links between hosts


def link_traffic(rank, world, gloo, algos=("ring", "hierarchical"), n=1 << 18):
    """Per forced all_reduce algorithm, the bytes this rank sent per link class (tilecomm.stats) in one
    all_reduce of ``n`` float32 values, on a fresh subgroup over every rank (which takes the
    algorithm from TILECOMM_ALGO); the result is checked as usual."""
    import tilecomm

    out = {}
    for algo in algos:
        os.environ["TILECOMM_ALGO"] = f"all_reduce:{algo}"
        group = dist.new_group(backend="tilecomm")
        x = pattern("sum", torch.float32, n, rank)
        before = tilecomm.stats(group)
        dist.all_reduce(x, group=group)
        after = tilecomm.stats(group)
        assert_equal(x, closed_form("sum", torch.float32, n, range(world)), f"all_reduce {algo}")
        out[algo] = {k: after[k]["bytes_sent"] - before[k]["bytes_sent"] for k in after}
        out[algo]["topology"] = str(tilecomm.topology(group))
        dist.destroy_process_group(group)
    os.environ.pop("TILECOMM_ALGO", None)
    return out


def spawn_send_then_leave(rank, world, port, n=16_000_000, timeout_s=30, delay_s=1.0):
    """Rank 0 broadcasts a large buffer and leaves at once (destroy_process_group); the others
    start receiving only later: everything rank 0 sent must still arrive, and a clean close is
    no failure while its data is being read."""
    _init(rank, world, port, timeout_s)
    x = torch.arange(n, dtype=torch.float32) if rank == 0 else torch.zeros(n)
    if rank != 0:
        time.sleep(delay_s)
    dist.broadcast(x, src=0)
    ok = bool(torch.equal(x, torch.arange(n, dtype=torch.float32)))
    dist.destroy_process_group()
    return ok
