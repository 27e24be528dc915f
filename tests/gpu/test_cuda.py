"""CUDA tensors through tilecomm: every op, dtype and ReduceOp, the direct cuda_ipc kernels (simple and
LL) and the staged path, NCCL's stream contract, CUDA graph capture and replay, DDP against Gloo, FSDP2
and tensor parallelism against one-process references, and a rank that never arrives.

Skipped as a whole where there is no GPU (see gpu_harness.skip_without_gpu).
"""

import json
import os
import re

import gpu_harness

gpu_harness.skip_without_gpu()

import pytest  # noqa: E402

from tilecomm import settings  # noqa: E402

REGISTER_BYTES = settings.value("TILECOMM_CUDA_REGISTER_BYTES", {})  # the default
WORLDS = [int(w) for w in os.environ.get("TILECOMM_TEST_GPU_WORLDS", "2,4").split(",") if w]

# TILECOMM_* environments of the pools: how all_reduce runs on CUDA tensors.
# The simple kernels are forced with TILECOMM_PROTO=simple (auto would run small messages as LL).
CONFIGS = {
    "auto": {},
    "one_shot": {"TILECOMM_CUDA_ALLREDUCE": "one_shot", "TILECOMM_PROTO": "simple"},
    "two_shot": {"TILECOMM_CUDA_ALLREDUCE": "two_shot", "TILECOMM_PROTO": "simple"},
    "registered": {"TILECOMM_CUDA_ALLREDUCE": "registered", "TILECOMM_PROTO": "simple"},
    "ll": {"TILECOMM_PROTO": "ll"},
    "staged": {"TILECOMM_CUDA_ALLREDUCE": "staged", "TILECOMM_PROTO": "simple"},
    "smallipc": {"TILECOMM_CUDA_IPC_BYTES": "4096", "TILECOMM_CUDA_TWO_SHOT_BYTES": "256", "TILECOMM_LL_BYTES": "64"},
    # The PCIe path (shared host memory registered with the GPU), forced on a GPU that has peer access.
    "host_mapped": {"TILECOMM_TRANSPORT": "host_mapped"},
    "host_mapped_simple": {"TILECOMM_TRANSPORT": "host_mapped", "TILECOMM_PROTO": "simple",
                           "TILECOMM_CUDA_IPC_BYTES": "65536", "TILECOMM_CUDA_TWO_SHOT_BYTES": "4096"},
}
EXPECT_DIRECT = {"auto": "on", "one_shot": "on", "two_shot": "on", "registered": "on", "ll": "on", "staged": "unset", "smallipc": "on",
                 "host_mapped": "on", "host_mapped_simple": "on"}

ALL_DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
              "complex64"]
ALL_OPS = ["sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor"]
SIZES = [0, 1, 7, 1031, 65543]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_every_dtype_and_op(pools, world, config):
    results = pools.run(world, CONFIGS[config], "allreduce_matrix", dtypes=ALL_DTYPES, ops=ALL_OPS, sizes=SIZES,
                        expect_direct=EXPECT_DIRECT[config])
    assert results[0][0] > 300


@pytest.mark.parametrize("config", ["auto", "one_shot", "two_shot", "ll", "staged"])
@pytest.mark.parametrize("world", [1])
def test_world_one(pools, world, config):
    """A group of one rank: all_reduce of every dtype and ReduceOp under each path, and every other
    operation (the case skips point-to-point, which needs a peer)."""
    pools.run(world, CONFIGS[config], "allreduce_matrix", dtypes=ALL_DTYPES, ops=ALL_OPS, sizes=SIZES,
              expect_direct=EXPECT_DIRECT[config])
    for dtype in ("float32", "bfloat16", "bool"):
        for n in (0, 1, 1031):
            pools.run(world, CONFIGS[config], "every_op", dtype=dtype, n=n)


@pytest.mark.parametrize("config", ["one_shot", "two_shot", "registered", "ll", "host_mapped"])
@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_unaligned(pools, world, config):
    pools.run(world, CONFIGS[config], "allreduce_matrix", dtypes=["float16", "int8", "float32", "float64"],
              ops=["sum", "max"], sizes=[1, 7, 1031, 4099], unaligned=True, expect_direct="on")


@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_large(pools, world):
    # 4 MiB + 12 B of float32 is above the default cuda_ipc buffer: staged; the others run two_shot.
    pools.run(world, {}, "allreduce_matrix", dtypes=["float32", "bfloat16"], ops=["sum", "max"],
              sizes=[300_001, (1 << 20) - 1, (1 << 20) + 3], expect_direct="on")


