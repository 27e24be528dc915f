"""Direct scatter: the root sends every rank its block.

One round; the root sends p-1 blocks concurrently. Cost: 1 round, (p-1)/p of
the buffer out of the root, nothing reduced.
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "scatter"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, p)
    s.add_round(0, [send(v, v) for v in range(1, p)])
    for v in range(1, p):
        s.add_round(v, [recv(0, v)])
    return s
