"""Binomial-tree scatter: each subtree receives its contiguous block range, then splits it.

Relative to the root (vrank 0), vrank v's subtree is vranks [v, v + lowbit(v)) (clipped to p),
so its blocks are one contiguous range. Vrank v receives its subtree's range from its parent
v - lowbit(v), then sends the ranges of its children .., v + 4, v + 2, v + 1 in that order (one
round each, largest first, so deep subtrees start early). Cost: ceil(log2 p) rounds, (p-1)/p of
the buffer sent by the root, nothing reduced. The root sends log2 p messages instead of p-1:
wins where per-message cost at the root dominates (many ranks, small blocks).
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "scatter"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, p)
    for v in range(p):
        low = v & -v if v > 0 else 1 << p.bit_length()  # the root's subtree is everything
        if v > 0:
            # first round: receive our subtree's blocks [v, v + low) from the parent.
            s.add_round(v, [recv(v - low, v, min(v + low, p))])
        step = low // 2
        while step >= 1:
            if v + step < p:
                # round: send child v + step the blocks of its subtree, [v + step, v + 2 step).
                s.add_round(v, [send(v + step, v + step, min(v + 2 * step, p))])
            step //= 2
    return s
