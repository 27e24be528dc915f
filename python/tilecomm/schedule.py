"""Schedules as data, and the cost terms read off them.

A schedule says, for every rank, a list of rounds; a round is a list of ops
that run concurrently. An op sends a chunk range to a peer, or receives a chunk
range from a peer and copies it or reduces it into place. Chunk ``c`` of ``C``
covers elements ``[c*n//C, (c+1)*n//C)`` of the buffer, so one schedule serves
every size. ``dep`` bounds an op by another op of the same round over the same
chunks: a forwarding send by the receive it forwards, a receive-reduce by the
send that must first read the bytes it overwrites.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEND, RECV_COPY, RECV_REDUCE = 0, 1, 2


@dataclass(frozen=True)
class Op:
    kind: int
    peer: int
    lo: int
    hi: int
    dep: int = -1

    def as_tuple(self):
        return (self.kind, self.peer, self.lo, self.hi, self.dep)


def send(peer, lo, hi=None, dep=-1):
    return Op(SEND, peer, lo, lo + 1 if hi is None else hi, dep)


def recv(peer, lo, hi=None, dep=-1):
    return Op(RECV_COPY, peer, lo, lo + 1 if hi is None else hi, dep)


def recv_reduce(peer, lo, hi=None, dep=-1):
    return Op(RECV_REDUCE, peer, lo, lo + 1 if hi is None else hi, dep)


@dataclass
class Schedule:
    """Every rank's rounds. ``ranks[r]`` is a list of rounds, each a list of Ops."""

    nchunks: int
    ranks: list[list[list[Op]]] = field(default_factory=list)

    @classmethod
    def empty(cls, p, nchunks):
        return cls(nchunks, [[] for _ in range(p)])

    def add_round(self, rank, ops):
        if ops:
            self.ranks[rank].append(list(ops))

    def for_rank(self, rank):
        """(nchunks, rounds as tuples): the form the engine takes."""
        return (self.nchunks, [[op.as_tuple() for op in rnd] for rnd in self.ranks[rank]])

    def validate(self):
        """Structural checks: peers, chunk ranges, deps. Raises ValueError."""
        p = len(self.ranks)
        for r, rounds in enumerate(self.ranks):
            for k, rnd in enumerate(rounds):
                for i, op in enumerate(rnd):
                    where = f"rank {r} round {k} op {i}"
                    if not (0 <= op.peer < p) or op.peer == r:
                        raise ValueError(f"{where}: bad peer {op.peer}")
                    if not (0 <= op.lo <= op.hi <= self.nchunks):
                        raise ValueError(f"{where}: bad chunk range [{op.lo}, {op.hi})")
                    if op.dep >= len(rnd):
                        raise ValueError(f"{where}: dep {op.dep} is outside the round")
                    if op.dep >= 0:
                        d = rnd[op.dep]
                        if op.dep == i or (d.lo, d.hi) != (op.lo, op.hi):
                            raise ValueError(f"{where}: dep must name another op over the same chunks")
                        if (op.kind == SEND) == (d.kind == SEND):
                            raise ValueError(f"{where}: dep must pair a send with a receive")


@dataclass(frozen=True)
class CostTerms:
    """What one call costs, in units the fitted constants multiply.

    rounds: message latencies on the critical path (one alpha each).
    wire: bytes sent per byte of buffer by the busiest rank.
    reduced: bytes reduced per byte of buffer by the busiest rank.
    """

    rounds: int
    wire: float
    reduced: float


def critical_path(schedule: Schedule) -> int:
    """Message latencies on the longest chain of dependent messages.

    A message is delivered one unit after both its sender's and its receiver's
    rounds have started (a forwarding send starts when the receive it forwards
    is delivered); a round ends when its last message is delivered.
    """
    ranks = schedule.ranks
    p = len(ranks)
    delivered: dict[tuple[int, int, int], int] = {}  # (src, dst, n-th message) -> time
    # Start times of the send side of each message, filled as ranks advance.
    send_start: dict[tuple[int, int, int], int] = {}
    pos = [0] * p  # next round per rank
    now = [0] * p  # start time of that round
    sent = [[0] * p for _ in range(p)]
    got = [[0] * p for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(ranks[r]):
                rnd = ranks[r][pos[r]]
                t0 = now[r]
                keys = []
                for op in rnd:
                    if op.kind == SEND:
                        key = (r, op.peer, sent[r][op.peer] + sum(1 for o in keys if o[0] == "s" and o[1] == op.peer))
                        keys.append(("s", op.peer, key))
                    else:
                        key = (op.peer, r, got[r][op.peer] + sum(1 for o in keys if o[0] == "r" and o[1] == op.peer))
                        keys.append(("r", op.peer, key))
                for op, (side, _, key) in zip(rnd, keys):
                    if side == "s" and key not in send_start:
                        send_start[key] = t0
                # A receive needs its sender to have reached the matching round.
                if any(side == "r" and key not in send_start for side, _, key in keys):
                    break
                end = t0
                times = {}
                for i, (op, (side, _, key)) in enumerate(zip(rnd, keys)):
                    if side == "r":
                        times[i] = max(t0, send_start[key]) + 1
                for i, (op, (side, _, key)) in enumerate(zip(rnd, keys)):
                    if side == "s":
                        begin = times.get(op.dep, t0) if op.dep >= 0 else t0
                        times[i] = begin + 1
                end = max([end] + list(times.values()))
                for op, (side, peer, key) in zip(rnd, keys):
                    if side == "s":
                        sent[r][peer] += 1
                    else:
                        got[r][peer] += 1
                now[r] = end
                pos[r] += 1
                progress = True
    if any(pos[r] < len(ranks[r]) for r in range(p)):
        raise ValueError("schedule deadlocks: some receive never meets its send")
    return max(now, default=0)


def cost_terms(schedule: Schedule) -> CostTerms:
    """Reads the cost terms off a schedule (never written by hand twice)."""
    c = schedule.nchunks
    wire = reduced = 0.0
    for rank_rounds in schedule.ranks:
        ops = [op for rnd in rank_rounds for op in rnd]
        wire = max(wire, sum((op.hi - op.lo) / c for op in ops if op.kind == SEND))
        reduced = max(reduced, sum((op.hi - op.lo) / c for op in ops if op.kind == RECV_REDUCE))
    return CostTerms(critical_path(schedule), wire, reduced)
