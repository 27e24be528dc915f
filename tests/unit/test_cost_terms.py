"""schedule.cost_terms: the cost terms are read off the schedules."""

import pytest

from tilecomm import algorithms, selector
from tilecomm.schedule import CostTerms, Schedule, cost_terms, recv, recv_reduce, send


@pytest.mark.parametrize("p", range(2, 17))
def test_ring_allreduce(p):
    t = cost_terms(algorithms.by_name("allreduce_ring").schedule(p))
    assert t.rounds == 2 * (p - 1)
    assert t.wire == pytest.approx(2 * (p - 1) / p)
    assert t.reduced == pytest.approx((p - 1) / p)


@pytest.mark.parametrize("p,rounds", [(2, 1), (4, 2), (8, 3), (16, 4), (3, 3), (6, 4), (12, 5)])
def test_recursive_doubling_rounds(p, rounds):
    # log2(q) exchanges, +2 (fold in, hand back) when p is not a power of two.
    t = cost_terms(algorithms.by_name("allreduce_recursive_doubling").schedule(p))
    assert t.rounds == rounds
    q = 1 << (p.bit_length() - 1)
    steps = q.bit_length() - 1
    # The busiest rank reduces the whole buffer per exchange, plus the folded-in one.
    assert t.reduced == pytest.approx(steps + (1 if p != q else 0))
    if p == q:
        assert t.wire == pytest.approx(steps)  # the whole buffer every exchange


def test_recursive_doubling_p8_is_three_rounds():
    assert cost_terms(algorithms.by_name("allreduce_recursive_doubling").schedule(8)).rounds == 3


@pytest.mark.parametrize("p", range(2, 17))
def test_ring_allgather_and_reducescatter(p):
    ag = cost_terms(algorithms.by_name("allgather_ring").schedule(p))
    assert (ag.rounds, ag.wire, ag.reduced) == (p - 1, pytest.approx((p - 1) / p), 0)
    rs = cost_terms(algorithms.by_name("reducescatter_ring").schedule(p))
    assert (rs.rounds, rs.wire, rs.reduced) == (p - 1, pytest.approx((p - 1) / p), pytest.approx((p - 1) / p))


@pytest.mark.parametrize("algo", [a for a in algorithms.ALGORITHMS if not a.direct], ids=lambda a: a.name)
def test_p1_is_free(algo):
    t = cost_terms(algo.schedule(1))
    assert t == CostTerms(0, 0, 0)


@pytest.mark.parametrize("algo", [a for a in algorithms.ALGORITHMS if a.direct], ids=lambda a: a.name)
def test_direct_algorithms_declare_terms(algo):
    assert selector.terms(algo, 1).rounds == 0
    assert selector.terms(algo, 8) == algo.module.cost_terms(8)


def test_derived_from_the_schedule():
    # Round 0 moves chunks [0, 2) 0->1 and chunk 2 2->0; round 1 moves chunk 3 1->0, which 0 reduces.
    s = Schedule.empty(3, 4)
    s.add_round(0, [send(1, 0, 2), recv(2, 2)])
    s.add_round(0, [recv_reduce(1, 3)])
    s.add_round(1, [recv(0, 0, 2)])
    s.add_round(1, [send(0, 3)])
    s.add_round(2, [send(0, 2)])
    t = cost_terms(s)
    assert t.rounds == 2  # two dependent message latencies
    assert t.wire == pytest.approx(2 / 4)  # rank 0 sends the most: chunks [0, 2)
    assert t.reduced == pytest.approx(1 / 4)


def test_a_longer_chain_costs_more_rounds():
    # A chain 0 -> 1 -> 2 -> 3 in separate rounds: three latencies.
    s = Schedule.empty(4, 1)
    s.add_round(0, [send(1, 0)])
    for r in (1, 2):
        s.add_round(r, [recv(r - 1, 0)])
        s.add_round(r, [send(r + 1, 0)])
    s.add_round(3, [recv(2, 0)])
    assert cost_terms(s).rounds == 3


def test_empty_schedule():
    assert cost_terms(Schedule.empty(4, 1)) == CostTerms(0, 0, 0)


def test_selector_terms_match_cost_terms():
    for a in algorithms.ALGORITHMS:
        if not a.direct:
            assert selector.terms(a, 6) == cost_terms(a.schedule(6))
