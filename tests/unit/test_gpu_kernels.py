"""benchmarks/gpu_kernels.py: a graph replay's GPU activities summarized per call."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_kernels  # noqa: E402

KERNEL = "void tilecomm::cuda::allreduceOneShotKernel<float, (tilecomm::RedOp)0>(tilecomm::cuda::DirectArgs)"


def _replay(iters, period=10.0, first_wait=50.0):
    """Two activities a call (a memset of 1 µs, then a kernel of 6 µs), one call every `period` µs
    after the first, whose kernel also waits `first_wait` µs for late peers; listed out of order."""
    acts, t = [], 0.0
    for i in range(iters):
        kernel = 6.0 + (first_wait if i == 0 else 0.0)
        acts.append(("Memset (Device)", t, t + 1.0))
        acts.append((KERNEL, t + 1.5, t + 1.5 + kernel))
        t += period + (first_wait if i == 0 else 0.0)
    return acts[::-1]


def test_medians_per_call():
    s = gpu_kernels.summarize(_replay(9), 9)
    assert s["acts"] == 2
    assert s["names"] == ["Memset (Device)", "allreduceOneShotKernel"]
    assert s["cycle_us"] == 10.0  # the first call's wait moves one cycle of eight, not the median
    assert s["busy_us"] == 7.0
    assert s["gap_us"] == 3.0
    assert s["other"] == []


def test_work_of_the_replay_itself_is_left_out():
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>>(int)"
    acts = _replay(4) + [(fill, -9.0, -8.5), (fill, -8.0, -7.5)]  # twice before the calls, not once a call
    s = gpu_kernels.summarize(acts, 4)
    assert s["acts"] == 2 and s["other"] == ["vectorized_elementwise_kernel"]
    assert s["busy_us"] == 7.0 and s["cycle_us"] == 10.0


def test_calls_that_do_not_split_are_refused():
    acts = sorted(_replay(4), key=lambda a: a[1])
    name, start, end = acts[3]  # call 2's kernel moved before its memset
    acts[3] = (name, acts[2][1] - 0.5, acts[2][1] - 0.1)
    assert gpu_kernels.summarize(acts, 4) is None
    assert gpu_kernels.summarize([], 4) is None


def test_one_call_has_no_cycle():
    s = gpu_kernels.summarize(_replay(1), 1)
    assert s["busy_us"] == 7.0 + 50.0 and s["cycle_us"] != s["cycle_us"]  # NaN


def test_names_in_anonymous_namespaces_are_kept():
    symm = ("void c10d::symmetric_memory::(anonymous namespace)::two_shot_all_reduce_kernel<float, 16, 4>"
            "(float*, unsigned long, unsigned long, float**, unsigned int**, unsigned long, unsigned long)")
    assert gpu_kernels._short(symm) == "two_shot_all_reduce_kernel"
    assert gpu_kernels._short(KERNEL) == "allreduceOneShotKernel"
    assert gpu_kernels._short("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD (Device -> Device)"


def test_symmetric_buffer_is_zeroed_and_rendezvoused():
    """The SymmetricMemory buffer the GPU comparisons share (gpu_compare.symmetric_buffer)."""
    import torch
    from gpu_compare import symmetric_buffer

    class FakeSymm:
        joined = []

        @staticmethod
        def empty(n, dtype, device):
            return torch.full((n,), 7, dtype=dtype, device=device)

        @classmethod
        def rendezvous(cls, buf, group_name):
            cls.joined.append((buf, group_name))

    buf = symmetric_buffer(FakeSymm, 5, torch.bfloat16, torch.device("cpu"), "g")
    assert buf.dtype == torch.bfloat16 and buf.tolist() == [0.0] * 5
    assert len(FakeSymm.joined) == 1 and FakeSymm.joined[0][0] is buf and FakeSymm.joined[0][1] == "g"
