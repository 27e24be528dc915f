"""The algorithm registry: one module per algorithm, one line each below.

Each module defines ``COLLECTIVE`` (the collective it implements), ``ROOTED``
(whether its schedule is generated for root 0 and rotated), a docstring whose
first paragraph is its summary, and either ``schedule(p) -> Schedule`` or, for
algorithms the engine runs directly, ``DIRECT = True``. Topology-aware
algorithms set ``TOPOLOGY = True`` and take ``schedule(p, layout)``, where
``layout[r]`` is rank r's host index.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

# Order is the algorithm id; append only.
_MODULES = [
    "allreduce_ring",
    "allreduce_recursive_doubling",
    "allgather_ring",
    "reducescatter_ring",
    "broadcast_binomial_tree",
    "reduce_binomial_tree",
    "gather_direct",
    "scatter_direct",
    "alltoall_pairwise",
    "barrier_dissemination",
    "reduce_reduce_scatter_gather",
    "broadcast_scatter_allgather",
    "allreduce_rabenseifner",
    "allreduce_tree",
    "allgather_recursive_doubling",
    "allgather_direct",
    "reducescatter_recursive_halving",
    "broadcast_pipelined_chain",
    "gather_binomial_tree",
    "scatter_binomial_tree",
    "allreduce_one_shot",
    "allreduce_two_shot",
    "reducescatter_direct",
    "alltoall_direct",
    "allreduce_hierarchical",
]

# The engine's numbering of collectives (csrc/common/types.h, enum Coll).
COLLECTIVES = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "gather",
    "scatter",
    "all_to_all",
    "barrier",
]


@dataclass(frozen=True)
class Algorithm:
    id: int
    name: str  # the module's name, e.g. allreduce_ring
    short: str  # "<algo>", e.g. ring
    collective: str
    rooted: bool
    module: ModuleType

    @property
    def coll_id(self):
        return COLLECTIVES.index(self.collective)

    @property
    def direct(self):
        return getattr(self.module, "DIRECT", False)

    @property
    def summary(self):
        return (self.module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")

    @property
    def topology_aware(self):
        return getattr(self.module, "TOPOLOGY", False)

    def schedule(self, p, layout=None):
        """The schedule for p ranks; layout (host index per rank) matters only to topology-aware ones."""
        if self.topology_aware:
            return self.module.schedule(p, layout)
        return self.module.schedule(p)


def _load():
    algos = []
    for i, mod_name in enumerate(_MODULES):
        mod = importlib.import_module(f"tilecomm.algorithms.{mod_name}")
        coll = mod.COLLECTIVE
        short = mod_name.split("_", 1)[1]
        algos.append(Algorithm(i, mod_name, short, coll, getattr(mod, "ROOTED", False), mod))
    return algos


ALGORITHMS = _load()


def for_collective(collective):
    return [a for a in ALGORITHMS if a.collective == collective]


def by_name(name):
    for a in ALGORITHMS:
        if a.name == name:
            return a
    raise KeyError(name)
