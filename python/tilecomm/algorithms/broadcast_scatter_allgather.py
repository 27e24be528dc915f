"""Broadcast as a scatter from the root followed by a ring all-gather.

Relative to the root (vrank 0): the root sends chunk v to vrank v in one round,
then p-1 ring rounds circulate the chunks. Cost: p rounds, about 2(p-1)/p of the
buffer on the busiest link instead of the whole buffer per tree level. Wins for
large messages (van de Geijn).
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "broadcast"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, p)
    # round 0: the root hands chunk v to vrank v.
    s.add_round(0, [send(v, v) for v in range(1, p)])
    for v in range(1, p):
        s.add_round(v, [recv(0, v)])
    for v in range(p):
        # round k: send chunk v-k right, receive chunk v-k-1 from the left.
        for k in range(p - 1):
            s.add_round(v, [send((v + 1) % p, (v - k) % p), recv((v - 1) % p, (v - k - 1) % p)])
    return s
