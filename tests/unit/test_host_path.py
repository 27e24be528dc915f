"""benchmarks/host_path.py's paired rounds: the order of the rows and the report of their differences."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import host_path  # noqa: E402


def test_round_order_alternates():
    assert host_path._round_order(3, 0) == [0, 1, 2]
    assert host_path._round_order(3, 1) == [2, 1, 0]
    assert host_path._round_order(3, 2) == [0, 1, 2]


def test_steady_drift_adds_equally_over_two_rounds():
    # Each loop a row runs in takes 1 µs longer than the one before it: over an even number of
    # rounds every row's total drift is the same, so the difference of two equal rows is zero.
    rows, rounds, slot = 3, 4, 0
    drift = torch.zeros(rows, rounds, dtype=torch.float64)
    for r in range(rounds):
        for i in host_path._round_order(rows, r):
            drift[i, r] = slot
            slot += 1
    assert torch.all(drift.sum(dim=1) == drift.sum(dim=1)[0])


def test_paired_report():
    times = torch.tensor([[10.0, 11.0, 9.0, 12.0, 10.0],
                          [11.0, 11.5, 10.0, 12.5, 9.0],
                          [9.0, 9.0, 9.0, 9.0, 9.0]], dtype=torch.float64)
    lines = host_path._paired_report(["op", "symm", "add_"], times)
    assert lines[0].split()[0] == "op" and lines[0].split()[-1] == "10.00"
    assert lines[1].split()[0] == "symm" and lines[1].split()[-1] == "11.00"
    # op - symm per round: -1, -0.5, -1, -0.5, +1: median -0.5; op faster in 4 of 5
    assert "op - symm: median -0.50 µs" in lines[3]
    assert lines[3].endswith("op faster in 4 of 5 rounds")
    # op - add_: +1, +2, 0, +3, +1: median +1; op never faster
    assert "op - add_: median +1.00 µs" in lines[4]
    assert lines[4].endswith("op faster in 0 of 5 rounds")
    # an even count of rounds: the median is the mean of the two middle values
    even = host_path._paired_report(["a", "b"], torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]]))
    assert even[0].split()[-1] == "2.50" and "a - b: median +2.50 µs" in even[2]
