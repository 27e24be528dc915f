// Pairwise all-to-all, run directly (block sizes vary per call, so there is no
// fixed schedule). Round k = 1..p-1: send the block for rank r+k, receive the
// block of rank r-k; the own block is a local copy. Cost: p-1 rounds, (p-1)/p of
// the buffer sent per rank, nothing reduced (declared in
// python/tilecomm/algorithms/alltoall_pairwise.py). Each round pairs distinct
// partners, so no rank is flooded.
#include "algorithms/direct.h"

namespace tilecomm::algo {

void alltoallPairwise(const AllToAllArgs& a) {
  copyOwnBlock(a);
  std::vector<exec::Step> steps;
  for (int k = 1; k < a.world; ++k) {
    steps.clear();
    addExchange(a, k, steps);
    a.exec.runRound(steps, a.desc, DType::kBytes, RedOp::kNone, a.deadline, a.timeout_ms);
  }
}

}  // namespace tilecomm::algo
