"""Fits the selector's constants on this machine, or checks a profile against measurements.

    python -m tilecomm.tune --world-sizes 2,4,8 -b 8 -e 16M -f 4 -n 20 -o profile.json
    TILECOMM_PROFILE=profile.json python train.py          # groups then select with it
    python -m tilecomm.tune --validate profile.json --world-sizes 2,4,8 --json report.json
    python -m tilecomm.tune --validate other.json --measured report.json   # the same times, another profile
    python -m tilecomm.tune --validate other.json --measured a.json b.json c.json   # and the runs' floor

Spawns its own ranks for each world size (under torchrun: runs at torchrun's
world size). Tuning measures, then fits with ``tilecomm.fit``:

1. the links: ranks 0 and 1 bounce a message back and forth (tilecomm
   send/recv), over shared memory and over TCP (a group with
   TILECOMM_TRANSPORT=tcp); half the median round trip is one message's time;
2. local reductions: ``tilecomm._C.reduce_into`` (sum) per dtype, on rank 0;
3. every algorithm of each collective, forced in turn (float32, sum):
   nccl-tests' time, the wall time of ``-n`` back-to-back calls divided by
   ``-n``, the slowest rank's; the least of ``--repeats`` such times, taken in
   passes that each sweep every size and algorithm.

It writes a profile JSON (docs/selector.md). ``--validate`` times
auto-selection under a profile against every forced algorithm and prints, per
collective and world size, the model's prediction error and the regret (time
of the auto-selected algorithm / time of the fastest), and the totals over
the points where there is a choice. ``--validate PROFILE --measured REPORT.json`` scores PROFILE
against the times of an earlier ``--json`` report instead of measuring: a
profile fitted on one run, checked on another run's times. Given several
reports, it also prints what the best fixed choice per point would score
across them (``choice_floor``): the least regret any selector that chooses by
collective, world size and size could reach on those runs.

GPUs: ``--device cuda`` measures this machine's GPU paths itself, with its own ranks (one GPU
per rank where there are enough, else ranks sharing GPUs, which wants the MPS daemon): for each
world size, the direct all_reduce and all_gather kernels forced in turn (``tilecomm.gpu_points``)
and every scheduled algorithm of the GPU's schedule executor forced in turn (``tilecomm.bench
--device cuda --graph``), each point the fastest of ``--repeats`` replays, over GPU memory (cuda_ipc)
and shared host memory (host_mapped), all timed by CUDA-graph replay. It fits the ``cuda`` and
``cuda_executor`` sections as below, prints both reports and writes them, with the records
(``cuda_points``), into a copy of the current profile. It starts its ranks itself (not under
torchrun). Fitting earlier records
instead: ``--cuda-from LATENCY.jsonl`` fits the CUDA kernels' constants (``tilecomm.cuda_model``)
to the CUDA-graph times that ``benchmarks/gpu_latency.py`` measured (``scripts/gpu-latency``),
writes them into the ``cuda`` section of the profile (TILECOMM_PROFILE's, else the shipped
default's other sections) and prints the kernel thresholds they give, and the
regret of each ``auto`` entry measured, at every world size in the file.
``--executor-from BENCH.jsonl ...`` does the same for the GPU's schedule executor
(``tilecomm.executor_model``) from ``python -m tilecomm.bench --device cuda --graph``
records of forced algorithms (``scripts/gpu-executor-algos``): it writes the
``cuda_executor`` section and prints the fit, the regret its decision tables
would have on those times, and the regret of the choices the records measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import warnings
from datetime import datetime, timezone

import torch
import torch.distributed as dist

import tilecomm
from tilecomm import algorithms, bench, cuda_model, executor_model, fit, gpu_points, launch, selector, settings

REDUCE_DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8"]


# Measurement (runs on every rank) ------------------------------------------------------------------


def _grid(args):
    return list(bench.sizes(args.minbytes, args.maxbytes, args.stepfactor))


def _timed(iters, warmup, fn, *args):
    """Median seconds of one fn(*args) call over `iters` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn(*args)
    times = [0.0] * iters
    for i in range(iters):
        t0 = time.perf_counter()
        fn(*args)
        times[i] = time.perf_counter() - t0
    return statistics.median(times)


def bounce(rank, buf, group):
    """One round trip of buf between ranks 0 and 1 (rank 0 sends first)."""
    if rank == 0:
        dist.send(buf, 1, group=group)
        dist.recv(buf, 1, group=group)
    else:
        dist.recv(buf, 0, group=group)
        dist.send(buf, 0, group=group)


def _ping_pong(rank, args, timing, group=None):
    """[[bytes, one-way seconds], ...] between ranks 0 and 1 (rank 0's list; other ranks wait)."""
    points = []
    for n in _grid(args):
        buf = torch.zeros(n, dtype=torch.uint8)
        dist.barrier(group=timing)
        if rank <= 1:
            points.append([n, _timed(args.iters, args.warmup, bounce, rank, buf, group) / 2])
    dist.barrier(group=timing)
    return points


def _links(rank, args, timing):
    """Ping-pong points per link class: the default group's (shared memory) and a TCP group's."""
    os.environ["TILECOMM_TRANSPORT"] = "tcp"
    try:
        tcp = dist.new_group(backend="tilecomm")
    finally:
        os.environ.pop("TILECOMM_TRANSPORT", None)
    points = {selector.LINK: _ping_pong(rank, args, timing), selector.REMOTE_LINK: _ping_pong(rank, args, timing, tcp)}
    dist.destroy_process_group(tcp)
    return points