@pytest.mark.parametrize("world", WORLDS + [3])
def test_allreduce_registered(pools, world):
    ran_fallback = pools.run(world, CONFIGS["registered"], "allreduce_registered")[0]
    if not ran_fallback:
        pytest.skip("the mixed exportable/unexportable part needs cupy")


@pytest.mark.parametrize("config", ["auto", "staged"])
@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_random_data_vs_gloo(pools, world, config):
    for n in (1000, 100_000):
        pools.run(world, CONFIGS[config], "allreduce_vs_gloo", n=n)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "uint8", "bool"])
@pytest.mark.parametrize("world", WORLDS)
def test_every_op(pools, world, dtype):
    for n in (0, 1, 1031):
        pools.run(world, {}, "every_op", dtype=dtype, n=n)


A2A_REGISTERED = {"TILECOMM_CUDA_ALLTOALL": "registered"}


@pytest.mark.parametrize("config", ["auto", "host_mapped", "alltoall_registered"])
@pytest.mark.parametrize("world", WORLDS + [3])
def test_all_to_all_on_the_gpu(pools, world, config):
    # With TILECOMM_CUDA_ALLTOALL=registered, equal blocks from TILECOMM_CUDA_REGISTER_BYTES (its default)
    # of output are pushed into registered outputs over cuda_ipc; otherwise, and over host_mapped
    # (no peer addresses of device memory), the FIFO kernel runs.
    env = A2A_REGISTERED if config == "alltoall_registered" else CONFIGS[config]
    pools.run(world, env, "alltoall_cases", register_from=REGISTER_BYTES if config == "alltoall_registered" else 0)


@pytest.mark.parametrize("config", ["auto", "p2p_staged", "host_mapped"])
@pytest.mark.parametrize("world", WORLDS + [3])
def test_point_to_point(pools, world, config):
    # Note [Direct point-to-point]: GPU to GPU by default; staged when forced or over host_mapped.
    env = {"p2p_staged": {"TILECOMM_CUDA_P2P": "staged"}}.get(config, CONFIGS.get(config, {}))
    pools.run(world, env, "p2p_cases", expect="direct" if config == "auto" else "staged")


@pytest.mark.parametrize("mode", ["sizes", "empty", "registered"])
def test_all_to_all_mismatched_splits_fail_fast(mode):
    out = gpu_harness.spawn_ranks(2, "spawn_alltoall_mismatch", A2A_REGISTERED if mode == "registered" else {},
                                  timeout=120.0, mode=mode)
    assert [o[0] for o in out] == ["ok", "ok"], out
    r0, r1 = out[0][1], out[1][1]
    assert r0["ran"] == r1["ran"] == "alltoall_fifo", out
    if mode == "registered":
        assert "collective mismatch on the GPU: rank 1 registered" in r0["first"], out
        assert "collective mismatch on the GPU: rank 0 registered" in r1["first"], out
    elif mode == "empty":  # rank 0 receives what it expects; the group's failure reaches it
        assert "collective mismatch on the GPU: rank 0 sent rank 1" in r1["first"], out
        assert "rank 1 failed" in r0["first"] and "rank 0 sent rank 1" in r0["first"], out
    else:
        assert "collective mismatch on the GPU: rank 0 sent rank 1" in r1["first"], out
        assert "collective mismatch on the GPU: rank 1 sent rank 0" in r0["first"], out
    assert r0["waited"] < 15.0 and r1["waited"] < 15.0, out
    assert "has failed" in r0["second"] and "has failed" in r1["second"], out


@pytest.mark.parametrize("world", WORLDS)
def test_every_op_large(pools, world):
    pools.run(world, {}, "every_op", dtype="float32", n=300_000)


@pytest.mark.parametrize("world", WORLDS)
def test_every_op_over_tcp(pools, world):
    """Ranks linked by TCP (as on different hosts): CUDA tensors are staged through pinned host memory."""
    for n in (0, 1031, 300_000):
        pools.run(world, {"TILECOMM_TRANSPORT": "tcp"}, "every_op", dtype="float32", n=n)


@pytest.mark.parametrize("world", WORLDS)
def test_objects_bad_input_and_cpu_tensors(pools, world):
    pools.run(world, {}, "objects")
    pools.run(world, {}, "bad_input")
    pools.run(world, {}, "cpu_and_cuda")


