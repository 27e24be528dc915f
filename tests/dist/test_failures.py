"""Failures must be loud, fast and precise, and must not leak.

Tests that break a group run in processes of their own (harness.spawn_ranks,
every wait bounded); bad inputs, which must leave the group usable, run in the
shared pools.
"""

import re
import time

import pytest

import harness
from harness import Cfg, shm_segments, spawn_ranks


def _ok(outcomes):
    bad = [o for o in outcomes if o.status != "ok"]
    assert not bad, "\n".join(str(o) for o in bad)
    return [o.result for o in outcomes]


def _no_segments(outcomes):
    pids = [o.pid for o in outcomes]
    left = shm_segments(pids)
    assert not left, f"shared-memory segments left behind by {pids}: {left}"


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("cfg", [pytest.param(Cfg(w), id=f"bad_inputs-auto-p{w}") for w in [1, 2, 3]])
def test_bad_inputs_raise_and_leave_group_usable(pools, cfg):
    """Non-contiguous tensors, dtype mismatches, wrong list lengths, invalid roots, bad splits ..."""
    msgs = pools.run(cfg.world, cfg.env, "bad_inputs")
    for m in msgs[0].values():  # every message names the backend or the problem
        assert m


# ---------------------------------------------------------------- desync

DESYNC = {
    # kind: (world, strings every rank's message must contain)
    "all_reduce_vs_broadcast": (2, ["all_reduce", "broadcast"]),
    "count": (2, ["4 x float32", "8 x float32"]),
    "dtype": (2, ["float32", "float64"]),
    "op": (2, ["sum", "max"]),
    "all_gather_vs_all_reduce": (3, ["all_gather", "all_reduce"]),
}


@pytest.mark.parametrize("kind", list(DESYNC))
def test_desync_raises_on_every_rank(kind):
    world, must_name = DESYNC[kind]
    res = _ok(spawn_ranks(world, "spawn_desync", timeout=60, kind=kind, timeout_s=30))
    for r, out in enumerate(res):
        err = out["first"]
        assert err is not None, f"rank {r}: the mismatched collective succeeded"
        assert err["is_dist_backend_error"], f"rank {r}: {err}"
        msg = err["message"]
        assert "collective mismatch" in msg or "failed" in msg, f"rank {r}: {msg}"
        for s in must_name:
            assert s in msg, f"rank {r}: message does not name {s!r}: {msg}"
        assert out["elapsed"] < 10, f"rank {r} took {out['elapsed']:.1f} s to notice (timeout 30 s)"
        later = out["later"]
        assert later is not None and later["is_dist_backend_error"], f"rank {r}: the failed group ran more work"
        assert "failed" in later["message"], later


@pytest.mark.parametrize("world", [2, 3])
def test_desync_of_roots_is_caught_by_the_next_collective(world):
    """broadcast with root 0 on rank 0 and root 1 elsewhere.

    Ranks that only send cannot see the other side's descriptor, so the
    mismatch may pass unnoticed (by design, without a handshake); it must be
    reported by the next collective at the latest, on every rank.
    """
    res = _ok(spawn_ranks(world, "spawn_desync", timeout=60, kind="root", timeout_s=30))
    for r, out in enumerate(res):
        err = out["first"] or out["later"]
        assert err is not None and err["is_dist_backend_error"], f"rank {r}: {out}"
        assert "collective mismatch" in err["message"] and "broadcast(root=" in err["message"], err["message"]
        assert out["later"] is not None, f"rank {r}: the group ran more work after the mismatch"


# ---------------------------------------------------------------- desync under every algorithm

REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
ROOTED = {"broadcast", "reduce", "gather", "scatter"}


def _mismatches(coll):
    """(kind, rank 0's call, the other ranks' call, strings every rank's message must contain) for ``coll``."""
    other = "broadcast" if coll == "all_reduce" else "all_reduce"
    out = [("collective", {"coll": coll}, {"coll": other}, [coll + "(", other + "("])]
    if coll == "barrier":
        return out
    out.append(("count", {"coll": coll, "n": 5}, {"coll": coll, "n": 7}, []))
    out.append(("dtype", {"coll": coll, "dtype": "float32"}, {"coll": coll, "dtype": "int32"}, ["float32", "int32"]))
    if coll in REDUCING:
        out.append(("op", {"coll": coll, "op": "sum"}, {"coll": coll, "op": "max"}, ["sum", "max"]))
    if coll in ROOTED:
        out.append(("root", {"coll": coll, "root": 0}, {"coll": coll, "root": 1}, ["root=0", "root=1"]))
    return out


