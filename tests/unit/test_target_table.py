"""benchmarks/target_table.py: auto against the best of the others, per run and by the median ratio."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import target_table  # noqa: E402

MiB = 1 << 20


def _run(tmp_path, name, cells, **extra):
    """A gpu_compare.py record file: cells {(world, bytes): (auto, one_shot, two_shot[, bound])}."""
    path = tmp_path / name
    with open(path, "w") as f:
        for (world, nbytes), times in cells.items():
            rec = {"world": world, "bytes": nbytes, "timing": "graph", "tilecomm:auto": times[0],
                   "symm_mem:one_shot": times[1], "symm_mem:two_shot": times[2], **extra}
            if len(times) > 3:
                rec["bound_us"] = times[3]
            f.write(json.dumps(rec) + "\n")
    return str(path)


def test_counts_per_run_and_by_median(tmp_path, capsys):
    a = _run(tmp_path, "a", {(2, 1024): (5.0, 6.0, 5.5), (4, 1024): (5.9, 6.0, 6.5)})
    b = _run(tmp_path, "b", {(2, 1024): (5.6, 6.0, 5.5), (4, 1024): (6.0, 6.0, 6.5)})
    c = _run(tmp_path, "c", {(2, 1024): (5.0, 6.0, 5.5), (4, 1024): (6.6, 6.0, 6.5)})
    rs = target_table.rows(target_table.load([a, b, c]), "tilecomm:auto",
                           ["symm_mem:one_shot", "symm_mem:two_shot"], 64 * MiB)
    assert [r["ratios"] for r in rs] == [[5.0 / 5.5, 5.6 / 5.5, 5.0 / 5.5], [5.9 / 6.0, 1.0, 6.6 / 6.0]]
    assert rs[0]["median"] == pytest.approx(5.0 / 5.5) and rs[1]["median"] == 1.0
    # the times shown are the middle run's: run b at world 4 (ratios 0.98, 1.0, 1.1)
    assert (rs[1]["auto"], rs[1]["best"]) == (6.0, 6.0)
    target_table.main([a, b, c])
    out = capsys.readouterr().out
    assert "per run: 2, 1, 1 of 2 points" in out  # run b: above at world 2; its tie at world 4 counts as at or below
    assert "by the median ratio: 2 of 2" in out
    assert "HBM" not in out  # no point from 64 MiB


def test_hbm_fraction_and_failed_entries(tmp_path, capsys):
    a = _run(tmp_path, "a", {(2, 64 * MiB): (100.0, 250.0, 130.0, 80.0), (2, 1024): (5.0, 6.0, 5.5)})
    b = _run(tmp_path, "b", {(2, 64 * MiB): (160.0, 250.0, 170.0, 80.0), (2, 1024): (5.0, 6.0, 5.5)})
    recs = [json.loads(line) for line in open(b)]
    recs[1]["tilecomm:auto"] = "failed: timeout"  # run b's 1 KiB point is left out of it
    with open(b, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    rs = target_table.rows(target_table.load([a, b]), "tilecomm:auto", ["symm_mem:two_shot"], 64 * MiB)
    assert rs[0]["ratios"] == [5.0 / 5.5] and rs[0]["hbm"] is None
    assert rs[1]["hbm"] == [0.8, 0.5]
    target_table.main([a, b, "--against", "symm_mem:two_shot"])
    out = capsys.readouterr().out
    assert "per run: 1, 1 of 1 points timed in every run" in out
    assert "HBM bound over auto: 50%-80% (target 60%: missed)" in out


def test_mixed_timings_are_refused(tmp_path):
    a = _run(tmp_path, "a", {(2, 1024): (5.0, 6.0, 5.5)})
    b = _run(tmp_path, "b", {(2, 1024): (5.0, 6.0, 5.5)}, timing="loop")
    with pytest.raises(SystemExit, match="mix timings"):
        target_table.load([a, b])
