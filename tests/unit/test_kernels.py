"""tilecomm._C.reduce_into(dst, src, op): dst = op(dst, src), checked against torch.

16-bit floats are combined in float and rounded back once, so sum and product
must equal torch's ``(a.float() op b.float()).to(dtype)`` bit for bit. min and
max are symmetric (min(+0, -0) = -0 in either order, max = +0) and propagate
NaN. On bool, sum is or and product is and. NaN results are compared as NaN
(their sign and payload are not specified).
"""

import pytest
import torch

from tilecomm import _C

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
COMPLEX = [torch.complex64, torch.complex128]
ALL = FLOATS + INTS + [torch.bool] + COMPLEX
OPS = ["sum", "product", "min", "max", "band", "bor", "bxor"]
N = 4096


def name(dt):
    return str(dt).replace("torch.", "")


def valid(dt, op):
    if op in ("band", "bor", "bxor"):
        return dt in INTS or dt == torch.bool
    if op in ("min", "max"):
        return dt not in COMPLEX
    return True


def special(dt):
    f = torch.finfo(dt)
    return [0.0, -0.0, 1.0, -1.0, f.max, -f.max, f.tiny, -f.tiny, f.tiny / 4, f.eps, float("inf"), float("-inf"),
            float("nan"), 0.5, 1.5, 2.5, 65504.0 if dt == torch.float16 else f.max / 2]


def operands(dt, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dt in (torch.float16, torch.bfloat16):
        # Every bit pattern, against a shuffled copy of itself: covers subnormals, inf, NaN, rounding.
        a = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dt)
        b = a[torch.randperm(a.numel(), generator=g)]
        sp = torch.tensor(special(dt), dtype=dt)
        aa, bb = torch.meshgrid(sp, sp, indexing="ij")
        return torch.cat([a, aa.flatten()]), torch.cat([b, bb.flatten()])
    if dt in (torch.float32, torch.float64):
        scale = torch.exp2(torch.randint(-40, 40, (N,), generator=g).to(dt))
        a = torch.randn(N, generator=g, dtype=dt) * scale
        b = torch.randn(N, generator=g, dtype=dt) * scale
        sp = torch.tensor(special(dt), dtype=dt)
        aa, bb = torch.meshgrid(sp, sp, indexing="ij")
        eq = a[: N // 4].clone()  # equal operands
        return torch.cat([a, aa.flatten(), eq]), torch.cat([b, bb.flatten(), eq])
    if dt in COMPLEX:
        return torch.randn(N, generator=g, dtype=dt), torch.randn(N, generator=g, dtype=dt)
    if dt == torch.bool:
        a = torch.tensor([False, False, True, True])
        b = torch.tensor([False, True, False, True])
        return torch.cat([a, torch.randint(0, 2, (N,), generator=g).bool()]), torch.cat(
            [b, torch.randint(0, 2, (N,), generator=g).bool()]
        )
    i = torch.iinfo(dt)
    a = torch.randint(i.min, i.max, (N,), generator=g, dtype=dt)
    b = torch.randint(i.min, i.max, (N,), generator=g, dtype=dt)
    edge = torch.tensor([i.min, i.max, 0, -1 if i.min < 0 else 1, 1], dtype=dt)
    aa, bb = torch.meshgrid(edge, edge, indexing="ij")
    return torch.cat([a, aa.flatten()]), torch.cat([b, bb.flatten()])


def reduce_into(a, b, op):
    d = a.clone()
    _C.reduce_into(d, b, op)
    return d


def expected(a, b, op):
    dt = a.dtype
    if dt == torch.bool:
        return {"sum": a | b, "product": a & b, "min": a & b, "max": a | b, "band": a & b, "bor": a | b,
                "bxor": a ^ b}[op]
    if op in ("sum", "product"):
        f = torch.add if op == "sum" else torch.mul
        if dt in (torch.float16, torch.bfloat16):
            return f(a.float(), b.float()).to(dt)
        return f(a, b)
    return {"min": torch.minimum, "max": torch.maximum, "band": torch.bitwise_and, "bor": torch.bitwise_or,
            "bxor": torch.bitwise_xor}[op](a, b)


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[t.element_size()])


def assert_bitwise(got, want, what):
    assert got.dtype == want.dtype
    if got.is_floating_point():
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan), f"{what}: NaN where not expected (or missing)"
        ok = bits(got) == bits(want)
        bad = (~ok & ~nan).nonzero().flatten()
    else:
        bad = (got != want).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.numel()} mismatches, first at {i}: got {got[i]!r}, want {want[i]!r}")


CASES = [pytest.param(dt, op, id=f"{name(dt)}-{op}") for dt in ALL for op in OPS if valid(dt, op)]


