"""Process pools for the tilecomm distributed tests.

Starting a process and importing torch costs about two seconds on a small box,
so tests never spawn per case. A :class:`Pool` starts ``world`` worker
processes (multiprocessing "spawn" context) once. Every worker

* applies the pool's ``TILECOMM_*`` environment (and removes any other),
* runs ``init_process_group("tilecomm")`` (the default group) over a fresh
  TCP port, and creates a Gloo group over all ranks (the oracle),
* then serves *cases*: a case is the name of a module-level function of
  ``cases.py`` plus keyword arguments. Every rank calls
  ``cases.<name>(rank, world, gloo_group, **kwargs)`` and sends back its return
  value, or the exception text.

A pool serves one (world size, environment) combination at a time; switching
to another environment (``TILECOMM_ALGO=ring`` ...) destroys the process
groups and creates them again in the same processes (:meth:`Pool.reconfigure`),
which costs a fraction of a second instead of a new interpreter per rank
(``TILECOMM_TEST_FRESH_POOLS=1`` starts new processes instead).

Every wait in the parent is bounded. A case that fails on any rank, or does
not finish in time, marks the pool broken: its processes are killed (a failed
tilecomm group cannot run more work, and a rank may be stuck in a collective)
and the next test gets a fresh pool. :class:`PoolManager` hands out pools and
keeps few processes alive; ``conftest.py`` orders the tests by world size and
environment so that each is set up once, and closes everything at session end.

:func:`spawn_ranks` is the separate helper for tests that need processes of
their own (failures, init errors): it starts ``world`` processes that each run
one function of ``cases.py`` and returns what each one reported, killing
stragglers after a timeout.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
import warnings
from multiprocessing.connection import wait as mp_wait

HERE = os.path.dirname(os.path.abspath(__file__))

CASE_TIMEOUT_S = float(os.environ.get("TILECOMM_TEST_CASE_TIMEOUT", "120"))
START_TIMEOUT_S = float(os.environ.get("TILECOMM_TEST_START_TIMEOUT", "180"))
# How long to wait for the other ranks once one rank has reported an error.
ERROR_GRACE_S = 5.0
# Group timeout of the pools' process groups (tilecomm and gloo).
GROUP_TIMEOUT_S = 90.0
# Most worker processes alive at once across cached pools (memory on a small box).
MAX_LIVE_PROCS = 12


class CaseFailure(AssertionError):
    """A case failed on at least one rank, or did not finish in time."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_segments(pids=None) -> list[str]:
    """tilecomm segments in /dev/shm; only those created by ``pids`` when given."""
    try:
        names = [n for n in os.listdir("/dev/shm") if n.startswith("tilecomm-")]
    except OSError:
        return []
    if pids is None:
        return sorted(names)
    prefixes = tuple(f"tilecomm-{p}-" for p in pids)
    return sorted(n for n in names if n.startswith(prefixes))


def _apply_env(env: dict, rank: int) -> None:
    """Sets the TILECOMM_* environment; ``TILECOMM_TEST_HOSTS="a,a,b"`` gives rank r
    TILECOMM_HOSTNAME=<r-th name> (simulated hosts)."""
    for k in list(os.environ):
        if k.startswith("TILECOMM_") and not k.startswith("TILECOMM_TEST_"):
            del os.environ[k]
    os.environ.update({k: str(v) for k, v in env.items() if k != "TILECOMM_TEST_HOSTS"})
    if env.get("TILECOMM_TEST_HOSTS"):
        os.environ["TILECOMM_HOSTNAME"] = env["TILECOMM_TEST_HOSTS"].split(",")[rank]


def _format_exc(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}


# ---------------------------------------------------------------- pool worker


def _init_groups(rank, world, port, env, group_timeout_s):
    """(Re)creates the default tilecomm group and the Gloo oracle group under ``env``."""
    from datetime import timedelta

    import torch.distributed as dist

    _apply_env(env, rank)
    timeout = timedelta(seconds=group_timeout_s)
    dist.init_process_group(
        "tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}", timeout=timeout
    )
    return dist.new_group(backend="gloo", timeout=timeout)