def _desync_matrix():
    """Every mismatch of every collective under each of its algorithms, forced: (test id, item, must_name)."""
    from tilecomm import algorithms

    return [
        (f"{a.name}-{kind}", (f"{coll}:{a.name}", mine, theirs), must_name)
        for coll in algorithms.COLLECTIVES
        for a in algorithms.for_collective(coll)
        for kind, mine, theirs, must_name in _mismatches(coll)
    ]


DESYNC_MATRIX = _desync_matrix()
DESYNC_TIMEOUT_S = 10


@pytest.fixture(scope="module", params=["shm", "tcp"])
def desync_matrix_outcomes(request):
    """All of DESYNC_MATRIX in one set of 3 processes, a fresh group per mismatch (a few seconds in all),
    over shared memory and over TCP."""
    items = [item for _, item, _ in DESYNC_MATRIX]
    env = {"TILECOMM_TRANSPORT": request.param}
    return _ok(spawn_ranks(3, "spawn_desync_matrix", env=env, timeout=300, items=items, timeout_s=DESYNC_TIMEOUT_S))


@pytest.mark.parametrize("i", range(len(DESYNC_MATRIX)), ids=[t for t, _, _ in DESYNC_MATRIX])
def test_desync_under_every_algorithm(desync_matrix_outcomes, i):
    """Rank 0 calls one thing, ranks 1 and 2 another, at the same sequence number.

    Every rank raises DistBackendError at that call or, if it only sent, at the
    next collective; the message compares the two calls of that one sequence
    number and names both sides.
    """
    _, _, must_name = DESYNC_MATRIX[i]
    for r, res in enumerate(desync_matrix_outcomes):
        out = res[i]
        err = out["first"] or out["later"]
        assert err is not None, f"rank {r}: neither the mismatched call nor the next collective raised"
        assert err["is_dist_backend_error"], f"rank {r}: {err}"
        msg = err["message"]
        assert "collective mismatch" in msg, f"rank {r}: {msg}"
        seqs = re.findall(r"as collective #(\d+)", msg)
        assert len(seqs) == 2 and seqs[0] == seqs[1], f"rank {r}: the message compares different collectives: {msg}"
        for s in must_name:
            assert s in msg, f"rank {r}: the message does not name {s!r}: {msg}"
        assert out["later"] is not None, f"rank {r}: the failed group ran more work"
        assert out["elapsed"] < DESYNC_TIMEOUT_S / 2, f"rank {r} took {out['elapsed']:.1f} s to notice"


# ---------------------------------------------------------------- dead and late ranks


@pytest.mark.parametrize(
    "world,n,during",
    [
        pytest.param(2, 4, False, id="p2-small"),
        pytest.param(3, 4, False, id="p3-small"),
        pytest.param(4, 3_000_001, False, id="p4-large"),
        pytest.param(3, 3_000_001, True, id="p3-large-mid_transfer"),
    ],
)
def test_dead_rank_is_named_quickly(world, n, during):
    timeout_s = 10
    outs = spawn_ranks(world, "spawn_dead_rank", timeout=60, victim=1, n=n, timeout_s=timeout_s, during=during)
    assert outs[1].status == "died" and outs[1].exitcode == 1, str(outs[1])
    for o in outs:
        if o.rank == 1:
            continue
        assert o.status == "ok", str(o)
        err = o.result["error"]
        assert err is not None and err["is_dist_backend_error"], f"rank {o.rank}: {err}"
        assert "rank 1" in err["message"] and "exited" in err["message"], f"rank {o.rank}: {err['message']}"
        assert o.result["elapsed"] < timeout_s / 2, f"rank {o.rank} took {o.result['elapsed']:.1f} s"
        assert o.result["later"] is not None, f"rank {o.rank}: the failed group ran more work"
        late = o.result["late_future"]
        assert late is not None and "has failed" in late["message"], f"rank {o.rank}: {late}"
    _no_segments(outs)


