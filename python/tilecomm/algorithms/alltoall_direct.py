"""Direct all-to-all, run directly by the engine (block sizes vary per call).

One round: every rank sends each peer its block and receives every peer's block
at once; its own block is copied locally. Cost: 1 round, (p-1)/p of the buffer
on the wire per rank, nothing reduced. Fewer rounds than pairwise, so it wins
for small blocks; every rank serves p-1 peers at the same time.
"""

COLLECTIVE = "all_to_all"
DIRECT = True

from tilecomm.schedule import CostTerms  # noqa: E402


def cost_terms(p):
    return CostTerms(rounds=1 if p > 1 else 0, wire=(p - 1) / p if p else 0.0, reduced=0.0)
