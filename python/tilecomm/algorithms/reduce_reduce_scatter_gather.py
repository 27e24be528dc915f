"""Reduce as a ring reduce-scatter followed by a direct gather to the root.

Relative to the root (vrank 0): p-1 ring rounds leave vrank v with the full
reduction of chunk v, then every vrank sends its chunk to the root in one
round. Cost: p rounds, about 2(p-1)/p of the buffer on the busiest link (the
root's), (p-1)/p reduced per rank. Spreads the reduction over all ranks: wins
over the binomial tree for large messages.
"""

from tilecomm.schedule import Schedule, recv, recv_reduce, send

COLLECTIVE = "reduce"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, p)
    for v in range(p):
        # round k: send chunk v-k-1 right, reduce chunk v-k-2 from the left (vrank v ends owning chunk v).
        for k in range(p - 1):
            s.add_round(v, [send((v + 1) % p, (v - k - 1) % p), recv_reduce((v - 1) % p, (v - k - 2) % p)])
        # last round: every chunk goes to the root.
        if v == 0:
            s.add_round(v, [recv(u, u) for u in range(1, p)])
        else:
            s.add_round(v, [send(0, v)])
    return s
