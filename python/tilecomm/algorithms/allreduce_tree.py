"""Pipelined binary-tree all-reduce: reduce up a binary tree, broadcast down, over K = 8 chunks.

Rank x's children are 2x+1 and 2x+2. Chunk t is reduced from the first child, then from the last
one while the sum is forwarded to the parent as it lands (dep); final chunk t goes back down as
it lands, so a rank's round mixes chunks of both directions. Cost: K+1..K+3 rounds per rank, each
a chain of forwards up to 2 depth long (2K+2 latencies at p = 3, 4K+5 at p = 16); inner ranks
send the buffer up once and down twice (3x wire) and reduce it twice. K = 8: the pipeline fills
in ~3 rounds at any depth, and chunks stay >= one 64 KiB slot from 512 KiB up. Wins where
per-link bandwidth and log depth count (many ranks, large messages); on one host Rabenseifner
copies less. One fixed reduction tree, results copied down: bitwise identical on all ranks.
"""

from collections import defaultdict

from tilecomm.schedule import Schedule, recv, recv_reduce, send

COLLECTIVE = "all_reduce"

K = 8  # pipeline chunks, see the docstring


def schedule(p):
    def children(x):
        return [c for c in (2 * x + 1, 2 * x + 2) if c < p]

    # Rank x sends partial chunk t up in round t + up[x], the round its last child's share lands
    # (its first child's lands one round earlier). Rank x receives final chunk t in round
    # t + down[x]: for the root's children the round after they sent it, below them the same round.
    up, down = {0: 0}, {}
    order = [0]
    for x in order:
        kids = children(x)
        for i, c in enumerate(kids):
            up[c] = up[x] - (len(kids) - 1 - i)
            down[c] = up[c] + 1 if x == 0 else down[x]
        order += kids

    # events[x][round]: rank x's ops in that round, keyed by name so that deps can name them.
    events = defaultdict(lambda: defaultdict(dict))
    for x in order:
        kids = children(x)
        parent = (x - 1) // 2
        for t in range(K):
            for c in kids:
                # round t + up[c]: reduce chunk t from child c (first child a round before the last).
                events[x][t + up[c]][("in", c)] = (recv_reduce, c, t, None)
            if x:
                # round t + up[x]: send partial chunk t up as the last child's share lands.
                events[x][t + up[x]][("up",)] = (send, parent, t, ("in", kids[-1]) if kids else None)
                # round t + down[x]: receive final chunk t from the parent ...
                events[x][t + down[x]][("down",)] = (recv, parent, t, None)
            for c in kids:
                # ... and forward it to each child as it lands. The root sends it to its first child
                # as the last child's share lands, to its last child one round later.
                dep = ("down",) if x else (("in", kids[-1]) if down[c] == up[kids[-1]] else None)
                events[x][t + down[c]][("out", c)] = (send, c, t, dep)

    s = Schedule.empty(p, K)
    for x in range(p):
        for rnd in (events[x][k] for k in sorted(events[x])):
            names = list(rnd)
            s.add_round(x, [f(peer, t, dep=names.index(dep) if dep else -1) for f, peer, t, dep in rnd.values()])
    return s