@pytest.mark.parametrize("config", ["ll", "allgather_ll", "host_mapped"])
@pytest.mark.parametrize("world", WORLDS)
def test_allgather_ll(pools, world, config):
    # sizes per rank in bytes: 0 (staged), tails, and up to the 1 MiB LL buffer (ll); 64 B crossover (auto)
    env = {"ll": CONFIGS["ll"], "allgather_ll": {"TILECOMM_LL_BYTES": "64"},
           "host_mapped": {**CONFIGS["ll"], **CONFIGS["host_mapped"]}}[config]
    pools.run(world, env, "allgather_matrix", dtypes=["float16", "float32", "int8", "bool", "complex64"],
              sizes=[0, 1, 3, 17, 1031, 65536], expect_direct="on")


@pytest.mark.parametrize("world", WORLDS + [3])
def test_allgather_registered(pools, world):
    # Note [Registered tensors]: from 1 byte (above LL, which simple turns off), outputs registered in place.
    env = {"TILECOMM_CUDA_REGISTER_BYTES": "1", "TILECOMM_PROTO": "simple", "TILECOMM_NVSHMEM": "off"}
    dtypes, sizes = ["float16", "float32", "int8", "bool", "complex64"], [0, 1, 3, 17, 1031, 65536]
    statuses = pools.run(world, env, "allgather_matrix", dtypes=dtypes, sizes=sizes, expect_direct="on")
    calls = [int(st.split("registered_calls=")[1].split()[0]) for st in statuses]
    # Into a tensor (aligned, unaligned, in place) at every size but 0, and the lists whose outputs
    # happen to lie back to back on every rank: the same count on every rank.
    assert len(set(calls)) == 1 and calls[0] >= 3 * len(dtypes) * (len(sizes) - 1), statuses[0]


@pytest.mark.parametrize("memory", ["cuda_ipc", "host_mapped"])
@pytest.mark.parametrize("world", WORLDS)
def test_cuda_graph_replay(pools, world, memory):
    """LL all_reduce and all_gather captured in one CUDA graph, replayed with fresh inputs."""
    env = {**CONFIGS["ll"], **(CONFIGS["host_mapped"] if memory == "host_mapped" else {})}
    pools.run(world, env, "graph_replay", replays=40)


@pytest.mark.parametrize("world", WORLDS + [3])
def test_cuda_graph_registered(pools, world):
    """Registered all_reduce, all_gather and all_to_all captured in a CUDA graph (their first
    registration inside the capture), replayed with fresh inputs, eager registered calls in between."""
    env = {"TILECOMM_CUDA_ALLREDUCE": "registered", "TILECOMM_PROTO": "simple", "TILECOMM_CUDA_REGISTER_BYTES": "1",
           "TILECOMM_CUDA_ALLTOALL": "registered", "TILECOMM_NVSHMEM": "off"}
    pools.run(world, env, "graph_registered")


@pytest.mark.parametrize("world", WORLDS + [3])
def test_cuda_graph_capture_registers(pools, world):
    """With the default settings, an all_reduce registers its tensors from a smaller size when captured
    in a CUDA graph (TILECOMM_CUDA_CAPTURE_REGISTER_BYTES) than when run eagerly."""
    pools.run(world, CONFIGS["auto"], "graph_capture_registers")


