"""python -m tilecomm.tune --device cuda: what it measures, with what settings, and the profile it writes.

The GPU's measurements are stood in for by functions that write records whose times follow known
constants, so these tests check the plumbing on any machine: which groups and algorithms are
measured over which peer memory, that the fits get the records, and that the settings come back.
tests/gpu/test_tune.py runs the real thing on a GPU.
"""

import os

import pytest
import torch
from test_cuda_model import KNOWN as KERNEL_KNOWN
from test_cuda_model import records as kernel_records

from tilecomm import bench, cuda_model, executor_model, gpu_points, launch, selector, tune

EXECUTOR_KNOWN = {
    "cuda_ipc": {"alpha_s": 4e-6, "alpha_round_s": 7e-6, "alpha_step_s": 1.5e-7, "beta_s_per_byte": 3e-11},
    "host_mapped": {"alpha_s": 9e-6, "alpha_round_s": 2e-5, "alpha_step_s": 5e-6, "beta_s_per_byte": 8e-11},
}


class FakeGpu:
    """Stands in for the spawned ranks: kernel records from gpu_points.fit_points' arguments, bench rows
    from bench.main's, each following the known constants; remembers what it was asked."""

    def __init__(self):
        self.kernel_calls, self.nvshmem_calls, self.bench_calls = [], [], []

    def run(self, fn, world, *args):
        assert fn in (gpu_points.fit_points, gpu_points.nvshmem_fit_points)
        path, grid, calls, reps = args
        nvshmem = fn is gpu_points.nvshmem_fit_points
        share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        (self.nvshmem_calls if nvshmem else self.kernel_calls).append((world, list(grid), calls, reps, share))
        with open(path, "a") as f:
            f.writelines(tune.json.dumps(r) + "\n" for r in split_records(world, grid, nvshmem))

    def bench(self, argv):
        args = bench.build_parser().parse_args(argv)
        env = {k: v for k, v in os.environ.items() if k.startswith("TILECOMM_")}
        self.bench_calls.append((args, env))
        memory = "host_mapped" if env.get("TILECOMM_TRANSPORT") == "host_mapped" else "cuda_ipc"
        with open(args.jsonl, "a") as f:
            for coll in args.collective.split(","):
                algos = [a for a in executor_model.candidates(coll) if args.algo == "all" or a.short in args.algo]
                for n in bench.sizes(args.minbytes, args.maxbytes, args.stepfactor):
                    for a in algos:
                        t = executor_model.predict(a, args.np, n, EXECUTOR_KNOWN[memory]) * 1e6
                        f.write(tune.json.dumps({"collective": coll, "backend": f"tilecomm:{a.short}", "world": args.np,
                                                 "bytes": n, "time_us": t, "device": args.device, "graph": args.graph,
                                                 "wrong": 0, "transport": memory}) + "\n")


def split_records(world, grid, nvshmem):
    """What gpu_points' worker writes at `world` ranks: the NVSHMEM kernels' entries of the known
    constants' records (nvshmem_fit_points), or the others (fit_points)."""
    out = []
    for r in kernel_records(KERNEL_KNOWN, worlds=(world,), sizes=grid):
        keep = {e for e, m in r["memory"].items() if (m == "nvshmem") == nvshmem}
        out.append({"world": r["world"], "bytes": r["bytes"],
                    "kernels": {k: v for k, v in r["kernels"].items() if k.split(":")[1] in keep},
                    "memory": {e: r["memory"][e] for e in keep},
                    **{k: v for k, v in r.items() if k.count(":") == 2 and k.split(":")[1] in keep}})
    return out


@pytest.fixture
def fake_gpu(monkeypatch):
    fake = FakeGpu()
    monkeypatch.delenv("TILECOMM_PROFILE", raising=False)
    monkeypatch.delenv("TILECOMM_TRANSPORT", raising=False)
    monkeypatch.setattr(tune, "gpu_problem", lambda: "")
    monkeypatch.setattr(tune, "_mps_running", lambda: True)
    monkeypatch.setattr(tune, "nvshmem_problem", lambda: "")
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a GPU")
    monkeypatch.setattr(launch, "run", fake.run)
    monkeypatch.setattr(bench, "main", fake.bench)
    return fake


