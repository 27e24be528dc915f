"""Where a synchronous collective spends its host time, stage by stage.

    with tilecomm.host_stages() as stages:
        for _ in range(200):
            dist.all_reduce(x)
    print(stages.table())

Inside the block, this process's synchronous ``all_reduce`` and ``all_gather_into_tensor`` calls
(through torch.distributed or ``tilecomm.ops``, on CPU or CUDA tensors) record the time between
points on their way through the backend. The stages are those of Note [Host stages]
(``csrc/common/host_stages.h``); CPU calls have no CUDA stages. What comes before the backend
(torch.distributed's or the dispatcher's Python and C++ on the way in) is not a stage: a loop's
time per call minus the sum of the stages is that part. Asynchronous calls are not recorded.
"""

from __future__ import annotations

import contextlib


class HostStages:
    """The samples of one ``host_stages()`` block: microseconds per call, by stage, in the stages' order."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    def _quantile(self, stage: str, q: float) -> float:
        s = sorted(self.samples[stage])
        return s[min(len(s) - 1, int(q * len(s)))]

    def medians(self) -> dict[str, float]:
        """Each recorded stage's median, in the stages' order."""
        return {st: self._quantile(st, 0.5) for st in self.samples}

    def table(self) -> str:
        rows = ["| stage | calls | median (µs) | p10 | p90 |", "| --- | ---: | ---: | ---: | ---: |"]
        medians = self.medians()
        for st, med in medians.items():
            rows.append(
                f"| {st} | {len(self.samples[st])} | {med:.2f} | {self._quantile(st, 0.1):.2f} | "
                f"{self._quantile(st, 0.9):.2f} |"
            )
        rows.append(f"| sum of medians | | {sum(medians.values()):.2f} | | |")
        return "\n".join(rows)


@contextlib.contextmanager
def host_stages():
    """Records the host stages of the block's synchronous collectives (one block at a time per process: a
    nested block raises RuntimeError)."""
    from tilecomm import _C

    _C.host_stages_start()
    record = HostStages()
    try:
        yield record
    finally:
        record.samples = dict(_C.host_stages_stop())