def test_capture_on_some_ranks_is_a_mismatch():
    """A call captured on one rank and run eagerly on the other: the captured one registers; the eager
    rank's next registration (captured) pairs with it and both raise a collective mismatch. The eager
    rank's kernel still waits for its peer when the ranks exit, so they run without MPS (as in
    test_rank_killed_mid_kernel: under MPS that exit is a fatal fault for every client of the GPU)."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": "/nonexistent/tilecomm-no-mps"}  # no MPS daemon there
    out = gpu_harness.spawn_ranks(2, "spawn_capture_mismatch", env, timeout=120.0)
    assert [o[0] for o in out] == ["ok", "ok"], out
    r0, r1 = out[0][1], out[1][1]
    calls = []
    for me, r in enumerate((r0, r1)):
        m = re.search(rf"collective mismatch on the GPU: rank {1 - me} registered tensors for its call (\d+), "
                      rf"rank {me} for its call (\d+)", r["first"])
        assert m, out
        calls.append((int(m[2]), int(m[1])) if me == 0 else (int(m[1]), int(m[2])))  # (rank 0's, rank 1's)
    assert calls[0] == calls[1] and calls[0][1] == calls[0][0] + 1, out  # rank 1 issued one call more
    assert r0["registered"] == r1["registered"] == 0, out


@pytest.mark.parametrize("config", ["auto", "host_mapped", "system_fence"])
@pytest.mark.parametrize("world", WORLDS)
def test_gpu_topology(pools, world, config):
    """Ranks sharing one GPU: every pair is same_gpu and cuda_ipc is chosen; host_mapped when forced.
    The kernels fence at GPU scope over cuda_ipc, at system scope over host_mapped or when forced."""
    env = {"TILECOMM_CUDA_FENCE": "system"} if config == "system_fence" else CONFIGS[config]
    topo = pools.run(world, env, "gpu_topology")
    for r, t in enumerate(topo):
        assert t == topo[0], topo
        assert len(t["devices"]) == world and len(set(t["devices"])) == 1 and t["devices"][0], t
        assert t["links"][r][r] == "self", t
        assert all(t["links"][a][b] == "same_gpu" for a in range(world) for b in range(world) if a != b), t
        assert t["transport"] == ("host_mapped" if config == "host_mapped" else "cuda_ipc"), t
        assert t["fence"] == ["gpu" if config == "auto" else "system"], t


@pytest.mark.parametrize("world", WORLDS)
def test_auto_kernels_follow_the_model(pools, world):
    """all_reduce: LL up to the CUDA model's crossover, a simple kernel above; all_gather: LL up to the
    LL buffer whatever all_reduce's crossover, but the push into registered outputs from the model's
    crossover where the output registers (separate outputs keep LL)."""
    ran = pools.run(world, CONFIGS["auto"], "auto_kernels")
    assert all(r == ran[0] for r in ran), ran


@pytest.mark.parametrize("world", WORLDS)
def test_cuda_graph_mixed_protocols(pools, world):
    """Simple (two_shot) and LL kernels in one graph, with eager calls between replays (auto)."""
    pools.run(world, {"TILECOMM_CUDA_TWO_SHOT_BYTES": "65536", "TILECOMM_LL_BYTES": "4096"}, "graph_replay",
              replays=20, sizes=[7, 1000, 40_000])


@pytest.mark.parametrize("config", ["auto", "two_shot", "ll", "staged"])
@pytest.mark.parametrize("world", WORLDS)
def test_stream_semantics(pools, world, config):
    for n in (1000, 300_000):
        pools.run(world, CONFIGS[config], "streams", n=n, direct=config != "staged")


# ipc_2m: two-shot pieces of 2 MiB, so a 4 MiB all_reduce launches two grids of half the blocks.
@pytest.mark.parametrize("config", ["auto", "ipc_2m"])
@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_sequence(pools, world, config):
    env = {"TILECOMM_CUDA_IPC_BYTES": str(2 << 20)} if config == "ipc_2m" else {}
    pools.run(world, env, "allreduce_sequence")


@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_sequence_without_mps(world):
    """The same sequence with the ranks' kernels time-slicing the GPU (no MPS daemon for them)."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": "/nonexistent/tilecomm-no-mps"}
    out = gpu_harness.spawn_ranks(world, "spawn_allreduce_sequence", env, timeout=300.0)
    assert all(status == "ok" for status, _ in out), out


@pytest.mark.parametrize("config", ["auto", "ll", "host_mapped"])
@pytest.mark.parametrize("world", WORLDS)
def test_operators(pools, world, config):
    pools.run(world, CONFIGS[config], "operators")


@pytest.mark.parametrize("world", WORLDS)
def test_host_stages(pools, world):
    pools.run(world, CONFIGS["auto"], "host_stages")


@pytest.mark.parametrize("fp16_hook", [False, True], ids=["plain", "fp16_hook"])
@pytest.mark.parametrize("world", WORLDS)
def test_ddp_matches_gloo(pools, world, fp16_hook):
    pools.run(world, {}, "ddp_matches_gloo", fp16_hook=fp16_hook)


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard", "no_reshard"])
@pytest.mark.parametrize("world", WORLDS)
def test_fsdp2_matches_reference(pools, world, reshard):
    pools.run(world, {}, "fsdp2_on_cuda", reshard_after_forward=reshard)


@pytest.mark.parametrize("world", WORLDS)
def test_tensor_parallel(pools, world):
    pools.run(world, {}, "tensor_parallel_on_cuda")


@pytest.mark.parametrize("world", WORLDS)
def test_default_group_bound_to_its_gpu(world):
    """init_process_group(device_id=...): DeviceMesh, new_group and dist.split_group over tilecomm."""
    out = gpu_harness.spawn_ranks(world, "spawn_bound_device", {}, timeout=180.0)
    assert [status for status, _ in out] == ["ok"] * world, out
    for _, checks in out:
        assert all(checks.values()), out


