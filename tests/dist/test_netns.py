"""Two ranks in separate network namespaces joined by a veth pair: real TCP
between distinct addresses, the listener on the interface TILECOMM_SOCKET_IFNAME
names, then the link cut mid-job (every rank must time out naming the other).

Needs root and `ip` (creates and removes its namespaces); skipped elsewhere.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import tilecomm

    rank, addr0, port, ifname = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    os.environ.update(TILECOMM_HOSTNAME=f"host{rank}", TILECOMM_SOCKET_IFNAME=ifname)
    dist.init_process_group("tilecomm", init_method=f"tcp://{addr0}:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    out = {"topology": str(tilecomm.topology())}
    for n in (0, 1, 1001, 3_000_001):
        x = torch.arange(n, dtype=torch.float32) + rank
        dist.all_reduce(x)
        assert torch.equal(x, 2 * torch.arange(n, dtype=torch.float32) + 1), n
    parts = [torch.empty(5, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(parts, torch.full((5,), rank))
    assert [int(p[0]) for p in parts] == [0, 1]
    t = torch.full((7,), 10 + rank)
    if rank == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
        assert int(t[0]) == 10
    out["stats"] = tilecomm.stats()
    short = dist.new_group(backend="tilecomm", timeout=timedelta(seconds=4))
    dist.barrier()
    # Cut the link (rank 0 owns one end); no FIN or RST reaches anyone.
    if rank == 0:
        subprocess.run(["ip", "link", "set", ifname, "down"], check=True)
    else:
        time.sleep(0.5)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=short)
        out["error"] = None
    except Exception as e:
        out["error"] = str(e)
    out["elapsed"] = time.monotonic() - t0
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)
    """
)


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@pytest.fixture
def namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    ns = [f"tcns{tag}a", f"tcns{tag}b"]
    dev = [f"tcv{tag}a", f"tcv{tag}b"]
    net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    addrs = [f"{net}.1", f"{net}.2"]
    try:
        _ip("netns", "add", ns[0])
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    try:
        _ip("netns", "add", ns[1])
        _ip("link", "add", dev[0], "type", "veth", "peer", "name", dev[1])
        for i in range(2):
            _ip("link", "set", dev[i], "netns", ns[i])
            _ip("-n", ns[i], "addr", "add", f"{addrs[i]}/24", "dev", dev[i])
            _ip("-n", ns[i], "link", "set", dev[i], "up")
            _ip("-n", ns[i], "link", "set", "lo", "up")
        yield ns, dev, addrs
    finally:
        for n in ns:
            _ip("netns", "del", n, check=False)


def test_two_namespaces_over_veth(namespaces, tmp_path):
    ns, dev, addrs = namespaces
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = 29500 + os.getpid() % 1000
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILECOMM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    procs = [
        subprocess.Popen(["ip", "netns", "exec", ns[r], sys.executable, str(script), str(r), addrs[0], str(port),
                          dev[r]], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    results = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"rank {r} hung")
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"rank {r} failed:\n{err[-3000:]}"
        results.append(json.loads(lines[0][len("RESULT "):]))
    for r, res in enumerate(results):
        assert "TCP" in res["topology"], res
        assert res["stats"]["tcp"]["bytes_sent"] >= 4 * 3_000_001 and res["stats"]["shm"]["bytes_sent"] == 0, res
        other = 1 - r
        assert res["error"] is not None and "timed out" in res["error"] and f"rank {other}" in res["error"], res
        assert res["elapsed"] < 4 + 3, res
