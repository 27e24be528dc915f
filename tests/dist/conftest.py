"""Fixtures for the distributed tests: the session's worker pools (see harness.py)."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import harness  # noqa: E402


_MANAGER = None


@pytest.fixture(scope="session")
def pools():
    global _MANAGER
    _MANAGER = harness.PoolManager()
    yield _MANAGER
    _MANAGER.close_all()


def pytest_terminal_summary(terminalreporter):
    m = _MANAGER
    if m is None:
        return
    terminalreporter.write_line(
        f"tilecomm pools: {m.started} started, {m.reconfigured} re-initialised in place, "
        f"{len(m.reinit_failures)} re-initialisations failed"
    )
    for f in m.reinit_failures:
        terminalreporter.write_line("re-initialisation failure: " + f.splitlines()[0])
    if m.leftover_segments:
        terminalreporter.write_line(f"ERROR: pools left shared-memory segments behind: {m.leftover_segments}")


def pytest_sessionfinish(session, exitstatus):
    """Fails the run if closing the pools (destroy_process_group) left /dev/shm segments behind."""
    if _MANAGER is not None and _MANAGER.leftover_segments and exitstatus == 0:
        session.exitstatus = 1


def pytest_collection_modifyitems(config, items):
    """Orders pooled tests by world size, then environment (stable, in order of first appearance).

    Each world size's processes then start once, and each environment is set
    up once per world size. Tests without a pool keep their relative order and
    run after the pooled ones.
    """
    worlds, envs = {}, {}

    def pool_key(item):
        cs = getattr(item, "callspec", None)
        if cs is not None:
            for v in cs.params.values():
                if isinstance(v, harness.Cfg):
                    return v.key
        return None

    keyed = []
    for pos, item in enumerate(items):
        k = pool_key(item)
        if k is None:
            keyed.append(((1, 0, 0), pos, item))
        else:
            worlds.setdefault(k.world, len(worlds))
            envs.setdefault(k, len(envs))
            keyed.append(((0, worlds[k.world], envs[k]), pos, item))
    keyed.sort(key=lambda t: (t[0], t[1]))
    items[:] = [t[2] for t in keyed]
