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


class Fold:
    """The standard fold of p ranks onto q = 2^floor(log2 p), for the recursive algorithms.

    The first 2e ranks (e = p - q) pair up: each even one hands its data to its odd
    neighbour and sits out; the odd ones and the ranks from 2e on form the q
    "virtual" ranks 0..q-1. Virtual rank v owns blocks [first_block(v), first_block(v + 1)).
    """

    def __init__(self, p: int):
        self.q = 1 << (p.bit_length() - 1)
        self.extra = p - self.q

    def folded_out(self, r: int) -> bool:
        """r hands its data to r + 1 and waits for the result."""
        return r < 2 * self.extra and r % 2 == 0

    def paired(self, r: int) -> bool:
        """r is one of a folded pair (either side)."""
        return r < 2 * self.extra

    def vrank(self, r: int) -> int:
        return r // 2 if r < 2 * self.extra else r - self.extra

    def real(self, v: int) -> int:
        return 2 * v + 1 if v < self.extra else v + self.extra

    def first_block(self, v: int) -> int:
        return 2 * v if v <= self.extra else v + self.extra


@dataclass(frozen=True)
class CostTerms:
    """What one call costs, in units the fitted constants multiply.

    rounds: message latencies on the critical path (one alpha each).
    wire: bytes sent per byte of buffer by the busiest rank.
    reduced: bytes reduced per byte of buffer by the busiest rank.
    remote_rounds, remote_wire: the parts of rounds and wire that cross a TCP
    link (priced with that link class's alpha and beta; 0 when every peer is
    in shared memory).
    """

    rounds: int
    wire: float
    reduced: float
    remote_rounds: int = 0
    remote_wire: float = 0.0


def critical_path(schedule: Schedule, remote=None) -> tuple[int, int]:
    """Message latencies on the longest chain of dependent messages, and how
    many of them cross a remote link (``remote(i, j)``; of the chains of that
    length, the one with most remote messages).

    A message is delivered one unit after its sender is ready (its round has
    started; for a forwarding send, the receive it forwards is delivered) and
    its receiver's round has started. A round ends when its last message is
    delivered; a rank's next round starts then.
    """
    ranks = schedule.ranks
    p = len(ranks)
    # Match the n-th send from i to j with the n-th receive at j from i.
    sends: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    recvs: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    partner: dict[tuple[int, int, int], tuple[int, int, int]] = {}  # (rank, round, op) -> message key
    for r in range(p):
        count: dict[tuple[str, int], int] = {}
        for k, rnd in enumerate(ranks[r]):
            for i, op in enumerate(rnd):
                side = "s" if op.kind == SEND else "r"
                n = count.get((side, op.peer), 0)
                count[(side, op.peer)] = n + 1
                key = (r, op.peer, n) if side == "s" else (op.peer, r, n)
                (sends if side == "s" else recvs)[key] = (r, k, i)
                partner[(r, k, i)] = key
    if sends.keys() != recvs.keys():
        raise ValueError("schedule has unmatched sends or receives")

    memo_start: dict[tuple[int, int], int] = {}
    memo_msg: dict[tuple[int, int, int], int] = {}
    busy: set = set()

    def round_start(r, k):
        if k == 0:
            return (0, 0)
        if (r, k) not in memo_start:
            rnd = ranks[r][k - 1]
            memo_start[(r, k)] = max([round_start(r, k - 1)] + [delivered(partner[(r, k - 1, i)]) for i in range(len(rnd))])
        return memo_start[(r, k)]

    def delivered(key):
        if key in memo_msg:
            return memo_msg[key]
        if key in busy:
            raise ValueError("schedule deadlocks: a chain of messages waits on itself")
        busy.add(key)
        rs, ks, i = sends[key]
        rr, kr, _ = recvs[key]
        op = ranks[rs][ks][i]
        ready = delivered(partner[(rs, ks, op.dep)]) if op.dep >= 0 else round_start(rs, ks)
        t, far = max(ready, round_start(rr, kr))
        memo_msg[key] = (t + 1, far + (1 if remote is not None and remote(rs, rr) else 0))
        busy.discard(key)
        return memo_msg[key]

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 100000))
    try:
        return max((round_start(r, len(ranks[r])) for r in range(p)), default=(0, 0))
    finally:
        sys.setrecursionlimit(limit)


def cost_terms(schedule: Schedule, remote=None) -> CostTerms:
    """Reads the cost terms off a schedule (never written by hand twice).

    remote(i, j): whether ranks i and j talk over TCP (None: all shared memory).
    """
    c = schedule.nchunks
    wire = reduced = remote_wire = 0.0
    for r, rank_rounds in enumerate(schedule.ranks):
        ops = [op for rnd in rank_rounds for op in rnd]
        wire = max(wire, sum((op.hi - op.lo) / c for op in ops if op.kind == SEND))
        reduced = max(reduced, sum((op.hi - op.lo) / c for op in ops if op.kind == RECV_REDUCE))
        if remote is not None:
            far = sum((op.hi - op.lo) / c for op in ops if op.kind == SEND and remote(r, op.peer))
            remote_wire = max(remote_wire, far)
    rounds, remote_rounds = critical_path(schedule, remote)
    return CostTerms(rounds, wire, reduced, remote_rounds, remote_wire)
