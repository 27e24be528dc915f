"""Ring reduce-scatter: p-1 rounds of pass-and-reduce around the ring.

The buffer holds p blocks; rank r must end with the reduction of block r. In
round k each rank sends block r-k-1 to its right neighbour and reduces block
r-k-2 arriving from its left, so block r reaches rank r last. Cost: p-1 rounds,
(p-1)/p of the buffer on the wire and reduced per rank. Bandwidth-optimal for
large messages.
"""

from tilecomm.schedule import Schedule, recv_reduce, send

COLLECTIVE = "reduce_scatter"


def schedule(p):
    s = Schedule.empty(p, p)
    for r in range(p):
        # round k: send block r-k-1 right, reduce block r-k-2 from the left.
        for k in range(p - 1):
            s.add_round(r, [send((r + 1) % p, (r - k - 1) % p), recv_reduce((r - 1) % p, (r - k - 2) % p)])
    return s
