"""Ring all-gather: each block travels once around the ring.

The buffer holds p blocks, rank r's own at position r. In round k each rank
sends block r-k to its right neighbour and receives block r-k-1 from its left.
Cost: p-1 rounds, (p-1)/p of the buffer on the wire per rank, nothing reduced.
Bandwidth-optimal for large messages.
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "all_gather"


def schedule(p):
    s = Schedule.empty(p, p)
    for r in range(p):
        # round k: send block r-k right, receive block r-k-1 from the left.
        for k in range(p - 1):
            s.add_round(r, [send((r + 1) % p, (r - k) % p), recv((r - 1) % p, (r - k - 1) % p)])
    return s
