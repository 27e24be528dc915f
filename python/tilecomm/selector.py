"""Picks an algorithm per (collective, size) from cost terms and a profile of constants.

The predicted time of algorithm A on an n-byte buffer of dtype d is (``predict``,
the one formula; see docs/selector.md)::

    corr_lat(A) * (local_rounds * alpha_shm + remote_rounds * alpha_tcp)
      + corr_bw(A) * (local_wire * n * beta_shm + remote_wire * n * beta_tcp + reduced * n * gamma_d)

``rounds``, ``wire`` and ``reduced`` are A's own cost terms (read off its
schedule, see ``schedule.cost_terms``, or declared next to a direct algorithm),
split by the link class their messages cross (remote: TCP, between hosts or
when forced; local = total - remote); alpha and beta belong to a link class
(``shm``: shared memory on one host; ``tcp``), gamma to a dtype, and the two
corrections to A at one world size. A profile
holds those constants: the shipped default below, or one fitted on the machine
by ``python -m tilecomm.tune`` and named by ``TILECOMM_PROFILE``.

The decision table lists, per collective, size ranges and the algorithm that
wins in each; it is built once per group (by rank 0) and handed to the engine,
which only looks it up per call. Tables are by byte size alone, so they are
computed with float32's gamma whatever the dtype of a call.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass

from tilecomm import algorithms, cuda_model, executor_model
from tilecomm.schedule import CostTerms, cost_terms

log = logging.getLogger("tilecomm")

SCHEMA_VERSION = 1
LINK = "shm"  # the link class of ranks on one host; every profile has it
REMOTE_LINK = "tcp"  # between hosts; a profile without it uses the default's
TABLE_DTYPE = "float32"  # decision tables are by byte size; they use this dtype's gamma

# Shipped conservative constants for shared memory on one host.
DEFAULT_PROFILE = {
    "version": SCHEMA_VERSION,
    "name": "default (shipped)",
    "links": {
        "shm": {
            "alpha_s": 4e-6,  # per round: a flag round trip, often a context switch when ranks share cores
            "beta_s_per_byte": 1 / 2.0e9,  # copy in and out of a slot
        },
        "tcp": {
            "alpha_s": 50e-6,  # a small frame's round trip through the socket layer and the I/O thread
            "beta_s_per_byte": 1 / 1.0e9,  # loopback or a 10 Gb/s link
        },
    },
    # Element-wise reduction; "default" serves every dtype not listed.
    "gamma_s_per_byte": {"float32": 1 / 2.0e9, "default": 1 / 2.0e9},
    # {"<world size>": {"<algorithm id>": {"latency": .., "bandwidth": ..}}}; missing means 1.0.
    "corrections": {},
    # The CUDA direct kernels' constants per peer memory and protocol (cuda_model.py).
    "cuda": cuda_model.DEFAULT,
    # The GPU's schedule executor's constants per peer memory (executor_model.py).
    "cuda_executor": executor_model.DEFAULT,
}

MAX_BYTES = (1 << 64) - 1
_GRID = [0] + [1 << k for k in range(41)]  # 1 B .. 1 TiB


@dataclass(frozen=True)
class Prediction:
    latency_s: float
    bandwidth_s: float
    reduction_s: float

    @property
    def total_s(self):
        return self.latency_s + self.bandwidth_s + self.reduction_s


def terms(algo: algorithms.Algorithm, p: int, layout=None, domains=None) -> CostTerms:
    """An algorithm's cost terms at p ranks.

    layout: host index per rank, for topology-aware algorithms; domains:
    shared-memory domain per rank (ranks in different domains talk over TCP),
    None when all share memory.
    """
    remote = None if domains is None or len(set(domains)) == 1 else (lambda i, j: domains[i] != domains[j])
    if not algo.direct:
        return cost_terms(algo.schedule(p, layout), remote)
    t = algo.module.cost_terms(p)
    if remote is None:
        return t
    # A direct algorithm talks to every peer alike: the busiest rank's share of remote peers.
    far = max(sum(remote(r, q) for q in range(p) if q != r) for r in range(p)) / (p - 1)
    return dataclasses.replace(t, remote_rounds=t.rounds if far else 0, remote_wire=t.wire * far)


def link_constants(profile, link: str = LINK) -> tuple[float, float]:
    """(alpha in s per message, beta in s per byte) of a link class; a profile without
    a ``tcp`` class (fitted where there was no TCP) uses the default profile's."""
    links = profile["links"]
    if link not in links and link == REMOTE_LINK:
        links = DEFAULT_PROFILE["links"]
    if link not in links:
        raise ValueError(f"profile {profile.get('name', '?')!r} has no link class {link!r} (it has {sorted(links)})")
    return links[link]["alpha_s"], links[link]["beta_s_per_byte"]


