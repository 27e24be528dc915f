"""Cost model of the GPU's schedule executor, and the decision tables it gives CUDA tensors.

broadcast, reduce, gather, scatter, and all_gather, reduce_scatter and all_reduce where no direct
kernel runs them, walk a scheduled algorithm inside one kernel (Note [Schedule executor] in
``csrc/cuda/schedule_executor.h``). The CPU's decision tables price schedules with shared
memory's constants, whose latency-to-bandwidth ratio is some 100x the GPU's, so on the GPU they
pick bandwidth-saving algorithms at sizes where a shallow one wins. These tables price the same
schedules with the executor's constants. An algorithm's predicted time for an n-byte buffer at p
ranks over one peer memory (``predict``, the one formula)::

    alpha + rounds * alpha_round + steps * p * alpha_step + wire * n * beta

``rounds`` and ``wire`` are the schedule's own cost terms (``schedule.cost_terms``: the critical
path, and bytes sent per buffer byte by the busiest rank); ``steps`` is the busiest rank's sends
and receives over all its rounds. A step's channels are served by the thread blocks of its lane,
and a rank's block budget is the GPU's SMs divided by p: a round of many steps at many ranks runs
each step on few blocks, hence the ``steps * p`` term. alpha (s per call), alpha_round (s per
round on the critical path), alpha_step (s per step and rank) and beta (s per byte) belong to a
peer memory: ``cuda_ipc`` (GPU memory) or ``host_mapped`` (shared host memory over PCIe). They
live in the profile's ``cuda_executor`` section, the shipped default's or one fitted by ``python
-m tilecomm.tune --executor-from``. Reductions on the GPU are part of beta (the executor reduces
a slice as it copies it).

As on the CPU, each algorithm may carry two scale factors per world size where it was measured
(a memory's ``corrections``): ``latency`` on the three alpha terms and ``bandwidth`` on the wire
term. Four constants shared by every schedule rank some algorithms the wrong way round (at 8 ranks
the ``steps * p`` term prices all_gather's direct schedule above recursive doubling, which
measured up to 3.6x slower); the factors are fitted per algorithm on its own times, and
``predict`` applies them.
"""

from __future__ import annotations

import copy
import json
import os
from collections import defaultdict

from tilecomm import algorithms, cuda_model
from tilecomm.schedule import cost_terms

MEMORIES = ("cuda_ipc", "host_mapped")  # the executor's peer memories, in cuda::PeerMemory order
KEYS = ("alpha_s", "alpha_round_s", "alpha_step_s", "beta_s_per_byte")
MAX_BYTES = (1 << 64) - 1
MAX_RANKS = cuda_model.MAX_RANKS  # larger groups stage CUDA tensors through host memory

# Fitted on one H200 shared by the ranks under MPS, from CUDA-graph replay of every scheduled algorithm
# forced in turn (scripts/gpu-executor-algos): cuda_ipc at 2, 4 and 8 ranks
# (benchmarks/results/executor_algos_h200.jsonl), host_mapped (TILECOMM_TRANSPORT=host_mapped, shared
# host memory) at 2 and 4 (..._host_mapped.jsonl); the fit, its errors and the regret: docs/benchmarks.md.
CONSTANTS = {  # without corrections
    "cuda_ipc": {"alpha_s": 1.1e-05, "alpha_round_s": 3.2e-06, "alpha_step_s": 3.2e-07, "beta_s_per_byte": 1.1e-11},
    "host_mapped": {"alpha_s": 2.0e-05, "alpha_round_s": 2.3e-05, "alpha_step_s": 7.5e-06,
                    "beta_s_per_byte": 6.5e-11},
}


SHIPPED_CORRECTIONS = os.path.join(os.path.dirname(__file__), "executor_corrections.json")


