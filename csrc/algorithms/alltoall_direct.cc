// Direct all-to-all: one round in which every rank sends each peer its block
// and receives every peer's block at once; the own block is a local copy.
// Cost: 1 round, (p-1)/p of the buffer sent per rank, nothing reduced
// (declared in python/tilecomm/algorithms/alltoall_direct.py). Fewer rounds
// than pairwise, at the price of every rank serving p-1 peers at the same time.
#include "algorithms/direct.h"

namespace tilecomm::algo {

void alltoallDirect(const AllToAllArgs& a) {
  copyOwnBlock(a);
  std::vector<exec::Step> steps;
  for (int k = 1; k < a.world; ++k) addExchange(a, k, steps);
  if (!steps.empty()) a.exec.runRound(steps, a.desc, DType::kBytes, RedOp::kNone, a.deadline, a.timeout_ms);
}

}  // namespace tilecomm::algo
