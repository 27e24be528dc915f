"""End to end on 2 spawned ranks with a tiny grid: tune writes a profile, groups use it
(TILECOMM_PROFILE, logged under TILECOMM_DEBUG=INFO), and --validate reports on it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tilecomm import algorithms, selector

GRID = [
    "--world-sizes",
    "2",
    "--collectives",
    "broadcast,barrier",
    "-b",
    "8",
    "-e",
    "4K",
    "-f",
    "8",
    "-n",
    "3",
    "-w",
    "1",
    "-r",
    "2",
]
TIMEOUT_S = 120


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILECOMM_")}
    env.update(extra)
    return env


def _run(args, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=TIMEOUT_S, env=_env(**env))


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tune") / "profile.json"
    r = _run(["-m", "tilecomm.tune", *GRID, "--dtypes", "float32,float16", "-o", str(path)])
    assert r.returncode == 0, r.stderr
    assert f"wrote {path}" in r.stdout
    return path


def test_tune_writes_a_complete_profile(profile_path):
    prof = selector.load_profile(str(profile_path))
    fp = prof["fingerprint"]
    assert {"hostname", "cpu_model", "cpu_count", "torch", "tilecomm"} <= set(fp)
    assert set(prof["gamma_s_per_byte"]) == {"float32", "float16", "default"}
    expected = {a.name for c in ("broadcast", "barrier") for a in algorithms.for_collective(c)}
    assert set(prof["corrections"]["2"]) == expected
    assert set(prof["points"]["collectives"]["2"]) == expected
    sizes = [n for n, _ in prof["points"]["links"]["shm"]]
    assert sizes == [8, 64, 512, 4096]
    assert prof["residuals"]["links"]["shm"]["points"] == 4


def test_validate_reports_every_collective(profile_path, tmp_path):
    report = tmp_path / "report.json"
    r = _run(["-m", "tilecomm.tune", "--validate", str(profile_path), *GRID, "--json", str(report)])
    assert r.returncode == 0, r.stderr
    assert "| broadcast | 2 | 4 | " in r.stdout and "| barrier | 2 | 1 | 1 |" in r.stdout
    written = json.loads(report.read_text())
    assert written["profile"] == str(profile_path)  # as given on the command line
    rows = written["rows"]
    assert [(row["collective"], row["world"]) for row in rows] == [("broadcast", 2), ("barrier", 2)]
    for row in rows:
        assert row["regret_worst"] >= row["regret_median"] > 0
        assert row["error_worst"] >= row["error_median"] >= 0


SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import tilecomm
    from tilecomm import launch

    def worker(rank, world):
        try:
            dist.init_process_group("tilecomm", rank=rank, world_size=world)
        except ValueError as e:
            print(f"rank {rank} failed: {e}", flush=True)
            return
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.all_reduce(t)  # the same size class: logged once
        assert t.tolist() == [4.0] * 4
        dist.destroy_process_group()

    if __name__ == "__main__":
        launch.run(worker, 2)
    """
)


def test_groups_use_and_log_the_profile(profile_path, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    r = _run([str(script)], TILECOMM_PROFILE=str(profile_path), TILECOMM_DEBUG="INFO")
    assert r.returncode == 0, r.stderr
    assert "tilecomm world=2 profile: tuned on" in r.stderr and f"(from {profile_path})" in r.stderr
    assert "tilecomm world=2 all_reduce: [0, " in r.stderr
    # Once per (collective, size class) in use: the choice and its predicted time (rank 0).
    chosen = [line for line in r.stderr.splitlines() if line.startswith("tilecomm: all_reduce of 9..16 B at world 2")]
    assert len(chosen) == 1 and "predicted" in chosen[0], r.stderr
    r = _run([str(script)], TILECOMM_PROFILE=str(tmp_path / "missing.json"))
    for rank in (0, 1):  # rank 0 reads the file; its error reaches every rank
        assert (
            f"rank {rank} failed: TILECOMM_PROFILE: profile '{tmp_path / 'missing.json'}': cannot read it" in r.stdout
        )


def test_a_variable_that_is_no_setting_is_named_once(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    r = _run([str(script)], TILECOMM_SPINS="64")  # the name this setting had before TILECOMM_SPIN_NS
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "TILECOMM_SPINS is not a tilecomm setting" in line]
    # rank 0 reads the settings every rank uses, and says so once
    assert len(lines) == 1 and "did you mean TILECOMM_SPIN_NS?" in lines[0], r.stderr
