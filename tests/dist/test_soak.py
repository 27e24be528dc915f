"""Soak: 8 ranks on however many cores run 10,000 random collectives (ops, sizes 0 B .. 4 MB,
dtypes, forced algorithms, random small delays), every result checked; memory (RSS), open file
descriptors and shared-memory segments stay flat between the warm-up and the end."""

import os

from harness import shm_segments, spawn_ranks

N_OPS = int(os.environ.get("TILECOMM_TEST_SOAK_OPS", "10000"))


def test_soak_8_ranks():
    outs = spawn_ranks(8, "spawn_soak", timeout=900, n_ops=N_OPS, seed=1234)
    for o in outs:
        assert o.status == "ok", str(o)
    for o in outs:
        res = o.result
        assert res["checks"] == N_OPS
        (rss0, fds0, segs0), (rss1, fds1, segs1) = res["start"], res["end"]
        # A descriptor or two may be open for a moment (the Store's connections); a leak per
        # call would show as thousands.
        assert fds1 <= fds0 + 4, f"rank {o.rank}: open file descriptors went from {fds0} to {fds1}"
        assert segs1 <= segs0, f"rank {o.rank}: shared-memory segments went from {segs0} to {segs1}"
        # Buffers of up to 4 MB come and go; a leak of one per call would show as hundreds of MB.
        assert rss1 - rss0 < 64 << 20, f"rank {o.rank}: RSS grew by {(rss1 - rss0) >> 20} MB"
    assert not shm_segments([o.result["pid"] for o in outs]), "segments left behind after destroy"
