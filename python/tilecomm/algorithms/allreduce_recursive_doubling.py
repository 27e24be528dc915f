"""Recursive-doubling all-reduce, with the standard fold for non-powers of two.

With q = 2^floor(log2 p) and e = p - q extra ranks: first each of ranks
0, 2, .., 2e-2 hands its whole buffer to its odd neighbour, which reduces it;
then q ranks exchange and reduce whole buffers with partners at distance
1, 2, 4, ..; finally the odd neighbours hand the result back. Cost: log2(q)
rounds (+2 when p is not a power of two), the whole buffer on the wire and
reduced every round. Latency-optimal: wins for small messages. op(a, b) equals
op(b, a) bit for bit, so partners end identical.
"""

from tilecomm.schedule import Fold, Schedule, recv, recv_reduce, send

COLLECTIVE = "all_reduce"


def schedule(p):
    s = Schedule.empty(p, 1)
    f = Fold(p)
    q = f.q
    for r in range(p):
        if f.folded_out(r):
            # fold: hand the buffer to the odd neighbour, get the result back at the end.
            s.add_round(r, [send(r + 1, 0)])
            s.add_round(r, [recv(r + 1, 0)])
            continue
        if f.paired(r):
            s.add_round(r, [recv_reduce(r - 1, 0)])
        v = f.vrank(r)
        # round k: exchange whole buffers with the partner at distance 2^k and reduce.
        dist = 1
        while dist < q:
            partner = f.real(v ^ dist)
            s.add_round(r, [send(partner, 0), recv_reduce(partner, 0, dep=0)])
            dist *= 2
        if f.paired(r):
            s.add_round(r, [send(r - 1, 0)])
    return s
