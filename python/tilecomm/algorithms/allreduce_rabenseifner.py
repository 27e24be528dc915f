"""Rabenseifner all-reduce: recursive-halving reduce-scatter, then recursive-doubling all-gather.

With q = 2^floor(log2 p) and e = p - q: ranks 0, 2, .., 2e-2 first hand their buffer to their odd
neighbour, which reduces it. The q others halve: at distance q/2, .., 1 each sends the half of its
range the partner keeps and reduces the half holding its own chunk (of q); doubling at distance
1, .., q/2 then swaps the reduced chunks, and the odd neighbours hand the result back. Cost:
2 log2(q) rounds (+2 for the fold), 2(q-1)/q of the buffer on the wire and (q-1)/q reduced (+1
each for the fold). Bandwidth-optimal with logarithmic latency: wins from medium messages up.
Each chunk is reduced on one rank and copied, so all ranks end bitwise identical.
"""

from tilecomm.schedule import Fold, Schedule, recv, recv_reduce, send

COLLECTIVE = "all_reduce"


def schedule(p):
    f = Fold(p)
    q = f.q
    s = Schedule.empty(p, q)
    for r in range(p):
        if f.folded_out(r):
            # fold: hand the whole buffer to the odd neighbour ...
            s.add_round(r, [send(r + 1, 0, q)])
            # ... and take the result back at the end.
            s.add_round(r, [recv(r + 1, 0, q)])
            continue
        if f.paired(r):
            # fold: reduce the even neighbour's buffer into ours.
            s.add_round(r, [recv_reduce(r - 1, 0, q)])
        v = f.vrank(r)
        lo, hi = 0, q
        dist = q // 2
        while dist >= 1:
            partner = f.real(v ^ dist)
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if v & dist == 0 else ((mid, hi), (lo, mid))
            # round: send the half the partner keeps, reduce the half we keep (distance q/2, q/4, .., 1).
            s.add_round(r, [send(partner, *give), recv_reduce(partner, *keep)])
            lo, hi = keep
            dist //= 2
        dist = 1
        while dist < q:
            partner = f.real(v ^ dist)
            mine, theirs = v & ~(dist - 1), (v ^ dist) & ~(dist - 1)
            # round: swap reduced ranges of dist chunks with the partner at distance 1, 2, .., q/2.
            s.add_round(r, [send(partner, mine, mine + dist), recv(partner, theirs, theirs + dist)])
            dist *= 2
        if f.paired(r):
            # fold: hand the result back to the even neighbour.
            s.add_round(r, [send(r - 1, 0, q)])
    return s
