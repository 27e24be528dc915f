"""Fixtures of the GPU tests (see gpu_harness.py). Each test module skips itself
as a whole where there is no GPU, before importing or starting anything."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

_POOLS = None


@pytest.fixture(scope="session")
def pools():
    global _POOLS
    import gpu_harness

    _POOLS = gpu_harness.Pools()
    yield _POOLS
    _POOLS.close_all()


def pytest_collection_modifyitems(config, items):
    """Runs the GPU tests grouped by world size, so each world's processes start once, and within
    a world by the name of their configuration (the default first, then stable), so that tests
    whose pools have the same TILECOMM_* environment mostly follow each other and the pool's
    groups are re-created less often (a name stands for one environment in most tests; where it
    does not, the pool re-creates its groups as it would anyway)."""
    def key(item):
        cs = getattr(item, "callspec", None)
        params = cs.params if cs is not None else {}
        w = params.get("world")
        path = str(getattr(item, "path", "")).replace(os.sep, "/")
        if not (isinstance(w, int) and "/tests/gpu/" in path):
            return (1, 0, "")
        name = str(params.get("config", params.get("memory", "")))
        name = "" if name in ("auto", "cuda_ipc") else name
        return (0, w, f"{os.path.basename(path)}:{name}" if name else "")

    order = {id(item): pos for pos, item in enumerate(items)}
    items.sort(key=lambda it: (key(it), order[id(it)]))


def pytest_runtest_logreport(report):
    """Prints a failure's report as soon as it happens, not only in the final summary: a later
    test that hangs until the command's time limit would take the summary with it. With
    TILECOMM_TEST_DURATIONS set, appends each test's seconds (set-up, call and tear-down) to that
    file as it ends, so a run cut off by a time limit still tells where its time went."""
    path = os.environ.get("TILECOMM_TEST_DURATIONS")
    if path:
        with open(path, "a") as f:
            f.write(f"{report.duration:.1f} {report.when} {report.outcome} {report.nodeid}\n")
    if report.failed:
        text = report.longreprtext
        sys.stderr.write(f"\n{report.nodeid} failed ({report.when}):\n{text[-4000:]}\n")
        sys.stderr.flush()
