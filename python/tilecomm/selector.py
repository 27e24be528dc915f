"""Picks an algorithm per (collective, size) from cost terms and constants.

The predicted time of an algorithm is its own cost terms (read off its schedule,
see ``schedule.cost_terms``) times the constants of a profile:
``rounds * alpha + wire * n * beta + reduced * n * gamma`` for an n-byte buffer.
The decision table lists, per collective, size ranges and the algorithm that
wins in each; it is built once per group (by rank 0) and handed to the engine,
which only looks it up per call.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilecomm import algorithms
from tilecomm.schedule import CostTerms, cost_terms

# Shipped conservative constants for shared memory on one host.
DEFAULT_PROFILE = {
    "name": "default (shipped)",
    "alpha_s": 4e-6,  # per round: a flag round trip, often a context switch when ranks share cores
    "beta_s_per_byte": 1 / 2.0e9,  # copy in and out of a slot
    "gamma_s_per_byte": 1 / 2.0e9,  # element-wise reduction
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


def terms(algo: algorithms.Algorithm, p: int) -> CostTerms:
    if algo.direct:
        return algo.module.cost_terms(p)
    return cost_terms(algo.schedule(p))


def predict(t: CostTerms, nbytes: int, profile=DEFAULT_PROFILE) -> Prediction:
    return Prediction(
        t.rounds * profile["alpha_s"],
        t.wire * nbytes * profile["beta_s_per_byte"],
        t.reduced * nbytes * profile["gamma_s_per_byte"],
    )


def parse_forced(spec: str) -> dict[str, str]:
    """TILECOMM_ALGO -> {collective: algorithm id}. Raises ValueError naming the valid choices."""
    forced: dict[str, str] = {}
    spec = spec.strip()
    if not spec:
        return forced
    valid = sorted({a.short for a in algorithms.ALGORITHMS} | {a.name for a in algorithms.ALGORITHMS})
    for part in filter(None, (x.strip() for x in spec.split(";"))):
        if ":" in part:
            coll, name = (x.strip() for x in part.split(":", 1))
            if coll not in algorithms.COLLECTIVES:
                raise ValueError(f"TILECOMM_ALGO: unknown collective {coll!r}; valid: {', '.join(algorithms.COLLECTIVES)}")
            cands = algorithms.for_collective(coll)
            match = [a for a in cands if name in (a.short, a.name)]
            if not match:
                names = ", ".join(a.short for a in cands)
                raise ValueError(f"TILECOMM_ALGO: {coll} has no algorithm {name!r}; valid for {coll}: {names}")
            forced[coll] = match[0].name
        else:
            match = [a for a in algorithms.ALGORITHMS if part in (a.short, a.name)]
            if not match:
                raise ValueError(f"TILECOMM_ALGO: unknown algorithm {part!r}; valid: {', '.join(valid)}")
            for a in match:
                forced[a.collective] = a.name
    return forced


def build_table(collective: str, p: int, forced: dict[str, str], profile=DEFAULT_PROFILE):
    """[(max_bytes, algorithm id), ...] for one collective, smallest sizes first."""
    cands = algorithms.for_collective(collective)
    if collective in forced:
        return [(MAX_BYTES, algorithms.by_name(forced[collective]).id)]
    cost = {a.id: terms(a, p) for a in cands}
    table: list[tuple[int, int]] = []
    for i, n in enumerate(_GRID):
        best = min(cands, key=lambda a: (predict(cost[a.id], n, profile).total_s, a.id))
        if table and table[-1][1] == best.id:
            table[-1] = (n, best.id)
        else:
            table.append((n, best.id))
    table[-1] = (MAX_BYTES, table[-1][1])
    return table


def build_tables(p: int, forced: dict[str, str], profile=DEFAULT_PROFILE):
    return {c: build_table(c, p, forced, profile) for c in algorithms.COLLECTIVES}
