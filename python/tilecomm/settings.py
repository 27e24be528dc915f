"""The one table of every TILECOMM_* environment variable.

Nothing else reads the environment: code asks ``resolve()`` for the values,
and ``docs/env.md`` is generated from this table (``python -m tilecomm.settings``).
Within a group, rank 0's values are used by every rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    kind: type
    default: object
    doc: str


SETTINGS = [
    Setting(
        "TILECOMM_ALGO",
        str,
        "",
        "Force algorithms. A bare name applies to every collective that has it (`ring`); "
        "`collective:name` pairs separated by `;` pick per collective "
        '(`"all_reduce:recursive_doubling;all_gather:ring"`). Full ids (`allreduce_ring`) work too. '
        "An unknown or inapplicable name is an error at init that lists the valid names.",
    ),
    Setting(
        "TILECOMM_DEBUG",
        str,
        "",
        "`INFO` logs, once per group, the algorithms registered and the decision table.",
    ),
    Setting("TILECOMM_SHM_SLOTS", int, 4, "Slots per shared-memory channel (one channel per peer and lane)."),
    Setting(
        "TILECOMM_SHM_SLOT_BYTES",
        int,
        65536,
        "Payload bytes per slot (a multiple of 64); messages are pipelined in slices of this size.",
    ),
    Setting(
        "TILECOMM_SPINS",
        int,
        -1,
        "Busy polls before a waiting rank yields its core. -1: 64 when the host has a core per rank, else 0.",
    ),
    Setting("TILECOMM_YIELDS", int, 8, "sched_yield calls before a waiting rank sleeps on a futex."),
    Setting(
        "TILECOMM_SLEEP_US",
        int,
        20000,
        "Longest single futex sleep, in microseconds; peer liveness is checked between sleeps.",
    ),
]

_BY_NAME = {s.name: s for s in SETTINGS}


def resolve(environ=None) -> dict:
    """Reads every setting from ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ
    out = {}
    for s in SETTINGS:
        raw = env.get(s.name)
        if raw is None or raw == "":
            out[s.name] = s.default
            continue
        try:
            out[s.name] = s.kind(raw)
        except ValueError:
            raise ValueError(f"{s.name}={raw!r}: expected {s.kind.__name__}") from None
    return out


def markdown() -> str:
    lines = [
        "# Environment variables",
        "",
        "Generated from `python/tilecomm/settings.py` by `python -m tilecomm.settings`; do not edit by hand.",
        "Within a process group every rank uses rank 0's values.",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
    ]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default != "" else "(unset)"
        lines.append(f"| `{s.name}` | {default} | {s.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
