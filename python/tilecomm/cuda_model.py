"""Cost model of the CUDA direct kernels, and the size thresholds it gives the C++ side.

Each kernel of ``csrc/cuda/`` declares its cost terms here, once (``KERNELS``):
``rounds``, the trips through peer memory on its critical path (a flag round,
or LL's one-way trip), and ``wire``, the bytes each rank moves through peer
memory per byte of the message (LL lines carry 8 data bytes in 16, so they
count twice). A kernel's predicted time for an n-byte message at p ranks is
(``predict``, the one formula)::

    alpha + rounds * (alpha_round + alpha_peer * (p - 1)) + wire(p) * n * beta

with alpha (s per call: the launch and the kernel's fixed work), alpha_round
(s per round), alpha_peer (s per round and peer) and beta (s per byte)
belonging to a peer memory (``cuda_ipc``: GPU memory; ``host_mapped``:
shared host memory over PCIe; ``nvshmem``: NVSHMEM's symmetric heap, where
the ``nvshmem_*`` kernels run) and a protocol (``ll`` or ``simple``). The
constants live in the profile's ``cuda`` section (the shipped default's, or
one fitted by ``python -m tilecomm.tune --device cuda`` or ``--cuda-from``); ``thresholds`` turns
them into what the group's C++ side looks up per call: per peer memory, the
largest all_reduce that runs the LL kernel and the smallest that runs
two_shot. all_gather's LL kernel runs up to the whole LL buffer (its own limit,
``_backend.allgather_ll_bytes``), but an output that registers runs the push into
registered outputs from where the model prices that below LL
(``allgather_register_ll_bytes``). Above the LL limit, and for reduce_scatter,
``nvshmem_thresholds`` says from which size pull replaces push.

Where the two parts of the formula are off for one kernel, a memory's section
may carry **corrections** (``CORRECTED``: NVSHMEM's kernels, whose push and pull
the terms price alike at p = 2 and where they measure apart): per world size
and kernel, a factor on the latency part (alpha and the rounds) and one on the
bandwidth part, fitted by ``fit`` to the kernel's own times at that world size
(``fit_corrections``), as the executor's (``executor_model``). A world size
without them gets the constants alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

MEMORIES = ("cuda_ipc", "host_mapped", "nvshmem")  # index = cuda::PeerMemory
PROTOCOLS = ("ll", "simple")
LL_MAX_BYTES = 1 << 20  # the LL buffer (cuda::kLLMaxBytes)
NEVER = (1 << 64) - 1  # a threshold no message reaches
MAX_RANKS = 16  # the direct kernels' largest group (cuda::kMaxRanks)


@dataclass(frozen=True)
class Kernel:
    collective: str
    protocol: str
    rounds: Callable[[int], float]
    wire: Callable[[int], float]  # bytes moved per rank per message byte
    memory: str = ""  # the only peer memory it runs over ("": the group's cuda_ipc or host_mapped)


KERNELS = {
    # LL: one one-way trip; (p - 1) x 2n of lines written to peers (and read locally).
    "allreduce_one_shot_ll": Kernel("all_reduce", "ll", lambda p: 1, lambda p: 2 * (p - 1)),
    # stage n, one flag round, read (p - 1) x n of peers' staging buffers.
    "allreduce_one_shot": Kernel("all_reduce", "simple", lambda p: 1, lambda p: p),
    # stage n; round 1: reduce my 1/p from the peers; round 2: gather the other (p - 1)/p.
    "allreduce_two_shot": Kernel("all_reduce", "simple", lambda p: 2, lambda p: 1 + 2 * (p - 1) / p),
    "allgather_direct_ll": Kernel("all_gather", "ll", lambda p: 1, lambda p: 2 * (p - 1)),
    # (registered outputs) announce, then store (p - 1) x n into peers' outputs and n into my own.
    "allgather_push_registered": Kernel("all_gather", "simple", lambda p: 2, lambda p: p, "cuda_ipc"),
    # (n: bytes per rank's block) store (p - 1) x n into peers, own block n, copy (p - 1) x n out.
    "allgather_nvshmem_push": Kernel("all_gather", "simple", lambda p: 1, lambda p: 2 * p - 1, "nvshmem"),
    # stage n, own block n, one flag round, read (p - 1) x n of peers' staging buffers.
    "allgather_nvshmem_pull": Kernel("all_gather", "simple", lambda p: 1, lambda p: p + 1, "nvshmem"),
    # store (p - 1) x n into peers, reduce p x n locally.
    "reducescatter_nvshmem_push": Kernel("reduce_scatter", "simple", lambda p: 1, lambda p: 2 * p - 1, "nvshmem"),
    # stage (p - 1) x n, one flag round, read (p - 1) x n of peers' and n own, reduce.
    "reducescatter_nvshmem_pull": Kernel("reduce_scatter", "simple", lambda p: 1, lambda p: 2 * p - 1, "nvshmem"),
}
# Kernels TILECOMM_ALGO can force (the others follow TILECOMM_PROTO and TILECOMM_CUDA_ALLREDUCE).
FORCEABLE = {k: v for k, v in KERNELS.items() if v.memory == "nvshmem"}

# Fitted from CUDA-graph replay of the forced kernels (tune --device cuda), ranks sharing one GPU
# under MPS: four runs on an H100 80GB HBM3 (three at 2 and 4 ranks, one at 8) and one on an H200 (2
# and 4 ranks); records benchmarks/results/tune_gpu_h100_grid_{fastest,median_3,median_w8}.json,
# tune_gpu_h100_fastest_2.json, tune_gpu_h200_graph_capture.json; the fit and how it scores left out
# in turn: docs/benchmarks.md, "The CUDA model refitted on five runs". A machine whose GPUs are
# joined otherwise (NVLink between GPUs, PCIe) wants its own fit.
_GPU_MEMORY = {
    "ll": {"alpha_s": 3.46e-06, "alpha_round_s": 0.0, "alpha_peer_s": 1.18e-06, "beta_s_per_byte": 2.82e-12},
    "simple": {"alpha_s": 2.9e-06, "alpha_round_s": 1.32e-06, "alpha_peer_s": 1.22e-06, "beta_s_per_byte": 1.12e-12},
}
DEFAULT = {
    "cuda_ipc": copy.deepcopy(_GPU_MEMORY),
    "host_mapped": {
        "ll": {"alpha_s": 7.0e-06, "alpha_round_s": 0.0, "alpha_peer_s": 2.1e-06, "beta_s_per_byte": 3.5e-10},
        "simple": {"alpha_s": 4.0e-06, "alpha_round_s": 1.5e-06, "alpha_peer_s": 4.6e-06, "beta_s_per_byte": 6.3e-11},
    },
    # NVSHMEM's heap: LL's are cuda_ipc's (no LL kernel runs over the heap); simple's and the
    # corrections were fitted to CUDA-graph replay of the forced push and pull kernels, 8 B to 2 MiB
    # per rank at 2 and 4 ranks sharing one H100 under MPS (tune --device cuda; record
    # benchmarks/results/tune_gpu_h100_nvshmem_graph.json; docs/benchmarks.md, "Corrections for
    # NVSHMEM's push and pull").
    "nvshmem": {
        "ll": dict(_GPU_MEMORY["ll"]),
        "simple": {"alpha_s": 4.51e-06, "alpha_round_s": 0.0, "alpha_peer_s": 1.93e-06, "beta_s_per_byte": 1.45e-12},
        "corrections": {
            "2": {
                "allgather_nvshmem_push": {"latency": 1.052, "bandwidth": 0.663},
                "allgather_nvshmem_pull": {"latency": 0.884, "bandwidth": 0.616},
                "reducescatter_nvshmem_push": {"latency": 1.056, "bandwidth": 0.834},
                "reducescatter_nvshmem_pull": {"latency": 1.180, "bandwidth": 0.903},
            },
            "4": {
                "allgather_nvshmem_push": {"latency": 1.071, "bandwidth": 1.396},
                "allgather_nvshmem_pull": {"latency": 0.828, "bandwidth": 1.222},
                "reducescatter_nvshmem_push": {"latency": 0.999, "bandwidth": 1.736},
                "reducescatter_nvshmem_pull": {"latency": 1.114, "bandwidth": 1.776},
            },
        },
    },
}
_KEYS = ("alpha_s", "alpha_round_s", "alpha_peer_s", "beta_s_per_byte")
# Memories whose kernels get corrections: NVSHMEM's, where the threshold chooses between push and pull.
# The all_reduce thresholds over cuda_ipc and host_mapped score within the selector's targets on the
# constants alone (docs/benchmarks.md).
CORRECTED = ("nvshmem",)


def constants(profile) -> dict:
    """The profile's ``cuda`` section, completed from the shipped default where it has no entry. A
    memory's corrections come with its constants: the profile's where it has an entry for that memory
    (none if it carries none), else the default's."""
    own = (profile or {}).get("cuda", {})
    out = {}
    for m in MEMORIES:
        mine = own.get(m, {})
        out[m] = {pr: dict(mine.get(pr) or DEFAULT[m][pr]) for pr in PROTOCOLS}
        corrections = mine.get("corrections") if mine else DEFAULT[m].get("corrections")
        if corrections:
            out[m]["corrections"] = copy.deepcopy(corrections)
    return out