def gamma(profile, dtype: str = TABLE_DTYPE) -> float:
    """Seconds per reduced byte of `dtype` ("float32", "bfloat16", ...); "default" covers unlisted dtypes."""
    g = profile["gamma_s_per_byte"]
    if dtype in g:
        return g[dtype]
    return g["default"] if "default" in g else g[TABLE_DTYPE]


def correction(profile, world: int | None, algo: str | None) -> tuple[float, float]:
    """(latency, bandwidth) scale factors of an algorithm at a world size; 1.0 where none was fitted."""
    if world is None or algo is None:
        return 1.0, 1.0
    c = profile.get("corrections", {}).get(str(world), {}).get(algo)
    if c is None:
        return 1.0, 1.0
    return c["latency"], c["bandwidth"]


def predict(
    t: CostTerms,
    nbytes: int,
    profile=DEFAULT_PROFILE,
    *,
    algo: str | None = None,
    world: int | None = None,
    dtype: str = TABLE_DTYPE,
) -> Prediction:
    """Predicted time of one call with cost terms `t` on an `nbytes` buffer.

    `algo` (an algorithm id such as "allreduce_ring") and `world` select the
    profile's corrections; without them the pure model is returned.
    """
    alpha, beta = link_constants(profile, LINK)
    c_lat, c_bw = correction(profile, world, algo)
    latency = (t.rounds - t.remote_rounds) * alpha
    wire = (t.wire - t.remote_wire) * nbytes * beta
    if t.remote_rounds or t.remote_wire:
        alpha_r, beta_r = link_constants(profile, REMOTE_LINK)
        latency += t.remote_rounds * alpha_r
        wire += t.remote_wire * nbytes * beta_r
    return Prediction(c_lat * latency, c_bw * wire, c_bw * t.reduced * nbytes * gamma(profile, dtype))


def predict_algo(algo: algorithms.Algorithm, p: int, nbytes: int, profile=DEFAULT_PROFILE, dtype=TABLE_DTYPE,
                 layout=None):
    """``predict`` for a registered algorithm at world size p (on hosts `layout`, one
    shared-memory domain each), with its corrections."""
    return predict(terms(algo, p, layout, layout), nbytes, profile, algo=algo.name, world=p, dtype=dtype)


def _cuda_forceable():
    """(collective, short name, id) of the CUDA kernels TILECOMM_ALGO can force (cuda_model.FORCEABLE)."""
    from tilecomm import cuda_model  # noqa: PLC0415

    return [(k.collective, name.split("_", 1)[1], name) for name, k in cuda_model.FORCEABLE.items()]


