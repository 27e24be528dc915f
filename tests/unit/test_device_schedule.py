"""Every scheduled algorithm can be walked by the GPU's schedule executor (exec/device_schedule.h):
for every rank, root and world size up to the executor's 16 ranks, one host; and what it refuses."""

import pytest

from tilecomm import _C, algorithms
from tilecomm.schedule import Schedule, recv, recv_reduce, send

SCHEDULED = [a for a in algorithms.ALGORITHMS if not a.direct and a.collective != "barrier"]


@pytest.mark.parametrize("algo", SCHEDULED, ids=lambda a: a.name)
def test_every_rank_and_root(algo):
    for world in range(1, 17):
        s = algo.schedule(world, [0] * world)
        for rank in range(world):
            for root in range(world) if algo.rooted else [-1]:
                scheds = [s.for_rank(v) for v in range(world)] if algo.rooted else [s.for_rank(rank)]
                p = _C.device_program(algo.name, algo.rooted, scheds, rank, world, root)
                ops = sum(len(r) for r in s.ranks[(rank - root) % world if algo.rooted else rank])
                assert p["steps"] == ops and p["lanes"] <= 32, (algo.name, world, rank, root, p)
                if world > 1 and algo.collective != "scatter" and algo.collective != "gather":
                    assert p["rounds"] > 0, (algo.name, world, rank)


def one_rank(ops_per_round, nchunks=2):
    s = Schedule.empty(2, nchunks)
    for ops in ops_per_round:
        s.add_round(0, ops)
    return [s.for_rank(0)]


@pytest.mark.parametrize(
    "rounds, why",
    [
        ([[send(1, 0), send(1, 1)]], "two sends to one peer"),
        ([[recv(1, 0), recv_reduce(1, 1)]], "two receives from one peer"),
        ([[recv(1, 0), send(1, 1, dep=0)]], "over the same chunks"),
        ([[send(1, 0), send(1, 0, dep=0)]], "two sends"),
        ([[recv(1, 0, dep=0)]], "a dep outside its round"),
        ([[send(0, 0)]], "invalid peer"),
    ],
)
def test_refused(rounds, why):
    with pytest.raises(ValueError, match=why):
        _C.device_program("handmade", False, one_rank(rounds), 0, 2, -1)


def test_direct_algorithms_have_no_program():
    algo = algorithms.by_name("allreduce_one_shot")
    with pytest.raises(ValueError, match="no schedule"):
        _C.device_program(algo.name, False, [], 0, 2, -1)