def _reductions(rank, args, timing):
    """{dtype: [[bytes, seconds], ...]} of reduce_into(sum) on rank 0; the other ranks wait."""
    from tilecomm import _C  # noqa: PLC0415  (needs torch.distributed imported first)

    out = {}
    if rank == 0:
        for name in args.dtypes:
            dtype = bench.DTYPES[name]
            esize = torch.empty((), dtype=dtype).element_size()
            points = []
            for n in _grid(args):
                count = n // esize
                if count == 0:
                    continue
                dst, src = torch.ones(count, dtype=dtype), torch.zeros(count, dtype=dtype)  # dst stays put
                points.append([count * esize, _timed(args.iters, args.warmup, _C.reduce_into, dst, src, "sum")])
            out[name] = points
    dist.barrier(group=timing)
    return out


def _time_algorithms(rank, world, args, timing, with_auto=False):
    """{collective: {algorithm id (or "auto"): [[bytes, seconds], ...]}}, float32 sum.

    Each algorithm runs in a group of its own, created while TILECOMM_ALGO forces
    it (bench's way); "auto" is the default group, which selects by its table.
    """
    out = {}
    for coll in args.collectives:
        by_short = {a.short: a.name for a in algorithms.for_collective(coll)}
        forced = bench._algo_groups(coll, "all", world)
        groups = {by_short[key.split(":", 1)[1]]: g for key, g in forced.items()}
        if with_auto:
            groups = {"auto": dist.group.WORLD, **groups}
        grid = [0] if coll == "barrier" else _grid(args)
        best = [dict.fromkeys(groups, float("inf")) for _ in grid]
        nbytes = list(grid)
        # A pass sweeps every size, each size every algorithm, and the point is the least over the
        # passes: a pass spoiled by a descheduled rank only adds time. The passes of one point are a
        # whole sweep apart, longer than the spells (up to tens of ms) in which the scheduler stacks
        # ranks on one core; passes back to back at one size caught the same spell (docs/selector.md,
        # "Tuning"). The algorithms take turns at going first.
        # NOTE: the loop's time per call, not the median call: where ranks outnumber cores, a call's
        # time is short or long by where the scheduler put the ranks, and the median of single calls
        # flips between the two (docs/selector.md).
        names = list(groups)
        for r in range(args.repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            for i, n in enumerate(grid):
                for name in order:
                    case = bench.Case(coll, n, torch.float32, dist.ReduceOp.SUM, rank, world, groups[name])
                    per_call, _ = bench.time_case(case, args.iters, args.warmup, timing)
                    best[i][name] = min(best[i][name], per_call)
                    nbytes[i] = case.nbytes
        points = {name: [[nbytes[i], best[i][name]] for i in range(len(grid))] for name in names}
        for g in forced.values():
            dist.destroy_process_group(g)
        out[coll] = points
    return out


def _start(rank, world):
    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    return dist.new_group(backend="gloo")


def _tune_worker(rank, world, out_path, args, base_world):
    os.environ.pop("TILECOMM_PROFILE", None)  # measurements never depend on an earlier profile
    timing = _start(rank, world)
    result = {"world": world}
    if world == base_world:
        result["links"] = _links(rank, args, timing)
        result["reduce"] = _reductions(rank, args, timing)
    result["collectives"] = _time_algorithms(rank, world, args, timing)
    _finish(rank, out_path, result)


def _validate_worker(rank, world, out_path, args, profile_path):
    # Rank 0's settings configure the groups: the default group selects with this profile, unforced.
    if profile_path:
        os.environ["TILECOMM_PROFILE"] = profile_path
    else:
        os.environ.pop("TILECOMM_PROFILE", None)
    os.environ.pop("TILECOMM_ALGO", None)
    timing = _start(rank, world)
    _finish(rank, out_path, {"world": world, "collectives": _time_algorithms(rank, world, args, timing, True)})


def _finish(rank, out_path, result):
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def _leader():
    """True in the process that gathers results: the parent, or rank 0 under torchrun."""
    return not launch.under_torchrun() or os.environ["RANK"] == "0"


def _run_worlds(worker, worlds, *extra):
    """Runs worker(rank, world, out_path, *extra) per world size; rank 0's results (None off the leader)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="tilecomm-tune-") as tmp:
        for world in worlds:
            path = os.path.join(tmp, f"world-{world}.json")
            if _leader():
                print(f"# world size {world} ...", file=sys.stderr, flush=True)
            launch.run(worker, world, path, *extra)
            if _leader():
                with open(path) as f:
                    results.append(json.load(f))
    return results if _leader() else None


# Tuning --------------------------------------------------------------------------------------------


def fingerprint():
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "tilecomm": tilecomm.__version__,
        "python": platform.python_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def raw_points(results):
    """tune's per-world results -> the raw points fit.fit_profile takes."""
    base = next(r for r in results if "links" in r)
    return {
        "dtype": "float32",
        "links": base["links"],
        "reduce": base["reduce"],
        "collectives": {
            str(r["world"]): {name: pts for per_coll in r["collectives"].values() for name, pts in per_coll.items()}
            for r in results
        },
    }


def tune(args, worlds):
    results = _run_worlds(_tune_worker, worlds, args, worlds[0])
    if results is None:
        return 0
    fp = fingerprint()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fit.FitWarning)
        profile = fit.fit_profile(
            raw_points(results), name=f"tuned on {fp['hostname']} {fp['created']}", fingerprint=fp
        )
    profile["warnings"] = [str(w.message) for w in caught]
    profile["measured_with"] = {
        "world_sizes": worlds,
        "collectives": args.collectives,
        "bytes": [args.minbytes, args.maxbytes, args.stepfactor],
        "iters": args.iters,
        "warmup": args.warmup,
    }
    selector.save_profile(profile, args.output)
    print(summary(profile))
    print(f"\nwrote {args.output}; use it with TILECOMM_PROFILE={os.path.abspath(args.output)}")
    return 0