def parse_forced(spec: str) -> dict[str, str]:
    """TILECOMM_ALGO -> {collective: algorithm id}; a CUDA kernel (cuda_model.FORCEABLE) goes under
    ``"cuda:<collective>"`` by its short name (the CPU tables ignore those keys). Raises ValueError
    naming the valid choices."""
    forced: dict[str, str] = {}
    spec = spec.strip()
    if not spec:
        return forced
    cuda = _cuda_forceable()
    valid = sorted({a.short for a in algorithms.ALGORITHMS} | {a.name for a in algorithms.ALGORITHMS}
                   | {short for _, short, _ in cuda} | {name for _, _, name in cuda})
    for part in filter(None, (x.strip() for x in spec.split(";"))):
        if ":" in part:
            coll, name = (x.strip() for x in part.split(":", 1))
            if coll not in algorithms.COLLECTIVES:
                raise ValueError(f"TILECOMM_ALGO: unknown collective {coll!r}; valid: {', '.join(algorithms.COLLECTIVES)}")
            cands = algorithms.for_collective(coll)
            match = [a for a in cands if name in (a.short, a.name)]
            on_cuda = [short for c, short, full in cuda if c == coll and name in (short, full)]
            if on_cuda:
                forced[f"cuda:{coll}"] = on_cuda[0]
            elif not match:
                names = ", ".join([a.short for a in cands] + [short for c, short, _ in cuda if c == coll])
                raise ValueError(f"TILECOMM_ALGO: {coll} has no algorithm {name!r}; valid for {coll}: {names}")
            else:
                forced[coll] = match[0].name
        else:
            match = [a for a in algorithms.ALGORITHMS if part in (a.short, a.name)]
            on_cuda = [(c, short) for c, short, full in cuda if part in (short, full)]
            if not match and not on_cuda:
                raise ValueError(f"TILECOMM_ALGO: unknown algorithm {part!r}; valid: {', '.join(valid)}")
            for a in match:
                forced[a.collective] = a.name
            for c, short in on_cuda:
                forced[f"cuda:{c}"] = short
    return forced


def build_table(collective: str, p: int, forced: dict[str, str], profile=DEFAULT_PROFILE, layout=None,
                domains=None):
    """[(max_bytes, algorithm id), ...] for one collective, smallest sizes first."""
    cands = algorithms.for_collective(collective)
    if collective in forced:
        return [(MAX_BYTES, algorithms.by_name(forced[collective]).id)]
    cost = {a.id: terms(a, p, layout, domains) for a in cands}
    return cheapest_table(cands, lambda a, n: predict(cost[a.id], n, profile, algo=a.name, world=p).total_s)


def cheapest_table(cands, seconds) -> list[tuple[int, int]]:
    """[(max_bytes, algorithm id), ...]: at each size of the grid, the candidate with the least
    seconds(algorithm, nbytes) (ties: the lower id), neighbouring sizes of one winner merged."""
    table: list[tuple[int, int]] = []
    for n in _GRID:
        best = min(cands, key=lambda a: (seconds(a, n), a.id))
        if table and table[-1][1] == best.id:
            table[-1] = (n, best.id)
        else:
            table.append((n, best.id))
    table[-1] = (MAX_BYTES, table[-1][1])
    return table


def build_tables(p: int, forced: dict[str, str], profile=DEFAULT_PROFILE, layout=None, domains=None):
    return {c: build_table(c, p, forced, profile, layout, domains) for c in algorithms.COLLECTIVES}


def size_class_notes(collective: str, p: int, table, profile=DEFAULT_PROFILE, layout=None, domains=None):
    """[(max_bytes, line), ...]: per size class of the table grid (powers of two), the algorithm
    the table picks and its predicted time, for TILECOMM_DEBUG=INFO's once-per-class log."""
    notes, lo = [], 0
    for n in _GRID:
        algo = lookup(table, n)
        t = predict(terms(algo, p, layout, domains), n, profile, algo=algo.name, world=p).total_s
        notes.append((n, f"{collective} of {lo}..{n} B at world {p}: {algo.name}, predicted {t * 1e6:.3g} us at {n} B"))
        lo = n + 1
    notes.append((MAX_BYTES, notes[-1][1].replace(f"..{_GRID[-1]} B", f"..{MAX_BYTES} B")))
    return notes


def lookup(table, nbytes: int) -> algorithms.Algorithm:
    """The algorithm a decision table picks for an nbytes buffer (as the engine does)."""
    for max_bytes, aid in table:
        if nbytes <= max_bytes:
            return algorithms.ALGORITHMS[aid]
    raise ValueError(f"decision table does not cover {nbytes} bytes")


def table_ranges(table):
    """[(lo, hi or None for unbounded, algorithm), ...]: a decision table as inclusive byte ranges."""
    out, lo = [], 0
    for hi, aid in table:
        out.append((lo, None if hi == MAX_BYTES else hi, algorithms.ALGORITHMS[aid]))
        lo = hi + 1
    return out


