"""A pure-Python simulator of schedules, for tests: runs every rank's rounds on numpy buffers.

``simulate(schedule, buffers)`` executes a :class:`~tilecomm.schedule.Schedule`
for p ranks, one numpy buffer each, under the strictest transport model:

* **Rendezvous.** A send and its receive complete together, and only while both
  ranks are in the rounds that hold them; nothing is buffered. Messages are
  matched first-in first-out per ordered pair of ranks (the k-th send from i to
  j is the k-th receive at j from i), and a message completes only once every
  earlier message of its pair has (or completes with it). A schedule that
  finishes here finishes with any amount of buffering.
* **Rounds.** A rank leaves a round when all of its ops have completed. If no
  rank can make progress before all have finished, :class:`DeadlockError` says
  where every rank is stuck.
* **Data.** A send carries its range as it was at the start of its round, except
  a forwarding send (``dep`` on a receive), which carries what that receive
  left there. A receive-copy overwrites its range; a receive-reduce does
  ``dst = op(dst, incoming)``. A ``dep`` between ops of one round lets both
  progress together (the engine interleaves them slice by slice), but one can
  never finish before the op it depends on.

Before running, the schedule is checked (:class:`ScheduleError`) for what the
engine would get wrong silently: sends and receives that do not pair up,
paired ops with different chunk ranges, a round in which two ops write
overlapping ranges, a round that sends a range another of its ops writes
without a ``dep`` pairing the two (the send could read half-written bytes), a
``dep`` cycle, and two ops of one round that send to (or receive from) the
same peer (the engine would interleave their slices on one FIFO channel).

``check(algorithm, p, n)`` builds inputs per the buffer conventions of the
algorithm's collective, simulates every root of a rooted algorithm, and
compares the results with the closed form (:class:`CheckError` on mismatch).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from tilecomm.schedule import RECV_COPY, RECV_REDUCE, SEND, Schedule

_KIND = {SEND: "send", RECV_COPY: "recv", RECV_REDUCE: "recv_reduce"}

# Collectives whose buffer holds p blocks (n counts elements per block).
BLOCKED = frozenset({"all_gather", "reduce_scatter", "gather", "scatter"})


class ScheduleError(ValueError):
    """The schedule is malformed or would race in the engine."""


class DeadlockError(ScheduleError):
    """No rank can make progress before every rank has finished."""


class CheckError(AssertionError):
    """The simulated result differs from the closed form."""


def _describe(op):
    arrow = "to" if op.kind == SEND else "from"
    dep = f", dep={op.dep}" if op.dep >= 0 else ""
    return f"{_KIND.get(op.kind, op.kind)} {arrow} {op.peer} chunks [{op.lo}, {op.hi}){dep}"


def _overlap(a, b):
    return max(a.lo, b.lo) < min(a.hi, b.hi)


@dataclass(frozen=True)
class _Msg:
    """One message: a send matched FIFO with its receive."""

    src: int
    s_round: int
    s_idx: int
    dst: int
    r_round: int
    r_idx: int
    prev: int  # index of the previous message on the same ordered pair, or -1


class Simulator:
    """The static analysis of one schedule, runnable on many sets of buffers."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.p = len(schedule.ranks)
        for r, rounds in enumerate(schedule.ranks):
            for k, rnd in enumerate(rounds):
                for i, op in enumerate(rnd):
                    if op.dep >= len(rnd):
                        raise ScheduleError(f"rank {r} round {k} op {i}: dep {op.dep} is not an op of the round")
        try:
            schedule.validate()
        except ValueError as e:
            raise ScheduleError(str(e)) from None
        self._check_rounds()
        self._match()

    # ---- static checks ----

    def _check_rounds(self):
        for r, rounds in enumerate(self.schedule.ranks):
            for k, rnd in enumerate(rounds):
                where = f"rank {r} round {k}"
                writes = [(i, op) for i, op in enumerate(rnd) if op.kind != SEND]
                sends = [(i, op) for i, op in enumerate(rnd) if op.kind == SEND]
                for a in range(len(writes)):
                    for b in range(a + 1, len(writes)):
                        (i, x), (j, y) = writes[a], writes[b]
                        if _overlap(x, y):
                            raise ScheduleError(
                                f"{where}: ops {i} ({_describe(x)}) and {j} ({_describe(y)}) write overlapping chunks"
                            )
                for i, s in sends:
                    for j, w in writes:
                        if _overlap(s, w) and s.dep != j and w.dep != i:
                            raise ScheduleError(
                                f"{where}: op {i} ({_describe(s)}) sends chunks that op {j} ({_describe(w)}) "
                                "writes in the same round, and no dep pairs them"
                            )
                for i, op in enumerate(rnd):
                    if op.dep >= 0 and rnd[op.dep].dep == i:
                        raise ScheduleError(f"{where}: ops {i} and {op.dep} depend on each other")
                seen = {}
                for i, op in enumerate(rnd):
                    key = (op.kind == SEND, op.peer)
                    if key in seen:
                        what = "send to" if op.kind == SEND else "receive from"
                        raise ScheduleError(
                            f"{where}: ops {seen[key]} and {i} both {what} rank {op.peer}; the engine would "
                            "interleave their slices on one FIFO channel"
                        )
                    seen[key] = i

    def _match(self):
        sends, recvs = {}, {}  # (src, dst) -> [(round, idx)]
        for r, rounds in enumerate(self.schedule.ranks):
            for k, rnd in enumerate(rounds):
                for i, op in enumerate(rnd):
                    if op.kind == SEND:
                        sends.setdefault((r, op.peer), []).append((k, i))
                    elif op.kind in (RECV_COPY, RECV_REDUCE):
                        recvs.setdefault((op.peer, r), []).append((k, i))
                    else:
                        raise ScheduleError(f"rank {r} round {k} op {i}: unknown kind {op.kind}")
        self.msgs: list[_Msg] = []
        self.msg_of = {}  # (rank, round, idx) -> message index
        ranks = self.schedule.ranks
        for pair in sorted(set(sends) | set(recvs)):
            src, dst = pair
            s_list, r_list = sends.get(pair, []), recvs.get(pair, [])
            if len(s_list) != len(r_list):
                raise ScheduleError(
                    f"rank {src} sends {len(s_list)} messages to rank {dst}, which receives {len(r_list)} from it"
                )
            prev = -1
            for (sk, si), (rk, ri) in zip(s_list, r_list):
                s, rv = ranks[src][sk][si], ranks[dst][rk][ri]
                if rv.kind not in (RECV_COPY, RECV_REDUCE):
                    raise ScheduleError(f"rank {src} round {sk} op {si} ({_describe(s)}) meets a {_KIND[rv.kind]}")
                if (s.lo, s.hi) != (rv.lo, rv.hi):
                    raise ScheduleError(
                        f"rank {src} round {sk} op {si} ({_describe(s)}) is received by rank {dst} round {rk} "
                        f"op {ri} ({_describe(rv)}): chunk ranges differ"
                    )
                m = len(self.msgs)
                self.msgs.append(_Msg(src, sk, si, dst, rk, ri, prev))
                self.msg_of[(src, sk, si)] = m
                self.msg_of[(dst, rk, ri)] = m
                prev = m

    # ---- execution ----

    def run(self, buffers, op=np.add):
        """Runs the schedule on copies of ``buffers`` (one per rank); returns the results."""
        p, sched = self.p, self.schedule
        if len(buffers) != p:
            raise ValueError(f"schedule has {p} ranks but {len(buffers)} buffers were given")
        bufs = [np.array(b, copy=True) for b in buffers]
        n = len(bufs[0]) if p else 0
        if any(len(b) != n or b.dtype != bufs[0].dtype for b in bufs):
            raise ValueError("buffers must share one length and dtype")
        C = sched.nchunks

        def elems(o):
            return o.lo * n // C, o.hi * n // C

        cur = [0] * p
        done = [False] * len(self.msgs)
        payload = {}  # message -> data a plain send captured at the start of its round

        def start_round(r):
            rnd = sched.ranks[r][cur[r]]
            for i, o in enumerate(rnd):
                if o.kind == SEND and o.dep < 0:
                    lo, hi = elems(o)
                    payload[self.msg_of[(r, cur[r], i)]] = bufs[r][lo:hi].copy()

        def round_done(r):
            return all(done[self.msg_of[(r, cur[r], i)]] for i in range(len(sched.ranks[r][cur[r]])))

        started = [-1] * p  # the last round whose sends captured their data

        def advance():
            for r in range(p):
                while cur[r] < len(sched.ranks[r]):
                    if started[r] != cur[r]:
                        started[r] = cur[r]
                        start_round(r)
                    if not round_done(r):
                        break
                    cur[r] += 1

        def dep_msg(rank, rnd_k, o):
            return self.msg_of[(rank, rnd_k, o.dep)] if o.dep >= 0 else -1

        def execute(m, stack):
            if done[m]:
                return
            if m in stack:
                raise DeadlockError(
                    "deadlock: forwarding sends wait on each other's data: "
                    + " -> ".join(self._where(x) for x in stack + [m])
                )
            msg = self.msgs[m]
            s = sched.ranks[msg.src][msg.s_round][msg.s_idx]
            rv = sched.ranks[msg.dst][msg.r_round][msg.r_idx]
            if s.dep >= 0:  # forwarding: carries what its receive left in the buffer
                d = dep_msg(msg.src, msg.s_round, s)
                execute(d, stack + [m])
                lo, hi = elems(s)
                data = bufs[msg.src][lo:hi].copy()
            else:
                data = payload.pop(m)
            lo, hi = elems(rv)
            if rv.kind == RECV_COPY:
                bufs[msg.dst][lo:hi] = data
            else:
                bufs[msg.dst][lo:hi] = op(bufs[msg.dst][lo:hi], data)
            done[m] = True

        advance()
        while any(cur[r] < len(sched.ranks[r]) for r in range(p)):
            # Messages whose both ends are in their ranks' current rounds.
            ready = set()
            for m, msg in enumerate(self.msgs):
                if not done[m] and cur[msg.src] == msg.s_round and cur[msg.dst] == msg.r_round:
                    ready.add(m)
            # Keep those whose deps and FIFO predecessors finish before or with them.
            changed = True
            while changed:
                changed = False
                for m in list(ready):
                    msg = self.msgs[m]
                    need = [msg.prev]
                    need.append(dep_msg(msg.src, msg.s_round, sched.ranks[msg.src][msg.s_round][msg.s_idx]))
                    need.append(dep_msg(msg.dst, msg.r_round, sched.ranks[msg.dst][msg.r_round][msg.r_idx]))
                    if any(d >= 0 and not done[d] and d not in ready for d in need):
                        ready.discard(m)
                        changed = True
            if not ready:
                raise DeadlockError(self._deadlock(cur, done))
            for m in sorted(ready):
                execute(m, [])
            advance()
        return bufs

    def _where(self, m):
        msg = self.msgs[m]
        return f"rank {msg.src} round {msg.s_round} op {msg.s_idx} -> rank {msg.dst} round {msg.r_round} op {msg.r_idx}"

    def _deadlock(self, cur, done):
        lines = ["deadlock: no rank can make progress"]
        sched = self.schedule
        for r in range(self.p):
            if cur[r] >= len(sched.ranks[r]):
                lines.append(f"  rank {r}: finished")
                continue
            waits = []
            for i, o in enumerate(sched.ranks[r][cur[r]]):
                m = self.msg_of[(r, cur[r], i)]
                if done[m]:
                    continue
                msg = self.msgs[m]
                peer_round = msg.r_round if o.kind == SEND else msg.s_round
                pc = cur[o.peer]
                if pc == peer_round:
                    why = "both ends are in place, but it waits for a dep or an earlier message between them"
                else:
                    there = "finished" if pc >= len(sched.ranks[o.peer]) else f"in round {pc}"
                    why = f"matched in rank {o.peer}'s round {peer_round}, but rank {o.peer} is {there}"
                waits.append(f"op {i} ({_describe(o)}): {why}")
            lines.append(f"  rank {r} round {cur[r]}: " + "; ".join(waits))
        return "\n".join(lines)


