"""The GPU's schedule executor (Note [Schedule executor] in csrc/cuda/schedule_executor.h): every
scheduled algorithm of every collective it runs, forced one at a time, on CUDA tensors against the
closed form; over cuda_ipc and host_mapped; captured in a CUDA graph; and ranks that call different
collectives. World sizes: the GPU worlds and 3 (not a power of two).

Skipped as a whole where there is no GPU (see gpu_harness.skip_without_gpu).
"""

import os

import gpu_harness

gpu_harness.skip_without_gpu()

import pytest  # noqa: E402

WORLDS = sorted({int(w) for w in os.environ.get("TILECOMM_TEST_GPU_WORLDS", "2,4").split(",") if w} | {3})

# all_reduce through the executor, all_gather and reduce_scatter not through LL or NVSHMEM kernels.
BASE = {"TILECOMM_CUDA_ALLREDUCE": "scheduled", "TILECOMM_PROTO": "simple", "TILECOMM_NVSHMEM": "off"}
# TILECOMM_ALGO per config, and the algorithm each collective must then run.
FORCED = {
    "ring": {"all_reduce": "allreduce_ring", "all_gather": "allgather_ring", "reduce_scatter": "reducescatter_ring",
             "broadcast": "broadcast_pipelined_chain", "reduce": "reduce_binomial_tree",
             "gather": "gather_binomial_tree", "scatter": "scatter_binomial_tree"},
    "tree": {"all_reduce": "allreduce_tree", "all_gather": "allgather_recursive_doubling",
             "reduce_scatter": "reducescatter_recursive_halving", "broadcast": "broadcast_binomial_tree",
             "reduce": "reduce_reduce_scatter_gather", "gather": "gather_direct", "scatter": "scatter_direct"},
    "recursive_doubling": {"all_reduce": "allreduce_recursive_doubling", "all_gather": "allgather_direct",
                           "broadcast": "broadcast_scatter_allgather"},
    "rabenseifner": {"all_reduce": "allreduce_rabenseifner"},
    "hierarchical": {"all_reduce": "allreduce_hierarchical"},
    "auto": {},  # the executor's decision table's choice (auto_algos)
}
SIZES = [0, 1, 7, 1031]  # elements


def auto_algos(world, memory="cuda_ipc"):
    """What the executor's tables (executor_model, the shipped profile) pick for every buffer of
    test_every_schedule: the first size range of each table covers them all (checked here)."""
    from tilecomm import algorithms, executor_model, selector  # noqa: PLC0415

    tables = executor_model.build_tables(world, {}, selector.DEFAULT_PROFILE)[memory]
    largest = world * max(SIZES) * 8  # all_gather's output of the widest dtype
    out = {}
    for coll in FORCED["ring"]:
        (max_bytes, aid), *_ = tables[coll]
        assert max_bytes >= largest, (coll, tables[coll])
        out[coll] = algorithms.ALGORITHMS[aid].name
    return out


def env_of(config, memory="cuda_ipc"):
    algo = ";".join(f"{coll}:{name.split('_', 1)[1]}" for coll, name in FORCED[config].items())
    env = {**BASE, **({"TILECOMM_ALGO": algo} if algo else {})}
    if memory == "host_mapped":
        env["TILECOMM_TRANSPORT"] = "host_mapped"
    return env


@pytest.mark.parametrize("config", list(FORCED))
@pytest.mark.parametrize("world", WORLDS)
def test_every_schedule(pools, world, config):
    pools.run(world, env_of(config), "schedule_matrix", dtypes=["float32", "bfloat16", "int32", "uint8", "bool"],
              ops=["sum", "avg", "product", "min", "max", "premul_sum", "bxor"], sizes=SIZES,
              algos=FORCED[config] or auto_algos(world))


@pytest.mark.parametrize("config", ["ring", "tree"])
@pytest.mark.parametrize("world", WORLDS)
def test_large_messages(pools, world, config):
    """Steps of several slices per channel: every FIFO fills and waits for its receiver."""
    pools.run(world, env_of(config), "schedule_matrix", dtypes=["float32", "float16"], ops=["sum", "max"],
              sizes=[300_001, 1_100_003], algos=FORCED[config])


@pytest.mark.parametrize("world", WORLDS)
def test_host_mapped(pools, world):
    pools.run(world, env_of("ring", "host_mapped"), "schedule_matrix", dtypes=["float32", "int8"],
              ops=["sum", "min"], sizes=[1, 1031, 300_001], algos=FORCED["ring"])


@pytest.mark.parametrize("world", WORLDS)
def test_host_mapped_tables(pools, world):
    """Over host_mapped, the executor takes host_mapped's table (not cuda_ipc's)."""
    pools.run(world, env_of("auto", "host_mapped"), "schedule_matrix", dtypes=["float32"], ops=["sum"], sizes=SIZES,
              algos=auto_algos(world, "host_mapped"))


@pytest.mark.parametrize("config", ["ring", "tree"])
@pytest.mark.parametrize("world", WORLDS)
def test_graph_replay(pools, world, config):
    pools.run(world, env_of(config), "schedule_graph", replays=20)


def test_mismatched_sizes_fail_fast():
    out = gpu_harness.spawn_ranks(2, "spawn_schedule_mismatch", env_of("ring"), timeout=120.0)
    assert [o[0] for o in out] == ["ok", "ok"], out
    r0, r1 = out[0][1], out[1][1]
    assert "collective mismatch on the GPU: rank 0 sent rank 1" in r1["first"], out
    assert "collective mismatch on the GPU" in r0["first"], out
    assert r0["waited"] < 15.0 and r1["waited"] < 15.0, out
    assert "has failed" in r0["second"] and "has failed" in r1["second"], out