def test_tune_gpu_measures_and_fits_both_sections(fake_gpu, monkeypatch, tmp_path, capsys):
    # the caller's path settings are set aside while tune measures, and restored after
    monkeypatch.setenv("TILECOMM_TRANSPORT", "tcp")
    monkeypatch.setenv("TILECOMM_CUDA_IPC_BYTES", "0")
    monkeypatch.setenv("TILECOMM_ALGO", "ring")
    seen = []
    fake_run = fake_gpu.run

    def run(*a):
        seen.append({k: os.environ.get(k) for k in ("TILECOMM_TRANSPORT", "TILECOMM_CUDA_IPC_BYTES", "TILECOMM_ALGO")})
        fake_run(*a)

    monkeypatch.setattr(launch, "run", run)
    out = tmp_path / "prof.json"
    argv = ["--device", "cuda", "--world-sizes", "2,4", "-b", "8", "-e", "1M", "-f", "8", "-n", "7", "-w", "3",
            "-r", "2", "-o", str(out)]
    assert tune.main(argv) == 0
    prof = selector.load_profile(str(out))
    # the direct kernels' constants, over both memories, and NVSHMEM's, from gpu_points' records
    for m, pr in [(m, pr) for m in ("cuda_ipc", "host_mapped") for pr in cuda_model.PROTOCOLS] + [("nvshmem", "simple")]:
        for key, want in KERNEL_KNOWN[m][pr].items():
            assert prof["cuda"][m][pr][key] == pytest.approx(want, rel=1e-6, abs=1e-15), (m, pr, key)
    # the executor's, over both memories, from bench's rows
    for m, consts in EXECUTOR_KNOWN.items():
        for key, want in consts.items():
            assert prof["cuda_executor"][m][key] == pytest.approx(want, rel=1e-6), (m, key)
    assert prof["links"] == selector.DEFAULT_PROFILE["links"]  # the CPU's sections are untouched
    # the records go in with the sections, exactly as measured, and how they were measured
    grid = list(bench.sizes(8, 1 << 20, 8))
    kernel_want = [r for w in (2, 4) for nv in (False, True) for r in split_records(w, grid, nv)]
    assert prof["cuda_points"]["cuda"] == tune.json.loads(tune.json.dumps(kernel_want))
    executor_rows = prof["cuda_points"]["cuda_executor"]
    assert {(r["world"], r["transport"]) for r in executor_rows} == {(w, m) for w in (2, 4) for m in EXECUTOR_KNOWN}
    measured = prof["cuda_measured_with"]
    assert measured["world_sizes"] == [2, 4] and measured["gpu"] == "a GPU"
    assert measured["bytes"] == [8, 1 << 20, 8] and measured["iters"] == 7 and measured["repeats"] == 2
    assert "a GPU" in prof["name"] and "cuda and cuda_executor" in prof["name"]
    assert seen == [dict.fromkeys(("TILECOMM_TRANSPORT", "TILECOMM_CUDA_IPC_BYTES", "TILECOMM_ALGO"))] * 4

    # the kernels with the whole GPU per rank; NVSHMEM's with each rank's share of it set (one GPU here)
    assert fake_gpu.kernel_calls == [(2, grid, 7, 2, None), (4, grid, 7, 2, None)]
    assert fake_gpu.nvshmem_calls == [(2, grid, 7, 2, "50"), (4, grid, 7, 2, "25")]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ
    # per world: both transports, the executor's collectives with every algorithm, then all_reduce's
    # scheduled algorithms with the direct kernels off; CUDA graphs on the GPU, checked
    runs = [(a.np, env.get("TILECOMM_TRANSPORT"), a.collective, env.get("TILECOMM_CUDA_ALLREDUCE"))
            for a, env in fake_gpu.bench_calls]
    assert [(w, t) for w, t, _, _ in runs] == [(w, t) for w in (2, 4) for t in ("auto", "host_mapped") for _ in "ab"]
    for (a, env), (_, _, coll, allreduce) in zip(fake_gpu.bench_calls, runs):
        assert a.device == "cuda" and a.graph and a.check == 1 and a.iters == 7 and a.warmup == 3
        assert a.replays == 2  # the fastest of --repeats replays of each graph
        assert a.backend == "tilecomm" and (a.minbytes, a.maxbytes, a.stepfactor) == (8, 1 << 20, 8)
        assert env["TILECOMM_NVSHMEM"] == "off" and "TILECOMM_ALGO" not in env and "TILECOMM_CUDA_IPC_BYTES" not in env
        if coll == "all_reduce":
            assert allreduce == "scheduled"
            assert sorted(a.algo.split(",")) == sorted(x.short for x in executor_model.candidates("all_reduce"))
        else:
            assert allreduce is None and env["TILECOMM_PROTO"] == "simple" and a.algo == "all"
            assert set(coll.split(",")) == set(executor_model.COLLECTIVES) - {"all_reduce"}
    # the settings are what they were
    assert (os.environ["TILECOMM_TRANSPORT"], os.environ["TILECOMM_CUDA_IPC_BYTES"], os.environ["TILECOMM_ALGO"]) == (
        "tcp", "0", "ring")
    assert not any(k in os.environ for k in ("TILECOMM_NVSHMEM", "TILECOMM_PROTO", "TILECOMM_CUDA_ALLREDUCE"))
    report = capsys.readouterr()
    assert "| cuda_ipc |" in report.out and "regret" in report.out
    # all_gather: push and pull cost the same at 2 ranks under the model (push runs); at 4, pull moves less
    assert "| 2 | all_gather | never |" in report.out and "| 4 | all_gather | 16 |" in report.out
    assert "MPS" not in report.err
    assert "sets TILECOMM_ALGO, TILECOMM_TRANSPORT, TILECOMM_CUDA_IPC_BYTES itself" in report.err