def _worker_main(rank, world, port, env, conn, group_timeout_s):
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    _apply_env(env, rank)
    try:
        import torch
        import torch.distributed as dist

        import tilecomm  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)  # many ranks share two cores
        gloo = _init_groups(rank, world, port, env, group_timeout_s)
        import cases
    except BaseException as e:  # report, then exit: the parent fails the pool
        conn.send(("error", _format_exc(e)))
        conn.close()
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(3)  # the parent went away
        if msg[0] in ("close", "reinit"):
            info = {}
            try:
                dist.destroy_process_group()
            except BaseException as e:
                info["destroy_error"] = _format_exc(e)
            info["segments"] = shm_segments([os.getpid()])
            if msg[0] == "close":
                conn.send(("closed", info))
                conn.close()
                return
            _, env, port = msg
            if "destroy_error" in info or info["segments"]:
                conn.send(("error", {"type": "RuntimeError", "message": f"destroy before re-init: {info}",
                                     "traceback": ""}))
                continue
            try:
                gloo = _init_groups(rank, world, port, env, group_timeout_s)
                conn.send(("ready", os.getpid()))
            except BaseException as e:
                conn.send(("error", _format_exc(e)))
            continue
        _, name, kwargs = msg
        cases.take_failures()
        cases._IDENTICAL.clear()
        try:
            result = getattr(cases, name)(rank, world, gloo, **kwargs)
            cases.flush_identical(gloo)
            failures = cases.take_failures()
            if failures:
                shown = "\n".join(failures[:10]) + (f"\n... and {len(failures) - 10} more" if len(failures) > 10 else "")
                conn.send(("error", {"type": "AssertionError", "message": shown, "traceback": ""}))
            else:
                conn.send(("ok", result))
        except BaseException as e:
            failures = cases.take_failures()
            info = _format_exc(e)
            if failures:
                info["message"] += "\n(earlier mismatches: " + "; ".join(failures[:5]) + ")"
            conn.send(("error", info))


def _describe(rank, msg) -> str:
    kind = msg[0]
    if kind == "error":
        info = msg[1]
        return f"--- rank {rank}: {info['type']}: {info['message']}\n{info['traceback']}"
    if kind == "died":
        return f"--- rank {rank}: process exited with code {msg[1]} without answering"
    if kind == "timeout":
        return f"--- rank {rank}: no answer within the time limit"
    return f"--- rank {rank}: {kind}"


@dataclasses.dataclass(frozen=True)
class PoolKey:
    world: int
    env: tuple  # sorted (name, value) pairs

    @staticmethod
    def of(world: int, env: dict | None = None) -> "PoolKey":
        return PoolKey(world, tuple(sorted((env or {}).items())))


