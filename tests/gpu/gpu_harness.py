"""Worker pools for the GPU tests (several ranks may share one GPU).

A :class:`Pool` starts ``world`` processes once (multiprocessing "spawn"). Each
picks GPU ``rank % device_count``, runs ``init_process_group("tilecomm")``
(CPU and CUDA tensors both go to tilecomm) and creates a Gloo group over every
rank (the CPU oracle), then serves cases: ``gpu_cases.<name>(rank, world,
gloo, **kwargs)`` on every rank, returning each rank's result or raising
:class:`CaseFailure` with every failing rank's traceback. Switching the
``TILECOMM_*`` environment re-creates the groups in the same processes. Every
wait is bounded; a pool that failed is killed and replaced, after its workers
that did not answer have reported their Python stacks and thread states.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait as mp_wait

HERE = os.path.dirname(os.path.abspath(__file__))
CASE_TIMEOUT_S = float(os.environ.get("TILECOMM_TEST_CASE_TIMEOUT", "300"))
START_TIMEOUT_S = float(os.environ.get("TILECOMM_TEST_START_TIMEOUT", "240"))
GROUP_TIMEOUT_S = float(os.environ.get("TILECOMM_TEST_GROUP_TIMEOUT", "120"))


class CaseFailure(AssertionError):
    pass


def gpu_missing():
    """Why the GPU tests cannot run here, or None. Cheap: no GPU is touched where there is none."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        import tilecomm._C as C
    except ImportError as e:
        return f"tilecomm's extension is not built: {e}"
    if not getattr(C, "HAS_CUDA", False):
        return "tilecomm was built without its CUDA parts"
    return None


def skip_without_gpu():
    """Module-level skip of a GPU test module; TILECOMM_TEST_REQUIRE_GPU=1 (scripts/gpu-test) makes it an error."""
    import pytest

    why = gpu_missing()
    if why is None:
        return
    if os.environ.get("TILECOMM_TEST_REQUIRE_GPU", "") == "1":
        raise RuntimeError(f"TILECOMM_TEST_REQUIRE_GPU=1, but {why}")
    pytest.skip(why, allow_module_level=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _apply_env(env: dict) -> None:
    for k in list(os.environ):
        if k.startswith("TILECOMM_") and not k.startswith("TILECOMM_TEST_"):
            del os.environ[k]
    os.environ.update({k: str(v) for k, v in env.items()})


def _error(e: BaseException) -> tuple:
    return ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


def _init_groups(rank, world, port, env):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    _apply_env(env)
    torch.cuda.set_device(rank % torch.cuda.device_count())
    timeout = timedelta(seconds=GROUP_TIMEOUT_S)
    dist.init_process_group("tilecomm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timeout)
    return dist.new_group(backend="gloo", timeout=timeout)


def _stack_file(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"tilecomm-gpu-worker-{pid}.stacks")


def _thread_states(pid: int) -> str:
    """Each thread's name, scheduler state and kernel wait channel (Linux), for a worker that hangs."""
    lines = []
    try:
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            base = f"/proc/{pid}/task/{tid}"
            try:
                with open(f"{base}/stat") as f:
                    stat = f.read()
                with open(f"{base}/wchan") as f:
                    wchan = f.read().strip()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
            lines.append(f"{tid} {name} {rest.split()[0]} {wchan}")
    except OSError as e:
        return f"(no threads: {e})\n"
    return "threads (tid name state wchan):\n" + "\n".join(lines) + "\n"


def _answer_where() -> None:
    """Makes this worker write its Python stacks to its stack file when asked (SIGUSR1, _where)."""
    global _STACKS
    _STACKS = open(_stack_file(os.getpid()), "w")  # open for as long as the handler may write
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)


def _remove_stacks(pid: int) -> None:
    try:
        os.unlink(_stack_file(pid))
    except OSError:
        pass


def _where(procs, replies) -> None:
    """Appends the Python stacks (and thread states) of the workers that did not answer to their replies."""
    silent = [r for r, m in enumerate(replies) if m[0] == "timeout" and procs[r].is_alive()]
    if not silent:
        return
    for r in silent:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(1.0)
    for r in silent:
        try:
            with open(_stack_file(procs[r].pid)) as f:
                stacks = f.read()
        except OSError as e:
            stacks = f"(no stacks: {e})"
        stacks += _thread_states(procs[r].pid)
        replies[r] = (replies[r][0], f"{replies[r][1]}; its threads:\n{stacks[-4000:]}")


def _worker(rank, world, port, env, conn):
    faulthandler.enable()  # a crash in a worker shows where it happened
    _answer_where()  # a worker that does not answer in time is asked where it is (Pool._expect)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    try:
        import torch
        import torch.distributed as dist

        import tilecomm  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        gloo = _init_groups(rank, world, port, env)
        import gpu_cases
    except BaseException as e:
        conn.send(_error(e))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            os._exit(3)
        try:
            if msg[0] in ("close", "reinit"):
                torch.cuda.synchronize()
                dist.destroy_process_group()
                if msg[0] == "close":
                    conn.send(("closed", None))
                    return
                gloo = _init_groups(rank, world, msg[2], msg[1])
                conn.send(("ready", os.getpid()))
                continue
            _, name, kwargs = msg
            conn.send(("ok", getattr(gpu_cases, name)(rank, world, gloo, **kwargs)))
        except BaseException as e:
            conn.send(_error(e))


def _collect(conns, procs, timeout):
    replies = [None] * len(conns)
    pending = set(range(len(conns)))
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        ready = mp_wait([conns[r] for r in pending] + [procs[r].sentinel for r in pending],
                        timeout=deadline - time.monotonic())
        for r in sorted(pending):
            if conns[r] in ready or (procs[r].sentinel in ready and conns[r].poll(0)):
                try:
                    replies[r] = conns[r].recv()
                except (EOFError, OSError):
                    replies[r] = ("died", f"exit code {procs[r].exitcode}")
                pending.discard(r)
            elif procs[r].sentinel in ready:
                procs[r].join(1)
                replies[r] = ("died", f"exit code {procs[r].exitcode}")
                pending.discard(r)
        if any(m is not None and m[0] not in ("ok", "ready", "closed") for m in replies):
            deadline = min(deadline, time.monotonic() + 10.0)  # give the others a moment to report too
    for r in pending:
        replies[r] = ("timeout", f"no answer within {timeout:.0f} s")
    return replies


class Pool:
    def __init__(self, world: int, env: dict):
        self.world, self.env = world, dict(env)
        self.broken = False
        ctx = mp.get_context("spawn")
        port = free_port()
        self.conns, self.procs = [], []
        for r in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, world, port, self.env, child), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self._expect(_collect(self.conns, self.procs, START_TIMEOUT_S), "ready", "start-up")

    def _expect(self, replies, kind, what):
        bad = [r for r, m in enumerate(replies) if m[0] != kind]
        if bad:
            try:
                _where(self.procs, replies)
            except Exception as e:  # the failure is reported either way
                replies[bad[0]] = (replies[bad[0]][0], f"{replies[bad[0]][1]} (no stacks: {e})")
            self.kill()
            raise CaseFailure(f"{what} failed on ranks {bad} of {self.world} (env {self.env}):\n"
                              + "\n".join(f"--- rank {r}: {replies[r][0]}: {replies[r][1]}" for r in bad))
        return [m[1] for m in replies]

    def run(self, case: str, timeout: float = CASE_TIMEOUT_S, **kwargs) -> list:
        for c in self.conns:
            c.send(("run", case, kwargs))
        return self._expect(_collect(self.conns, self.procs, timeout), "ok", f"case {case}({kwargs})")

    def reconfigure(self, env: dict) -> None:
        port = free_port()
        for c in self.conns:
            c.send(("reinit", dict(env), port))
        self._expect(_collect(self.conns, self.procs, START_TIMEOUT_S), "ready", f"re-init with {env}")
        self.env = dict(env)

    def close(self) -> None:
        if not self.broken:
            for c in self.conns:
                try:
                    c.send(("close",))
                except OSError:
                    pass
            _collect(self.conns, self.procs, 60.0)
        self.kill()

    def kill(self) -> None:
        self.broken = True
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(10)
            _remove_stacks(p.pid)