def correction(kernel: str, p: int, consts: dict, memory: str) -> dict | None:
    """`kernel`'s corrections at p ranks over `memory` ({"latency": f, "bandwidth": f}), or None."""
    return consts[memory].get("corrections", {}).get(str(p), {}).get(kernel)


def parts(kernel: str, p: int, nbytes: int, consts: dict, memory: str, corrected: bool = True) -> tuple[float, float]:
    """(latency, bandwidth) seconds of one call of `kernel` at p ranks over `memory` by the formula
    (constants from ``constants``), each times the kernel's correction at p where it has one and
    `corrected`."""
    k = KERNELS[kernel]
    c = consts[memory][k.protocol]
    latency = c["alpha_s"] + k.rounds(p) * (c["alpha_round_s"] + c["alpha_peer_s"] * (p - 1))
    bandwidth = k.wire(p) * nbytes * c["beta_s_per_byte"]
    f = correction(kernel, p, consts, memory) if corrected else None
    return (latency * f["latency"], bandwidth * f["bandwidth"]) if f else (latency, bandwidth)


def runs_over(memory: str) -> set[str]:
    """The kernels that run over `memory` (those of NVSHMEM's heap over it alone)."""
    return {k for k, v in KERNELS.items() if v.memory == memory or not v.memory and memory != "nvshmem"}


