"""Direct gather: every rank sends its block straight to the root.

One round; the root receives p-1 blocks concurrently. Cost: 1 round, (p-1)/p of
the buffer into the root, nothing reduced. Simple and latency-optimal; the
root's link is the bottleneck for large blocks.
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "gather"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, p)
    s.add_round(0, [recv(v, v) for v in range(1, p)])
    for v in range(1, p):
        s.add_round(v, [send(0, v)])
    return s
