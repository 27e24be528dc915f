"""Generated documentation stays in step with the code it is generated from."""

from pathlib import Path

from tilecomm.algorithms.__main__ import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_algorithms_md_is_current():
    assert (ROOT / "docs" / "algorithms.md").read_text() == markdown(), (
        "docs/algorithms.md is stale: run `python -m tilecomm.algorithms > docs/algorithms.md`"
    )
