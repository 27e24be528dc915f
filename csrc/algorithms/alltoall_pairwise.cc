// Pairwise all-to-all, run directly (block sizes vary per call, so there is no
// fixed schedule). Round k = 1..p-1: send the block for rank r+k, receive the
// block of rank r-k; the own block is a local copy. Cost: p-1 rounds, (p-1)/p of
// the buffer sent per rank, nothing reduced (declared in
// python/tilecomm/algorithms/alltoall_pairwise.py). Each round pairs distinct
// partners, so no rank is flooded.
#include <algorithm>

#include "algorithms/direct.h"

namespace tilecomm::algo {

void alltoallPairwise(const AllToAllArgs& a) {
  std::copy(a.in + a.in_off[a.rank], a.in + a.in_off[a.rank] + a.in_len[a.rank], a.out + a.out_off[a.rank]);
  std::vector<exec::Step> steps;
  for (int k = 1; k < a.world; ++k) {
    int to = (a.rank + k) % a.world, from = (a.rank - k + a.world) % a.world;
    steps.clear();
    steps.push_back(exec::Step{exec::StepKind::kSend, to, const_cast<char*>(a.in) + a.in_off[to], a.in_len[to], -1});
    steps.push_back(exec::Step{exec::StepKind::kRecvCopy, from, a.out + a.out_off[from], a.out_len[from], -1});
    a.exec.runRound(steps, a.desc, DType::kBytes, RedOp::kNone, a.deadline, a.timeout_ms);
  }
}

}  // namespace tilecomm::algo
