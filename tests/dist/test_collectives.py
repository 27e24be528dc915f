"""Collectives, point-to-point, async, subgroups and object collectives over tilecomm.

Every test runs a case of cases.py on every rank of a worker pool (harness.py).
Test ids read ``<collective>-<algorithm or auto>-p<world>-<dtype>-<op>``; the
algorithm part is the one forced through TILECOMM_ALGO for that collective
(``auto``: the selector picks by size), so each registered algorithm runs.
"""

import pytest

from harness import TINY_SLOTS_ENV, Cfg, algorithm_set_configs, configs

import cases

WORLDS = [1, 2, 3, 4, 8]
DTYPES = list(cases.DTYPES)
OPS = cases.OPS
SMALL = [(0,), (1,), (1001,), (3, 5, 7)]
LARGE_ALL_REDUCE = 3_000_001
LARGE = 1_000_003  # elements for the other collectives (a prime: uneven chunks everywhere)


def _run(pools, cfg, case, timeout=None, **kw):
    kwargs = {} if timeout is None else {"timeout": timeout}
    return pools.run(cfg.world, cfg.env, case, **kwargs, **kw)


def _params(prefix, cfgs, *axes):
    """pytest params over cfgs x axes with ids like prefix-ring-p3-float32-sum."""
    out = []

    def rec(cfg, chosen, rest):
        if not rest:
            test_id = "-".join([prefix, str(cfg)] + [str(c) for c in chosen])
            out.append(pytest.param(cfg, *chosen, id=test_id))
            return
        for v in rest[0]:
            rec(cfg, chosen + [v], rest[1:])

    for cfg in cfgs:
        rec(cfg, [], list(axes))
    return out


# ---------------------------------------------------------------- all_reduce


# One test per op x dtype for the selector's choice at world 3 and 4, and for
# every all_reduce algorithm forced at world 3 (not a power of two: the folds
# and uneven chunks). Elsewhere the same matrix runs inside one test per pool.
PER_COMBO = configs("all_reduce", [3]) + [Cfg(4)]
LOOPED = [c for c in configs("all_reduce", [1, 2, 4, 8]) if c not in PER_COMBO]
# 8 ranks on 2 cores are slow: there, forced algorithms get a representative subset of dtypes.
P8_DTYPES = ["float16", "bfloat16", "float32", "int8", "uint8", "bool", "complex128"]


@pytest.mark.parametrize("cfg,dtype,op", _params("all_reduce", PER_COMBO, DTYPES, OPS))
def test_all_reduce(pools, cfg, dtype, op):
    """Every ReduceOp x dtype: exact closed form, Gloo where it works, identical on all ranks; or a clear error."""
    rep = _run(pools, cfg, "all_reduce", dtype=dtype, op=op, shapes=SMALL)[0]
    assert rep["checked"] + len(rep["errors"]) >= len(SMALL)
    if _gloo_supports(dtype, op):  # the oracle must really have run where Gloo can
        assert rep["gloo"], f"Gloo comparison did not run for {dtype} {op}"


def _gloo_supports(dtype, op):
    """What Gloo (torch 2.x) reduces: probed once, kept here so a silently skipped oracle is noticed."""
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        return op in ("sum", "avg", "product", "min", "max")
    if dtype in ("int8", "int32", "int64", "uint8", "bool"):
        return op in ("sum", "product", "min", "max", "band", "bor", "bxor")
    if dtype in ("complex64", "complex128"):
        return op in ("sum", "avg")
    return False


@pytest.mark.parametrize("cfg", _params("all_reduce_matrix", LOOPED))
def test_all_reduce_matrix(pools, cfg):
    """Every ReduceOp x dtype at the other world sizes and algorithms, in one case per pool."""
    dtypes = P8_DTYPES if cfg.world >= 8 and cfg.label != "auto" else None
    _run(pools, cfg, "all_reduce_matrix", shapes=[(0,), (1,), (1001,)], dtypes=dtypes, timeout=300)


@pytest.mark.parametrize("cfg", _params("all_reduce_large", configs("all_reduce", [2, 3, 4, 8]) + [Cfg(1)]))
def test_all_reduce_large(pools, cfg):
    """3,000,001 float32 elements (odd: chunks of unequal size); 1,000,003 for forced algorithms at 8 ranks."""
    n = LARGE if cfg.world >= 8 and cfg.label != "auto" else LARGE_ALL_REDUCE
    _run(pools, cfg, "all_reduce_large", n=n, timeout=300)


