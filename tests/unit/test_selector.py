"""tilecomm.selector: TILECOMM_ALGO parsing and the per-size decision tables."""

import pytest

from tilecomm import algorithms, selector


def ids(*names):
    return {algorithms.by_name(n).collective: n for n in names}


def test_empty_spec():
    assert selector.parse_forced("") == {}
    assert selector.parse_forced("   ") == {}
    assert selector.parse_forced(";;") == {}


def test_bare_short_name_applies_to_every_collective_that_has_it():
    got = selector.parse_forced("ring")
    assert got == {a.collective: a.name for a in algorithms.ALGORITHMS if a.short == "ring"}
    assert got["all_reduce"] == "allreduce_ring"
    assert got["all_gather"] == "allgather_ring"
    assert got["reduce_scatter"] == "reducescatter_ring"


def test_bare_name_for_one_collective():
    assert selector.parse_forced("rabenseifner") == ids("allreduce_rabenseifner")


def test_bare_name_applies_to_every_collective_that_has_it():
    got = selector.parse_forced("recursive_doubling")
    assert got == ids("allreduce_recursive_doubling", "allgather_recursive_doubling")


def test_full_ids():
    assert selector.parse_forced("allreduce_ring") == ids("allreduce_ring")
    assert selector.parse_forced("allreduce_ring;broadcast_binomial_tree") == ids(
        "allreduce_ring", "broadcast_binomial_tree"
    )


def test_per_collective():
    got = selector.parse_forced("all_reduce:recursive_doubling;all_gather:ring")
    assert got == ids("allreduce_recursive_doubling", "allgather_ring")
    assert selector.parse_forced(" all_reduce : allreduce_ring ; ") == ids("allreduce_ring")


def test_per_collective_overrides_only_its_collective():
    got = selector.parse_forced("ring;all_reduce:recursive_doubling")
    assert got["all_reduce"] == "allreduce_recursive_doubling"
    assert got["all_gather"] == "allgather_ring"


def test_every_algorithm_can_be_forced_by_either_name():
    for a in algorithms.ALGORITHMS:
        assert selector.parse_forced(a.name)[a.collective] == a.name
        assert selector.parse_forced(f"{a.collective}:{a.short}")[a.collective] == a.name
        assert selector.parse_forced(f"{a.collective}:{a.name}")[a.collective] == a.name


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown algorithm 'nope'") as e:
        selector.parse_forced("nope")
    for a in algorithms.ALGORITHMS:
        assert a.name in str(e.value) and a.short in str(e.value)


def test_unknown_collective_lists_collectives():
    with pytest.raises(ValueError, match="unknown collective 'allreduce'") as e:
        selector.parse_forced("allreduce:ring")
    for c in algorithms.COLLECTIVES:
        assert c in str(e.value)


def test_inapplicable_name_lists_the_collectives_algorithms():
    with pytest.raises(ValueError, match="broadcast has no algorithm 'ring'") as e:
        selector.parse_forced("broadcast:ring")
    for a in algorithms.for_collective("broadcast"):
        assert a.short in str(e.value)


def _check_table(table, collective):
    assert table, collective
    prev = -1
    for max_bytes, aid in table:
        assert max_bytes > prev, f"{collective}: table not increasing: {table}"
        prev = max_bytes
        assert algorithms.ALGORITHMS[aid].collective == collective
    assert table[0][0] >= 0
    assert table[-1][0] == selector.MAX_BYTES == 2**64 - 1
    # Neighbouring entries pick different algorithms (ranges are merged).
    for (_, a), (_, b) in zip(table, table[1:]):
        assert a != b


def lookup(table, nbytes):
    for max_bytes, aid in table:
        if nbytes <= max_bytes:
            return algorithms.ALGORITHMS[aid].name
    raise AssertionError("table does not cover %d" % nbytes)


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"])
def test_small_sizes_pick_fewest_rounds_large_sizes_fewest_bytes(coll, p):
    """Latency-optimal for tiny messages, bandwidth-optimal for huge ones (from the cost terms)."""
    prof = selector.DEFAULT_PROFILE
    table = selector.build_table(coll, p, {})
    terms = {a.name: selector.terms(a, p) for a in algorithms.for_collective(coll)}
    small = terms[lookup(table, 1)]
    assert small.rounds == min(t.rounds for t in terms.values())

    def per_byte(t):
        return t.wire * prof["beta_s_per_byte"] + t.reduced * prof["gamma_s_per_byte"]

    large = terms[lookup(table, 1 << 40)]
    assert per_byte(large) == pytest.approx(min(per_byte(t) for t in terms.values()))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 13, 16])
def test_tables_cover_all_sizes_monotonically(p):
    tables = selector.build_tables(p, {})
    assert set(tables) == set(algorithms.COLLECTIVES)
    for coll, table in tables.items():
        _check_table(table, coll)


def test_forced_table_is_one_entry():
    forced = selector.parse_forced("all_reduce:ring")
    tables = selector.build_tables(8, forced)
    assert tables["all_reduce"] == [(selector.MAX_BYTES, algorithms.by_name("allreduce_ring").id)]
    _check_table(tables["all_gather"], "all_gather")


def test_predict_is_linear_in_the_terms():
    t = selector.terms(algorithms.by_name("allreduce_ring"), 4)
    prof = {"alpha_s": 1.0, "beta_s_per_byte": 10.0, "gamma_s_per_byte": 100.0}
    pr = selector.predict(t, 8, prof)
    assert pr.latency_s == pytest.approx(t.rounds)
    assert pr.bandwidth_s == pytest.approx(t.wire * 8 * 10)
    assert pr.reduction_s == pytest.approx(t.reduced * 8 * 100)
    assert pr.total_s == pytest.approx(pr.latency_s + pr.bandwidth_s + pr.reduction_s)