def tune_cuda(args) -> int:
    """--cuda-from: fit the CUDA model to gpu_latency records and write it into a profile."""
    return _fit_sections([("cuda", cuda_model.fit, cuda_report, _read_records([args.cuda_from]))], args.output)


def tune_executor(args) -> int:
    """--executor-from: fit the schedule executor's constants to bench records and write them into a profile."""
    part = ("cuda_executor", executor_model.fit, executor_report, _read_records(args.executor_from))
    return _fit_sections([part], args.output)


def _read_records(paths) -> list:
    records = []
    for path in paths:
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def _fit_sections(parts, output, measured_with=None) -> int:
    """For each (key, fit_section, report, records) of `parts`: fits profile section `key` to the
    records (fit_section(records, base section) -> (section, warnings)) and prints report(section,
    records). Writes the sections into a copy of the current profile (TILECOMM_PROFILE's, else the
    shipped one) at `output`; with `measured_with`, the records go in too (``cuda_points``)."""
    base = selector.load_profile(settings.value("TILECOMM_PROFILE") or None)
    profile = json.loads(json.dumps(base))
    profile["warnings"] = list(profile.get("warnings", []))
    for key, fit_section, report, records in parts:
        consts, notes = fit_section(records, base.get(key))
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        profile[key] = consts
        profile["warnings"] += notes
        print(report(consts, records) + "\n")
    # A GPU's own measurement keeps its records with the sections fitted to them; a refit of a
    # section from other records drops that section's (the other section's stay).
    points = {k: v for k, v in profile.pop("cuda_points", {}).items() if k not in {key for key, *_ in parts}}
    if measured_with is not None:
        points.update({key: records for key, _, _, records in parts})
        profile["cuda_measured_with"] = measured_with
    if points:
        profile["cuda_points"] = points
    else:
        profile.pop("cuda_measured_with", None)
    keys = " and ".join(key for key, *_ in parts)
    on = f" on {measured_with['gpu']}" if measured_with else " from records"
    profile["name"] = f"{base.get('name', 'profile').split('; ')[0]}; {keys} fitted{on}"  # the last fit's
    selector.save_profile(profile, output)
    print(f"\nwrote {output}; use it with TILECOMM_PROFILE={os.path.abspath(output)}")
    return 0


# Tuning on the GPU ---------------------------------------------------------------------------------

# The executor's points: every scheduled algorithm forced in turn, per peer memory. all_reduce runs
# on the executor only where the direct kernels are turned off; NVSHMEM and LL stay out of the way.
_EXECUTOR_RUNS = (
    ({"TILECOMM_PROTO": "simple", "TILECOMM_NVSHMEM": "off"},
     ",".join(c for c in executor_model.COLLECTIVES if c != "all_reduce"), "all"),
    ({"TILECOMM_CUDA_ALLREDUCE": "scheduled", "TILECOMM_NVSHMEM": "off"},
     "all_reduce", ",".join(a.short for a in executor_model.candidates("all_reduce"))),
)


def gpu_problem() -> str:
    """Why this process cannot tune the GPU ("" when it can)."""
    try:
        from tilecomm import _C  # noqa: PLC0415

        built = bool(getattr(_C, "HAS_CUDA", False))
    except ImportError:
        built = False
    if not built:
        return "this build of tilecomm has no CUDA parts (install it against a torch with CUDA)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return ""


def nvshmem_problem() -> str:
    """Why NVSHMEM's kernels cannot be measured here ("" when they can)."""
    from tilecomm import _C, nvshmem  # noqa: PLC0415

    if not getattr(_C, "HAS_NVSHMEM", False):
        return "tilecomm was built without the NVSHMEM headers"
    return nvshmem.library()[1]


