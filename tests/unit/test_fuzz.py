"""The receive-path fuzz targets (tests/fuzz/fuzz_receive.py), a short run of each in CI.

Without atheris: random inputs shaped by the targets' builders; with atheris
installed, also a short coverage-guided run. The long runs are documented in
docs/security.md.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ = os.path.join(os.path.dirname(HERE), "fuzz", "fuzz_receive.py")
sys.path.insert(0, os.path.dirname(FUZZ))

import fuzz_receive  # noqa: E402


@pytest.mark.parametrize("target", ["tcp", "slot"])
def test_random_inputs_are_refused_or_accepted_never_crash(target):
    outcomes = fuzz_receive.run_random(target, runs=3000, seed=1)
    assert sum(outcomes.values()) == 3000
    assert outcomes.get("accepted", 0) > 0 and len(outcomes) > 1, outcomes  # both paths were reached


def test_a_valid_stream_is_accepted_and_a_bad_magic_refused():
    good = fuzz_receive.tcp_input(bytes([1]) * 1000)  # choice bytes 1: one 256-byte frame, every field right
    assert len(good) > 256
    assert fuzz_receive.check_tcp(good) == ""
    bad = bytearray(good)
    bad[0] ^= 0xFF
    assert "bad magic" in fuzz_receive.check_tcp(bytes(bad))


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris is not installed")
@pytest.mark.parametrize("target", ["tcp", "slot"])
def test_short_atheris_run(target):
    proc = subprocess.run([sys.executable, FUZZ, target, "-runs=3000", "-seed=1"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
