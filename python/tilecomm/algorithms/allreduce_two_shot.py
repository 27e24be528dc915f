"""Two-shot all-reduce, run directly by the engine (csrc/algorithms/allreduce_two_shot.cc).

A direct reduce-scatter (chunk j goes straight to rank j, which combines the
p copies in rank order), then a direct all-gather of the reduced chunks. Cost:
2 rounds, 2(p-1)/p of the buffer sent and (p-1)/p reduced per rank. Sits
between one_shot (small) and ring (large).
"""

from tilecomm.schedule import CostTerms

COLLECTIVE = "all_reduce"
DIRECT = True


def cost_terms(p):
    return CostTerms(rounds=2 if p > 1 else 0, wire=2 * (p - 1) / p, reduced=(p - 1) / p)