def _shipped_corrections() -> dict:
    """executor_corrections.json: every algorithm's corrections at 2, 4 and 8 ranks against the
    constants above (which the file names too, and a unit test compares), fitted on GPU tune runs
    by benchmarks/executor_corrections.py (which scores each run out of sample; docs/benchmarks.md)."""
    with open(SHIPPED_CORRECTIONS) as f:
        return json.load(f)["corrections"]


_SHIPPED = _shipped_corrections()
DEFAULT = {m: {**c, "corrections": _SHIPPED.get(m, {})} for m, c in CONSTANTS.items()}


def candidates(collective: str) -> list[algorithms.Algorithm]:
    """The algorithms of a collective the executor can walk: those with a schedule."""
    return [a for a in algorithms.for_collective(collective) if not a.direct]


# barrier has no tensor: it never runs on the executor.
COLLECTIVES = tuple(c for c in algorithms.COLLECTIVES if candidates(c) and c != "barrier")

_features: dict = {}


def features(algo: algorithms.Algorithm, p: int, layout=None) -> tuple[int, float, int]:
    """(rounds, wire, steps) of a scheduled algorithm at p ranks (on hosts `layout`)."""
    key = (algo.id, p, tuple(layout) if layout is not None else None)
    if key not in _features:
        s = algo.schedule(p, layout)
        t = cost_terms(s)
        steps = max((sum(len(rnd) for rnd in rank) for rank in s.ranks), default=0)
        _features[key] = (t.rounds, t.wire, steps)
    return _features[key]


def row(algo: algorithms.Algorithm, p: int, nbytes: int, layout=None) -> list[float]:
    """What each constant of KEYS multiplies in the prediction."""
    rounds, wire, steps = features(algo, p, layout)
    return [1.0, float(rounds), float(steps * p), wire * nbytes]


def correction(consts: dict, p: int, algo: algorithms.Algorithm) -> tuple[float, float]:
    """(latency, bandwidth) factors of an algorithm at p ranks in one memory's constants; 1.0 where
    none were fitted."""
    c = consts.get("corrections", {}).get(str(p), {}).get(algo.name)
    return (c["latency"], c["bandwidth"]) if c else (1.0, 1.0)


def parts(algo: algorithms.Algorithm, p: int, nbytes: int, consts: dict, layout=None) -> list[float]:
    """Predicted seconds of one executor call, term by term (call, rounds, steps, wire): the constants
    of one memory (as ``constants`` gives them) times ``row``, with the algorithm's corrections."""
    c_lat, c_bw = correction(consts, p, algo)
    x = row(algo, p, nbytes, layout)
    return [c_lat * consts[k] * v for k, v in zip(KEYS[:3], x[:3])] + [c_bw * consts[KEYS[3]] * x[3]]


def predict(algo: algorithms.Algorithm, p: int, nbytes: int, consts: dict, layout=None) -> float:
    """Predicted seconds of one executor call (constants of one memory, as ``constants`` gives them)."""
    return sum(parts(algo, p, nbytes, consts, layout))


def constants(profile) -> dict:
    """The profile's ``cuda_executor`` section, completed from the shipped default where it has no entry
    (a copy: changing it changes neither)."""
    own = (profile or {}).get("cuda_executor", {})
    return {m: copy.deepcopy(own.get(m) or DEFAULT[m]) for m in MEMORIES}


def build_table(collective: str, p: int, forced: dict[str, str], consts: dict, layout=None):
    """[(max_bytes, algorithm id), ...] of one collective on the executor over one memory."""
    if collective in forced:
        return [(MAX_BYTES, algorithms.by_name(forced[collective]).id)]
    from tilecomm import selector  # noqa: PLC0415 (selector imports this module)

    return selector.cheapest_table(candidates(collective), lambda a, n: predict(a, p, n, consts, layout))


def build_tables(p: int, forced: dict[str, str], profile, layout=None) -> dict:
    """{memory: {collective: table}}: the executor's decision tables at p ranks."""
    consts = constants(profile)
    return {m: {c: build_table(c, p, forced, consts[m], layout) for c in COLLECTIVES} for m in MEMORIES}