def test_a_refit_from_records_drops_that_sections_measured_points(fake_gpu, monkeypatch, tmp_path):
    measured = tmp_path / "measured.json"
    assert tune.main(["--device", "cuda", "--world-sizes", "2,4", "-e", "64K", "-o", str(measured)]) == 0
    records = tmp_path / "kernels.jsonl"
    records.write_text("".join(tune.json.dumps(r) + "\n" for r in kernel_records(KERNEL_KNOWN)))
    monkeypatch.setenv("TILECOMM_PROFILE", str(measured))
    refit = tmp_path / "refit.json"
    assert tune.main(["--cuda-from", str(records), "-o", str(refit)]) == 0
    prof = selector.load_profile(str(refit))
    # the cuda section's measured points go; the executor's, still describing its section, stay
    assert set(prof["cuda_points"]) == {"cuda_executor"} and prof["cuda_measured_with"]["world_sizes"] == [2, 4]
    assert prof["name"] == "default (shipped); cuda fitted from records"
    executor_records = tmp_path / "executor.jsonl"
    executor_records.write_text("".join(tune.json.dumps(r) + "\n" for r in prof["cuda_points"]["cuda_executor"]))
    monkeypatch.setenv("TILECOMM_PROFILE", str(refit))
    again = tmp_path / "again.json"
    assert tune.main(["--executor-from", str(executor_records), "-o", str(again)]) == 0
    prof = selector.load_profile(str(again))
    assert "cuda_points" not in prof and "cuda_measured_with" not in prof
    assert prof["name"] == "default (shipped); cuda_executor fitted from records"


def test_tune_gpu_warns_without_mps_when_ranks_share_a_gpu(fake_gpu, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tune, "_mps_running", lambda: False)
    assert tune.main(["--device", "cuda", "--world-sizes", "2,4", "-e", "64K", "-o", str(tmp_path / "p.json")]) == 0
    assert "no MPS daemon" in capsys.readouterr().err


def test_tune_gpu_refuses_where_it_cannot_run(monkeypatch, tmp_path):
    monkeypatch.setattr(tune, "gpu_problem", lambda: "no CUDA device is visible")
    with pytest.raises(SystemExit, match="tune --device cuda: no CUDA device is visible"):
        tune.main(["--device", "cuda", "-o", str(tmp_path / "p.json")])
    assert not (tmp_path / "p.json").exists()


def test_gpu_problem_names_a_cpu_build():
    from tilecomm import _C

    if getattr(_C, "HAS_CUDA", False):
        pytest.skip("a CUDA build")
    assert "no CUDA parts" in tune.gpu_problem()


