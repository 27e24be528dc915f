"""Pipelined chain broadcast: vrank 0 -> 1 -> .. -> p-1, forwarding every slice as it lands.

Relative to the root (vrank 0), vrank v receives the buffer from v-1 and sends it to v+1 in
the same round, the send bounded by the receive (dep), so the engine forwards each slot-sized
slice as soon as it arrives. Cost: p-1 message latencies, the whole buffer sent once by every
rank but the last, nothing reduced. Every rank sends and receives the buffer at most once:
wins for large messages, where the binomial tree's root sends it log2 p times.
"""

from tilecomm.schedule import Schedule, recv, send

COLLECTIVE = "broadcast"
ROOTED = True


def schedule(p):
    s = Schedule.empty(p, 1)
    for v in range(p):
        ops = []
        if v > 0:
            ops.append(recv(v - 1, 0))
        if v + 1 < p:
            ops.append(send(v + 1, 0, dep=0 if v > 0 else -1))
        # round 0: receive from v-1 and forward each slice to v+1 as it lands.
        s.add_round(v, ops)
    return s