class Pool:
    """``world`` worker processes with a tilecomm default group and a Gloo oracle group."""

    def __init__(self, world: int, env: dict | None = None, start_timeout: float = START_TIMEOUT_S,
                 group_timeout_s: float = GROUP_TIMEOUT_S):
        self.world = world
        self.env = dict(env or {})
        self.key = PoolKey.of(world, self.env)
        self.broken = False
        self.closed = False
        self.pids: list[int] = []
        self.started_s = 0.0
        ctx = mp.get_context("spawn")
        port = free_port()
        self.conns, self.procs = [], []
        t0 = time.monotonic()
        for r in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_worker_main, args=(r, world, port, self.env, child, group_timeout_s),
                name=f"tilecomm-test-w{world}-r{r}", daemon=True,
            )
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        replies = self._collect(start_timeout, what="start-up")
        bad = [r for r, m in enumerate(replies) if m[0] != "ready"]
        if bad:
            self.kill()
            raise CaseFailure(
                f"pool world={world} env={self.env} failed to start:\n"
                + "\n".join(_describe(r, replies[r]) for r in bad)
            )
        self.pids = [m[1] for m in replies]
        self.started_s = time.monotonic() - t0

    # ---- waiting ----
    def _collect(self, timeout: float, what: str):
        """One reply per rank; ("timeout",) / ("died", code) for ranks that gave none."""
        n = self.world
        replies: list = [None] * n
        pending = set(range(n))
        deadline = time.monotonic() + timeout
        err_deadline = None
        while pending:
            now = time.monotonic()
            limit = deadline if err_deadline is None else min(deadline, err_deadline)
            if now >= limit:
                break
            objs = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            ready = mp_wait(objs, timeout=limit - now)
            for r in sorted(pending):
                conn = self.conns[r]
                msg = None
                if conn in ready or (self.procs[r].sentinel in ready and conn.poll(0)):
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        self.procs[r].join(1)
                        msg = ("died", self.procs[r].exitcode)
                elif self.procs[r].sentinel in ready:
                    self.procs[r].join(1)
                    msg = ("died", self.procs[r].exitcode)
                if msg is not None:
                    replies[r] = msg
                    pending.discard(r)
                    if msg[0] not in ("ok", "ready", "closed") and err_deadline is None:
                        err_deadline = time.monotonic() + ERROR_GRACE_S
        for r in pending:
            replies[r] = ("timeout",)
        return replies

    # ---- running cases ----
    def run(self, case: str, timeout: float = CASE_TIMEOUT_S, **kwargs) -> list:
        """Runs ``cases.<case>`` on every rank; returns the per-rank results.

        Raises CaseFailure (and kills the pool) if any rank raised, died, or did
        not answer within ``timeout`` seconds.
        """
        if self.broken or self.closed:
            raise CaseFailure("pool is no longer usable")
        for r, c in enumerate(self.conns):
            try:
                c.send(("run", case, kwargs))
            except (BrokenPipeError, OSError):
                self.broken = True
                self.kill()
                raise CaseFailure(f"{case}: rank {r}'s worker is gone") from None
        t0 = time.monotonic()
        replies = self._collect(timeout, what=case)
        bad = [r for r, m in enumerate(replies) if m[0] != "ok"]
        if bad:
            self.broken = True
            self.kill()
            timed_out = [r for r in bad if replies[r][0] == "timeout"]
            head = f"case {case}({kwargs}) failed on ranks {bad} of {self.world} (env {self.env})"
            if timed_out:
                head += f"; ranks {timed_out} gave no answer within {timeout:.0f} s " f"(after {time.monotonic() - t0:.1f} s)"
            raise CaseFailure(head + "\n" + "\n".join(_describe(r, replies[r]) for r in bad))
        return [m[1] for m in replies]

    # ---- switching environment in place ----
    def reconfigure(self, env: dict | None, timeout: float = 120.0) -> None:
        """Destroys the groups and creates them again under ``env``, in the same processes.

        Much cheaper than new processes (no interpreter start, no torch import);
        it also exercises destroy_process_group and re-initialisation. Raises
        CaseFailure (and kills the pool) if that fails.
        """
        if self.broken or self.closed:
            raise CaseFailure("pool is no longer usable")
        env = dict(env or {})
        port = free_port()
        for c in self.conns:
            c.send(("reinit", env, port))
        replies = self._collect(timeout, what="reinit")
        bad = [r for r, m in enumerate(replies) if m[0] != "ready"]
        if bad:
            self.broken = True
            self.kill()
            raise CaseFailure(
                f"re-initialising pool world={self.world} from env {self.env} to {env} failed:\n"
                + "\n".join(_describe(r, replies[r]) for r in bad)
            )
        self.env = env
        self.key = PoolKey.of(self.world, env)

    # ---- shutting down ----
    def close(self, timeout: float = 60.0) -> dict:
        """Destroys the process groups and joins the workers; returns what they reported."""
        if self.closed:
            return {}
        self.closed = True
        if self.broken:
            self.kill()
            return {"killed": True}
        for c in self.conns:
            try:
                c.send(("close",))
            except OSError:
                pass
        replies = self._collect(timeout, what="close")
        for p in self.procs:
            p.join(10)
        self.kill()
        out = {"replies": replies}
        leftover = shm_segments(self.pids)
        out["segments"] = leftover
        return out

    def kill(self) -> None:
        self.closed = True
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(10)
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