def check(section, where: str):
    """Raises ValueError unless `section` is a valid ``cuda_executor`` profile section."""
    if not isinstance(section, dict):
        raise ValueError(f"{where}: expected an object")
    for m, c in section.items():
        if m not in MEMORIES or not isinstance(c, dict):
            raise ValueError(f"{where}: {m!r} is not one of {', '.join(MEMORIES)} with an object")
        cuda_model.check_constants(c, KEYS, f"{where}.{m}")
        _check_corrections(c.get("corrections", {}), f"{where}.{m}.corrections")


def _check_corrections(corrections, where: str):
    names = {a.name for c in COLLECTIVES for a in candidates(c)}
    cuda_model.check_corrections(corrections, where, names, MAX_RANKS)


def _memory(record) -> str | None:
    """The peer memory a bench record ran over: its group's CUDA transport (older records: its
    TILECOMM_TRANSPORT, where absent, ``auto`` and ``shm`` leave GPUs on cuda_ipc); None for any other
    (the staged path)."""
    t = record.get("transport", "auto")
    return "cuda_ipc" if t in ("auto", "shm") else t if t in MEMORIES else None


def samples(records) -> list[tuple[str, algorithms.Algorithm, int, int, float]]:
    """(memory, algorithm, p, bytes, seconds) of every CUDA-graph row of a forced scheduled algorithm
    in ``python -m tilecomm.bench --device cuda --graph`` records (``tilecomm:<algorithm>`` backends;
    the group's own ``tilecomm`` rows validate the fit and are left out, and so are direct algorithms,
    which the executor does not run)."""
    out = []
    for r in records:
        backend = r.get("backend", "")
        if not (r.get("device") == "cuda" and r.get("graph") and backend.startswith("tilecomm:")):
            continue
        algo = next((a for a in candidates(r.get("collective", "")) if a.short == backend.split(":", 1)[1]), None)
        t = r.get("time_us")
        if algo is None or not isinstance(t, (int, float)) or t <= 0 or r.get("wrong") or _memory(r) is None:
            continue
        out.append((_memory(r), algo, int(r["world"]), int(r["bytes"]), float(t) * 1e-6))
    return out


def fit(records, base=None) -> tuple[dict, list[str]]:
    """Least-squares constants (relative error) per memory from bench records, then each measured
    algorithm's corrections at each measured world size against them; a memory without enough points
    keeps `base`'s constants (else the shipped default's), with its corrections at the world sizes
    not measured. Returns (cuda_executor section, warnings)."""
    import numpy as np  # noqa: PLC0415

    from tilecomm.fit import bounded_lstsq, chooses_worse, errors  # noqa: PLC0415

    consts, notes = constants({"cuda_executor": base or {}}), []
    pts = samples(records)
    for m in MEMORIES:
        rows = [(a, p, n, t) for mm, a, p, n, t in pts if mm == m]
        distinct, worlds = len({(a.id, p, n) for a, p, n, _ in rows}), len({p for _, p, _, _ in rows})
        if distinct < 8 or worlds < 2:
            notes.append(f"cuda_executor {m}: {distinct} distinct point(s) at {worlds} world size(s) (needs 8 and 2); "
                         "kept the current constants")
            continue
        A = np.array([row(a, p, n) for a, p, n, _ in rows])
        t = np.array([r[3] for r in rows])
        x = bounded_lstsq(A / t[:, None], np.ones_like(t), [0.0] * len(KEYS))
        err = errors(A @ x, t)
        fitted = dict(zip(KEYS, (float(v) for v in x)))
        fitted["fit"] = {"points": err["points"], "median_error": err["median"], "worst_error": err["worst"]}
        # Constants whose tables choose worse on the very points they were fitted to are not taken
        # (docs/selector.md); the comparison is without corrections on either side.
        plain = {**consts, m: _uncorrected(consts[m])}
        worse = chooses_worse(regret, records, m, plain, {**consts, m: fitted}, ("cuda_executor", "tables"))
        if worse:
            notes.append(worse)
            continue
        # the current corrections belong to the current constants: dropped
        dropped = sorted(set(consts[m].get("corrections", {})) - {str(p) for _, p, _, _ in rows}, key=int)
        if dropped:
            notes.append(f"cuda_executor {m}: new constants; the corrections at world size(s) {', '.join(dropped)} "
                         "belonged to the old ones and are dropped (tune at those sizes to fit them again)")
        consts[m] = fitted
    consts, more = fit_corrections(records, consts)
    return consts, notes + more