# Profiles ------------------------------------------------------------------------------------------


def load_profile(path: str | None = None):
    """The profile in the JSON file `path`, or the shipped default when `path` is empty or None.

    Raises ValueError naming the file and what is wrong with it.
    """
    if not path:
        log.info("tilecomm: TILECOMM_PROFILE is not set; using the shipped default profile")
        return DEFAULT_PROFILE
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"profile {path!r}: cannot read it: {e.strerror or e}") from None
    try:
        profile = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"profile {path!r}: not valid JSON: {e}") from None
    check_profile(profile, f"profile {path!r}")
    return profile


def save_profile(profile, path: str):
    check_profile(profile)
    with open(path, "w") as f:
        json.dump(profile, f, indent=1, sort_keys=True)
        f.write("\n")


def check_profile(profile, where: str = "profile"):
    """Raises ValueError unless `profile` follows the schema (docs/selector.md)."""
    if not isinstance(profile, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(profile).__name__}")
    version = profile.get("version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ValueError(f"{where}: schema version {version!r} is not supported (this version reads {SCHEMA_VERSION})")
    links = _member(profile, "links", dict, where)
    if LINK not in links:
        raise ValueError(f"{where}: links has no {LINK!r} entry (the link class of ranks on one host)")
    for name, link in links.items():
        at = f"{where}: links.{name}"
        if not isinstance(link, dict):
            raise ValueError(f"{at}: expected an object")
        for key in ("alpha_s", "beta_s_per_byte"):
            _constant(link.get(key), f"{at}.{key}")
    gammas = _member(profile, "gamma_s_per_byte", dict, where)
    if TABLE_DTYPE not in gammas:
        raise ValueError(f"{where}: gamma_s_per_byte has no {TABLE_DTYPE!r} entry (decision tables use it)")
    for dtype, value in gammas.items():
        _constant(value, f"{where}: gamma_s_per_byte.{dtype}")
    if "cuda" in profile:
        cuda_model.check(profile["cuda"], f"{where}: cuda")
    if "cuda_executor" in profile:
        executor_model.check(profile["cuda_executor"], f"{where}: cuda_executor")
    corrections = profile.get("corrections", {})
    if not isinstance(corrections, dict):
        raise ValueError(f"{where}: corrections: expected an object")
    for world, per_algo in corrections.items():
        if not (world.isdigit() and int(world) >= 1):
            raise ValueError(f"{where}: corrections: key {world!r} is not a world size")
        if not isinstance(per_algo, dict):
            raise ValueError(f"{where}: corrections.{world}: expected an object")
        for algo, c in per_algo.items():
            at = f"{where}: corrections.{world}.{algo}"
            if not isinstance(c, dict):
                raise ValueError(f"{at}: expected an object")
            for key in ("latency", "bandwidth"):
                _constant(c.get(key), f"{at}.{key}")


def _member(profile, key, kind, where):
    value = profile.get(key)
    if not isinstance(value, kind) or not value:
        raise ValueError(f"{where}: missing or empty {key!r}")
    return value


def _constant(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a finite number >= 0, got {value!r}")


def describe_profile(profile, path: str | None = None) -> str:
    """One line naming a profile and its main constants (for logs and ``explain``)."""
    alpha, beta = link_constants(profile)
    alpha_r, beta_r = link_constants(profile, REMOTE_LINK)
    tcp_from = "" if REMOTE_LINK in profile["links"] else " (default's)"
    worlds = sorted(profile.get("corrections", {}), key=int)
    source = f" (from {path})" if path else ""
    return (
        f"{profile.get('name', 'unnamed')}{source}: shm alpha {alpha * 1e6:.3g} us, "
        f"beta {_gbs(beta)}; tcp{tcp_from} alpha {alpha_r * 1e6:.3g} us, beta {_gbs(beta_r)}; "
        f"float32 gamma {_gbs(gamma(profile))}, "
        f"corrections for world sizes {', '.join(worlds) if worlds else 'none'}"
    )


def _gbs(s_per_byte):
    return f"{1 / s_per_byte / 1e9:.3g} GB/s" if s_per_byte > 0 else "free"
