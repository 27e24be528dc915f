"""The algorithm registry: one module per algorithm, well formed."""

import pathlib

import pytest

from tilecomm import algorithms
from tilecomm.schedule import Schedule

ALGOS = algorithms.ALGORITHMS
ROOTED_COLLECTIVES = {"broadcast", "reduce", "gather", "scatter"}
PKG = pathlib.Path(algorithms.__file__).parent


def test_ids_are_positions_and_unique():
    assert [a.id for a in ALGOS] == list(range(len(ALGOS)))
    assert len({a.name for a in ALGOS}) == len(ALGOS)


def test_every_module_file_is_registered():
    files = {f.stem for f in PKG.glob("*.py") if not f.stem.startswith("__")}
    assert files == {a.name for a in ALGOS}


def test_every_collective_has_an_algorithm():
    for c in algorithms.COLLECTIVES:
        assert algorithms.for_collective(c), c


@pytest.mark.parametrize("algo", ALGOS, ids=lambda a: a.name)
def test_module(algo):
    mod = algo.module
    # name: the module's name, "<collective without underscores>_<short>"
    assert algo.name == mod.__name__.rsplit(".", 1)[1]
    assert mod.__name__ == f"tilecomm.algorithms.{algo.name}"
    prefix, short = algo.name.split("_", 1)
    assert short == algo.short
    assert prefix == algo.collective.replace("_", "")
    assert algorithms.by_name(algo.name) is algo
    # COLLECTIVE, ROOTED
    assert mod.COLLECTIVE in algorithms.COLLECTIVES
    assert algo.collective == mod.COLLECTIVE
    assert algo.coll_id == algorithms.COLLECTIVES.index(mod.COLLECTIVE)
    assert algo.rooted == (mod.COLLECTIVE in ROOTED_COLLECTIVES)
    # docstring summary
    assert mod.__doc__ and algo.summary.strip()
    assert "\n" not in algo.summary
    # schedule() or DIRECT
    if algo.direct:
        assert mod.DIRECT is True
        assert callable(getattr(mod, "cost_terms", None))
        assert not hasattr(mod, "schedule")
    else:
        assert callable(getattr(mod, "schedule", None))
        for p in (1, 2, 5):
            s = mod.schedule(p)
            assert isinstance(s, Schedule) and len(s.ranks) == p