def _gpu_share(world) -> dict:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for ranks that share GPUs (NVSHMEM's collectives need each
    rank's share set under MPS), else nothing."""
    per_gpu = -(-world // max(1, torch.cuda.device_count()))
    return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // per_gpu)} if per_gpu > 1 else {}


def _nvshmem_points(world, args, path) -> list:
    """gpu_points.nvshmem_fit_points' records at `world` ranks; none, with a warning, where they fail."""
    try:
        with settings.overriding(_gpu_share(world)):
            launch.run(gpu_points.nvshmem_fit_points, world, path, _grid(args), args.iters, args.repeats)
    except Exception as e:  # noqa: BLE001  (the other sections are still worth fitting)
        print(f"warning: NVSHMEM's kernels at {world} ranks were not measured: {str(e).strip()[-300:]}",
              file=sys.stderr)
    return _read_records([path]) if os.path.exists(path) else []


def _mps_running() -> bool:
    """Whether an MPS control daemon answers at the pipe directory CUDA would use."""
    return os.path.exists(os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"), "control"))


# The settings that steer which GPU path a call takes: tune forces each path itself, so the user's
# values are set aside while it measures.
_GPU_PATH_SETTINGS = tuple(
    s.name for s in settings.SETTINGS
    if s.name in ("TILECOMM_ALGO", "TILECOMM_TRANSPORT", "TILECOMM_PROTO", "TILECOMM_LL_BYTES")
    or s.name.startswith(("TILECOMM_CUDA_", "TILECOMM_NVSHMEM"))
)


def _executor_points(world, args, path):
    """tilecomm.bench --device cuda --graph rows of every scheduled algorithm forced, per peer memory
    (each row names the memory its group used)."""
    common = ["--np", str(world), "-b", str(args.minbytes), "-e", str(args.maxbytes), "-f", str(args.stepfactor),
              "-n", str(args.iters), "-w", str(args.warmup), "-c", "1", "--device", "cuda", "--backend", "tilecomm",
              "--graph", "--replays", str(args.repeats), "--jsonl", path]
    for transport in ("auto", "host_mapped"):  # auto: cuda_ipc where the GPUs reach each other's memory
        for env, collectives, algos in _EXECUTOR_RUNS:
            with settings.overriding({**env, "TILECOMM_TRANSPORT": transport}):
                bench.main(common + ["--collective", collectives, "--algo", algos])


def tune_gpu(args, worlds) -> int:
    """--device cuda: measures this machine's GPU paths and fits the profile's ``cuda`` section (the
    direct kernels, from ``gpu_points``) and ``cuda_executor`` section (the schedule executor, from
    ``tilecomm.bench --graph`` with every scheduled algorithm forced), both timed by CUDA-graph
    replay, over GPU memory (cuda_ipc) and shared host memory (host_mapped)."""
    problem = gpu_problem()
    if problem:
        raise SystemExit(f"tune --device cuda: {problem}")
    if max(worlds) > torch.cuda.device_count() and not _mps_running():
        print("warning: ranks share a GPU and no MPS daemon was found: without it their kernels take turns "
              "on the GPU and the times are not those of a run under MPS (docs/selector.md)", file=sys.stderr)
    ignored = [k for k in _GPU_PATH_SETTINGS if k in os.environ]
    if ignored:
        print(f"note: tune --device cuda sets {', '.join(ignored)} itself while it measures (yours are "
              "restored after)", file=sys.stderr)
    no_nvshmem = nvshmem_problem()
    if no_nvshmem:
        print(f"note: NVSHMEM's kernels are not measured ({no_nvshmem}); the profile's nvshmem constants stay",
              file=sys.stderr)
    grid = _grid(args)
    kernels, executor = [], []
    tmp_dir = tempfile.TemporaryDirectory(prefix="tilecomm-tune-")
    with settings.overriding(dict.fromkeys(_GPU_PATH_SETTINGS)), tmp_dir as tmp:
        for world in worlds:
            print(f"# world size {world}: direct kernels ...", file=sys.stderr, flush=True)
            path = os.path.join(tmp, f"kernels-{world}.jsonl")
            launch.run(gpu_points.fit_points, world, path, grid, args.iters, args.repeats)
            kernels += _read_records([path])
            if not no_nvshmem:
                print(f"# world size {world}: NVSHMEM's kernels ...", file=sys.stderr, flush=True)
                kernels += _nvshmem_points(world, args, os.path.join(tmp, f"nvshmem-{world}.jsonl"))
            print(f"# world size {world}: the schedule executor ...", file=sys.stderr, flush=True)
            path = os.path.join(tmp, f"executor-{world}.jsonl")
            _executor_points(world, args, path)
            executor += _read_records([path])
    measured_with = {"world_sizes": worlds, "bytes": [args.minbytes, args.maxbytes, args.stepfactor],
                     "iters": args.iters, "repeats": args.repeats, "gpu": torch.cuda.get_device_name(),
                     **fingerprint()}
    return _fit_sections([("cuda", cuda_model.fit, cuda_report, kernels),
                          ("cuda_executor", executor_model.fit, executor_report, executor)],
                         args.output, measured_with)


def executor_report(consts, records) -> str:
    """The fitted constants; per world size, the regret the tables from `consts` would have on the records'
    forced times, and that of the choices the records measured (their ``tilecomm`` rows)."""
    lines = ["| memory | alpha (us) | per round (us) | per step and rank (us) | beta (GB/s) | points | "
             "median error | worst error |", "|---|---|---|---|---|---|---|---|"]
    for m in executor_model.MEMORIES:
        c = consts[m]
        f = c.get("fit", {})
        med, worst = (f"{f[k]:.0%}" if f.get(k) is not None else "(default)" for k in ("median_error", "worst_error"))
        bw = f"{1e-9 / c['beta_s_per_byte']:.0f}" if c["beta_s_per_byte"] > 0 else "inf"
        lines.append(f"| {m} | {c['alpha_s'] * 1e6:.2f} | {c['alpha_round_s'] * 1e6:.2f} | "
                     f"{c['alpha_step_s'] * 1e6:.2f} | {bw} | {f.get('points', 0)} | {med} | {worst} |")
    model = executor_model.regret(records, consts)
    measured = executor_model.measured_regret(records)
    lines += ["", "| memory | world | collective | points | tables' regret mean | worst (bytes) | "
              "measured choice's mean | worst (bytes) |", "|---|---|---|---|---|---|---|---|"]

    def cells(rs):
        worst = max(rs, key=lambda x: x[1])
        return f"{statistics.mean(r[1] for r in rs):.3f} | {worst[1]:.2f} ({worst[0]})"

    for key, rs in sorted(model.items()):
        got = measured.get(key)
        lines.append(f"| {' | '.join(map(str, key))} | {len(rs)} | {cells(rs)} | "
                     + (f"{cells(got)} |" if got else "- | - |"))
    for m, p in sorted({k[:2] for k in model}):
        rs = [r for k, v in model.items() if k[:2] == (m, p) for r in v]
        got = [r for k, v in measured.items() if k[:2] == (m, p) for r in v]
        lines.append(f"| {m} | {p} | all | {len(rs)} | {cells(rs)} | " + (f"{cells(got)} |" if got else "- | - |"))
    return "\n".join(lines)


def cuda_report(consts, records) -> str:
    """The fitted constants, the thresholds per world size, and the measured regret of `auto` entries."""
    lines = ["| memory | protocol | alpha (us) | per round (us) | per round and peer (us) | beta (GB/s) | points | "
             "median error |", "|---|---|---|---|---|---|---|---|"]
    for m in cuda_model.MEMORIES:
        for pr in cuda_model.PROTOCOLS:
            c = consts[m][pr]
            f = c.get("fit", {})
            med = f"{f['median_error']:.0%}" if f.get("median_error") is not None else "(default)"
            bw = f"{1e-9 / c['beta_s_per_byte']:.0f}" if c["beta_s_per_byte"] > 0 else "inf"
            lines.append(f"| {m} | {pr} | {c['alpha_s'] * 1e6:.2f} | {c['alpha_round_s'] * 1e6:.2f} | "
                         f"{c['alpha_peer_s'] * 1e6:.2f} | {bw} | {f.get('points', 0)} | {med} |")
    corrections = [(m, int(w), k, f) for m in cuda_model.CORRECTED
                   for w, per in consts[m].get("corrections", {}).items() for k, f in per.items()]
    if corrections:
        lines += ["", "| memory | world | kernel | latency correction | bandwidth correction |",
                  "|---|---|---|---|---|"]
        lines += [f"| {m} | {w} | {k} | {f['latency']:.3f} | {f['bandwidth']:.3f} |"
                  for m, w, k, f in sorted(corrections)]
    worlds = sorted({int(r["world"]) for r in records})
    lines += ["", "| world | memory | LL up to (B) | two_shot from (B) |", "|---|---|---|---|"]
    for p in worlds:
        for m, t in cuda_model.thresholds({"cuda": consts}, p).items():
            if m == "nvshmem":  # no all_reduce kernel runs over it: its thresholds mean nothing
                continue
            two = "never" if t["two_shot_bytes"] == cuda_model.NEVER else t["two_shot_bytes"]
            lines.append(f"| {p} | {m} | {t['ll_bytes']} | {two} |")
    chosen = cuda_model.regret(records, consts)
    if chosen:
        lines += ["", "| world | memory | all_reduce points | thresholds' regret mean | worst (bytes) |",
                  "|---|---|---|---|---|"]
        for (m, p), rs in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            worst = max(rs, key=lambda x: x[1])
            lines.append(f"| {p} | {m} | {len(rs)} | {statistics.mean(r for _, r in rs):.3f} | "
                         f"{worst[1]:.3f} ({worst[0]}) |")
    nvshmem = nvshmem_regret(records, consts)
    if nvshmem:
        lines += ["", "| world | collective | pull from (B) | points | regret mean | regret worst (bytes) |",
                  "|---|---|---|---|---|---|"]
        for (p, coll), rs in sorted(nvshmem.items()):
            pull = cuda_model.nvshmem_thresholds({"cuda": consts}, p)[f"{coll}_pull_bytes"]
            worst = max(rs, key=lambda x: x[1])
            lines.append(f"| {p} | {coll} | {'never' if pull == cuda_model.NEVER else pull} | {len(rs)} | "
                         f"{statistics.mean(r for _, r in rs):.3f} | {worst[1]:.3f} ({worst[0]}) |")
    regrets = cuda_regret(records)
    if regrets:
        lines += ["", "| world | entry | points | regret mean | regret worst (bytes) |", "|---|---|---|---|---|"]
        for (p, entry), rs in sorted(regrets.items()):
            worst = max(rs, key=lambda x: x[1])
            lines.append(f"| {p} | {entry} | {len(rs)} | {statistics.mean(r for _, r in rs):.3f} | "
                         f"{worst[1]:.3f} ({worst[0]}) |")
    return "\n".join(lines)


def cuda_regret(records) -> dict:
    """{(world, "all_reduce:auto" | ...): [(bytes, auto time / fastest forced kernel's time)]} over the
    CUDA-graph times of records whose forced entries over the same memory were measured too."""
    out = {}
    for r in records:
        for key in r.get("kernels", {}):
            coll, entry = key.split(":", 1)
            if entry.removeprefix("hm_") != "auto" or not isinstance(r.get(f"{key}:graph"), (int, float)):
                continue
            prefix = "hm_" if entry.startswith("hm_") else ""
            forced = [r.get(f"{coll}:{prefix}{k}:graph") for k in ("ll", "one_shot", "two_shot")]
            forced = [v for v in forced if isinstance(v, (int, float)) and v > 0]
            if forced:
                out.setdefault((int(r["world"]), key), []).append((int(r["bytes"]), r[f"{key}:graph"] / min(forced)))
    return out


def nvshmem_regret(records, consts) -> dict:
    """{(world, "all_gather" | "reduce_scatter"): [(bytes, time of the NVSHMEM kernel that the constants'
    thresholds pick / the faster of push and pull)]} over records where both were measured, both under
    graph replay where they were, else both eagerly."""
    out = {}
    pull_from = {p: cuda_model.nvshmem_thresholds({"cuda": consts}, p) for p in {int(r["world"]) for r in records}}
    for r in records:
        p = int(r["world"])
        for coll in ("all_gather", "reduce_scatter"):
            for timing in ("graph", "eager"):
                push, pull = (r.get(f"{coll}:nvshmem_{k}:{timing}") for k in ("push", "pull"))
                if cuda_model.is_time(push) and cuda_model.is_time(pull):
                    break
            else:
                continue
            chosen = pull if int(r["bytes"]) >= pull_from[p][f"{coll}_pull_bytes"] else push
            out.setdefault((p, coll), []).append((int(r["bytes"]), chosen / min(push, pull)))
    return out


def _pct(x):
    return "-" if x is None else f"{x:.0%}"


def summary(profile) -> str:
    """The fitted constants, corrections and fit errors as markdown."""
    res = profile.get("residuals", {})
    lines = ["## Link classes", ""]
    for link, c in profile["links"].items():
        e = res.get("links", {}).get(link, {})
        lines.append(
            f"- {link}: alpha {c['alpha_s'] * 1e6:.3g} us, beta {c['beta_s_per_byte'] * 1e9:.3g} ns/B; "
            f"fit error median {_pct(e.get('median'))}, worst {_pct(e.get('worst'))} ({e.get('points', 0)} points)"
        )
    lines += ["", "## Reduction (gamma)", ""]
    for dtype, g in profile["gamma_s_per_byte"].items():
        e = res.get("gamma", {}).get(dtype, {})
        fitted = f"; fit error median {_pct(e.get('median'))}, worst {_pct(e.get('worst'))}" if e else ""
        lines.append(f"- {dtype}: {g * 1e9:.3g} ns/B{fitted}")
    for world, per_algo in profile["corrections"].items():
        lines += [
            "",
            f"## Corrections, world size {world}",
            "",
            "| algorithm | latency | bandwidth | error before (median / worst) | after (median / worst) |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for name, c in per_algo.items():
            e = res.get("corrections", {}).get(world, {}).get(name, {})
            b, a = e.get("before", {}), e.get("after", {})
            lines.append(
                f"| {name} | {c['latency']:.3g} | {c['bandwidth']:.3g} | {_pct(b.get('median'))} / "
                f"{_pct(b.get('worst'))} | {_pct(a.get('median'))} / {_pct(a.get('worst'))} |"
            )
    if profile.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in profile["warnings"]]
    return "\n".join(lines)


# Validation ----------------------------------------------------------------------------------------


def forced_times(per_name):
    """A report's collective ({algorithm or "auto": [[bytes, seconds], ...]}) as, per position of its
    sizes (sizes that round alike repeat): (bytes, {forced algorithm: seconds})."""
    forced = {name: pts for name, pts in per_name.items() if name != "auto"}
    return [(n, {name: pts[i][1] for name, pts in forced.items()}) for i, (n, _) in enumerate(per_name["auto"])]


def validation_rows(results, profile):
    """One row per (collective, world size): prediction error over every forced algorithm and size,
    and regret of auto-selection (its measured time / the fastest forced algorithm's) per size."""
    rows = []
    registry = {a.name: a for a in algorithms.ALGORITHMS}
    for r in results:
        world = r["world"]
        for coll, per_name in r["collectives"].items():
            points = forced_times(per_name)
            table = selector.build_table(coll, world, {}, profile)
            pred, meas, regrets, auto_ratios, picked = [], [], [], [], 0
            for i, (n, times) in enumerate(points):
                for name, t in times.items():
                    pred.append(selector.predict_algo(registry[name], world, n, profile).total_s)
                    meas.append(t)
                fastest = min(times, key=times.get)
                chosen = selector.lookup(table, n).name
                regrets.append(times[chosen] / times[fastest])
                auto_ratios.append(per_name["auto"][i][1] / times[fastest])
                picked += chosen == fastest
            err = fit.errors(pred, meas)
            rows.append(
                {
                    "collective": coll,
                    "world": world,
                    "sizes": len(points),
                    "algorithms": len(per_name) - 1,  # all but auto
                    "error_median": err["median"],
                    "error_worst": err["worst"],
                    "regret_mean": statistics.mean(regrets),
                    "regret_median": statistics.median(regrets),
                    "regret_worst": max(regrets),
                    "auto_run_median": statistics.median(auto_ratios),
                    "picked_fastest": picked,
                }
            )
    return rows


def validation_totals(rows) -> dict:
    """The targets' figures over every point with a choice (rows of one algorithm, barrier, left out):
    regret mean (overall and per world size, each point counted once) and worst, the median of the
    rows' prediction-error medians, and how many points chose the fastest."""
    choice = [r for r in rows if r["algorithms"] > 1]
    if not choice:
        return {}

    def mean(rs):
        return sum(r["regret_mean"] * r["sizes"] for r in rs) / sum(r["sizes"] for r in rs)

    worlds = sorted({r["world"] for r in choice})
    return {
        "points": sum(r["sizes"] for r in choice),
        "regret_mean": mean(choice),
        "regret_mean_by_world": {w: mean([r for r in choice if r["world"] == w]) for w in worlds},
        "regret_worst": max(r["regret_worst"] for r in choice),
        "regret_worst_by_world": {w: max(r["regret_worst"] for r in choice if r["world"] == w) for w in worlds},
        "error_median": statistics.median(r["error_median"] for r in rows),
        "picked_fastest": sum(r["picked_fastest"] for r in choice),
    }


def validation_markdown(rows, profile_desc) -> str:
    lines = [
        f"Profile: {profile_desc}",
        "",
        "Prediction error: |predicted - measured| / measured over every forced algorithm and size.",
        (
            "Regret: measured time of the algorithm the profile's table chooses / the fastest forced "
            "algorithm's, per size. Auto run: the auto-selected group's own measured time / the fastest "
            "(the same choice measured once more; its spread is the timing noise)."
        ),
        "",
        (
            "| collective | world | sizes | algorithms | error median | error worst | regret mean | regret median "
            "| regret worst | auto run median | chose the fastest |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['collective']} | {r['world']} | {r['sizes']} | {r['algorithms']} | {_pct(r['error_median'])} "
            f"| {_pct(r['error_worst'])} | {r['regret_mean']:.2f} | {r['regret_median']:.2f} "
            f"| {r['regret_worst']:.2f} | {r['auto_run_median']:.2f} | {r['picked_fastest']}/{r['sizes']} |"
        )
    t = validation_totals(rows)
    if t:
        by_world = " / ".join(f"{v:.3f}" for v in t["regret_mean_by_world"].values())
        worlds = " / ".join(str(w) for w in t["regret_mean_by_world"])
        lines += [
            "",
            f"Over the {t['points']} points with a choice: regret mean {t['regret_mean']:.3f} ({by_world} at world "
            f"sizes {worlds}), worst {t['regret_worst']:.2f}; prediction error, median of the medians "
            f"{_pct(t['error_median'])}; chose the fastest at {t['picked_fastest']}/{t['points']}.",
        ]
    return "\n".join(lines)


def choice_floor(runs) -> tuple[dict, int]:
    """What the best fixed choice per (collective, world size, size) would score over several runs'
    times (each a --validate report's "measured"): a selector that chooses by collective, world size
    and size can do no better on these runs. Per world size, over the points with a choice measured
    in every run with the same algorithms: ``regret_worst``, the least over algorithms of the worst
    regret across runs (the worst point's), and ``regret_mean``, the mean over points of the least
    mean regret across runs; regret at a point of a run is an algorithm's time / that run's fastest
    forced algorithm's. Also returns how many points with a choice were left out (not measured
    alike in every run)."""
    points = {}
    for results in runs:
        for r in results:
            for coll, per_name in r["collectives"].items():
                for i, (n, times) in enumerate(forced_times(per_name)):  # position too: sizes repeat
                    points.setdefault((coll, r["world"], i, n), []).append(times)
    worst, means, left_out = {}, {}, 0
    for (_, world, _, _), per_run in points.items():
        if len(per_run[0]) < 2:
            continue
        if len(per_run) != len(runs) or any(t.keys() != per_run[0].keys() for t in per_run):
            left_out += 1
            continue
        ratios = [[t[a] / min(t.values()) for t in per_run] for a in per_run[0]]
        worst[world] = max(worst.get(world, 1.0), min(max(v) for v in ratios))
        means.setdefault(world, []).append(min(statistics.mean(v) for v in ratios))
    floor = {w: {"points": len(means[w]), "regret_mean": statistics.mean(means[w]), "regret_worst": worst[w]}
             for w in sorted(means)}
    return floor, left_out


def floor_markdown(floor, left_out, totals) -> str:
    """The best fixed choice's figures (``choice_floor``) beside the profile's in each run
    (``validation_totals`` of each)."""
    lines = [
        f"Across the {len(totals)} runs: the best fixed choice per point (collective, world size, size), "
        "chosen knowing every run's times, against this profile's choices; regret mean / worst (for the "
        "best fixed choice, the mean from the choice with the least mean across the runs, the worst from "
        "the one with the least worst):",
        "",
        "| world | points | best fixed choice | " + " | ".join(f"run {i + 1}" for i in range(len(totals))) + " |",
        "| ---: | ---: | ---: |" + " ---: |" * len(totals),
    ]
    for w, f in floor.items():
        runs = " | ".join(f"{t['regret_mean_by_world'][w]:.3f} / {t['regret_worst_by_world'][w]:.2f}"
                          if w in t.get("regret_mean_by_world", {}) else "-" for t in totals)
        lines.append(f"| {w} | {f['points']} | {f['regret_mean']:.3f} / {f['regret_worst']:.2f} | {runs} |")
    if left_out:
        lines += ["", f"Left out of the best fixed choice: {left_out} points with a choice not measured with the "
                  "same algorithms in every run (another size grid, world size or version)."]
    return "\n".join(lines)


def validate(args, worlds):
    cfg = settings.resolve()
    path = args.validate or cfg["TILECOMM_PROFILE"]
    try:
        profile = selector.load_profile(path or None)  # a bad file fails here, before any rank starts
    except ValueError as e:
        raise SystemExit(f"tilecomm.tune: {e}") from None
    if cfg["TILECOMM_ALGO"]:
        print(f"# TILECOMM_ALGO={cfg['TILECOMM_ALGO']!r} is ignored: auto-selection is validated", file=sys.stderr)
    abspath = os.path.abspath(path) if path else ""
    desc = selector.describe_profile(profile, abspath or None)
    if not args.measured:
        results = _run_worlds(_validate_worker, worlds, args, abspath)
        if results is None:
            return 0
        rows = validation_rows(results, profile)
        print(validation_markdown(rows, desc))
        if args.json:
            with open(args.json, "w") as f:
                # the profile as the user named it: a report is shared, the machine's paths stay out of it
                json.dump({"profile": path or "shipped default", "rows": rows, "measured": results}, f, indent=1)
        return 0
    # the times of earlier reports, scored again with this profile: nothing runs
    runs, totals = [], []
    for i, report in enumerate(args.measured):
        try:
            with open(report) as f:
                results = json.load(f)["measured"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"tilecomm.tune: --measured {report}: not a --validate --json report ({e})") from None
        try:
            rows = validation_rows(results, profile)
        except (KeyError, TypeError, IndexError, ValueError, ZeroDivisionError) as e:
            raise SystemExit(f"tilecomm.tune: --measured {report}: its times do not fit this version's "
                             f"algorithms ({type(e).__name__}: {e})") from None
        print(("" if i == 0 else "\n") + (f"Run {i + 1}: {report}\n\n" if len(args.measured) > 1 else "")
              + validation_markdown(rows, desc))
        runs.append(results)
        totals.append(validation_totals(rows))
    if len(runs) > 1:
        print("\n" + floor_markdown(*choice_floor(runs), totals))
    return 0


# Command line --------------------------------------------------------------------------------------


def _names(value, valid, what):
    if value == "all":
        return list(valid)
    names = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in names if x not in valid]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(bad) or value!r}; valid: {', '.join(valid)}")
    return names


def _world_sizes(value):
    try:
        worlds = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None
    if not worlds or min(worlds) < 2:
        raise argparse.ArgumentTypeError("world sizes must be >= 2 (the link is measured between ranks 0 and 1)")
    return sorted(set(worlds))


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tilecomm.tune", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--world-sizes", type=_world_sizes, default="2,4,8", help="ranks to spawn, one run each (default 2,4,8)"
    )
    p.add_argument(
        "--collectives",
        type=lambda v: _names(v, algorithms.COLLECTIVES, "collective"),
        default="all",
        help=f"comma-separated of {','.join(algorithms.COLLECTIVES)}, or all",
    )
    p.add_argument("-b", "--minbytes", type=bench.parse_size, default=8, help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=bench.parse_size, default=16 << 20, help="largest size (default 16M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between points (default 4)")
    p.add_argument("-n", "--iters", type=int, default=20,
                   help="timed back-to-back calls per size and pass (their time per call is used)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed calls before each size (default 5)")
    p.add_argument(
        "-r", "--repeats", type=int, default=3,
        help="passes over every size and algorithm; per point the least loop time is kept (default 3; with "
             "--device cuda: replays per point, the fastest kept)",
    )
    p.add_argument(
        "--dtypes",
        type=lambda v: _names(v, REDUCE_DTYPES, "dtype"),
        default="all",
        help=f"dtypes whose reduction is timed: comma-separated of {','.join(REDUCE_DTYPES)}, or all",
    )
    p.add_argument("-o", "--output", default="tilecomm-profile.json", help="profile to write")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: measure the GPU's paths (the direct kernels and the schedule executor, over GPU "
                        "memory and shared host memory) and fit the profile's cuda sections instead")
    p.add_argument(
        "--validate",
        nargs="?",
        const="",
        default=None,
        metavar="PROFILE",
        help="check PROFILE (default: TILECOMM_PROFILE, else the shipped one) instead of tuning",
    )
    p.add_argument("--json", default="", help="with --validate: also write the report (and the times) here")
    p.add_argument("--measured", nargs="+", default=[], metavar="REPORT_JSON",
                   help="with --validate: score PROFILE against the times of earlier --json reports instead of "
                        "measuring (a profile fitted on one run, checked on others); with several, also what the "
                        "best fixed choice per point would score across them")
    p.add_argument("--cuda-from", default="", metavar="LATENCY_JSONL",
                   help="fit the CUDA kernels' constants to benchmarks/gpu_latency.py records instead of tuning")
    p.add_argument("--executor-from", nargs="+", default=[], metavar="BENCH_JSONL",
                   help="fit the GPU schedule executor's constants to tilecomm.bench --device cuda --graph records "
                        "of forced algorithms instead of tuning")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cuda_from and args.executor_from:
        parser.error("--cuda-from and --executor-from: give one at a time (each writes its own -o profile)")
    if args.device == "cuda" and (args.cuda_from or args.executor_from):
        parser.error("--device cuda measures the GPU; --cuda-from and --executor-from fit earlier records")
    if args.cuda_from:
        return tune_cuda(args)
    if args.executor_from:
        return tune_executor(args)
    if args.minbytes < 1 or args.maxbytes < args.minbytes:
        parser.error("sizes: need 1 <= -b <= -e")
    if args.stepfactor < 2 or args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error("need -f >= 2, -n >= 1, -w >= 0, -r >= 1")
    if args.device == "cuda":
        if args.validate is not None:
            parser.error("--device cuda tunes; the GPU's fit reports its own regret (no --validate)")
        if args.measured or args.json:
            parser.error("--measured and --json go with --validate, which --device cuda does not take")
        if args.collectives != list(algorithms.COLLECTIVES) or args.dtypes != list(REDUCE_DTYPES):
            parser.error("--device cuda measures every GPU path in float32 (no --collectives, --dtypes)")
        if launch.under_torchrun():
            parser.error("--device cuda starts its own ranks for each measurement: run it without torchrun")
        return tune_gpu(args, args.world_sizes)
    worlds = args.world_sizes
    if launch.under_torchrun():
        worlds = [int(os.environ["WORLD_SIZE"])]
        if worlds[0] < 2:
            parser.error("under torchrun: needs at least 2 ranks")
    if args.measured and args.validate is None:
        parser.error("--measured goes with --validate")
    if args.measured and args.json:
        parser.error("--json writes what --validate measures; with --measured nothing is measured")
    return validate(args, worlds) if args.validate is not None else tune(args, worlds)


if __name__ == "__main__":
    sys.exit(main())
