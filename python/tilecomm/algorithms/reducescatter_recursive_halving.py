"""Recursive-halving reduce-scatter, with the standard fold for non-powers of two.

With q = 2^floor(log2 p) and e = p - q: ranks 0, 2, .., 2e-2 first hand their whole buffer to
their odd neighbour, which reduces it. The q others own one or two contiguous blocks each; at
distance q/2, .., 1 each sends the half of its range the partner owns and reduces the half it
owns; finally each odd neighbour sends the even one its block. Cost: log2(q) rounds (+2 for the
fold); (p-1)/p of the buffer on the wire and reduced for powers of two, else the whole buffer
sent by the even ranks and up to about 2.2x reduced by the odd ones. Latency-optimal: wins for
small and medium messages. The schedule fixes every block's reduction order: deterministic.
"""

from tilecomm.schedule import Fold, Schedule, recv, recv_reduce, send

COLLECTIVE = "reduce_scatter"


def schedule(p):
    f = Fold(p)
    q = f.q
    s = Schedule.empty(p, p)
    for r in range(p):
        if f.folded_out(r):
            # fold: hand the whole buffer to the odd neighbour ...
            s.add_round(r, [send(r + 1, 0, p)])
            # ... and take our reduced block back at the end.
            s.add_round(r, [recv(r + 1, r)])
            continue
        if f.paired(r):
            # fold: reduce the even neighbour's buffer into ours.
            s.add_round(r, [recv_reduce(r - 1, 0, p)])
        v = f.vrank(r)
        lo, hi = 0, q  # vranks whose blocks we still reduce
        dist = q // 2
        while dist >= 1:
            partner = f.real(v ^ dist)
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if v & dist == 0 else ((mid, hi), (lo, mid))
            # round: send the partner's half of our vranks' blocks, reduce our half (distance q/2, .., 1).
            s.add_round(
                r,
                [
                    send(partner, f.first_block(give[0]), f.first_block(give[1])),
                    recv_reduce(partner, f.first_block(keep[0]), f.first_block(keep[1])),
                ],
            )
            lo, hi = keep
            dist //= 2
        if f.paired(r):
            # fold: hand the even neighbour its reduced block.
            s.add_round(r, [send(r - 1, r - 1)])
    return s
