"""Two-level all-reduce: reduce-scatter inside each host, all-reduce of the slices across hosts, all-gather inside each host.

Host h with g_h ranks cuts the buffer into g_h parts, and local rank j owns part j.
1. A ring reduce-scatter inside each host leaves part j reduced over the host on
   local rank j.
2. The buffer is cut where any host's parts are cut; each resulting segment has
   one owner per host, and those H owners all-reduce it with a ring (segments
   are processed in buffer order, so a rank that owns several runs them one
   after the other).
3. A ring all-gather inside each host spreads the parts.
Hosts may hold unequal numbers of ranks; on one host phase 2 is empty and the
algorithm is a ring all-reduce, with one rank per host it is a ring across
hosts. Cost with G ranks on each of H hosts: 2(G-1) + 2(H-1) rounds; inter-host
traffic per rank is 2(H-1)/(H G) of the buffer, 1/G of what a flat ring sends
across the host boundary. Every element is reduced along one fixed path and then
copied, so all ranks end bitwise identical.
"""

from math import lcm

from tilecomm.schedule import Schedule, recv, recv_reduce, send

COLLECTIVE = "all_reduce"
TOPOLOGY = True  # schedule(p, layout): layout[r] is rank r's host index


def hosts_of(p, layout):
    """Ranks of each host, hosts in order of their lowest rank."""
    layout = tuple(layout) if layout is not None else (0,) * p
    if len(layout) != p:
        raise ValueError(f"layout names {len(layout)} ranks, expected {p}")
    order = sorted(set(layout), key=layout.index)
    return [[r for r in range(p) if layout[r] == h] for h in order]


def _ring_allreduce(s, ranks, lo, hi):
    """Ring all-reduce of chunks [lo, hi) among `ranks` (hi - lo divisible by their number)."""
    n = len(ranks)
    sub = (hi - lo) // n

    def rng(c):
        c %= n
        return lo + c * sub, lo + (c + 1) * sub

    for i, r in enumerate(ranks):
        right, left = ranks[(i + 1) % n], ranks[(i - 1) % n]
        for k in range(n - 1):
            s.add_round(r, [send(right, *rng(i - k)), recv_reduce(left, *rng(i - k - 1))])
        for k in range(n - 1):
            s.add_round(r, [send(right, *rng(i + 1 - k)), recv(left, *rng(i - k))])


def schedule(p, layout=None):
    members = hosts_of(p, layout)
    nhosts = len(members)
    # Every host's part boundaries fall on chunk boundaries, and every segment
    # between them splits evenly among the hosts.
    nchunks = lcm(*(len(m) for m in members)) * nhosts if p else 1
    s = Schedule.empty(p, nchunks)

    def part(g, j):
        j %= g
        return j * nchunks // g, (j + 1) * nchunks // g

    for m in members:  # 1. ring reduce-scatter inside each host
        g = len(m)
        for j, r in enumerate(m):
            for k in range(g - 1):
                s.add_round(r, [send(m[(j + 1) % g], *part(g, j - k - 1)), recv_reduce(m[(j - 1) % g], *part(g, j - k - 2))])
    if nhosts > 1:  # 2. across hosts, one ring per segment among its owners
        cuts = sorted({j * nchunks // len(m) for m in members for j in range(len(m))} | {nchunks})
        for lo, hi in zip(cuts, cuts[1:]):
            owners = [m[lo * len(m) // nchunks] for m in members]
            _ring_allreduce(s, owners, lo, hi)
    for m in members:  # 3. ring all-gather inside each host
        g = len(m)
        for j, r in enumerate(m):
            for k in range(g - 1):
                s.add_round(r, [send(m[(j + 1) % g], *part(g, j - k)), recv(m[(j - 1) % g], *part(g, j - k - 1))])
    return s
