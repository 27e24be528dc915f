"""NVSHMEM all_gather and reduce_scatter on CUDA tensors (push, pull, put-with-signal, inputs read and
outputs written in place on the symmetric heap, calls in pieces), every dtype and ReduceOp against the
closed form, at 2 and 4 ranks sharing the GPU under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / ranks;
and NVSHMEM's own fcollect and sum reduction (the benchmarks' baselines).

Skipped where there is no GPU, or no NVSHMEM (TILECOMM_TEST_REQUIRE_NVSHMEM=1, as scripts/gpu-test sets it,
makes that an error).
"""

import importlib.util
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
ALL_REDUCE = "allreduce_nvshmem_two_shot"
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
          "complex64"]
OPS = ["sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor"]
SIZES = [1, 7, 1031]  # every dtype; LARGE: float32, bfloat16 and int8 only
LARGE = [65543]
# The other configurations change how the data moves, not the arithmetic: fewer dtypes and ops.
SOME = {"dtypes": ["bfloat16", "float32", "int8", "bool"], "ops": ["sum", "avg", "max", "premul_sum"]}
# name: (TILECOMM_* environment, kernels expected, even ranks' inputs and outputs on the symmetric heap,
# matrix)
CONFIGS = {
    "push": ({"TILECOMM_ALGO": "nvshmem_push"}, PUSH, True, {}),
    "pull": ({"TILECOMM_ALGO": "nvshmem_pull"}, PULL, True, {}),
    "put_signal": ({"TILECOMM_ALGO": "nvshmem_push", "TILECOMM_NVSHMEM_DATA": "put_signal"}, PUSH, False, SOME),
    # 64 KiB staging buffers: larger calls run in pieces
    "pieces": ({"TILECOMM_ALGO": "all_gather:nvshmem_pull;reduce_scatter:nvshmem_push",
                "TILECOMM_NVSHMEM_BYTES": "65536"},
               {"all_gather": PULL["all_gather"], "reduce_scatter": PUSH["reduce_scatter"]}, True, SOME),
    "push_pieces": ({"TILECOMM_ALGO": "all_gather:nvshmem_push;reduce_scatter:nvshmem_pull",
                     "TILECOMM_NVSHMEM_BYTES": "65536"},
                    {"all_gather": PUSH["all_gather"], "reduce_scatter": PULL["reduce_scatter"]}, True, SOME),
    "auto": ({}, None, True, SOME),
    "forced_but_off": ({"TILECOMM_ALGO": "all_gather:nvshmem_push", "TILECOMM_NVSHMEM": "off"},
                       {"all_gather": "error: TILECOMM_NVSHMEM=off"}, False, {}),
    # all_reduce forced onto the NVSHMEM two-shot: even ranks' tensors in place, odd ranks' staged
    "all_reduce": ({"TILECOMM_CUDA_ALLREDUCE": "nvshmem_two_shot"}, {"all_reduce": ALL_REDUCE}, True, {}),
    "all_reduce_pieces": ({"TILECOMM_CUDA_ALLREDUCE": "nvshmem_two_shot", "TILECOMM_NVSHMEM_BYTES": "65536"},
                          {"all_reduce": ALL_REDUCE}, True, SOME),
    "all_reduce_but_off": ({"TILECOMM_CUDA_ALLREDUCE": "nvshmem_two_shot", "TILECOMM_NVSHMEM": "off"},
                           {"all_reduce": "error: TILECOMM_NVSHMEM=off"}, False, {}),
}


# Configurations run in two sets, each by one run of ranks (one NVSHMEM initialisation, each
# configuration in a new group): starting ranks takes longer than a configuration's calls. The
# configurations with NVSHMEM off come first, before any group has started it.
_ORDER = sorted(CONFIGS, key=lambda c: not c.endswith("_but_off"))
PARTS = {"all_gather_reduce_scatter": [c for c in _ORDER if not c.startswith("all_reduce")],
         "all_reduce": [c for c in _ORDER if c.startswith("all_reduce")]}


@pytest.mark.parametrize("part", list(PARTS))
@pytest.mark.parametrize("world", WORLDS)
def test_nvshmem_collectives(world, part):
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // world)}
    out = gpu_harness.spawn_ranks(world, "spawn_nvshmem", env, timeout=600.0,
                                  configs={c: CONFIGS[c] for c in PARTS[part]},
                                  dtypes=DTYPES, ops=OPS, sizes=SIZES, large=LARGE)
    assert all(status == "ok" for status, _ in out), out
    for rank, (_, report) in enumerate(out):
        assert sorted(report) == sorted(PARTS[part]), report
        for config, (calls, status) in report.items():
            if config.endswith("_but_off"):
                assert "nvshmem=off" in status and "TILECOMM_NVSHMEM=off" in status, status
                continue
            assert calls > 50 and "nvshmem=on" in status, (rank, config, status)
            # even ranks passed symmetric inputs (pull reads them in place) and outputs (push writes them)
            if rank % 2 == 0 and config in ("push", "pull", "all_reduce"):
                assert "in_place_calls=0" not in status, (rank, config, status)
            # Note [Fence scope]: every PE shares the one GPU; NVSHMEM writes put-with-signal's flags
            fence = "system" if config == "put_signal" else "gpu"
            assert f"nvshmem_fence={fence}" in status, (rank, config, status)
            if config == "put_signal":
                assert "put_signal" in status, status


def _nvshmem4py_missing() -> str:
    try:
        found = importlib.util.find_spec("nvshmem.core") is not None
    except ImportError:  # an unrelated top-level "nvshmem" without .core
        found = False
    return "" if found else "nvshmem4py is not installed (pip install nvshmem4py-cu13)"


@pytest.mark.parametrize("world", WORLDS)
def test_nvshmem4py_tensors(world):
    """Tensors of an application that initialised NVSHMEM through nvshmem4py: used in place, results
    against the closed form (gpu_cases.spawn_nvshmem4py). TILECOMM_TEST_REQUIRE_NVSHMEM4PY=1 makes a
    missing nvshmem4py an error."""
    why = _nvshmem4py_missing()
    if why and os.environ.get("TILECOMM_TEST_REQUIRE_NVSHMEM4PY") == "1":
        raise RuntimeError(f"TILECOMM_TEST_REQUIRE_NVSHMEM4PY=1, but {why}")
    if why:
        pytest.skip(why)
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // world)}
    out = gpu_harness.spawn_ranks(world, "spawn_nvshmem4py", env, timeout=300.0)
    assert all(status == "ok" for status, _ in out), out
    for rank, (_, report) in enumerate(out):
        assert sorted(report) == ["nvshmem_pull", "nvshmem_push"], report
        for algo, status in report.items():
            assert "nvshmem=on" in status and "in_place_calls=0" not in status, (rank, algo, status)
