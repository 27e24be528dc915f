"""Direct all-gather: every rank sends its block straight to every other rank.

One round in which rank r sends block r to each of the p-1 others and receives
their blocks, all concurrently. Cost: 1 round, (p-1)/p of the buffer on the wire
per rank (the same as the ring), nothing reduced. Latency-optimal; p-1 messages
in flight per rank, so it suits small and medium blocks on few ranks.
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "all_gather"


def schedule(p):
    s = Schedule.empty(p, p)
    for r in range(p):
        others = [(r + k) % p for k in range(1, p)]
        # round 0: send block r to every peer, receive every peer's block.
        s.add_round(r, [send(u, r) for u in others] + [recv(u, u) for u in others])
    return s