def fit_corrections(records, base=None) -> tuple[dict, list[str]]:
    """`base`'s constants (else the shipped default's) kept, with corrections fitted to the records
    for every algorithm and world size they measured (replacing those; the others stay).
    Returns (cuda_executor section, warnings)."""
    consts, notes = constants({"cuda_executor": base or {}}), []
    pts = samples(records)
    for m in MEMORIES:
        rows = [(a, p, n, t) for mm, a, p, n, t in pts if mm == m]
        if rows:
            consts[m], more = _fit_corrections(rows, consts[m], m)
            notes += more
    return consts, notes


def _uncorrected(c: dict) -> dict:
    return {k: v for k, v in c.items() if k != "corrections"}


def _fit_corrections(rows, consts: dict, memory: str) -> tuple[dict, list[str]]:
    """`consts` with corrections fitted (fit.fit_corrections) for every algorithm and world size of
    `rows` [(algorithm, p, bytes, seconds)], replacing those; warnings."""
    import warnings  # noqa: PLC0415

    from tilecomm import fit as fitting  # noqa: PLC0415

    plain = _uncorrected(consts)
    by: dict = defaultdict(list)
    for a, p, n, t in rows:
        x = parts(a, p, n, plain)
        by[(p, a)].append((sum(x[:3]), x[3], t))
    corrections = copy.deepcopy(consts.get("corrections", {}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fitting.FitWarning)
        for (p, a), samples_ in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1].id)):
            c, _ = fitting.fit_corrections(samples_, f"cuda_executor {memory} world {p} {a.name}")
            corrections.setdefault(str(p), {})[a.name] = c
    return {**plain, "corrections": corrections}, [str(w.message) for w in caught]


def regret(records, consts: dict) -> dict:
    """{(memory, world, collective): [(bytes, chosen's time / fastest's, chosen, fastest)]}: how the
    tables built from `consts` would choose among the forced algorithms the records timed, per point
    (records of one run: a point timed twice keeps its last time)."""
    times: dict = defaultdict(dict)
    for m, a, p, n, t in samples(records):
        times[(m, p, a.collective, n)][a] = t
    out: dict = defaultdict(list)
    for (m, p, coll, n), per in sorted(times.items()):  # keys are unique: values never compared
        if len(per) < 2:
            continue
        chosen = min(candidates(coll), key=lambda a: (predict(a, p, n, consts[m]), a.id))
        if chosen not in per:
            continue
        fastest = min(per, key=per.get)
        out[(m, p, coll)].append((n, per[chosen] / per[fastest], chosen.short, fastest.short))
    return out


def measured_regret(records) -> dict:
    """{(memory, world, collective): [(bytes, the group's own choice's time / fastest forced one's)]}
    from the ``tilecomm`` rows of the same records (what the tables in use when they ran chose)."""
    own = {}
    for r in records:
        if (r.get("backend") == "tilecomm" and r.get("device") == "cuda" and r.get("graph") and not r.get("wrong")
                and _memory(r) is not None):
            own[(_memory(r), int(r["world"]), r["collective"], int(r["bytes"]))] = r["time_us"] * 1e-6
    best: dict = {}
    for m, a, p, n, t in samples(records):
        key = (m, p, a.collective, n)
        best[key] = min(best.get(key, t), t)
    out: dict = defaultdict(list)
    for key in sorted(own):
        if key in best:
            out[key[:3]].append((key[3], own[key] / best[key]))
    return out