class Pools:
    """One pool per world size (re-initialised in place for another environment)."""

    def __init__(self):
        self.pools: dict[int, Pool] = {}

    def get(self, world: int, env: dict | None = None) -> Pool:
        env = dict(env or {})
        pool = self.pools.get(world)
        if pool is not None and not pool.broken:
            if pool.env != env:
                pool.reconfigure(env)
            return pool
        for other in list(self.pools.values()):  # one pool alive at a time: the GPU is shared
            other.close()
        self.pools = {world: Pool(world, env)}
        return self.pools[world]

    def run(self, world: int, env: dict | None, case: str, **kwargs) -> list:
        return self.get(world, env).run(case, **kwargs)

    def close_all(self) -> None:
        for p in self.pools.values():
            p.close()
        self.pools = {}


def _spawn_main(rank, world, port, env, conn, case, kwargs):
    faulthandler.enable()
    _answer_where()  # where it is, if it does not answer (spawn_ranks)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    _apply_env(env)
    try:
        import gpu_cases
        import torch

        torch.set_num_threads(1)  # as in the pool's workers: the ranks' CPU checks share the cores
        conn.send(("ok", getattr(gpu_cases, case)(rank, world, port, **kwargs)))
    except BaseException as e:
        conn.send(_error(e))
    # NOTE: rank 0 holds the TCPStore: stay until the parent has every rank's reply (it closes the pipe).
    try:
        conn.poll(600)
    except (OSError, EOFError):
        pass
    conn.close()
    os._exit(0)  # a failed group must not hang the exit


def spawn_ranks(world: int, case: str, env: dict | None = None, timeout: float = 120.0, **kwargs) -> list:
    """Fresh processes running ``gpu_cases.<case>(rank, world, port, **kwargs)``; (status, value) per rank."""
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
    replies = _collect(conns, procs, timeout)
    try:
        _where(procs, replies)
    except Exception as e:  # the failure is reported either way
        replies = [(m[0], f"{m[1]} (no stacks: {e})") if m[0] == "timeout" else m for m in replies]
    for c in conns:
        c.close()  # lets the ranks that replied exit
    for p in procs:
        p.join(2)
        if p.is_alive():
            p.kill()
        p.join(10)
        _remove_stacks(p.pid)
    return replies