def simulate(schedule: Schedule, buffers, op=np.add):
    """Runs ``schedule`` on copies of ``buffers`` (one numpy array per rank) and returns the results."""
    return Simulator(schedule).run(buffers, op)


# ---- checking algorithms against the closed form ----


def _algorithm(algorithm):
    from tilecomm import algorithms

    return algorithms.by_name(algorithm) if isinstance(algorithm, str) else algorithm


def _data(rng, shape, dtype, random):
    dtype = np.dtype(dtype)
    if random:
        if dtype.kind == "f":
            return rng.standard_normal(shape).astype(dtype)
        return rng.integers(-(2**20), 2**20, shape).astype(dtype)
    return rng.integers(-1000, 1000, shape).astype(dtype)


def _garbage(rank, shape, dtype):
    # Distinct from any input and any reduction of inputs (and per rank), so a missed write shows.
    return np.full(shape, 10**6 + rank, dtype)


def _same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def run_collective(algorithm, inputs, root=0, op=np.add, sim=None):
    """Simulates one call as the backend makes it, with real ranks' buffers.

    ``inputs[r]`` is real rank r's schedule buffer laid out as the backend lays
    it out (for rooted algorithms the blocks of gather/scatter sit in vrank
    order). Rooted algorithms run on vranks ``(r - root) mod p``. Returns real
    ranks' buffers.
    """
    algo = _algorithm(algorithm)
    p = len(inputs)
    sim = sim or Simulator(algo.schedule(p))
    if not algo.rooted:
        return sim.run(inputs, op)
    vin = [inputs[(v + root) % p] for v in range(p)]
    vout = sim.run(vin, op)
    return [vout[(r - root) % p] for r in range(p)]