@pytest.mark.parametrize(
    "cfg,dtype,op",
    _params("all_reduce_large", [Cfg(3)], ["bfloat16", "int64"], ["max", "sum"]),
)
def test_all_reduce_large_dtypes(pools, cfg, dtype, op):
    _run(pools, cfg, "all_reduce_large", n=LARGE, dtype=dtype, op=op, timeout=300)


@pytest.mark.parametrize("cfg", _params("all_reduce_special", [Cfg(w) for w in WORLDS]))
def test_all_reduce_special(pools, cfg):
    """Slices with a storage offset, 0-dim tensors, integer AVG truncation, tensor PREMUL factor, uint16 errors."""
    _run(pools, cfg, "all_reduce_special")


@pytest.mark.parametrize("cfg", _params("strided_tensors", [Cfg(w) for w in WORLDS]))
def test_strided_tensors(pools, cfg):
    _run(pools, cfg, "strided_tensors")


@pytest.mark.parametrize("cfg", _params("sparse_all_reduce", [Cfg(w) for w in WORLDS]))
def test_sparse_all_reduce(pools, cfg):
    _run(pools, cfg, "sparse_all_reduce")


@pytest.mark.parametrize(
    "cfg,dtype", _params("all_reduce_coalesced", [Cfg(w) for w in WORLDS], ["float32", "bfloat16", "int64"])
)
def test_all_reduce_coalesced(pools, cfg, dtype):
    _run(pools, cfg, "all_reduce_coalesced", dtype=dtype)


# ---------------------------------------------------------------- reduce / broadcast

REDUCE_DTYPES = ["float32", "bfloat16", "float16", "int8", "int64", "uint8", "bool", "complex128"]


@pytest.mark.parametrize("cfg,dtype,op", _params("reduce", configs("reduce", [3]), REDUCE_DTYPES, OPS))
def test_reduce(pools, cfg, dtype, op):
    """Every root; the root gets the closed form, other ranks' tensors are left alone."""
    _run(pools, cfg, "reduce", dtype=dtype, op=op, shapes=[(0,), (1,), (1001,)])


@pytest.mark.parametrize(
    "cfg,op", _params("reduce", configs("reduce", [1, 2, 4, 8]), ["sum", "avg", "product", "max", "bxor"])
)
def test_reduce_worlds(pools, cfg, op):
    dtype = "int32" if op == "bxor" else "float32"
    _run(pools, cfg, "reduce", dtype=dtype, op=op, shapes=[(0,), (1,), (1001,)], timeout=180)


@pytest.mark.parametrize("cfg", _params("reduce_large", configs("reduce", WORLDS)))
def test_reduce_large(pools, cfg):
    roots = sorted({0, cfg.world - 1})
    _run(pools, cfg, "reduce", dtype="float32", op="sum", shapes=[(LARGE,)], roots=roots, timeout=300)


BCAST_DTYPES = DTYPES + ["uint16"]  # uint16: moved as opaque bytes


@pytest.mark.parametrize("cfg,dtype", _params("broadcast", configs("broadcast", [3, 4]), BCAST_DTYPES))
def test_broadcast(pools, cfg, dtype):
    _run(pools, cfg, "broadcast", dtype=dtype, shapes=SMALL)


@pytest.mark.parametrize("cfg", _params("broadcast", configs("broadcast", [1, 2, 8])))
def test_broadcast_worlds(pools, cfg):
    for dtype in ["float32", "bool", "complex64", "int8"]:
        _run(pools, cfg, "broadcast", dtype=dtype, shapes=SMALL)


