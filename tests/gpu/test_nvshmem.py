"""NVSHMEM all_gather and reduce_scatter on CUDA tensors (push, pull, put-with-signal, inputs read in
place from the symmetric heap, calls in pieces), every dtype and ReduceOp against the closed form, at 2 and
4 ranks sharing the GPU under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / ranks.

Skipped where there is no GPU, or no NVSHMEM (TILECOMM_TEST_REQUIRE_NVSHMEM=1, as scripts/gpu-test sets it,
makes that an error).
"""

import os

import gpu_harness

gpu_harness.skip_without_gpu()

import pytest  # noqa: E402
from tilecomm import _C, nvshmem  # noqa: E402

WHY = None if getattr(_C, "HAS_NVSHMEM", False) else "tilecomm was built without the NVSHMEM headers"
WHY = WHY or nvshmem.library()[1] or None
if WHY and os.environ.get("TILECOMM_TEST_REQUIRE_NVSHMEM") == "1":
    raise RuntimeError(f"TILECOMM_TEST_REQUIRE_NVSHMEM=1, but {WHY}")
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

WORLDS = [int(w) for w in os.environ.get("TILECOMM_TEST_GPU_WORLDS", "2,4").split(",") if w and int(w) <= 4]
PUSH = {"all_gather": "allgather_nvshmem_push", "reduce_scatter": "reducescatter_nvshmem_push"}
PULL = {"all_gather": "allgather_nvshmem_pull", "reduce_scatter": "reducescatter_nvshmem_pull"}
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
          "complex64"]
OPS = ["sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor"]
SIZES = [1, 7, 1031]  # every dtype; LARGE: float32, bfloat16 and int8 only
LARGE = [65543]
# The other configurations change how the data moves, not the arithmetic: fewer dtypes and ops.
SOME = {"dtypes": ["bfloat16", "float32", "int8", "bool"], "ops": ["sum", "avg", "max", "premul_sum"]}
# name: (TILECOMM_* environment, kernels expected, even ranks' inputs on the symmetric heap, matrix)
CONFIGS = {
    "push": ({"TILECOMM_ALGO": "nvshmem_push"}, PUSH, False, {}),
    "pull": ({"TILECOMM_ALGO": "nvshmem_pull"}, PULL, True, {}),
    "put_signal": ({"TILECOMM_ALGO": "nvshmem_push", "TILECOMM_NVSHMEM_DATA": "put_signal"}, PUSH, False, SOME),
    # 64 KiB staging buffers: larger calls run in pieces
    "pieces": ({"TILECOMM_ALGO": "all_gather:nvshmem_pull;reduce_scatter:nvshmem_push",
                "TILECOMM_NVSHMEM_BYTES": "65536"},
               {"all_gather": PULL["all_gather"], "reduce_scatter": PUSH["reduce_scatter"]}, True, SOME),
    "auto": ({}, None, True, SOME),
    "forced_but_off": ({"TILECOMM_ALGO": "all_gather:nvshmem_push", "TILECOMM_NVSHMEM": "off"},
                       {"all_gather": "error: TILECOMM_NVSHMEM=off"}, False, {}),
}


@pytest.mark.parametrize("world", WORLDS)
def test_nvshmem_collectives(world):
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // world)}
    out = gpu_harness.spawn_ranks(world, "spawn_nvshmem", env, timeout=900.0, configs=CONFIGS, dtypes=DTYPES,
                                  ops=OPS, sizes=SIZES, large=LARGE)
    assert all(status == "ok" for status, _ in out), out
    for rank, (_, report) in enumerate(out):
        for name, (calls, status) in report.items():
            if name != "forced_but_off":
                assert calls > 50 and "nvshmem=on" in status, (rank, name, status)
        if rank % 2 == 0:  # even ranks passed symmetric inputs, which pull reads in place
            assert "in_place_calls=0" not in report["pull"][1], report["pull"]
        assert "put_signal" in report["put_signal"][1], report["put_signal"]
        assert "nvshmem=off" in report["forced_but_off"][1] and "TILECOMM_NVSHMEM=off" in report["forced_but_off"][1]