def check(algorithm, p, n, dtype=np.float64, *, roots=None, op=np.add, seed=0, random=False, layout=None):
    """Simulates ``algorithm`` for p ranks and checks the result against the closed form.

    n counts elements of the whole buffer for all_reduce, broadcast and reduce,
    and elements per block for the blocked collectives (all_gather,
    reduce_scatter, gather, scatter; their buffer holds p blocks). Rooted
    algorithms are checked for every root in ``roots`` (default: all). Data is
    integer-valued unless ``random`` (then floats are normal, compared with a
    tolerance). Every rank that should hold the result must hold bitwise
    identical bytes. ``layout`` (host index per rank) is passed to
    topology-aware algorithms. Raises CheckError, ScheduleError or DeadlockError.
    """
    algo = _algorithm(algorithm)
    if algo.direct:
        raise ValueError(f"{algo.name} is run directly by the engine; it has no schedule to simulate")
    dtype = np.dtype(dtype)
    sim = Simulator(algo.schedule(p, layout))
    if len(sim.schedule.ranks) != p:
        raise CheckError(f"{algo.name}: schedule({p}) has {len(sim.schedule.ranks)} ranks")
    rng = np.random.default_rng(seed)
    coll = algo.collective
    if roots is None:
        roots = range(p) if algo.rooted else [0]
    exact = not (random and dtype.kind in "fc")

    def agree(got, want, what):
        if got.shape != want.shape:
            raise CheckError(f"{what}: shape {got.shape}, expected {want.shape}")
        if exact:
            ok = np.array_equal(got, want)
        else:
            ok = np.allclose(got, want, rtol=1e-4, atol=1e-4 * p)
        if not ok:
            bad = np.flatnonzero(got != want) if exact else np.flatnonzero(~np.isclose(got, want, 1e-4, 1e-4 * p))
            i = int(bad[0])
            raise CheckError(
                f"{what}: {len(bad)} of {len(want)} elements wrong, first at {i}: got {got[i]!r}, expected {want[i]!r}"
            )

    def identical(outs, ranks, what):
        first = ranks[0]
        for r in ranks[1:]:
            if not _same_bytes(outs[r], outs[first]):
                raise CheckError(f"{what}: ranks {first} and {r} hold different bytes")

    name = f"{algo.name} p={p} n={n}"
    x = [_data(rng, n, dtype, random) for _ in range(p)]  # real rank r's input (its block, if blocked)
    full = [_data(rng, (p, n), dtype, random) for _ in range(p)] if coll == "reduce_scatter" else None
    for root in roots:
        tag = f"{name} root={root}" if algo.rooted else name
        if coll == "barrier":
            run_collective(algo, [np.zeros(0, dtype) for _ in range(p)], root, op, sim)
            continue
        if coll == "all_reduce":
            want = functools.reduce(op, x)
            outs = run_collective(algo, x, root, op, sim)
            for r in range(p):
                agree(outs[r], want, f"{tag}: rank {r}")
            identical(outs, list(range(p)), tag)
        elif coll == "broadcast":
            ins = [x[root] if r == root else _garbage(r, n, dtype) for r in range(p)]
            outs = run_collective(algo, ins, root, op, sim)
            for r in range(p):
                agree(outs[r], x[root], f"{tag}: rank {r}")
            identical(outs, list(range(p)), tag)
        elif coll == "reduce":
            outs = run_collective(algo, x, root, op, sim)
            agree(outs[root], functools.reduce(op, x), f"{tag}: root {root}")
        elif coll == "all_gather":
            ins = []
            for r in range(p):
                b = _garbage(r, (p, n), dtype)
                b[r] = x[r]
                ins.append(b.reshape(-1))
            outs = run_collective(algo, ins, root, op, sim)
            want = np.concatenate(x) if p else np.zeros(0, dtype)
            for r in range(p):
                agree(outs[r], want, f"{tag}: rank {r}")
            identical(outs, list(range(p)), tag)
        elif coll == "reduce_scatter":
            outs = run_collective(algo, [f.reshape(-1) for f in full], root, op, sim)
            for r in range(p):
                want = functools.reduce(op, [full[s][r] for s in range(p)])
                agree(outs[r].reshape(p, n)[r], want, f"{tag}: rank {r} block {r}")
        elif coll == "gather":
            ins = []
            for r in range(p):
                b = _garbage(r, (p, n), dtype)
                b[(r - root) % p] = x[r]
                ins.append(b.reshape(-1))
            outs = run_collective(algo, ins, root, op, sim)
            got = outs[root].reshape(p, n)
            for u in range(p):
                agree(got[u], x[(u + root) % p], f"{tag}: root block {u} (rank {(u + root) % p})")
        elif coll == "scatter":
            ins = [_garbage(r, (p, n), dtype) for r in range(p)]
            for u in range(p):
                ins[root][u] = x[(u + root) % p]
            outs = run_collective(algo, [b.reshape(-1) for b in ins], root, op, sim)
            for r in range(p):
                v = (r - root) % p
                agree(outs[r].reshape(p, n)[v], x[r], f"{tag}: rank {r} block {v}")
        else:
            raise ValueError(f"no closed form for collective {coll}")


__all__ = ["simulate", "check", "run_collective", "Simulator", "ScheduleError", "DeadlockError", "CheckError"]
