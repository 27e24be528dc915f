"""Pairwise all-to-all, run directly by the engine (block sizes vary per call).

In round k = 1..p-1 rank r sends its block for rank r+k and receives the block
from rank r-k; its own block is copied locally. Cost: p-1 rounds, (p-1)/p of
the buffer on the wire per rank, nothing reduced. Each round pairs distinct
partners, so no rank is flooded.
"""

COLLECTIVE = "all_to_all"
DIRECT = True

from tilecomm.schedule import CostTerms  # noqa: E402


def cost_terms(p):
    return CostTerms(rounds=p - 1, wire=(p - 1) / p if p else 0.0, reduced=0.0)