@pytest.mark.parametrize(
    "world,victim,n,env",
    [
        pytest.param(2, 1, 1_000_000, {}, id="p2"),
        pytest.param(3, 1, 3_000_001, {}, id="p3"),
        pytest.param(4, 2, 1_000_000, {"TILECOMM_ALGO": "ring"}, id="p4-ring"),
    ],
)
def test_stopped_rank_times_out_naming_it(world, victim, n, env):
    """``victim`` is stopped (SIGSTOP) mid-transfer: every other rank raises naming it within timeout + margin.

    Then it is resumed and must fail too; no process hangs and no segment is left behind.
    """
    timeout_s = 2
    outs = spawn_ranks(world, "spawn_stopped_rank", env=env, timeout=60, victim=victim, n=n, timeout_s=timeout_s)
    res = _ok(outs)
    for r, out in enumerate(res):
        err = out["error"]
        assert err is not None and err["is_dist_backend_error"], f"rank {r}: {err}"
        if r == victim:
            continue  # it failed after it was resumed, at whatever time
        msg = err["message"]
        named = re.search(rf"\brank {victim}\b", msg)
        assert named, f"rank {r}: the message does not name the stopped rank {victim}: {msg}"
        assert "timed out" in msg, f"rank {r}: {msg}"
        # Rank r enters 0.2 r s after rank 0, whose timeout may end it (the abort) that much sooner.
        lo = timeout_s - 0.2 * r - 0.5
        assert lo <= out["elapsed"] <= timeout_s + 3, f"rank {r}: raised after {out['elapsed']:.1f} s"
    _no_segments(outs)


@pytest.mark.parametrize(
    "world,env",
    [
        pytest.param(2, {}, id="p2"),
        pytest.param(3, {}, id="p3"),
        pytest.param(3, {"TILECOMM_ALGO": "ring"}, id="p3-ring"),
    ],
)
def test_late_rank_times_out_naming_it(world, env):
    """Rank 1 arrives 4 s late with a 2 s timeout: the others time out naming it, within timeout + margin.

    The late rank itself must fail too once it arrives (its peers have failed the group).
    """
    timeout_s, sleep_s = 2, 4
    outs = spawn_ranks(world, "spawn_late_rank", env=env, timeout=60, late=1, timeout_s=timeout_s, sleep_s=sleep_s)
    res = _ok(outs)
    for r, out in enumerate(res):
        err = out["error"]
        if r == 1:
            continue  # checked last
        assert err is not None and err["is_dist_backend_error"], f"rank {r}: {err}"
        msg = err["message"]
        assert "rank 1" in msg, f"rank {r}: the message does not name the missing rank 1: {msg}"
        assert "timed out" in msg or "failed" in msg, msg
        assert timeout_s - 0.5 <= out["elapsed"] <= timeout_s + 5, f"rank {r}: raised after {out['elapsed']:.1f} s"
    late = res[1]["error"]
    assert late is not None and late["is_dist_backend_error"], (
        f"the late rank completed its all_reduce although its peers had failed the group: {late}"
    )


@pytest.mark.parametrize(
    "any_source", [pytest.param(False, id="named_source"), pytest.param(True, id="any_source")]
)
def test_p2p_dead_peer_is_named_quickly(any_source):
    timeout_s = 6
    outs = spawn_ranks(2, "spawn_p2p_dead_peer", timeout=60, any_source=any_source, timeout_s=timeout_s)
    assert outs[1].status == "died", str(outs[1])
    assert outs[0].status == "ok", str(outs[0])
    err, elapsed = outs[0].result["error"], outs[0].result["elapsed"]
    assert err is not None and err["is_dist_backend_error"], err
    assert elapsed < timeout_s / 2, f"took {elapsed:.1f} s to notice (timeout {timeout_s} s): {err['message']}"
    assert "rank 1" in err["message"] and "exited" in err["message"], err["message"]
    _no_segments(outs)


@pytest.mark.parametrize(
    "kind", [pytest.param("p2p"), pytest.param("collective")]
)
def test_destroy_with_pending_operation(kind, tmp_path):
    """destroy_process_group returns promptly with an operation pending; the operation then fails."""
    timeout_s = 6
    outs = spawn_ranks(2, "spawn_destroy_pending", timeout=60, flag_path=str(tmp_path / "flag"), kind=kind,
                       timeout_s=timeout_s)
    res = _ok(outs)[0]
    assert res["destroy_err"] is None, res
    assert res["wait_err"] is not None and res["wait_err"]["is_dist_backend_error"], res
    assert res["destroy_s"] < 3, f"destroy_process_group took {res['destroy_s']:.1f} s (timeout {timeout_s} s)"


# ---------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "spec,names",
    [
        pytest.param("bogus", ["ring", "recursive_doubling"], id="bogus"),
        pytest.param("all_reduce:bogus", ["ring", "recursive_doubling"], id="all_reduce-bogus"),
        pytest.param("nosuchcollective:ring", ["all_reduce", "broadcast"], id="unknown_collective"),
    ],
)
def test_bad_algo_setting_fails_init_listing_valid_names(spec, names):
    """Every rank raises ValueError at init, listing the valid names (rank 0's setting is checked, then shared)."""
    import torch.distributed as dist

    # The store lives in this process, as under torchrun (see cases.spawn_init_error).
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    t0 = time.monotonic()
    res = _ok(spawn_ranks(2, "spawn_init_error", env={"TILECOMM_ALGO": spec}, timeout=60, timeout_s=20,
                          store_port=store.port))
    del store
    assert time.monotonic() - t0 < 40
    for r, out in enumerate(res):
        err = out["error"]
        assert err is not None, f"rank {r}: init succeeded with TILECOMM_ALGO={spec!r}"
        assert err["type"] == "ValueError", f"rank {r}: {err}"
        for n in names:
            assert n in err["message"], f"rank {r}: {err['message']!r} does not list {n!r}"


