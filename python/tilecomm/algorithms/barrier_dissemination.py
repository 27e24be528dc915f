"""Dissemination barrier: ceil(log2 p) rounds of empty messages.

In round k rank r signals rank r + 2^k and waits for rank r - 2^k; after the
last round every rank has heard, directly or not, from every other. Cost:
ceil(log2 p) rounds, no bytes.
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "barrier"


def schedule(p):
    s = Schedule.empty(p, 1)
    for r in range(p):
        dist = 1
        # round k: signal r + 2^k, wait for r - 2^k (empty messages).
        while dist < p:
            s.add_round(r, [send((r + dist) % p, 0, 0), recv((r - dist) % p, 0, 0)])
            dist *= 2
    return s