def test_tensors_freed_after_destroy():
    out = gpu_harness.spawn_ranks(2, "spawn_free_after_destroy", {}, timeout=90.0)
    assert out == [("ok", True), ("ok", True)], out


def test_point_to_point_then_destroy():
    out = gpu_harness.spawn_ranks(2, "spawn_p2p_then_destroy", {}, timeout=120.0)
    assert [o[0] for o in out] == ["ok", "ok"], out
    assert out[0][1][0] < 20.0 and out[0][1][1] and out[1][1][1], out


@pytest.mark.parametrize("config", ["one_shot", "ll", "allgather_ll"])
def test_absent_rank_times_out_on_the_gpu(config):
    env = CONFIGS["ll"] if config != "one_shot" else CONFIGS["one_shot"]
    out = gpu_harness.spawn_ranks(2, "spawn_timeout", env, timeout=90.0, gather=config == "allgather_ll")
    assert [o[0] for o in out] == ["ok", "ok"], out
    r0 = out[0][1]
    assert isinstance(r0, dict), r0
    assert r0["enqueued"] < 1.0 and 2.0 < r0["waited"] < 30.0, r0
    assert "timed out on the GPU" in r0["first"] and "waiting for rank 1" in r0["first"], r0
    kind = {"one_shot": "direct all_reduce", "ll": "LL all_reduce", "allgather_ll": "LL all_gather"}[config]
    assert kind in r0["first"], r0
    assert "has failed" in r0["second"] and "rank 1" in r0["second"], r0


@pytest.mark.parametrize("config", ["ll", "one_shot", "host_mapped"])
def test_rank_killed_mid_kernel(config):
    """A rank SIGKILLed while its kernel waits: the survivors' kernels stop waiting (the host saw the
    process exit), the error names the rank within seconds of a 60 s timeout, and the survivors form
    a new group and go on. The ranks run without MPS (their kernels time-slice the GPU): under MPS a
    client killed with a kernel in flight is a fatal fault for every client of the GPU (MPS's error
    containment), and their CUDA contexts are lost whatever the library does."""
    env = {"ll": CONFIGS["ll"], "one_shot": CONFIGS["one_shot"],
           "host_mapped": {**CONFIGS["ll"], **CONFIGS["host_mapped"]}}[config]
    env = {**env, "CUDA_MPS_PIPE_DIRECTORY": "/nonexistent/tilecomm-no-mps"}  # no MPS daemon there
    out = gpu_harness.spawn_ranks(3, "spawn_killed_mid_kernel", env, timeout=120.0, port2=gpu_harness.free_port())
    assert out[2][0] == "died", out
    for rank, (status, r) in enumerate(out[:2]):
        assert status == "ok", out
        assert r["waited"] < 15.0, r
        assert len(r["errors"]) == 2 and "has failed" in r["errors"][1], r
        first = r["errors"][0]
        assert "rank 2 (pid" in first and "exited" in first, r
        # rank 1's kernel was waiting when rank 2 died; rank 0 called later and launched nothing,
        # having seen either the death itself or rank 1's report of it
        if rank == 1:
            assert "stopped waiting on the GPU" in first, r
        else:
            assert "launches no more direct kernels" in first or "rank 1 failed: rank 1 stopped waiting" in first, r
        assert r["recovered"] is True, r


@pytest.mark.parametrize("world", WORLDS)
def test_latency_direct_and_staged(pools, world):
    """Times the direct kernels and the staged path at 8 B and 1 MiB, and checks which path each
    call took; the times are reported (TILECOMM_TEST_TIMINGS), not compared: speed is
    the benchmarks' to judge (benchmarks/gpu_latency.py)."""
    sizes = [8, 1 << 20]
    direct, direct_ran = pools.run(world, {}, "latency", sizes=sizes)[0]
    staged, staged_ran = pools.run(world, CONFIGS["staged"], "latency", sizes=sizes, iters=50)[0]
    report = {"world": world, "direct_us": direct, "staged_us": staged}
    print(f"\nall_reduce float32 latency (us), world {world}: {json.dumps(report)}")
    path = os.environ.get("TILECOMM_TEST_TIMINGS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(report) + "\n")
    assert all(k.startswith("allreduce_") for k in direct_ran.values()), direct_ran  # a direct kernel
    assert staged_ran == {8: "", 1 << 20: ""}, staged_ran
    assert all(0 < t < 1e6 for t in [*direct.values(), *staged.values()]), report