class PoolManager:
    """Hands out pools by (world, env), keeping at most MAX_LIVE_PROCS worker processes alive.

    One set of processes per world size: asking for another environment at the
    same world size re-initialises the groups in place (Pool.reconfigure)
    unless TILECOMM_TEST_FRESH_POOLS=1, which starts new processes instead.
    """

    def __init__(self, max_live_procs: int = MAX_LIVE_PROCS):
        self.max_live_procs = max_live_procs
        self.pools: dict[int, Pool] = {}  # by world; insertion order = least recently used first
        self.fresh = os.environ.get("TILECOMM_TEST_FRESH_POOLS", "") == "1"
        self.started = 0
        self.reconfigured = 0
        self.reinit_failures: list[str] = []
        self.leftover_segments: list[str] = []

    def get(self, world: int, env: dict | None = None) -> Pool:
        key = PoolKey.of(world, env)
        pool = self.pools.pop(world, None)
        if pool is not None and not (pool.broken or pool.closed):
            if pool.key == key:
                self.pools[world] = pool  # most recently used
                return pool
            if not self.fresh:
                try:
                    pool.reconfigure(env)
                    self.reconfigured += 1
                    self.pools[world] = pool
                    return pool
                except CaseFailure as e:  # a real problem, but not this test's: report it, start afresh
                    self.reinit_failures.append(str(e))
                    warnings.warn(f"tilecomm test pool: re-initialisation failed, starting new processes:\n{e}")
        if pool is not None:
            self._close(pool)
        while self.pools and sum(p.world for p in self.pools.values()) + world > self.max_live_procs:
            self._close(self.pools.pop(next(iter(self.pools))))
        pool = Pool(world, env)
        self.started += 1
        self.pools[world] = pool
        return pool

    def run(self, world: int, env: dict | None, case: str, timeout: float = CASE_TIMEOUT_S, **kwargs) -> list:
        return self.get(world, env).run(case, timeout=timeout, **kwargs)

    def close_all(self) -> None:
        """Closes every pool (destroy_process_group, join); records segments any of them left."""
        while self.pools:
            self._close(self.pools.popitem()[1])

    def _close(self, pool: Pool) -> None:
        self.leftover_segments.extend(pool.close().get("segments", []))


# ---------------------------------------------------------------- configurations


@dataclasses.dataclass(frozen=True)
class Cfg:
    """One pool configuration as a test parameter: world size plus TILECOMM_* environment.

    ``label`` names it in test ids: the algorithm forced for the collective under
    test, ``auto`` (the selector decides), or a variant such as ``tinyslots``.
    """

    world: int
    label: str = "auto"
    env_items: tuple = ()

    @property
    def env(self) -> dict:
        return dict(self.env_items)

    @property
    def key(self) -> PoolKey:
        return PoolKey(self.world, tuple(sorted(self.env_items)))

    def __str__(self):
        return f"{self.label}-p{self.world}"


TINY_SLOTS_ENV = (("TILECOMM_SHM_SLOTS", "1"), ("TILECOMM_SHM_SLOT_BYTES", "192"))


def algorithm_sets() -> list[str]:
    """TILECOMM_ALGO values; value i forces the i-th algorithm of every collective that has one.

    Read from the registry, so algorithms added later are exercised without
    touching the tests, with one pool per value (not per algorithm).
    """
    from tilecomm import algorithms

    per = {c: algorithms.for_collective(c) for c in algorithms.COLLECTIVES}
    k = max(len(v) for v in per.values())
    return [";".join(f"{c}:{v[i].name}" for c, v in per.items() if len(v) > i) for i in range(k)]


