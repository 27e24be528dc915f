"""benchmarks/ab_table.py: medians, paired differences and the table of a gpu-ab run."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import ab_table  # noqa: E402

ORDER = "ABBAABBA"  # gpu-ab's rounds 1..8


def _records(a_values, b_values, key="k", world=4, nbytes=1024, **extra):
    """Records of rounds 1..8 in gpu-ab's order, A's and B's values taken in turn."""
    a, b = iter(a_values), iter(b_values)
    return [dict(world=world, bytes=nbytes, build=x, round=i + 1, **{key: next(a) if x == "A" else next(b)}, **extra)
            for i, x in enumerate(ORDER)]


def test_pairs_are_adjacent_rounds():
    # A: rounds 1, 4, 5, 8; B: rounds 2, 3, 6, 7. Pairs (1,2) (3,4) (5,6) (7,8).
    recs = _records([10, 10, 10, 10], [9, 11, 8, 12])
    (row,) = ab_table.rows(recs, ["k"])
    assert (row["a"], row["b"]) == (10, 10)
    assert row["pairs"] == 4 and row["below"] == 2  # -1, +1, -2, +2
    assert row["diff"] == 0  # median of -2, -1, +1, +2


def test_missing_round_drops_its_pair_and_points_sort():
    recs = _records([1, 1, 1, 1], [2, 2, 2, 2], nbytes=2048) + _records([5, 5, 5, 5], [4, 4, 4, 4], world=2)
    recs = [r for r in recs if not (r["world"] == 2 and r["round"] == 3)]  # B's round 3 of world 2 lost
    first, second = ab_table.rows(recs, ["k", "absent"])
    assert (first["world"], first["pairs"], first["below"], first["diff"]) == (2, 3, 3, -1)
    assert (second["world"], second["bytes"], second["diff"], second["below"]) == (4, 2048, 1, 0)


def test_failed_entries_are_not_numbers():
    recs = _records([1, 1, 1, 1], [1, 1, 1, 1])
    recs[0]["k"] = "failed: out of memory"
    (row,) = ab_table.rows(recs, ["k"])
    assert row["pairs"] == 3


def test_records_of_one_entry_take_entry_colon_field():
    recs = _records([5, 5, 5, 5], [4, 4, 4, 4], key="busy_us", entry="tilecomm:registered", acts=1)
    recs += _records([6, 6, 6, 6], [6, 6, 6, 6], key="busy_us", entry="symm_mem:two_shot", acts=1)
    reg, symm = ab_table.rows(recs, ["tilecomm:registered:busy_us", "symm_mem:two_shot:busy_us", "busy_us"])
    assert (reg["key"], reg["a"], reg["b"], reg["below"]) == ("tilecomm:registered:busy_us", 5, 4, 4)
    assert (symm["key"], symm["diff"], symm["below"]) == ("symm_mem:two_shot:busy_us", 0, 0)


def test_markdown_and_command_line(tmp_path, capsys):
    f = tmp_path / "ab.jsonl"
    recs = _records([3, 3, 3, 3], [2, 2, 2, 2], key="tilecomm:auto", nbytes=1 << 20, script="gpu_compare.py")
    recs += _records([7, 7, 7, 7], [7, 7, 7, 7], key="tilecomm:auto", script="gpu_latency.py")
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    ab_table.main([str(f), "--keys", "tilecomm:auto", "--script", "gpu_compare.py"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| world | bytes | entry | A | B | B - A | pairs |"
    assert out[2] == "| 4 | 1 MiB | tilecomm:auto | 3.00 | 2.00 | -1.00 | 4 of 4 |"
    assert len(out) == 3


def test_several_batches_need_a_choice(tmp_path):
    f = tmp_path / "ab.jsonl"
    recs = _records([1] * 4, [1] * 4, batch="x") + _records([2] * 4, [2] * 4, batch="y")
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(SystemExit, match="several batches"):
        ab_table.main([str(f), "--keys", "k"])
    with pytest.raises(SystemExit, match="no A/B records"):
        ab_table.main([str(f), "--keys", "k", "--batch", "z"])