# ---------------------------------------------------------------- clean-up


def test_no_segments_after_destroy():
    outs = spawn_ranks(3, "spawn_lifecycle", timeout=60)
    for out in _ok(outs):
        assert out["after"] == [], out
    _no_segments(outs)


def test_no_segments_after_pool_close():
    pool = harness.Pool(3)
    try:
        pool.run("subgroups", churn=1)
        pool.run("p2p_edge_cases")
    finally:
        info = pool.close()
    assert info.get("segments") == [], info
    for reply in info["replies"]:
        assert reply[0] == "closed" and reply[1]["segments"] == [] and "destroy_error" not in reply[1], reply


def test_reinit_after_destroy():
    res = _ok(spawn_ranks(3, "spawn_reinit", timeout=60, port2=harness.free_port()))
    for out in res:
        assert out["sum"] == [3.0] * 5 and out["gathered"] == [[0.0] * 2, [1.0] * 2, [2.0] * 2], out


@pytest.mark.parametrize("victim", [pytest.param(1, id="rank1"), pytest.param(0, id="rank0_store_host")])
def test_recovery_after_a_killed_rank(victim):
    """A rank is killed (SIGKILL) mid-collective; the survivors destroy the group and form a smaller one that works."""
    outs = spawn_ranks(3, "spawn_recover_after_kill", timeout=60, port2=harness.free_port(), victim=victim,
                       n=3_000_001, timeout_s=10)
    assert outs[victim].status == "died", str(outs[victim])
    for o in outs:
        if o.rank == victim:
            continue
        assert o.status == "ok", str(o)
        res = o.result
        err = res["error"]
        assert err is not None and err["is_dist_backend_error"], f"rank {o.rank}: {err}"
        assert f"rank {victim}" in err["message"] and "exited" in err["message"], f"rank {o.rank}: {err['message']}"
        assert res["destroy_s"] < 3, f"rank {o.rank}: destroy_process_group took {res['destroy_s']:.1f} s"
        assert res["segments"] == [], f"rank {o.rank}: segments left after destroy: {res['segments']}"
        assert res["sum_ok"], f"rank {o.rank}: all_reduce on the new group is wrong"
        assert res["gathered"] == [[0] * 3, [1] * 3], f"rank {o.rank}: {res['gathered']}"
    _no_segments(outs)


# ---------------------------------------------------------------- point-to-point timeouts


def test_p2p_timeout_is_per_operation():
    """A receive posted at t=2 s and matched at t=5.5 s waited 3.5 s < the 4 s timeout: it must succeed."""
    res = _ok(spawn_ranks(2, "spawn_p2p_timeout_per_op", timeout=60, timeout_s=4))
    r0, r1 = res
    assert r0["a"] is None, f"first receive failed: {r0['a']}"
    assert r0["b"] is None, f"second receive failed: {r0['b']}"
    assert r1.get("sent"), r1
    assert r0["values"] == ([1.0] * 4, [2.0] * 4), r0["values"]


# ---------------------------------------------------------------- the harness itself


def test_harness_kills_a_hung_case():
    pool = harness.Pool(2)
    t0 = time.monotonic()
    with pytest.raises(harness.CaseFailure, match="no answer"):
        pool.run("hang", timeout=2)
    assert time.monotonic() - t0 < 15
    assert pool.broken and all(not p.is_alive() for p in pool.procs)


def test_harness_reports_the_failing_rank_without_waiting_for_the_rest(monkeypatch):
    """Rank 0 raises; rank 1 waits in a collective rank 0 never joins: fail after the grace period, not the timeout."""
    monkeypatch.setattr(harness, "ERROR_GRACE_S", 1.0)
    pool = harness.Pool(2)
    t0 = time.monotonic()
    with pytest.raises(harness.CaseFailure, match="deliberate failure on rank 0"):
        pool.run("one_rank_raises", timeout=120)
    assert time.monotonic() - t0 < 15
    assert pool.broken and all(not p.is_alive() for p in pool.procs)
