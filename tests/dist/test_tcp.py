"""The TCP transport: every collective and point-to-point operation over TCP
(TILECOMM_TRANSPORT=tcp) and over simulated hosts (shared memory inside a host,
TCP between), traffic counters, and failures that reach a rank only over TCP.

Simulated hosts: TILECOMM_TEST_HOSTS="a,a,b" gives rank r the r-th name as
TILECOMM_HOSTNAME (harness._apply_env), so ranks with different names talk
over TCP on this one machine.
"""

import pytest

import harness
from harness import Cfg, algorithm_set_configs, spawn_ranks

TCP = (("TILECOMM_TRANSPORT", "tcp"),)


def _hosts(names):
    return (("TILECOMM_TEST_HOSTS", names),)


def _with(cfgs, extra, label):
    return [Cfg(c.world, f"{label}-{c.label}", c.env_items + extra) for c in cfgs]


# Every algorithm of every collective (one pool per algorithm set), all over TCP
# at world 3, and with shared memory and TCP mixed on unequal hosts at world 4.
BATTERY = _with(algorithm_set_configs([3]), TCP, "tcp") + _with(
    algorithm_set_configs([4]), _hosts("a,a,a,b"), "hosts3+1"
)


@pytest.mark.parametrize("cfg", BATTERY, ids=str)
def test_battery(pools, cfg):
    pools.run(cfg.world, cfg.env, "battery", timeout=300, n=101, big=5_001)


P2P = [Cfg(1, "tcp", TCP), Cfg(2, "tcp", TCP), Cfg(3, "hosts2+1", _hosts("a,b,a"))]


@pytest.mark.parametrize("cfg", P2P, ids=str)
@pytest.mark.parametrize("case", ["p2p_send_recv_tags", "p2p_isend_irecv", "p2p_any_source", "p2p_batch_ring",
                                  "p2p_tag_order", "subgroups"])
def test_point_to_point(pools, cfg, case):
    if cfg.world == 1 and case != "subgroups":
        pytest.skip("needs two ranks")
    pools.run(cfg.world, cfg.env, case)


@pytest.mark.parametrize("algo", ["ring", "rabenseifner", "hierarchical", "one_shot", "two_shot"])
def test_large_all_reduce_across_hosts(pools, algo):
    """Messages of many slots in flight per connection, every all_reduce shape of traffic."""
    env = dict(_hosts("a,a,b") + (("TILECOMM_ALGO", f"all_reduce:{algo}"),))
    pools.run(3, env, "all_reduce_large", n=1_000_003, dtype="float32")


@pytest.mark.parametrize("hosts", ["a,a,b,b", "a,a,a,a,b,b,b,b"])
def test_hierarchical_sends_a_fraction_of_ring_inter_host_bytes(pools, hosts):
    """Per rank, ring sends 2(p-1)/p of the buffer to its successor, which for the last rank of
    a host is on another host; hierarchical sends 2(H-1)/H of a 1/G segment across (G ranks per
    host, H hosts): at most 1/G of ring's busiest inter-host sender."""
    names = hosts.split(",")
    p, h = len(names), len(set(names))
    g = p // h
    n = 1 << 18
    res = pools.run(p, dict(_hosts(hosts)), "link_traffic", n=n)
    busiest = {a: max(r[a]["tcp"] for r in res) for a in ("ring", "hierarchical")}
    nbytes = 4 * n
    assert busiest["ring"] == pytest.approx(2 * (p - 1) / p * nbytes, rel=0.01), res
    assert busiest["hierarchical"] == pytest.approx(2 * (h - 1) / h * nbytes / g, rel=0.01), res
    assert busiest["hierarchical"] <= busiest["ring"] / g
    assert "TCP" in res[0]["ring"]["topology"]
    # Inside a host, hierarchical moves its bytes over shared memory.
    assert max(r["hierarchical"]["shm"] for r in res) > 0


# ---------------------------------------------------------------- failures over TCP


@pytest.mark.parametrize("env", [dict(TCP), dict(_hosts("a,b,b"))], ids=["tcp", "hosts"])
def test_dead_rank_over_tcp_is_named_quickly(env):
    """Rank 1 dies mid-collective; rank 0 reaches it only over TCP (the connection closes)."""
    res = spawn_ranks(3, "spawn_dead_rank", env=env, timeout=60, victim=1, n=3_000_001, timeout_s=20, during=True)
    for o in res:
        if o.rank == 1:
            continue
        assert o.status == "ok", o
        err = o.result["error"]
        assert err is not None and err["is_dist_backend_error"], o.result
        assert "rank 1" in err["message"], err
        assert o.result["elapsed"] < 10, o.result
        assert o.result["later"] is not None
    assert not harness.shm_segments([o.pid for o in res])


def test_late_rank_over_tcp_times_out_naming_it():
    res = spawn_ranks(2, "spawn_late_rank", env=dict(TCP), timeout=60, late=1, timeout_s=3, sleep_s=8)
    err = res[0].result["error"]
    assert err is not None and "timed out" in err["message"] and "rank 1" in err["message"], res[0]


@pytest.mark.parametrize("world,victim", [(2, 1), (3, 1)])
def test_stopped_rank_over_tcp_times_out_naming_it(world, victim):
    """SIGSTOP mid-transfer: a stopped peer keeps its connections open, so only the timeout tells.

    (The resumed victim may still complete its call: what its peers sent before they failed sits in
    its socket buffers. The group is failed for it from then on.)"""
    res = spawn_ranks(world, "spawn_stopped_rank", env=dict(TCP), timeout=60, victim=victim, n=3_000_001,
                      timeout_s=2)
    for o in res:
        assert o.status == "ok", o
        if o.rank == victim:
            continue
        err = o.result["error"]
        assert err is not None and err["is_dist_backend_error"], o.result
        assert "timed out" in err["message"] and f"rank {victim}" in err["message"], err
        assert o.result["elapsed"] < 2 + 3, o.result
    assert not harness.shm_segments([o.pid for o in res])


def test_recovery_after_a_killed_rank_over_tcp():
    """The survivors of a SIGKILL over TCP destroy the group and form a smaller one (over TCP too) that works."""
    outs = spawn_ranks(3, "spawn_recover_after_kill", env=dict(TCP), timeout=60, port2=harness.free_port(),
                       victim=1, n=3_000_001, timeout_s=10)
    assert outs[1].status == "died", outs[1]
    for o in (outs[0], outs[2]):
        assert o.status == "ok", o
        res = o.result
        assert res["error"] is not None and "rank 1" in res["error"]["message"], res
        assert res["destroy_s"] < 3 and res["segments"] == [], res
        assert res["sum_ok"] and res["gathered"] == [[0] * 3, [1] * 3], res


def test_a_rank_that_leaves_right_after_sending_delivers_everything():
    """The sender's teardown flushes and waits for the peer's acknowledgements before closing, and the
    receiver does not take the clean close for a failure while frames are still to be read."""
    res = spawn_ranks(2, "spawn_send_then_leave", env=dict(TCP), timeout=90)
    assert [(o.status, o.result) for o in res] == [("ok", True), ("ok", True)], res
