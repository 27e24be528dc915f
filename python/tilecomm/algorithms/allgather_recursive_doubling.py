"""Recursive-doubling all-gather: log2 p exchanges of doubling block ranges.

For p a power of two, in round k rank r swaps the 2^k blocks it holds with rank r ^ 2^k. Other
p, with q = 2^floor(log2 p) and e = p - q: ranks 0, 2, .., 2e-2 first send their block to their
odd neighbour; the q others then hold one or two contiguous blocks each and double over those
uneven ranges; the odd neighbours send the whole result back. Cost: log2(q) rounds (+2 for the
fold), (p-1)/p of the buffer on the wire for powers of two, else up to about 2x on the odd
neighbours (doubling plus the hand-back); nothing reduced. Latency-optimal: wins for small blocks.
"""

from tilecomm.schedule import Fold, Schedule, recv, send

COLLECTIVE = "all_gather"


def schedule(p):
    f = Fold(p)
    q = f.q
    s = Schedule.empty(p, p)
    for r in range(p):
        if f.folded_out(r):
            # fold: hand our block to the odd neighbour ...
            s.add_round(r, [send(r + 1, r)])
            # ... and take the whole result back at the end.
            s.add_round(r, [recv(r + 1, 0, p)])
            continue
        if f.paired(r):
            # fold: take the even neighbour's block.
            s.add_round(r, [recv(r - 1, r - 1)])
        v = f.vrank(r)
        dist = 1
        while dist < q:
            partner = f.real(v ^ dist)
            mine, theirs = v & ~(dist - 1), (v ^ dist) & ~(dist - 1)
            # round: swap the blocks of our dist vranks for the partner's (distance 1, 2, .., q/2).
            s.add_round(
                r,
                [
                    send(partner, f.first_block(mine), f.first_block(mine + dist)),
                    recv(partner, f.first_block(theirs), f.first_block(theirs + dist)),
                ],
            )
            dist *= 2
        if f.paired(r):
            # fold: hand the whole result back to the even neighbour.
            s.add_round(r, [send(r - 1, 0, p)])
    return s
