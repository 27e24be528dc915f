"""tilecomm.selector: TILECOMM_ALGO parsing and the per-size decision tables."""

import json

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
        return t.wire * prof["links"]["shm"]["beta_s_per_byte"] + t.reduced * prof["gamma_s_per_byte"]["float32"]

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
    prof = {"links": {"shm": {"alpha_s": 1.0, "beta_s_per_byte": 10.0}}, "gamma_s_per_byte": {"float32": 100.0}}
    pr = selector.predict(t, 8, prof)
    assert pr.latency_s == pytest.approx(t.rounds)
    assert pr.bandwidth_s == pytest.approx(t.wire * 8 * 10)
    assert pr.reduction_s == pytest.approx(t.reduced * 8 * 100)
    assert pr.total_s == pytest.approx(pr.latency_s + pr.bandwidth_s + pr.reduction_s)


# Profiles: link classes, gamma per dtype, per-algorithm corrections ---------------------------------

PROFILE = {
    "links": {"shm": {"alpha_s": 2.0, "beta_s_per_byte": 10.0}, "tcp": {"alpha_s": 50.0, "beta_s_per_byte": 80.0}},
    "gamma_s_per_byte": {"float32": 100.0, "float16": 300.0, "default": 200.0},
    "corrections": {"4": {"allreduce_ring": {"latency": 0.5, "bandwidth": 3.0}}},
}


def test_default_profile_follows_the_schema():
    selector.check_profile(selector.DEFAULT_PROFILE)
    prof = selector.DEFAULT_PROFILE
    assert prof["links"]["shm"] == {"alpha_s": 4e-6, "beta_s_per_byte": 1 / 2.0e9}
    assert prof["gamma_s_per_byte"]["float32"] == prof["gamma_s_per_byte"]["default"] == 1 / 2.0e9
    assert selector.link_constants(prof) == (4e-6, 1 / 2.0e9)


def test_predict_uses_the_link_class_the_dtype_and_the_corrections():
    ring = algorithms.by_name("allreduce_ring")
    t = selector.terms(ring, 4)
    plain = selector.predict(t, 8, PROFILE)
    assert (plain.latency_s, plain.bandwidth_s, plain.reduction_s) == pytest.approx(
        (t.rounds * 2.0, t.wire * 8 * 10.0, t.reduced * 8 * 100.0)
    )
    half = selector.predict(t, 8, PROFILE, dtype="float16")
    assert half.reduction_s == pytest.approx(t.reduced * 8 * 300.0)
    other = selector.predict(t, 8, PROFILE, dtype="int64")  # not listed: "default"
    assert other.reduction_s == pytest.approx(t.reduced * 8 * 200.0)
    # Every message over TCP (TILECOMM_TRANSPORT=tcp): that class's alpha and beta throughout.
    far = selector.terms(ring, 4, domains=[0, 1, 2, 3])
    assert (far.remote_rounds, far.remote_wire) == (far.rounds, far.wire) == (t.rounds, t.wire)
    tcp = selector.predict(far, 8, PROFILE)
    assert (tcp.latency_s, tcp.bandwidth_s) == pytest.approx((t.rounds * 50.0, t.wire * 8 * 80.0))
    # Two hosts of two: ranks 1 -> 2 and 3 -> 0 cross, and every ring step waits for one of them.
    mixed = selector.terms(ring, 4, domains=[0, 0, 1, 1])
    assert (mixed.remote_rounds, mixed.remote_wire) == (t.rounds, t.wire)
    # Hierarchical: 2 of its 4 steps cross hosts, with half a segment's bytes.
    hier = selector.terms(algorithms.by_name("allreduce_hierarchical"), 4, (0, 0, 1, 1), (0, 0, 1, 1))
    assert (hier.rounds, hier.remote_rounds, hier.wire, hier.remote_wire) == (4, 2, 1.5, 0.5)
    ph = selector.predict(hier, 8, PROFILE)
    assert ph.latency_s == pytest.approx(2 * 2.0 + 2 * 50.0)
    assert ph.bandwidth_s == pytest.approx(1.0 * 8 * 10.0 + 0.5 * 8 * 80.0)
    corrected = selector.predict(t, 8, PROFILE, algo="allreduce_ring", world=4)
    assert corrected.latency_s == pytest.approx(0.5 * plain.latency_s)
    assert corrected.bandwidth_s == pytest.approx(3.0 * plain.bandwidth_s)
    assert corrected.reduction_s == pytest.approx(3.0 * plain.reduction_s)
    assert selector.predict_algo(ring, 4, 8, PROFILE) == corrected
    # Corrections are per world size and algorithm: none fitted means none applied.
    assert selector.predict(t, 8, PROFILE, algo="allreduce_ring", world=8) == plain
    assert selector.predict(t, 8, PROFILE, algo="allreduce_tree", world=4) == plain


