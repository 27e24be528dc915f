"""Prints docs/algorithms.md from the registry: ``python -m tilecomm.algorithms > docs/algorithms.md``."""

from tilecomm import algorithms, selector


def markdown() -> str:
    lines = [
        "# Algorithms",
        "",
        "Generated from the registry (`python/tilecomm/algorithms/`) by `python -m tilecomm.algorithms`;",
        "a test checks that this file is current. Cost terms are read off each schedule (or declared next",
        "to a direct algorithm): *rounds* = message latencies on the critical path, *wire* = bytes sent by",
        "the busiest rank per byte of buffer, *reduced* = bytes it reduces per byte of buffer. Predicted",
        "time = rounds x alpha + wire x n x beta + reduced x n x gamma.",
        "",
        "| id | collective | `TILECOMM_ALGO` name | cost at p = 2, 4, 8 (rounds / wire / reduced) | summary |",
        "| --- | --- | --- | --- | --- |",
    ]
    for a in algorithms.ALGORITHMS:
        costs = []
        for p in (2, 4, 8):
            t = selector.terms(a, p)
            costs.append(f"{t.rounds} / {t.wire:.3g} / {t.reduced:.3g}")
        lines.append(f"| `{a.name}` | {a.collective} | `{a.short}` | {'; '.join(costs)} | {a.summary} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
