"""python -m tilecomm.tune --device cuda on the GPU: it measures the direct kernels and the schedule
executor over cuda_ipc and host_mapped, and NVSHMEM's kernels, at two world sizes (a small grid), and
writes a profile whose cuda and cuda_executor sections are fitted to what it measured.

Skipped as a whole where there is no GPU (see gpu_harness.skip_without_gpu).
"""

import os
import subprocess
import sys

import gpu_harness

gpu_harness.skip_without_gpu()

from tilecomm import cuda_model, executor_model, selector, tune  # noqa: E402

KERNELS = {"ll": "allreduce_one_shot_ll", "one_shot": "allreduce_one_shot", "two_shot": "allreduce_two_shot"}


def test_tune_measures_the_gpu(tmp_path):
    out = tmp_path / "profile.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILECOMM_") or k.startswith("TILECOMM_TEST_")}
    # path settings of the caller's: tune sets its own while it measures (else nothing would be cuda_ipc)
    env.update(TILECOMM_TRANSPORT="host_mapped", TILECOMM_CUDA_IPC_BYTES="0", TILECOMM_PROTO="ll")
    cmd = [sys.executable, "-m", "tilecomm.tune", "--device", "cuda", "--world-sizes", "2,3", "-b", "8", "-e", "4K",
           "-f", "8", "-n", "5", "-w", "2", "-r", "1", "-o", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "sets TILECOMM_TRANSPORT, TILECOMM_CUDA_IPC_BYTES, TILECOMM_PROTO itself" in done.stderr
    prof = selector.load_profile(str(out))  # the schema holds
    # Each section is fitted, unless its thresholds or tables chose worse on these points than the
    # shipped constants' (those are kept, with a warning).
    def kept(section, m):
        head = f"{section} {m}: the fitted constants'"
        return any(w.startswith(head) and "choose worse" in w for w in prof["warnings"])

    for m in ("cuda_ipc", "host_mapped"):
        for pr in cuda_model.PROTOCOLS:
            assert kept("cuda", m) or prof["cuda"][m][pr]["fit"]["points"] > 0, (m, pr, done.stderr[-2000:])
        assert kept("cuda_executor", m) or prof["cuda_executor"][m]["fit"]["points"] > 0, (m, done.stderr[-2000:])
        # every scheduled algorithm's corrections at both world sizes measured (executor_model.fit_corrections)
        for w in ("2", "3"):
            assert set(prof["cuda_executor"][m]["corrections"][w]) == {
                a.name for c in executor_model.COLLECTIVES for a in executor_model.candidates(c)}, (m, w)
    points, executor = prof["cuda_points"]["cuda"], prof["cuda_points"]["cuda_executor"]
    nvshmem = [r for r in points if "nvshmem" in r["memory"].values()]
    kernels = [r for r in points if r not in nvshmem]
    assert {r["world"] for r in kernels} == {2, 3} and {r["bytes"] for r in kernels} == {8, 64, 512, 4096}
    why = tune.nvshmem_problem()
    assert not (why and os.environ.get("TILECOMM_TEST_REQUIRE_NVSHMEM") == "1"), why
    if not why:  # NVSHMEM's kernels, forced, timed eagerly and under graph replay at every size and world
        assert sorted((r["world"], r["bytes"]) for r in nvshmem) == [(w, n) for w in (2, 3) for n in (8, 64, 512, 4096)]
        for r in nvshmem:
            for coll, short in (("all_gather", "allgather"), ("reduce_scatter", "reducescatter")):
                for kind in ("push", "pull"):
                    assert r["kernels"][f"{coll}:nvshmem_{kind}"] == f"{short}_nvshmem_{kind}", r
                    assert isinstance(r[f"{coll}:nvshmem_{kind}:eager"], float), r
                    assert isinstance(r[f"{coll}:nvshmem_{kind}:graph"], float), r  # peer addresses: captured
        assert prof["cuda"]["nvshmem"]["simple"]["fit"]["points"] == 4 * len(nvshmem), done.stderr[-2000:]
        assert "| 3 | all_gather |" in done.stdout
    for r in kernels:  # each forced entry ran its kernel over its memory, and every time was taken
        for entry, kernel in KERNELS.items():
            for prefix, memory in (("", "cuda_ipc"), ("hm_", "host_mapped")):
                assert r["kernels"][f"all_reduce:{prefix}{entry}"] == kernel, r
                assert r["memory"][f"{prefix}{entry}"] == memory, r
                assert isinstance(r[f"all_reduce:{prefix}{entry}:graph"], float), r
    assert {r["transport"] for r in executor} == {"cuda_ipc", "host_mapped"}
    assert all(r["wrong"] == 0 and r["graph"] for r in executor)
    forced = {(r["collective"], r["backend"]) for r in executor if r["backend"] != "tilecomm"}
    for coll in executor_model.COLLECTIVES:
        for a in executor_model.candidates(coll):
            assert (coll, f"tilecomm:{a.short}") in forced, (coll, a.short)
