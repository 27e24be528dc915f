"""tilecomm.launch: local ranks, and the text they report back."""

import os
import tempfile

from tilecomm import launch


def _report(rank, world, word, path):
    if rank == world - 1:
        with open(path, "w") as f:
            f.write(f"{word} from rank {rank} of {world}")


def test_run_read_returns_what_a_rank_wrote_and_removes_the_file(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    made, real = [], tempfile.mkstemp

    def mkstemp(**kw):
        fd, path = real(**kw)
        made.append(path)
        return fd, path

    monkeypatch.setattr(launch.tempfile, "mkstemp", mkstemp)
    assert launch.run_read(_report, 2, "hello") == "hello from rank 1 of 2"
    assert len(made) == 1 and not os.path.exists(made[0])
