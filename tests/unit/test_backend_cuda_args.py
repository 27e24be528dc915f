"""What a CUDA build's group hands its CUDA side (ProcessGroupTilecomm.set_cuda), checked on a CPU
build: the C++ under TILECOMM_WITH_CUDA is not compiled here, so the arguments' shape is checked
against what its pybind11 signature takes (csrc/backend/module.cpp)."""

import importlib
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from tilecomm import _backend, _C, algorithms, cuda_model, executor_model, selector

topology = importlib.import_module("tilecomm.topology")  # the package exports a function of that name


class _RecordingGroup(_C.ProcessGroupTilecomm):
    calls: list = []

    def set_cuda(self, *args, **kwargs):
        type(self).calls.append((args, kwargs))


@pytest.fixture
def cuda_build(monkeypatch):
    monkeypatch.setattr(_C, "HAS_CUDA", True, raising=False)
    monkeypatch.setattr(_C, "ProcessGroupTilecomm", _RecordingGroup)
    monkeypatch.setattr(topology, "host_gpu_links", lambda: [])
    for key in ("TILECOMM_ALGO", "TILECOMM_PROFILE", "TILECOMM_TRANSPORT", "TILECOMM_LL_BYTES"):
        monkeypatch.delenv(key, raising=False)
    _RecordingGroup.calls = []
    yield _RecordingGroup.calls


def _create():
    opts = SimpleNamespace(store=dist.HashStore(), group_rank=0, group_size=1, group_id="cuda-args",
                           timeout=timedelta(seconds=30))
    return _backend.create(opts)


def test_set_cuda_gets_the_executors_tables(cuda_build):
    pg = _create()
    try:
        assert len(cuda_build) == 1
        _, kwargs = cuda_build[0]
        tables = kwargs["executor_tables"]
        # std::array<std::vector<std::vector<std::pair<uint64_t, uint16_t>>>, 2>: per memory, per Coll
        assert isinstance(tables, list) and len(tables) == 2 == len(executor_model.MEMORIES)
        want = executor_model.build_tables(1, {}, selector.DEFAULT_PROFILE)
        for m, per_coll in zip(executor_model.MEMORIES, tables):
            assert len(per_coll) == len(algorithms.COLLECTIVES)
            for coll, table in zip(algorithms.COLLECTIVES, per_coll):
                assert all(isinstance(e, tuple) and len(e) == 2 for e in table)
                assert all(0 <= lo < 1 << 64 and 0 <= aid < 1 << 16 for lo, aid in table)
                assert table == [tuple(e) for e in want[m].get(coll, [])], (m, coll)
        assert tables[0][algorithms.COLLECTIVES.index("broadcast")]  # collectives the executor runs have one
        assert not tables[0][algorithms.COLLECTIVES.index("all_to_all")]  # the others none
        assert len(kwargs["ll_bytes"]) == 3 and len(kwargs["register_bytes"]) == 4
        # uint64_t each: all_gather's LL limit, and from where a registered output leaves LL
        assert kwargs["allgather_ll_bytes"] == cuda_model.LL_MAX_BYTES
        want = cuda_model.allgather_register_ll_bytes(selector.DEFAULT_PROFILE, 1)
        assert kwargs["allgather_register_ll_bytes"] == want
    finally:
        del pg


def test_forced_algorithm_reaches_the_executors_tables(cuda_build, monkeypatch):
    monkeypatch.setenv("TILECOMM_ALGO", "broadcast:pipelined_chain")
    pg = _create()
    try:
        tables = cuda_build[0][1]["executor_tables"]
        chain = algorithms.by_name("broadcast_pipelined_chain").id
        for per_coll in tables:
            assert per_coll[algorithms.COLLECTIVES.index("broadcast")] == [(selector.MAX_BYTES, chain)]
    finally:
        del pg


def test_each_memory_and_collective_lands_in_its_slot(cuda_build, monkeypatch):
    """Distinct tables per (memory, collective) arrive at [PeerMemory][Coll] (a world-1 group's own
    tables cannot tell memories apart: every algorithm costs the same there)."""
    def fake(p, forced, profile, layout=None):
        return {m: {c: [(1000 * (i + 1) + j, executor_model.candidates(c)[-1 if i else 0].id)]
                    for j, c in enumerate(executor_model.COLLECTIVES)}
                for i, m in enumerate(executor_model.MEMORIES)}

    monkeypatch.setattr(executor_model, "build_tables", fake)
    pg = _create()
    try:
        tables = cuda_build[0][1]["executor_tables"]
        want = fake(1, {}, None)
        for i, m in enumerate(executor_model.MEMORIES):
            for c in algorithms.COLLECTIVES:
                assert tables[i][algorithms.COLLECTIVES.index(c)] == want[m].get(c, []), (m, c)
    finally:
        del pg