def predict(kernel: str, p: int, nbytes: int, consts: dict, memory: str) -> float:
    """Predicted seconds of one call of `kernel` at p ranks over `memory`: the sum of its ``parts``."""
    return sum(parts(kernel, p, nbytes, consts, memory))


_GRID = [1 << k for k in range(4, 41)]  # the sizes a crossover is placed at: 16 B to 1 TiB


def _ll_up_to(loses) -> int:
    """The last size of the grid before the first at which LL loses (loses(n)); at most the LL buffer."""
    ll = 0
    for n in _GRID:
        if n > LL_MAX_BYTES or loses(n):
            break
        ll = n
    return ll


def thresholds(profile, p: int) -> dict:
    """Per peer memory: ``ll_bytes`` (all_reduce up to this size runs LL; at most the LL buffer) and
    ``two_shot_bytes`` (from this size on the simple path runs two_shot), from the model at p ranks."""
    consts = constants(profile)
    out = {}
    for m in MEMORIES:
        def t(kernel, n, m=m):
            return predict(kernel, p, n, consts, m)

        two_shot = next((n for n in _GRID if t("allreduce_two_shot", n) < t("allreduce_one_shot", n)), NEVER)

        def simple(n, two_shot=two_shot):
            return t("allreduce_two_shot" if n >= two_shot else "allreduce_one_shot", n)

        ll = _ll_up_to(lambda n, t=t, simple=simple: t("allreduce_one_shot_ll", n) > simple(n))
        out[m] = {"ll_bytes": ll, "two_shot_bytes": two_shot}
    return out


def allgather_register_ll_bytes(profile, p: int) -> int:
    """The largest all_gather (bytes per rank) at which LL is predicted no slower than the push into
    registered outputs over GPU memory at p ranks (the last such size of the grid; at most the LL
    buffer). Above it, an output that registers (TILECOMM_CUDA_REGISTER_BYTES) runs the push; one that
    does not, and every all_gather over host_mapped (where nothing registers), keeps LL up to its limit:
    their alternatives (NVSHMEM's kernels, the schedule executor) are not priced against LL."""
    consts = constants(profile)

    def t(kernel, n):
        return predict(kernel, p, n, consts, "cuda_ipc")

    return _ll_up_to(lambda n: t("allgather_push_registered", n) < t("allgather_direct_ll", n))


def nvshmem_thresholds(profile, p: int) -> dict:
    """``all_gather_pull_bytes`` and ``reduce_scatter_pull_bytes``: from which size (bytes per rank's block)
    the pull kernel's prediction at p ranks is below push's at that size and every larger one of the
    grid (0: at every size, down to none; NEVER: not at 1 TiB)."""
    consts = constants(profile)
    out = {}
    for coll, short in (("all_gather", "allgather"), ("reduce_scatter", "reducescatter")):
        def t(kind, n, short=short):
            return predict(f"{short}_nvshmem_{kind}", p, n, consts, "nvshmem")

        # With corrections, pull may win below a crossover and lose above it; one threshold cannot say
        # that, and the larger sizes, where the times differ most, keep push then.
        loses = [n for n in (0, *_GRID) if t("pull", n) >= t("push", n)]
        out[f"{coll}_pull_bytes"] = next((n for n in _GRID if n > loses[-1]), NEVER) if loses else 0
    return out


