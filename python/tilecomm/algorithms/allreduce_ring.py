"""Ring all-reduce: a ring reduce-scatter, then a ring all-gather.

The buffer is cut into p chunks. In p-1 rounds each rank sends one chunk to its
right neighbour and reduces the chunk arriving from its left; then in p-1 more
rounds the reduced chunks travel once around the ring. Cost: 2(p-1) rounds,
2(p-1)/p of the buffer on the wire per rank, (p-1)/p reduced. Bandwidth-optimal:
wins for large messages. Every chunk is reduced along one fixed path and then
copied, so all ranks end bitwise identical.
"""

from tilecomm.schedule import Schedule, recv, recv_reduce, send

COLLECTIVE = "all_reduce"


def schedule(p):
    s = Schedule.empty(p, p)
    for r in range(p):
        right, left = (r + 1) % p, (r - 1) % p
        # round k: send chunk r-k right, reduce chunk r-k-1 from the left.
        for k in range(p - 1):
            s.add_round(r, [send(right, (r - k) % p), recv_reduce(left, (r - k - 1) % p)])
        # round k: forward reduced chunk r+1-k right, take chunk r-k from the left.
        for k in range(p - 1):
            s.add_round(r, [send(right, (r + 1 - k) % p), recv(left, (r - k) % p)])
    return s