@pytest.mark.parametrize("dt,op", CASES)
def test_against_torch(dt, op):
    a, b = operands(dt)
    got = reduce_into(a, b, op)
    want = expected(a, b, op)
    what = f"{name(dt)} {op}"
    if dt in COMPLEX and op == "product":
        # Written out by hand; torch may contract to fma. Same to rounding, and symmetric bit for bit.
        torch.testing.assert_close(got, want, rtol=1e-5 if dt == torch.complex64 else 1e-12, atol=0)
        assert torch.equal(bits(torch.view_as_real(got)), bits(torch.view_as_real(reduce_into(b, a, op))))
        return
    if op in ("min", "max") and dt in FLOATS:
        nan = torch.isnan(a) | torch.isnan(b)
        assert torch.isnan(got[nan]).all(), f"{what}: NaN must win"
        assert torch.equal(got[~nan], want[~nan]), f"{what}: wrong values"  # == treats +0 and -0 alike
        zeros = ~nan & (a == 0) & (b == 0)
        sign = torch.signbit(got[zeros])
        want_sign = torch.signbit(a[zeros]) | torch.signbit(b[zeros]) if op == "min" else (
            torch.signbit(a[zeros]) & torch.signbit(b[zeros]))
        assert torch.equal(sign, want_sign), f"{what}: sign of zero"
        assert_bitwise(got, reduce_into(b, a, op), f"{what} symmetric")
        return
    assert_bitwise(got, want, what)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.float32, torch.float64] + COMPLEX, ids=name)
@pytest.mark.parametrize("op", ["sum", "product"])
def test_commutative_bit_for_bit(dt, op):
    # Partners in recursive doubling compute op(a, b) and op(b, a): they must agree.
    a, b = operands(dt, seed=1)
    x, y = reduce_into(a, b, op), reduce_into(b, a, op)
    if dt in COMPLEX:
        x, y = torch.view_as_real(x), torch.view_as_real(y)
    nan = torch.isnan(x)
    assert torch.equal(nan, torch.isnan(y))
    assert torch.equal(bits(x)[~nan], bits(y)[~nan])


@pytest.mark.parametrize("op", ["min", "max"])
@pytest.mark.parametrize("dt", FLOATS, ids=name)
def test_signed_zero_and_nan(dt, op):
    pz, nz, nan = torch.tensor([0.0], dtype=dt), torch.tensor([-0.0], dtype=dt), torch.tensor([float("nan")], dtype=dt)
    one = torch.tensor([1.0], dtype=dt)
    for a, b in ((pz, nz), (nz, pz)):  # min(+0, -0) = -0 and max(+0, -0) = +0, in either order
        r = reduce_into(a, b, op)
        assert r.item() == 0 and bool(torch.signbit(r)) == (op == "min")
    for a, b in ((nan, one), (one, nan), (nan, nan)):
        assert torch.isnan(reduce_into(a, b, op)).all()


def test_bool_sum_is_or_and_integers_wrap():
    t, f = torch.tensor([True, True, False]), torch.tensor([True, False, False])
    assert reduce_into(t, f, "sum").tolist() == [True, True, False]
    assert reduce_into(t, f, "product").tolist() == [True, False, False]
    assert reduce_into(torch.tensor([127], dtype=torch.int8), torch.tensor([1], dtype=torch.int8), "sum").item() == -128
    assert reduce_into(torch.tensor([255], dtype=torch.uint8), torch.tensor([2], dtype=torch.uint8), "sum").item() == 1
    big = torch.tensor([2**62], dtype=torch.int64)
    assert reduce_into(big, torch.tensor([4], dtype=torch.int64), "product").item() == 0


def test_empty_and_large():
    for n in (0, 1, 1 << 20):
        a = torch.arange(n, dtype=torch.float32)
        assert torch.equal(reduce_into(a, a, "sum"), a + a)


INVALID = [pytest.param(dt, op, id=f"{name(dt)}-{op}") for dt in ALL for op in OPS if not valid(dt, op)]


@pytest.mark.parametrize("dt,op", INVALID)
def test_invalid_combination_raises_type_error(dt, op):
    a = torch.zeros(4, dtype=dt)
    with pytest.raises(TypeError):
        _C.reduce_into(a, a.clone(), op)


def test_unsupported_dtype_raises_type_error():
    a = torch.zeros(4, dtype=torch.uint16)
    with pytest.raises(TypeError, match="unsupported dtype"):
        _C.reduce_into(a, a.clone(), "sum")


def test_bad_arguments_raise_value_error():
    a = torch.zeros(4)
    with pytest.raises(ValueError, match="unknown op"):
        _C.reduce_into(a, a.clone(), "avg")
    with pytest.raises(ValueError):
        _C.reduce_into(a, torch.zeros(5), "sum")
    with pytest.raises(ValueError):
        _C.reduce_into(a, torch.zeros(4, dtype=torch.float64), "sum")
    with pytest.raises(ValueError):
        _C.reduce_into(torch.zeros(4, 2).t(), torch.zeros(2, 4), "sum")