def configs(collective: str, worlds, auto: bool = True) -> list[Cfg]:
    """Pool configurations that exercise every algorithm of ``collective`` at each world size.

    A collective with one algorithm runs only in the default pool (where the
    selector has no other choice); one with several runs in the default pool
    ("auto") and once with each algorithm forced.
    """
    from tilecomm import algorithms

    algs = algorithms.for_collective(collective)
    sets = algorithm_sets()
    out = []
    for w in worlds:
        if len(algs) <= 1:
            out.append(Cfg(w, algs[0].short if algs else "auto"))
            continue
        if auto:
            out.append(Cfg(w, "auto"))
        for i, a in enumerate(algs):
            out.append(Cfg(w, a.short, (("TILECOMM_ALGO", sets[i]),)))
    return out


def algorithm_set_configs(worlds) -> list[Cfg]:
    """auto plus one Cfg per algorithm set (labelled algoset<i>): every algorithm of every collective runs."""
    out = []
    for w in worlds:
        out.append(Cfg(w, "auto"))
        out.extend(Cfg(w, f"algoset{i}", (("TILECOMM_ALGO", spec),)) for i, spec in enumerate(algorithm_sets()))
    return out


# ---------------------------------------------------------------- one-shot processes


def _spawn_main(rank, world, port, env, conn, case, kwargs):
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    _apply_env(env, rank)
    try:
        import cases

        result = getattr(cases, case)(rank, world, port, **kwargs)
        conn.send(("ok", result))
    except BaseException as e:
        try:
            conn.send(("error", _format_exc(e)))
        except OSError:
            pass
    finally:
        # NOTE: rank 0 holds the TCPStore; a rank that finished first stays until the parent
        # has every rank's outcome (it closes the pipe), so no rank loses the store mid-case.
        try:
            conn.poll(600)
        except (OSError, EOFError):
            pass
        conn.close()
    os._exit(0)  # skip interpreter teardown: a failed group must not hang the exit


@dataclasses.dataclass
class RankOutcome:
    rank: int
    pid: int
    status: str  # "ok", "error", "died", "timeout"
    result: object = None  # the case's return value when ok, the error dict when error
    exitcode: int | None = None

    def __str__(self):
        return _describe(self.rank, (self.status, self.result) if self.status != "died" else ("died", self.exitcode))


def spawn_ranks(world: int, case: str, env: dict | None = None, timeout: float = 90.0, **kwargs) -> list[RankOutcome]:
    """Starts ``world`` fresh processes running ``cases.<case>(rank, world, port, **kwargs)``.

    The case does its own ``init_process_group`` on ``tcp://127.0.0.1:port``.
    Returns one RankOutcome per rank; processes still running after
    ``timeout`` seconds are killed and reported as "timeout". Never hangs.
    """
    ctx = mp.get_context("spawn")
    port = free_port()
    conns, procs = [], []
    for r in range(world):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_spawn_main, args=(r, world, port, dict(env or {}), child, case, kwargs), daemon=True)
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    outcomes: list = [None] * world
    pending = set(range(world))
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready = mp_wait([conns[r] for r in pending] + [procs[r].sentinel for r in pending], timeout=left)
        for r in sorted(pending):
            msg = None
            if conns[r] in ready or (procs[r].sentinel in ready and conns[r].poll(0)):
                try:
                    msg = conns[r].recv()
                except (EOFError, OSError):
                    msg = None
                    if procs[r].sentinel in ready or not procs[r].is_alive():
                        procs[r].join(1)
                        msg = ("died", procs[r].exitcode)
                    else:
                        procs[r].join(5)
                        msg = ("died", procs[r].exitcode)
            elif procs[r].sentinel in ready:
                procs[r].join(1)
                msg = ("died", procs[r].exitcode)
            if msg is not None:
                pending.discard(r)
                if msg[0] == "died":
                    outcomes[r] = RankOutcome(r, procs[r].pid, "died", None, msg[1])
                else:
                    outcomes[r] = RankOutcome(r, procs[r].pid, msg[0], msg[1])
    for r in pending:
        outcomes[r] = RankOutcome(r, procs[r].pid, "timeout")
        procs[r].kill()
    for c in conns:
        c.close()  # lets the ranks exit
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join(10)
    for r, p in enumerate(procs):
        outcomes[r].exitcode = p.exitcode
    return outcomes
