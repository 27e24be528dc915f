"""Binomial-tree reduce to the root.

Relative to the root (vrank 0), vrank v reduces the buffers of its children
v + 1, v + 2, v + 4, .. below its lowest set bit (one round each, in that fixed order, so the result does
not depend on arrival order), then sends the sum to its parent. Cost:
ceil(log2 p) rounds on the critical path, the whole buffer on every edge and
reduced once per child.
"""

from tilecomm.schedule import Schedule, recv_reduce, send

COLLECTIVE = "reduce"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, 1)
    for v in range(p):
        low = v & -v if v > 0 else p  # children are v + 2^k for 2^k < low
        step = 1
        while step < low and v + step < p:
            # round: reduce the subtree rooted at child v + step
            s.add_round(v, [recv_reduce(v + step, 0)])
            step *= 2
        if v > 0:
            s.add_round(v, [send(v - low, 0)])
    return s