@pytest.mark.parametrize("extra", [["--validate"], ["--cuda-from", "x.jsonl"], ["--executor-from", "x.jsonl"],
                                   ["--measured", "r.json"], ["--json", "r.json"], ["--collectives", "broadcast"],
                                   ["--dtypes", "float64"]])
def test_tune_gpu_refuses_other_modes(extra, capsys):
    with pytest.raises(SystemExit):
        tune.main(["--device", "cuda", *extra])
    assert "--device cuda" in capsys.readouterr().err


def test_tune_gpu_refuses_torchrun(fake_gpu, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launch.under_torchrun()
    with pytest.raises(SystemExit):
        tune.main(["--device", "cuda"])
    assert "without torchrun" in capsys.readouterr().err
    assert fake_gpu.kernel_calls == [] and fake_gpu.bench_calls == []


def test_tune_gpu_without_nvshmem_keeps_its_constants(fake_gpu, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tune, "nvshmem_problem", lambda: "tilecomm was built without the NVSHMEM headers")
    out = tmp_path / "p.json"
    assert tune.main(["--device", "cuda", "--world-sizes", "2,4", "-e", "64K", "-o", str(out)]) == 0
    assert fake_gpu.nvshmem_calls == [] and len(fake_gpu.kernel_calls) == 2
    err = capsys.readouterr().err
    assert "NVSHMEM's kernels are not measured (tilecomm was built without the NVSHMEM headers)" in err
    assert "cuda nvshmem simple: 0 point(s)" in err
    prof = selector.load_profile(str(out))
    assert prof["cuda"]["nvshmem"]["simple"] == cuda_model.DEFAULT["nvshmem"]["simple"]
    assert prof["cuda"]["cuda_ipc"]["ll"]["alpha_s"] == pytest.approx(KERNEL_KNOWN["cuda_ipc"]["ll"]["alpha_s"])


def test_tune_gpu_goes_on_where_nvshmem_fails(fake_gpu, monkeypatch, tmp_path, capsys):
    fake_run = fake_gpu.run

    def run(fn, world, *args):
        if fn is gpu_points.nvshmem_fit_points and world == 4:
            fake_run(fn, world, args[0], args[1][:2], *args[2:])  # two sizes written, then it fails
            raise RuntimeError("NVSHMEM could not start")
        fake_run(fn, world, *args)

    monkeypatch.setattr(launch, "run", run)
    out = tmp_path / "p.json"
    assert tune.main(["--device", "cuda", "--world-sizes", "2,4", "-b", "8", "-e", "64K", "-f", "8", "-o", str(out)]) == 0
    assert "warning: NVSHMEM's kernels at 4 ranks were not measured: NVSHMEM could not start" in capsys.readouterr().err
    prof = selector.load_profile(str(out))
    nv = [r for r in prof["cuda_points"]["cuda"] if "nvshmem_push" in r["memory"]]
    assert [(r["world"], r["bytes"]) for r in nv] == [(2, 8), (2, 64), (2, 512), (2, 4096), (2, 32768), (4, 8), (4, 64)]
    for key, want in KERNEL_KNOWN["nvshmem"]["simple"].items():  # the points written still fit
        assert prof["cuda"]["nvshmem"]["simple"][key] == pytest.approx(want, rel=1e-6, abs=1e-15), key
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in os.environ


def test_nvshmem_regret_scores_the_thresholds_choice():
    consts = cuda_model.constants({"cuda": KERNEL_KNOWN})
    from_bytes = cuda_model.nvshmem_thresholds({"cuda": consts}, 4)["all_gather_pull_bytes"]
    assert from_bytes == 16
    recs = [{"world": 4, "bytes": 8, "all_gather:nvshmem_push:eager": 10.0, "all_gather:nvshmem_pull:eager": 12.0},
            {"world": 4, "bytes": 4096, "all_gather:nvshmem_push:eager": 30.0, "all_gather:nvshmem_pull:eager": 20.0},
            {"world": 4, "bytes": 65536, "all_gather:nvshmem_push:eager": 30.0, "all_gather:nvshmem_pull:eager": 40.0},
            {"world": 4, "bytes": 1024, "all_gather:nvshmem_push:eager": 30.0, "all_gather:nvshmem_pull:eager": "failed"},
            {"world": 2, "bytes": 64, "reduce_scatter:nvshmem_push:eager": 9.0, "reduce_scatter:nvshmem_pull:eager": 6.0}]
    got = tune.nvshmem_regret(recs, consts)
    assert got == {(4, "all_gather"): [(8, 1.0), (4096, 1.0), (65536, 40.0 / 30.0)],
                   (2, "reduce_scatter"): [(64, 1.5)]}
    # both graph times where both were captured, else both eager ones (never one of each)
    recs[0].update({"all_gather:nvshmem_push:graph": 8.0, "all_gather:nvshmem_pull:graph": 4.0})
    recs[1]["all_gather:nvshmem_push:graph"] = 1.0  # pull not captured: the eager pair stays
    got = tune.nvshmem_regret(recs, consts)
    assert got[(4, "all_gather")][:2] == [(8, 2.0), (4096, 1.0)]


def test_cuda_regret_scores_the_thresholds_choice():
    consts = cuda_model.constants({"cuda": KERNEL_KNOWN})
    t = cuda_model.thresholds({"cuda": consts}, 2)["cuda_ipc"]
    assert 0 < t["ll_bytes"] and 2 * t["ll_bytes"] < t["two_shot_bytes"]  # the cases below rely on both

    def rec(n, ll, one, two):
        return {"world": 2, "bytes": n, "all_reduce:ll:graph": ll, "all_reduce:one_shot:graph": one,
                "all_reduce:two_shot:graph": two, "memory": dict.fromkeys(("ll", "one_shot", "two_shot"), "cuda_ipc")}

    recs = [rec(8, 4.0, 5.0, 8.0),  # LL picked, and fastest
            rec(8, 6.0, 3.0, 8.0),  # LL picked, one_shot faster
            rec(1 << 20, 9.0, 6.0, "failed"),  # skipped: a kernel was not measured
            rec(t["ll_bytes"] * 2, 4.0, 8.0, 9.0)]  # past the LL limit: the simple kernel, twice LL's time
    got = cuda_model.regret(recs, consts)
    assert got == {("cuda_ipc", 2): [(8, 1.0), (8, 2.0), (t["ll_bytes"] * 2, 2.0)]}


@pytest.mark.parametrize("argv", [["--replays", "2"], ["--replays", "0", "--device", "cuda", "--graph"]])
def test_bench_refuses_replays_it_cannot_make(argv, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--np", "1", *argv])
    assert "--replays takes a positive count, and more than one needs --graph" in capsys.readouterr().err


class _Clock:
    """Stands in for torch.cuda's events: each timed loop takes the next of `ms` milliseconds."""

    def __init__(self, ms):
        self.ms = list(ms)

    def event(self, enable_timing=False):
        clock = self

        class Event:
            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return clock.ms.pop(0)

        return Event()


@pytest.mark.parametrize("pick, want_ms", [(None, 5.0), (min, 1.0)])
def test_per_call_keeps_the_median_or_the_fastest_loop(monkeypatch, pick, want_ms):
    clock = _Clock([9.0, 1.0, 5.0])
    monkeypatch.setattr(gpu_points.torch.cuda, "Event", clock.event)
    monkeypatch.setattr(gpu_points.torch.cuda, "synchronize", lambda: None)
    loops = []
    kw = {} if pick is None else {"pick": pick}
    t = gpu_points.per_call(lambda: loops.append(1), 10, 3, lambda: None, **kw)
    assert len(loops) == 3 and clock.ms == []
    assert t == pytest.approx(want_ms * 1e-3 / 10)


def test_tunes_workers_keep_the_fastest_loop(monkeypatch):
    """fit_points and nvshmem_fit_points time with pick=min (a loop that caught a descheduled rank only
    adds time); benchmarks keep the median."""
    picks = []
    monkeypatch.setattr(gpu_points, "time_entries", lambda *a: picks.append(("kernels", a[-1])))
    monkeypatch.setattr(gpu_points, "time_nvshmem", lambda *a: picks.append(("nvshmem", a[-1])))
    monkeypatch.setattr(gpu_points, "_points", lambda *a: a[-1]({}, None, None, None))
    gpu_points.fit_points(0, 2, "unused", [8], 20, 3)
    gpu_points.nvshmem_fit_points(0, 2, "unused", [8], 20, 3)
    assert picks == [("kernels", min), ("nvshmem", min)]
