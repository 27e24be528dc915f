"""Direct reduce-scatter, run directly by the engine (csrc/algorithms/reducescatter_direct.cc).

Block j goes straight to rank j, which combines the p copies in rank order.
Cost: 1 round, (p-1)/p of the buffer sent and reduced per rank. Wins for small
messages, where one exchange beats p-1 ring rounds.
"""

from tilecomm.schedule import CostTerms

COLLECTIVE = "reduce_scatter"
DIRECT = True


def cost_terms(p):
    return CostTerms(rounds=1 if p > 1 else 0, wire=(p - 1) / p, reduced=(p - 1) / p)