def test_unknown_link_class_is_an_error():
    with pytest.raises(ValueError, match="no link class 'ib'"):
        selector.link_constants(PROFILE, "ib")


def test_a_profile_without_tcp_uses_the_default_tcp_constants():
    shm_only = {k: v for k, v in PROFILE.items() if k != "links"} | {"links": {"shm": PROFILE["links"]["shm"]}}
    assert selector.link_constants(shm_only, "tcp") == selector.link_constants(selector.DEFAULT_PROFILE, "tcp")
    assert "tcp (default's)" in selector.describe_profile(shm_only)


def test_gamma_without_default_falls_back_to_float32():
    assert selector.gamma({"gamma_s_per_byte": {"float32": 7.0}}, "bfloat16") == 7.0


def _winner_everywhere(coll, p, profile):
    return {algorithms.ALGORITHMS[aid].name for _, aid in selector.build_table(coll, p, {}, profile)}


def test_corrections_change_the_decision_table():
    prof = json.loads(json.dumps(selector.DEFAULT_PROFILE))
    base = _winner_everywhere("all_reduce", 8, prof)
    assert "allreduce_tree" not in base
    # Make the tree a hundred times cheaper than the model says, at world 8 only.
    prof["corrections"] = {"8": {"allreduce_tree": {"latency": 0.01, "bandwidth": 0.01}}}
    assert _winner_everywhere("all_reduce", 8, prof) == {"allreduce_tree"}
    assert _winner_everywhere("all_reduce", 4, prof) == _winner_everywhere("all_reduce", 4, selector.DEFAULT_PROFILE)


def test_table_uses_the_float32_gamma():
    prof = json.loads(json.dumps(selector.DEFAULT_PROFILE))
    prof["gamma_s_per_byte"]["float16"] = 1.0  # absurdly slow: would change every decision if used
    assert selector.build_tables(8, {}, prof) == selector.build_tables(8, {})


def test_lookup_and_ranges_follow_the_table():
    table = selector.build_table("all_reduce", 8, {})
    ranges = selector.table_ranges(table)
    assert ranges[0][0] == 0 and ranges[-1][1] is None
    for (lo, hi, algo), (max_bytes, aid) in zip(ranges, table):
        assert algo.id == aid
        assert selector.lookup(table, lo).id == aid
        if hi is not None:
            assert hi == max_bytes and selector.lookup(table, hi).id == aid
    for (_, hi, _), (lo, _, _) in zip(ranges, ranges[1:]):
        assert lo == hi + 1


def test_describe_profile_names_the_source_and_constants():
    line = selector.describe_profile(selector.DEFAULT_PROFILE)
    assert "default (shipped)" in line and "alpha 4 us" in line and "none" in line
    prof = dict(PROFILE, name="mine")
    line = selector.describe_profile(prof, "/x/p.json")
    assert "mine (from /x/p.json)" in line and "world sizes 4" in line


def test_forced_cuda_kernels_go_under_cuda_keys():
    both = {"cuda:all_gather": "nvshmem_push", "cuda:reduce_scatter": "nvshmem_push"}
    assert selector.parse_forced("nvshmem_push") == both
    assert selector.parse_forced("all_gather:nvshmem_pull") == {"cuda:all_gather": "nvshmem_pull"}
    assert selector.parse_forced("all_gather:allgather_nvshmem_pull;all_reduce:ring") == {
        "cuda:all_gather": "nvshmem_pull", "all_reduce": "allreduce_ring"}
    with pytest.raises(ValueError, match="broadcast has no algorithm 'nvshmem_push'"):
        selector.parse_forced("broadcast:nvshmem_push")
    with pytest.raises(ValueError, match="valid for all_gather: .*nvshmem_pull"):
        selector.parse_forced("all_gather:nvshmem_sideways")
    # CPU tables do not see the CUDA entries: all_gather keeps its priced table
    forced = selector.parse_forced("nvshmem_pull")
    assert selector.build_table("all_gather", 4, forced) == selector.build_table("all_gather", 4, {})
