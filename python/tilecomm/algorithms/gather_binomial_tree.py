"""Binomial-tree gather: subtrees collect their contiguous block ranges, then pass them up.

Relative to the root (vrank 0), vrank v's subtree is vranks [v, v + lowbit(v)) (clipped to p),
so its blocks are one contiguous range. Vrank v receives the ranges of its children v + 1,
v + 2, v + 4, .. in that order (one round each, smallest first: the order they complete in),
then sends its whole range to its parent v - lowbit(v). Cost: ceil(log2 p) rounds, up to half
the buffer sent by one rank (vrank 2^(k-1) forwards its subtree), nothing reduced. The root
takes log2 p messages instead of p-1: wins where per-message cost or incast at the root
dominates (many ranks, small blocks).
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "gather"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, p)
    for v in range(p):
        low = v & -v if v > 0 else 1 << p.bit_length()  # the root's subtree is everything
        end = min(v + low, p)
        step = 1
        while step < low and v + step < p:
            # round: receive the blocks of the subtree of child v + step, [v + step, v + 2 step).
            s.add_round(v, [recv(v + step, v + step, min(v + 2 * step, p))])
            step *= 2
        if v > 0:
            # last round: send our subtree's blocks [v, end) to the parent.
            s.add_round(v, [send(v - low, v, end)])
    return s