def check(section, where: str):
    """Raises ValueError unless `section` is a valid ``cuda`` profile section (entries may be missing)."""
    if not isinstance(section, dict):
        raise ValueError(f"{where}: expected an object")
    for m, per_proto in section.items():
        if m not in MEMORIES or not isinstance(per_proto, dict):
            raise ValueError(f"{where}: {m!r} is not one of {', '.join(MEMORIES)} with an object")
        for pr, c in per_proto.items():
            at = f"{where}.{m}.{pr}"
            if pr == "corrections":
                check_corrections(c, at, runs_over(m), MAX_RANKS)
                continue
            if pr not in PROTOCOLS or not isinstance(c, dict):
                raise ValueError(f"{at}: expected a protocol ({', '.join(PROTOCOLS)}) with an object")
            check_constants(c, _KEYS, at)


def check_corrections(corrections, at: str, names, max_world: int):
    """Raises ValueError unless `corrections` is {"<world size of 1 to max_world>": {"<one of `names`>":
    {"latency": f, "bandwidth": f}}} with finite factors > 0 (a factor of 0 would price the algorithm
    at nothing). The CUDA kernels' and the schedule executor's corrections both have this shape."""
    if not isinstance(corrections, dict):
        raise ValueError(f"{at}: expected an object")
    worlds = {str(p) for p in range(1, max_world + 1)}
    for world, per in corrections.items():
        if world not in worlds or not isinstance(per, dict):
            raise ValueError(f"{at}: key {world!r} is not a world size of 1 to {max_world} with an object")
        for name, c in per.items():
            if name not in names or not isinstance(c, dict):
                raise ValueError(f"{at}.{world}: {name!r} is not an algorithm of this section with an object")
            check_constants(c, ("latency", "bandwidth"), f"{at}.{world}.{name}")
            if not min(c["latency"], c["bandwidth"]) > 0:
                raise ValueError(f"{at}.{world}.{name}: factors must be > 0")


def check_constants(c: dict, keys, at: str):
    """Raises ValueError unless every key of `keys` in `c` is a finite number >= 0."""
    for key in keys:
        v = c.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 or v == float("inf"):
            raise ValueError(f"{at}.{key}: expected a finite number >= 0, got {v!r}")