@pytest.mark.parametrize("cfg", _params("broadcast_large", configs("broadcast", WORLDS)))
def test_broadcast_large(pools, cfg):
    roots = sorted({0, cfg.world - 1})
    _run(pools, cfg, "broadcast", dtype="float32", shapes=[(LARGE,)], roots=roots, timeout=300)
    _run(pools, cfg, "broadcast", dtype="int16", shapes=[(LARGE,)], roots=[cfg.world // 2], async_op=True, timeout=300)


# ---------------------------------------------------------------- all_gather

GATHER_DTYPES = ["float32", "bfloat16", "float16", "int8", "int64", "uint8", "bool", "complex128", "uint16"]


@pytest.mark.parametrize("cfg,dtype", _params("all_gather", configs("all_gather", WORLDS), GATHER_DTYPES))
def test_all_gather(pools, cfg, dtype):
    _run(pools, cfg, "all_gather", dtype=dtype, shapes=[(0,), (1,), (1001,), (4, 3)])


@pytest.mark.parametrize("cfg", _params("all_gather_large", configs("all_gather", WORLDS)))
def test_all_gather_large(pools, cfg):
    _run(pools, cfg, "all_gather", dtype="float32", shapes=[(LARGE // cfg.world + 1,)], timeout=300)


@pytest.mark.parametrize("cfg", _params("in_place", [Cfg(w) for w in WORLDS]))
def test_in_place_aliasing(pools, cfg):
    """ZeRO/FSDP-style aliasing: the input is this rank's slice of the output (all_gather, reduce_scatter, scatter)."""
    _run(pools, cfg, "in_place_variants")


@pytest.mark.parametrize("cfg", _params("all_gather_coalesced", configs("all_gather", WORLDS)))
def test_all_gather_coalesced(pools, cfg):
    _run(pools, cfg, "all_gather_coalesced", dtype="float32")
    _run(pools, cfg, "all_gather_coalesced", dtype="int16")


# ---------------------------------------------------------------- reduce_scatter

RS_DTYPES = ["float32", "bfloat16", "int32", "uint8", "bool", "complex64"]


@pytest.mark.parametrize("cfg,dtype,op", _params("reduce_scatter", configs("reduce_scatter", [3, 4]), RS_DTYPES, OPS))
def test_reduce_scatter(pools, cfg, dtype, op):
    _run(pools, cfg, "reduce_scatter", dtype=dtype, op=op, blocks=[0, 1, 1001])


@pytest.mark.parametrize(
    "cfg,op", _params("reduce_scatter", configs("reduce_scatter", [1, 2, 8]), ["sum", "avg", "min", "premul_sum"])
)
def test_reduce_scatter_worlds(pools, cfg, op):
    _run(pools, cfg, "reduce_scatter", dtype="float32", op=op, blocks=[0, 1, 1001])


@pytest.mark.parametrize(
    "cfg,dtype,op",
    _params("reduce_scatter_tensor_coalesced", configs("reduce_scatter", [1, 3, 4]), ["float32", "int64"],
            ["sum", "max"]),
)
def test_reduce_scatter_tensor_coalesced(pools, cfg, dtype, op):
    _run(pools, cfg, "reduce_scatter_tensor_coalesced", dtype=dtype, op=op)


@pytest.mark.parametrize("cfg", _params("reduce_scatter_large", configs("reduce_scatter", WORLDS)))
def test_reduce_scatter_large(pools, cfg):
    _run(pools, cfg, "reduce_scatter", dtype="float32", op="sum", blocks=[LARGE // cfg.world + 1], timeout=300)


# ---------------------------------------------------------------- all_to_all


@pytest.mark.parametrize(
    "cfg,dtype,split",
    _params("all_to_all_single", configs("all_to_all", WORLDS), ["float32", "int8", "complex64", "bool"],
            ["equal", "uneven"]),
)
def test_all_to_all_single(pools, cfg, dtype, split):
    for rows, row_shape in [(0, ()), (1, ()), (7, ()), (3, (2, 5))]:
        _run(pools, cfg, "all_to_all_single", dtype=dtype, split_kind=split, base_rows=rows, row_shape=row_shape)


@pytest.mark.parametrize("cfg,split", _params("all_to_all_single_large", configs("all_to_all", WORLDS),
                                              ["equal", "uneven"]))
def test_all_to_all_single_large(pools, cfg, split):
    rows = LARGE // (cfg.world * cfg.world) + 1
    _run(pools, cfg, "all_to_all_single", dtype="float32", split_kind=split, base_rows=rows, timeout=300)


@pytest.mark.parametrize("cfg,uneven", _params("all_to_all", configs("all_to_all", WORLDS), [False, True]))
def test_all_to_all_list(pools, cfg, uneven):
    _run(pools, cfg, "all_to_all_list", dtype="float32", uneven=uneven)
    _run(pools, cfg, "all_to_all_list", dtype="uint16", uneven=uneven)


# ---------------------------------------------------------------- gather / scatter


@pytest.mark.parametrize(
    "cfg,dtype", _params("gather", configs("gather", WORLDS), ["float32", "bfloat16", "int64", "bool", "complex64"])
)
def test_gather(pools, cfg, dtype):
    _run(pools, cfg, "gather", dtype=dtype, shapes=[(0,), (1,), (1001,), (3, 4)])


@pytest.mark.parametrize(
    "cfg,dtype", _params("scatter", configs("scatter", WORLDS), ["float32", "bfloat16", "int64", "bool", "complex64"])
)
def test_scatter(pools, cfg, dtype):
    _run(pools, cfg, "scatter", dtype=dtype, shapes=[(0,), (1,), (1001,), (3, 4)])


@pytest.mark.parametrize("cfg", _params("gather_scatter_large", configs("gather", WORLDS)))
def test_gather_scatter_large(pools, cfg):
    n = LARGE // cfg.world + 1
    roots = sorted({0, cfg.world - 1})
    _run(pools, cfg, "gather", dtype="float32", shapes=[(n,)], roots=roots, timeout=300)
    _run(pools, cfg, "scatter", dtype="float32", shapes=[(n,)], roots=roots, timeout=300)


# ---------------------------------------------------------------- barrier


@pytest.mark.parametrize("cfg", _params("barrier", configs("barrier", WORLDS)))
def test_barrier(pools, cfg):
    _run(pools, cfg, "barrier")


# ---------------------------------------------------------------- point-to-point

P2P_WORLDS = [2, 3, 4, 8]


@pytest.mark.parametrize("cfg", _params("p2p_send_recv_tags", [Cfg(w) for w in P2P_WORLDS]))
def test_p2p_send_recv_tags(pools, cfg):
    _run(pools, cfg, "p2p_send_recv_tags", n=1001)
    _run(pools, cfg, "p2p_send_recv_tags", n=300_001)  # larger than the channel: blocking sends must drain


@pytest.mark.parametrize("cfg", _params("p2p_isend_irecv", [Cfg(w) for w in P2P_WORLDS]))
def test_p2p_isend_irecv(pools, cfg):
    _run(pools, cfg, "p2p_isend_irecv", n=1001)


@pytest.mark.parametrize("cfg", _params("p2p_any_source", [Cfg(w) for w in P2P_WORLDS]))
def test_p2p_any_source(pools, cfg):
    _run(pools, cfg, "p2p_any_source")


@pytest.mark.parametrize("cfg", _params("p2p_any_source_mixed", [Cfg(w) for w in [3, 4]]))
def test_p2p_any_source_mixed(pools, cfg):
    """A receive from rank 1 posted before two any-source receives gets rank 1's first message."""
    _run(pools, cfg, "p2p_any_source_mixed")


@pytest.mark.parametrize("cfg", _params("p2p_batch_ring", [Cfg(w) for w in P2P_WORLDS]))
def test_p2p_batch_isend_irecv_ring(pools, cfg):
    _run(pools, cfg, "p2p_batch_ring", n=1_000_000, timeout=300)


@pytest.mark.parametrize(
    "cfg,n,blocking",
    _params("p2p_tag_order", [Cfg(w) for w in [2, 3]], [10, 1_000_000], [True, False]),
)
def test_p2p_tag_order(pools, cfg, n, blocking):
    """Rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first (the tag-1 message is set aside)."""
    _run(pools, cfg, "p2p_tag_order", n=n, blocking=blocking)


@pytest.mark.parametrize("cfg", _params("p2p_edge_cases", [Cfg(w) for w in P2P_WORLDS]))
def test_p2p_edge_cases(pools, cfg):
    _run(pools, cfg, "p2p_edge_cases")


# ---------------------------------------------------------------- async, subgroups, objects


@pytest.mark.parametrize("cfg", _params("async", [Cfg(w) for w in WORLDS] + configs("all_reduce", [3], auto=False)))
def test_async_ops(pools, cfg):
    _run(pools, cfg, "async_ops")


@pytest.mark.parametrize("cfg", _params("subgroups", [Cfg(w) for w in WORLDS]))
def test_subgroups(pools, cfg):
    _run(pools, cfg, "subgroups")


@pytest.mark.parametrize("cfg", _params("concurrent_groups", [Cfg(w) for w in [2, 3, 8]]))
def test_concurrent_groups(pools, cfg):
    """Six groups over the same ranks driven at once from six threads (plus a use_local_synchronization group)."""
    _run(pools, cfg, "concurrent_groups")


@pytest.mark.parametrize("cfg", _params("device_mesh_2d", [Cfg(4), Cfg(8)]))
def test_device_mesh_2d(pools, cfg):
    _run(pools, cfg, "device_mesh_2d")


@pytest.mark.parametrize("cfg", _params("split", [Cfg(w) for w in WORLDS]))
def test_split_groups(pools, cfg):
    """ProcessGroup.split_group (dist.split_group's C++ side) gives tilecomm child groups."""
    _run(pools, cfg, "split_groups")


@pytest.mark.parametrize("cfg", _params("objects", [Cfg(w) for w in WORLDS]))
def test_object_collectives(pools, cfg):
    _run(pools, cfg, "object_collectives")


# ---------------------------------------------------------------- world size 6
# Not a power of two, with two extra ranks to fold (recursive doubling/halving,
# Rabenseifner) and uneven trees: every collective under every algorithm set.
# algoset<i> forces the i-th registered algorithm of each collective
# (harness.algorithm_sets); "auto" lets the selector choose by size.


@pytest.mark.parametrize("cfg", _params("battery", algorithm_set_configs([5, 6, 7])))
def test_battery(pools, cfg):
    _run(pools, cfg, "battery", timeout=300)


# ---------------------------------------------------------------- tiny shared-memory slots
# One 192-byte slot per channel: every message is cut into many slices and
# every send waits for the receiver, which stresses pipelining and the
# send/receive dependencies inside a round.

TINY = [Cfg(w, "tinyslots", TINY_SLOTS_ENV) for w in [3, 4]]
TINY_BATTERY = {
    "all_reduce_matrix": dict(shapes=[(1,), (1001,)], dtypes=["float32", "bfloat16", "int8", "bool", "complex128"]),
    "all_reduce_large": dict(n=60_001),
    "reduce": dict(dtype="float64", op="sum", shapes=[(0,), (1001,), (20_001,)]),
    "broadcast": dict(dtype="float16", shapes=[(0,), (1001,), (20_001,)]),
    "all_gather": dict(dtype="int32", shapes=[(0,), (1001,), (5_001,)]),
    "reduce_scatter": dict(dtype="float32", op="max", blocks=[0, 1, 1001, 5_001]),
    "all_to_all_single": dict(dtype="float32", split_kind="uneven", base_rows=301),
    "gather": dict(dtype="int8", shapes=[(1,), (3001,)]),
    "scatter": dict(dtype="int8", shapes=[(1,), (3001,)]),
    "p2p_tag_order": dict(n=20_000, blocking=True),
    "p2p_batch_ring": dict(n=20_000),
    "p2p_edge_cases": {},
    "async_ops": {},
}


@pytest.mark.parametrize(
    "cfg,case", [pytest.param(c, k, id=f"{k}-{c}") for c in TINY for k in TINY_BATTERY]
)
def test_tiny_slots(pools, cfg, case):
    _run(pools, cfg, case, timeout=300, **TINY_BATTERY[case])


# ---------------------------------------------------------------- operators


@pytest.mark.parametrize("cfg", [pytest.param(Cfg(w), id=f"operators-auto-p{w}") for w in (1, 2, 3, 4)])
def test_operators(pools, cfg):
    """torch.ops.tilecomm.all_reduce_ / all_gather_into_tensor_out: every dtype and op, as dist's functions do."""
    rep = _run(pools, cfg, "operators")[0]
    assert rep["checked"] >= 300, rep["checked"]  # the valid (dtype, op) pairs x shapes, and the gathers


@pytest.mark.parametrize("cfg", [pytest.param(Cfg(w), id=f"host_stages-auto-p{w}") for w in (1, 3)])
def test_host_stages(pools, cfg):
    """tilecomm.host_stages records one sample per stage for each synchronous call of its block, and nothing else."""
    assert _run(pools, cfg, "host_stages")[0]["checked"] == 120
