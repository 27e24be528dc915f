"""One-shot all-reduce, run directly by the engine (csrc/algorithms/allreduce_one_shot.cc).

Every rank sends its whole buffer to every peer in one round, then combines
the p contributions locally in rank order, so all ranks compute the same
expression and end bitwise identical. Cost: 1 round, (p-1) x the buffer sent
and reduced per rank. Wins for small messages.
"""

from tilecomm.schedule import CostTerms

COLLECTIVE = "all_reduce"
DIRECT = True


def cost_terms(p):
    return CostTerms(rounds=1 if p > 1 else 0, wire=float(p - 1), reduced=float(p - 1))