def is_time(v) -> bool:
    """Whether a record's value is a time (a positive number; failures are strings)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def kernel_time(record, key: str, memory: str):
    """The time (µs) of `key` ("<collective>:<entry>") in a ``tilecomm.gpu_points`` record that the fit
    and the scores use: the CUDA-graph time; for NVSHMEM's kernels the eager one where the record has no
    graph time (gpu_points.NVSHMEM_GROUPS says why). None where neither is a time."""
    for timing in ("graph", "eager") if memory == "nvshmem" else ("graph",):
        v = record.get(f"{key}:{timing}")
        if is_time(v):
            return v
    return None


def samples(records) -> list[tuple[str, str, int, int, float]]:
    """(memory, kernel, p, bytes, seconds) of every time of a forced kernel in ``tilecomm.gpu_points``
    records (each names, per entry, the kernel that ran and its memory), as kernel_time picks it. The
    ``auto`` entries are left out (they validate the fit), and so is ``ll_system_fence`` (a comparison
    with other settings)."""
    out = []
    for r in records:
        for key, kernel in r.get("kernels", {}).items():
            entry = key.split(":", 1)[1]
            if entry.removeprefix("hm_") in ("auto", "ll_system_fence"):
                continue
            memory = r.get("memory", {}).get(entry)
            v = kernel_time(r, key, memory)
            if kernel in KERNELS and memory in MEMORIES and v is not None:
                out.append((memory, kernel, int(r["world"]), int(r["bytes"]), float(v) * 1e-6))
    return out


def fit(records, base=None) -> tuple[dict, list[str]]:
    """Least-squares constants (relative error) per (memory, protocol) from gpu_latency records; entries
    without enough points keep `base`'s (the shipped default). Returns (cuda section, warnings)."""
    import numpy as np  # noqa: PLC0415

    from tilecomm.fit import bounded_lstsq, chooses_worse, errors  # noqa: PLC0415

    consts, notes = constants({"cuda": base or {}}), []
    current = copy.deepcopy(consts)
    pts = samples(records)
    for m in MEMORIES:
        for pr in PROTOCOLS:
            rows = [(k, p, n, t) for mm, k, p, n, t in pts if mm == m and KERNELS[k].protocol == pr]
            if len({(p, n) for _, p, n, _ in rows}) < 3 or len({p for _, p, _, _ in rows}) < 2:
                notes.append(f"cuda {m} {pr}: {len(rows)} point(s) over fewer than 2 world sizes; kept the defaults")
                continue
            A = np.array([[1.0, KERNELS[k].rounds(p), KERNELS[k].rounds(p) * (p - 1), KERNELS[k].wire(p) * n]
                          for k, p, n, _ in rows])
            t = np.array([r[3] for r in rows])
            # One number of rounds (LL: always 1) cannot tell alpha from alpha_round: alpha_round stays 0.
            cols = [0, 2, 3] if len(set(A[:, 1])) == 1 else [0, 1, 2, 3]
            x = np.zeros(len(_KEYS))
            x[cols] = bounded_lstsq(A[:, cols] / t[:, None], np.ones_like(t), [0.0] * len(cols))
            consts[m][pr] = dict(zip(_KEYS, (float(v) for v in x)))
            err = errors(A @ x, t)
            consts[m][pr]["fit"] = {"points": err["points"], "median_error": err["median"], "worst_error": err["worst"]}
        # Constants whose thresholds choose worse on the very points they were fitted to are not taken.
        worse = chooses_worse(regret, records, m, current, consts, ("cuda", "thresholds"))
        if worse:
            notes.append(worse)
            consts[m] = current[m]
        if m not in CORRECTED:
            continue
        worlds = {str(p) for mm, _, p, _, _ in pts if mm == m}
        consts[m].setdefault("corrections", {})
        if any(consts[m][pr] != current[m][pr] for pr in PROTOCOLS):  # they belonged to the old constants
            dropped = sorted(set(consts[m]["corrections"]) - worlds, key=int)
            if dropped:
                notes.append(f"cuda {m}: new constants; the corrections at world size(s) {', '.join(dropped)} "
                             "belonged to the old ones and are dropped (tune at those sizes to fit them again)")
            consts[m]["corrections"] = {w: c for w, c in consts[m]["corrections"].items() if w in worlds}
        notes += fit_corrections(pts, consts, m)
    return consts, notes


def fit_corrections(pts, consts: dict, memory: str) -> list[str]:
    """Fits, into ``consts[memory]["corrections"]``, each kernel's factors on ``parts`` at every world
    size of `pts` (``samples``) over `memory` (fit.fit_corrections), replacing those. Returns warnings."""
    import warnings  # noqa: PLC0415

    from tilecomm import fit as fitting  # noqa: PLC0415

    by: dict = {}
    for m, k, p, n, t in pts:
        if m == memory:
            by.setdefault((p, k), []).append((*parts(k, p, n, consts, m, corrected=False), t))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fitting.FitWarning)
        for (p, k), rows in sorted(by.items()):
            c, _ = fitting.fit_corrections(rows, f"cuda {memory} world {p} {k}")
            consts[memory]["corrections"].setdefault(str(p), {})[k] = c
    return [str(w.message) for w in caught]


def regret(records, consts: dict) -> dict:
    """{(memory, world): [(bytes, CUDA-graph time of the all_reduce kernel that the constants' thresholds
    pick / the fastest of ll, one_shot and two_shot)]} over records where all three were measured over
    one memory (the one each record names for its entries, as ``samples`` reads it); `consts` is a
    ``cuda`` section."""
    out, limits = {}, {}
    for r in records:
        p, n = int(r["world"]), int(r["bytes"])
        for prefix in ("", "hm_"):
            entries = {k: prefix + k for k in ("ll", "one_shot", "two_shot")}
            memory = {r.get("memory", {}).get(e) for e in entries.values()}
            times = {k: r.get(f"all_reduce:{e}:graph") for k, e in entries.items()}
            if len(memory) != 1 or not all(isinstance(v, (int, float)) and v > 0 for v in times.values()):
                continue
            m = memory.pop()
            t = limits.setdefault(p, thresholds({"cuda": consts}, p)).get(m)
            if t is None or m == "nvshmem":  # no all_reduce kernel of these runs over NVSHMEM
                continue
            chosen = "ll" if n <= t["ll_bytes"] else "two_shot" if n >= t["two_shot_bytes"] else "one_shot"
            out.setdefault((m, p), []).append((n, times[chosen] / min(times.values())))
    return out
