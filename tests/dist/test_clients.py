"""Real clients of the backend on CPU: DDP (with Join, ZeRO, sparse gradients, comm hooks), FSDP2,
tensor parallelism and distributed checkpoints, torch.distributed.nn's autograd collectives, and
c10d's debug wrapper.

DDP trains the same model, from per-rank different initial weights (DDP must
broadcast rank 0's), once over tilecomm and once over the Gloo group; both must
end at the same parameters as a communication-free reference that averages the
gradients of every rank's batch. FSDP2 (``fully_shard``) over tilecomm must
match a single-process, non-sharded reference, and so must a column- then row-parallel MLP
(tensor parallel, through DTensor and the functional collectives), whose sharded state dict then
goes through torch.distributed.checkpoint.
"""

import pytest

from harness import Cfg, spawn_ranks


def _run(pools, cfg, case, **kw):
    return pools.run(cfg.world, cfg.env, case, timeout=240, **kw)


@pytest.mark.parametrize(
    "cfg,bucket_cap_mb",
    [
        pytest.param(Cfg(2), None, id="ddp-auto-p2"),
        pytest.param(Cfg(3), None, id="ddp-auto-p3"),
        # tiny buckets: one all_reduce per parameter, several in flight at once
        pytest.param(Cfg(4), 0.0001, id="ddp-auto-p4-small_buckets"),
    ],
)
def test_ddp_matches_gloo(pools, cfg, bucket_cap_mb):
    _run(pools, cfg, "ddp_train", steps=5, bucket_cap_mb=bucket_cap_mb)


@pytest.mark.parametrize("cfg", [pytest.param(Cfg(w), id=f"ddp_join_zero-auto-p{w}") for w in (2, 3)])
def test_ddp_join_zero_and_autograd_collectives(pools, cfg):
    _run(pools, cfg, "ddp_join_and_zero")


@pytest.mark.parametrize("cfg", [pytest.param(Cfg(w), id=f"ddp_sparse_embedding-auto-p{w}") for w in (2, 3)])
def test_ddp_sparse_gradients_match_gloo(pools, cfg):
    _run(pools, cfg, "ddp_sparse_embedding")


@pytest.mark.parametrize(
    "cfg,reshard",
    [
        pytest.param(Cfg(2), True, id="fsdp2-auto-p2"),
        pytest.param(Cfg(3), True, id="fsdp2-auto-p3"),
        pytest.param(Cfg(4), False, id="fsdp2-auto-p4-no_reshard"),
    ],
)
def test_fsdp2_matches_reference(pools, cfg, reshard):
    res = _run(pools, cfg, "fsdp2_train", steps=4, reshard_after_forward=reshard)
    assert res[0]["mesh_backend"] == "tilecomm", res[0]


# 32 hidden features: even shards at these worlds (DTensor's own row-parallel mm refuses uneven ones)
@pytest.mark.parametrize("cfg", [pytest.param(Cfg(w), id=f"tensor_parallel-auto-p{w}") for w in (1, 2, 4)])
def test_tensor_parallel_and_checkpoint(pools, cfg):
    _run(pools, cfg, "tensor_parallel")


@pytest.mark.parametrize("cfg", [pytest.param(Cfg(2), id="ddp_fp16_hook-auto-p2"),
                                 pytest.param(Cfg(3), id="ddp_fp16_hook-auto-p3")])
def test_ddp_fp16_compress_hook(pools, cfg):
    _run(pools, cfg, "ddp_comm_hook", hook="fp16")


# These once deadlocked the backend's progress thread, so they run in processes
# of their own with bounded waits (a deadlock costs seconds, not the pool).


def test_collective_inside_future_callback():
    """A then() callback that runs collectives itself (as DDP's PowerSGD hook does) must not deadlock."""
    outs = spawn_ranks(2, "spawn_future_callback_collective", timeout=60, wait_s=10)
    for o in outs:
        assert o.status == "ok", str(o)
        assert o.result["finished"], f"rank {o.rank}: the chained future never completed (deadlock)"
        assert o.result["value"] == [3.0, 3.0, 3.0], o.result  # (0 + 1) + (1 + 1) from the two inner all_reduces


def test_queued_collectives_with_callbacks():
    """Each of two queued async collectives has a callback running a collective: both chains complete."""
    outs = spawn_ranks(2, "spawn_future_callbacks_queued", timeout=60, wait_s=10)
    for o in outs:
        assert o.status == "ok", str(o)
        assert o.result["finished"], f"rank {o.rank}: a chained future never completed (deadlock)"
        assert o.result["value"] == [4.0, 8.0], o.result  # (1 * 2) * 2 and (2 * 2) * 2


def test_ddp_powersgd_hook():
    outs = spawn_ranks(2, "spawn_ddp_powersgd", timeout=90, wait_s=12)
    for o in outs:
        assert o.status == "ok", str(o)
        assert o.result["finished"], f"rank {o.rank}: DDP + PowerSGD did not finish in 12 s (Gloo: 3 s; deadlock)"
        assert not isinstance(o.result["value"], str), o.result["value"]
    assert outs[0].result["value"] == outs[1].result["value"], "ranks ended with different parameters"


def test_under_torch_distributed_debug_detail():
    """c10d's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) wraps tilecomm and checks its calls."""
    outs = spawn_ranks(3, "spawn_debug_detail", timeout=90)
    for o in outs:
        assert o.status == "ok", str(o)
        r = o.result
        assert r["wrapper"] == "_ProcessGroupWrapper" and r["all_reduce"] == [3.0] * 3, r
        assert r.get("subgroup", [2.0, 2.0]) == [2.0, 2.0], r
        assert r["mismatch"] and "mismatch" in r["mismatch"].lower(), r
    assert len({o.result["seq"] for o in outs}) == 1 and outs[0].result["seq"] > 0, [o.result["seq"] for o in outs]
