"""Pipelined binomial-tree broadcast.

Relative to the root (vrank 0), vrank v receives from v minus its highest set
bit and forwards to v + 2^k for every 2^k above that bit. Receive and forwards
share one round, so each slice is forwarded as soon as it lands. Cost:
ceil(log2 p) hops of latency, the whole buffer on every edge, nothing reduced.
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "broadcast"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, 1)
    for v in range(p):
        ops = []
        low = 1
        if v > 0:
            high = 1 << (v.bit_length() - 1)
            ops.append(recv(v - high, 0))
            low = high * 2
        # forward to children, nearest subtree last (it is the smallest)
        step = low
        children = []
        while v + step < p:
            children.append(v + step)
            step *= 2
        for c in reversed(children):
            ops.append(send(c, 0, dep=0 if v > 0 else -1))
        s.add_round(v, ops)
    return s
