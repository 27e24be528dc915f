"""Every schedule-based algorithm, simulated for p = 1..16 ranks on numpy buffers.

The simulator (tilecomm.sim) runs under rendezvous semantics, so a schedule
that passes here finishes with any amount of buffering in the engine. Rooted
algorithms are checked for every root, with inputs laid out as the backend
lays them out. n counts elements of the whole buffer, or per block for the
blocked collectives (all_gather, reduce_scatter, gather, scatter).
"""

from types import SimpleNamespace

import numpy as np
import pytest

from tilecomm import algorithms
from tilecomm.algorithms import Algorithm
from tilecomm.schedule import Schedule, recv, recv_reduce, send
from tilecomm.sim import BLOCKED, CheckError, DeadlockError, ScheduleError, check, simulate

SCHEDULED = [a for a in algorithms.ALGORITHMS if not a.direct]
PS = range(1, 17)
SMALL = [0, 1, 7, 1001]
LARGE = 100003


def large_n(algo, p):
    # Blocked collectives hold p blocks of n: keep the whole buffer near LARGE, with odd blocks.
    return (LARGE // p) | 1 if algo.collective in BLOCKED else LARGE


CASES = [pytest.param(a, p, n, id=f"{a.name}-p{p}-n{n}") for a in SCHEDULED for p in PS for n in SMALL]
CASES += [pytest.param(a, p, large_n(a, p), id=f"{a.name}-p{p}-n{large_n(a, p)}") for a in SCHEDULED for p in PS]


@pytest.mark.parametrize("algo,p,n", CASES)
def test_schedule(algo, p, n):
    s = algo.schedule(p)
    assert len(s.ranks) == p
    s.validate()
    check(algo, p, n, np.float64, seed=p * 7919 + n)  # integer-valued: exact
    if n <= 1001:
        check(algo, p, n, np.int64, seed=p * 7919 + n + 1)


ALLREDUCE = [a for a in SCHEDULED if a.collective == "all_reduce"]


@pytest.mark.parametrize(
    "algo,p,n",
    [pytest.param(a, p, n, id=f"{a.name}-p{p}-n{n}-float32") for a in ALLREDUCE for p in PS for n in (1001,)]
    + [pytest.param(a, p, LARGE, id=f"{a.name}-p{p}-n{LARGE}-float32") for a in ALLREDUCE for p in (5, 8, 16)],
)
def test_allreduce_float32_bitwise_identical(algo, p, n):
    # Random floats: every rank must hold the same bytes (a fixed reduction order), close to the sum.
    check(algo, p, n, np.float32, random=True, seed=p)


# ---- the simulator catches what it should ----


def fake(collective, schedule, rooted=False):
    mod = SimpleNamespace(__doc__="Fake.", COLLECTIVE=collective, schedule=schedule)
    return Algorithm(999, "fake_" + collective, "fake", collective, rooted, mod)


def bufs(p, n=4):
    return [np.arange(n, dtype=np.float64) + 10 * r for r in range(p)]


def test_deadlock_is_reported():
    s = Schedule.empty(2, 1)
    for r in range(2):  # both receive first: no rank can move
        s.add_round(r, [recv(1 - r, 0)])
        s.add_round(r, [send(1 - r, 0)])
    with pytest.raises(DeadlockError, match=r"rank 0 round 0.*recv from 1"):
        simulate(s, bufs(2))


def test_rendezvous_rejects_send_before_recv_cycle():
    # With buffering this would pass; under rendezvous both sends wait for a receive that comes later.
    s = Schedule.empty(2, 1)
    for r in range(2):
        s.add_round(r, [send(1 - r, 0)])
        s.add_round(r, [recv(1 - r, 0)])
    with pytest.raises(DeadlockError):
        simulate(s, bufs(2))


def test_forwarding_cycle_is_a_deadlock():
    s = Schedule.empty(2, 1)
    for r in range(2):
        s.add_round(r, [recv(1 - r, 0), send(1 - r, 0, dep=0)])
    with pytest.raises(DeadlockError, match="forwarding"):
        simulate(s, bufs(2))


def test_mismatched_ranges_and_counts():
    s = Schedule.empty(2, 2)
    s.add_round(0, [send(1, 0)])
    s.add_round(1, [recv(0, 1)])
    with pytest.raises(ScheduleError, match="chunk ranges differ"):
        simulate(s, bufs(2))
    s = Schedule.empty(2, 1)
    s.add_round(0, [send(1, 0)])
    with pytest.raises(ScheduleError, match="receives 0"):
        simulate(s, bufs(2))


def test_unpaired_send_and_write_of_one_range():
    s = Schedule.empty(2, 1)
    for r in range(2):
        s.add_round(r, [send(1 - r, 0), recv_reduce(1 - r, 0)])  # no dep: the send could read half-reduced bytes
    with pytest.raises(ScheduleError, match="no dep pairs them"):
        simulate(s, bufs(2))


def test_overlapping_writes():
    s = Schedule.empty(3, 2)
    s.add_round(0, [recv(1, 0, 2), recv_reduce(2, 1, 2)])
    s.add_round(1, [send(0, 0, 2)])
    s.add_round(2, [send(0, 1, 2)])
    with pytest.raises(ScheduleError, match="overlapping"):
        simulate(s, bufs(3))


def test_two_sends_to_one_peer_in_a_round():
    s = Schedule.empty(2, 2)
    s.add_round(0, [send(1, 0), send(1, 1)])
    s.add_round(1, [recv(0, 0), recv(0, 1)])
    with pytest.raises(ScheduleError, match="interleave"):
        simulate(s, bufs(2))


def test_exchange_sends_data_from_round_start_and_forwarding_carries_received_data():
    s = Schedule.empty(2, 1)
    for r in range(2):
        s.add_round(r, [send(1 - r, 0), recv_reduce(1 - r, 0, dep=0)])
    out = simulate(s, [np.array([1.0, 2.0]), np.array([10.0, 20.0])])
    assert [o.tolist() for o in out] == [[11.0, 22.0], [11.0, 22.0]]
    s = Schedule.empty(3, 1)
    s.add_round(0, [send(1, 0)])
    s.add_round(1, [recv_reduce(0, 0), send(2, 0, dep=0)])
    s.add_round(2, [recv(1, 0)])
    out = simulate(s, [np.array([1.0]), np.array([2.0]), np.array([0.0])])
    assert [o.tolist() for o in out] == [[1.0], [3.0], [3.0]]


def test_wrong_result_is_caught():
    def shifted(p):  # a ring reduce-scatter that leaves block r+1 on rank r
        s = Schedule.empty(p, p)
        for r in range(p):
            for k in range(p - 1):
                s.add_round(r, [send((r + 1) % p, (r - k) % p), recv_reduce((r - 1) % p, (r - k - 1) % p)])
        return s

    with pytest.raises(CheckError, match="block"):
        check(fake("reduce_scatter", shifted), 4, 3)


def test_order_dependent_result_is_caught():
    def exchange(p):
        s = Schedule.empty(p, 1)
        for r in range(p):
            s.add_round(r, [send(1 - r, 0), recv_reduce(1 - r, 0, dep=0)])
        return s

    check(fake("all_reduce", exchange), 2, 5, np.float32, random=True)
    with pytest.raises(CheckError):
        check(fake("all_reduce", exchange), 2, 5, np.float32, random=True, op=np.subtract)


# ---- topology-aware algorithms, on host layouts ----

TOPO = [a for a in SCHEDULED if a.topology_aware]
LAYOUTS = [
    (0, 0, 1, 1),  # 2 hosts x 2
    (0, 0, 0, 0, 1, 1, 1, 1),  # 2 x 4
    (0, 1, 0, 1, 0, 1),  # interleaved ranks
    (0, 0, 0, 1, 1, 2),  # unequal hosts: 3, 2, 1
    (0, 1, 1, 1, 1, 1, 2, 2, 2),  # 1, 5, 3
    (0, 1, 2, 3, 4),  # one rank per host
    (5, 5, 3, 3, 3, 9, 9, 9, 9, 9, 9),  # arbitrary host labels
]


@pytest.mark.parametrize(
    "algo,layout,n",
    [pytest.param(a, lay, n, id=f"{a.name}-{''.join(map(str, lay))}-n{n}") for a in TOPO for lay in LAYOUTS
     for n in (0, 1, 7, 1001, 20011)],
)
def test_topology_layouts(algo, layout, n):
    p = len(layout)
    algo.schedule(p, layout).validate()
    check(algo, p, n, np.float64, seed=n + p, layout=layout)
    check(algo, p, n, np.float32, random=True, seed=n, layout=layout)  # bitwise identical on every rank


def test_hierarchical_inter_host_bytes():
    # G ranks on each of 2 hosts: the busiest rank sends at most 1/G of what a
    # flat ring's busiest rank sends across the host boundary.
    from tilecomm.schedule import cost_terms

    for g in (2, 3, 4):
        layout = (0,) * g + (1,) * g

        def across(schedule):
            return cost_terms(schedule, lambda i, j: layout[i] != layout[j]).remote_wire

        hier = across(algorithms.by_name("allreduce_hierarchical").schedule(2 * g, layout))
        ring = across(algorithms.by_name("allreduce_ring").schedule(2 * g))
        assert hier <= ring / g + 1e-12, (g, hier, ring)
        assert hier == pytest.approx(1 / g)  # 2(H-1)/(H G) of the buffer with H = 2
